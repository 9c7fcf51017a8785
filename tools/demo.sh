#!/usr/bin/env bash
# The demo: installs what is missing, builds qccl, and runs all_reduce_perf with 4 local ranks, first
# over shared memory, then with every rank behind an emulated 1 Gbit/s link (qcclrun --netem; needs
# root), printing the wire floor 2(n-1)/n * S / rate beside each measured time.
set -euo pipefail
cd "$(dirname "$0")/.."

tools/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "${QCCL_BUILD_JOBS:-2}"

run=build/tools/qcclrun
perf=build/perf/all_reduce_perf

echo
echo "=== all_reduce_perf, 4 ranks over shared memory (UCX sysv + cma), float sum"
"$run" -n 4 --no-prefix -- "$perf" -b 64K -e 64M -f 4 -n 10 -c 1

if [[ $(id -u) == 0 ]]; then
  echo
  echo "=== all_reduce_perf, 4 ranks, each behind an emulated 1 Gbit/s full-duplex link (tc tbf)"
  "$run" -n 4 --no-prefix --netem 1gbit -- "$perf" -b 1M -e 64M -f 4 -n 3 -w 1 -c 1 --link-rate 1gbit
else
  echo
  echo "(skipping the emulated 1 Gbit/s network: qcclrun --netem needs root)"
fi
