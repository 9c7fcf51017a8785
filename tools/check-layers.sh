#!/usr/bin/env bash
# Layers only look down (STYLE rule 3; DESIGN.md "Layout"). For each folder, the qccl headers its
# files may include; anything else is a violation, printed with its file and line, and exit 1.
#   kernels/      kernels/ only (numerics know nothing above them)
#   transports/   transports/, and src/ utility headers (errors, logging): never a codec or algorithm
#   collectives/  collectives/ and kernels/: never a socket, transport or the runtime
#   src/          anything of the library (it is the top of the library)
#   perf/, examples/  the public API only
set -euo pipefail
cd "$(dirname "$0")/.."

status=0
check() {  # folder, extended regex of allowed include paths
  local folder=$1 allowed=$2
  while IFS= read -r hit; do
    local include
    include=$(sed -E 's/.*#include "([^"]+)".*/\1/' <<<"$hit")
    if ! grep -qE "^($allowed)$" <<<"$include"; then
      echo "layer violation: $hit"
      status=1
    fi
  done < <(grep -nE '^#include "' "$folder"/*.h "$folder"/*.cc "$folder"/*.c 2>/dev/null || true)
}

check kernels 'kernels/[a-z_.-]+'
check transports 'transports/[a-z_.-]+|src/(errors|log)\.h'
check collectives 'collectives/[a-z_.-]+|kernels/[a-z_.-]+'
check perf 'qccl\.h|common\.h|options\.h'
check examples 'qccl\.h'

if ((status == 0)); then echo "check-layers: every include looks down"; fi
exit $status
