#!/usr/bin/env bash
# Layers only look down (STYLE rule 3; docs/ARCHITECTURE.md "Layers"). For each folder, the qccl
# headers its files may include (files of its subfolders too); anything else is a violation, printed
# with its file and line, and exit 1. A folder with C or C++ sources that is not listed is a violation
# as well, so that a new folder cannot escape the check.
#   include/      nothing of ours: the public header stands alone
#   base/         base/ and the public header: errors, logging, configuration, sockets, wire helpers
#   kernels/      kernels/ only (numerics know nothing above them)
#   transports/   transports/ and base/: never a codec, an algorithm or the runtime
#   collectives/  collectives/ and kernels/: never a socket, a transport or the runtime
#   src/          anything of the library (it is the top of the library)
#   sim/          the simulator and qccl_sim: the library's layers (it runs the plans and policy of
#                 src/ in virtual time) and its own headers
#   tools/        the public API, base/, their own headers, and the two runtime entry points made for
#                 them (src/aggregator_daemon.h, src/build_info.h)
#   perf/, examples/  the public API only, and perf's own headers (perf/codec_perf.cc, a kernel
#                     microbenchmark: kernels/)
#   shim/         the NCCL drop-in: the public API and its own headers (NCCL's nccl.h is a system header)
#   python/       the Python package's extension: the public API only
#   tests/        anything
set -euo pipefail
cd "$(dirname "$0")/.."

status=0
checked=()
check() {  # folder (or file), extended regex of allowed include paths, a file of the folder to skip
  local where=$1 allowed=$2 skip=${3:-} files=() f
  checked+=("$where")
  if [[ -f $where ]]; then
    files=("$where")
  else
    while IFS= read -r f; do
      [[ $f != "$skip" ]] && files+=("$f")
    done < <(find "$where" -type f \( -name '*.h' -o -name '*.cc' -o -name '*.c' -o -name '*.cu' -o -name '*.cuh' \) | sort)
  fi
  ((${#files[@]})) || return 0
  while IFS= read -r hit; do
    local include
    include=$(sed -E 's/.*#include "([^"]+)".*/\1/' <<<"$hit")
    if ! grep -qE "^($allowed)$" <<<"$include"; then
      echo "layer violation: $hit"
      status=1
    fi
  done < <(grep -nHE '^#include "' "${files[@]}" 2>/dev/null || true)
}

name='[a-z0-9_.-]+'
check include ''  # the public header includes nothing of ours
check base "base/$name|include/qccl\.h"
check kernels "kernels/$name"
check transports "transports/$name|base/$name"
check collectives "collectives/$name|kernels/$name"
check src "(src|base|kernels|transports|collectives)/$name|include/qccl\.h"
check sim "(sim|src|base|kernels|transports|collectives)/$name|include/qccl\.h"
check tools "include/qccl\.h|qccl\.h|base/$name|src/(aggregator_daemon|build_info)\.h|netem\.h"
check perf 'qccl\.h|common\.h|options\.h|codec_list\.h|demo\.h|baseline_common\.h|strict_number\.h' perf/codec_perf.cc
check perf/codec_perf.cc "kernels/$name|codec_list\.h"
check examples 'qccl\.h'
check shim "qccl\.h|shim/$name"
check python 'qccl\.h'
check tests "(tests/[a-z0-9_/.-]+|(src|sim|base|kernels|transports|collectives)/$name|include/qccl\.h|qccl\.h)"

# Every top-level folder with sources must be one of the above.
while IFS= read -r dir; do
  dir=${dir#./}
  known=0
  for c in "${checked[@]}"; do [[ $c == "$dir" ]] && known=1; done
  if ((!known)) && [[ -n $(find "$dir" -type f \( -name '*.h' -o -name '*.cc' -o -name '*.c' -o -name '*.cu' \) -print -quit) ]]; then
    echo "layer violation: folder $dir/ has sources but no rule in tools/check-layers.sh"
    status=1
  fi
done < <(find . -mindepth 1 -maxdepth 1 -type d ! -name '.*' ! -name 'build*' | sort)

if ((status == 0)); then echo "check-layers: every include looks down"; fi
exit $status
