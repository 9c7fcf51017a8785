#!/usr/bin/env bash
# Layers only look down (STYLE rule 3; DESIGN.md "Layout"). For each folder, the qccl headers its
# files may include; anything else is a violation, printed with its file and line, and exit 1.
#   kernels/      kernels/ only (numerics know nothing above them)
#   transports/   transports/, and src/ utility headers (errors, logging): never a codec or algorithm
#   collectives/  collectives/ and kernels/: never a socket, transport or the runtime
#   src/          anything of the library (it is the top of the library)
#   perf/, examples/  the public API only, and perf's own headers (perf/codec_perf.cc, a kernel
#                     microbenchmark: kernels/)
set -euo pipefail
cd "$(dirname "$0")/.."

status=0
check() {  # folder (or file), extended regex of allowed include paths, files of the folder to skip
  local where=$1 allowed=$2 skip=${3:-} files=() f
  if [[ -f $where ]]; then
    files=("$where")
  else
    for f in "$where"/*.h "$where"/*.cc "$where"/*.c; do
      [[ -e $f && $f != "$skip" ]] && files+=("$f")
    done
  fi
  while IFS= read -r hit; do
    local include
    include=$(sed -E 's/.*#include "([^"]+)".*/\1/' <<<"$hit")
    if ! grep -qE "^($allowed)$" <<<"$include"; then
      echo "layer violation: $hit"
      status=1
    fi
  done < <(grep -nHE '^#include "' "${files[@]}" 2>/dev/null || true)
}

check kernels 'kernels/[a-z_.-]+'
check transports 'transports/[a-z_.-]+|src/(errors|log)\.h'
check collectives 'collectives/[a-z_.-]+|kernels/[a-z_.-]+'
check perf 'qccl\.h|common\.h|options\.h|codec_list\.h|demo\.h' perf/codec_perf.cc
check examples 'qccl\.h'
check perf/codec_perf.cc 'kernels/[a-z_.-]+|codec_list\.h'

if ((status == 0)); then echo "check-layers: every include looks down"; fi
exit $status
