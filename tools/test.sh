#!/usr/bin/env bash
# The test command: installs what is missing, builds qccl twice (Release with -Werror, and
# RelWithDebInfo with AddressSanitizer + UndefinedBehaviorSanitizer) and runs the whole suite on
# both: unit tests, simulated-network tests of every algorithm, multi-rank tests as real processes
# through qcclrun (2, 3, 4 and 8 ranks), failure scenarios, and the launcher's own tests (the
# network-emulation ones need root and skip without it).
set -euo pipefail
cd "$(dirname "$0")/.."

tools/install-deps.sh

jobs=${QCCL_BUILD_JOBS:-2}
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DQCCL_WERROR=ON
cmake --build build -j "$jobs"
ctest --test-dir build -j "$jobs" --output-on-failure

cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DQCCL_SANITIZE=ON -DQCCL_BUILD_PERF=OFF
cmake --build build-asan -j "$jobs"
ctest --test-dir build-asan -j "$jobs" --output-on-failure
echo "test.sh: all tests passed (Release and ASan+UBSan)"
