#!/usr/bin/env bash
# Packs the GPU-labelled tests of a CUDA build (`ctest -L gpu`) into one folder that runs on a machine
# with an NVIDIA driver and none of the build's packages (UCX, hwloc, Highway, KissFFT, Catch2): a GPU
# box lent for a few minutes, a cloud image with only CUDA. The folder holds the binaries the tests
# run (and the drop-in, libqccl, qcclrun's aggregator), the scripts they call, the build's ctest
# files with their paths turned into placeholders, and the shared libraries the binaries load from
# outside the C and C++ runtimes (found with ldd, and UCX's shared-memory module).
#
#   tools/gpu-bundle.sh BUILD_DIR OUT_DIR      (OUT_DIR is made; it must not exist)
#
# On the GPU machine:
#
#   OUT_DIR/run.sh [CTEST_ARGS...]             (default: -L gpu --output-on-failure)
#
# run.sh writes the ctest files for the folder's place, puts the libraries first on the loader's
# path, finds NCCL (the drop-in's tests and QCCL_GPU_WIRE=nccl load libnccl.so.2: the machine's, or
# Python's nvidia-nccl package) and cuFFT (the fft codec's device path: likewise) and runs ctest in
# the folder's build tree. The C and C++ runtimes and
# the driver are the machine's, so it must be at least as new as the build machine's glibc.
set -euo pipefail

if [ $# -ne 2 ]; then
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
  exit 2
fi
build=$(cd "$1" && pwd)
out=$2
[ -f "$build/CTestTestfile.cmake" ] || { echo "gpu-bundle: $build is not a build tree" >&2; exit 1; }
[ -e "$out" ] && { echo "gpu-bundle: $out exists" >&2; exit 1; }
source=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$build/CMakeCache.txt")
mkdir -p "$out/build" "$out/source" "$out/lib/ucx"
out=$(cd "$out" && pwd)

# The ctest files (all of them, so that ctest finds every folder), with the two trees' paths as
# placeholders.
(cd "$build" && find . -name CTestTestfile.cmake) | while read -r f; do
  mkdir -p "$out/build/$(dirname "$f")"
  sed "s|$build|@BUILD@|g; s|$source|@SOURCE@|g" "$build/$f" > "$out/build/$f.in"
done

# The files the GPU-labelled tests name (a command's words and NAME=PATH values under either tree),
# and what those programs load or start: libqccl (their RUNPATH), qcclrun's aggregator.
files=$(cd "$build" && ctest -L gpu --show-only=json-v1 | python3 -c '
import json, sys
for test in json.load(sys.stdin)["tests"]:
    for word in test.get("command", []):
        for part in word.split("="):
            print(part)' | sort -u)
files+=$'\n'"$build/tools/qccl_aggregator"
for f in "$build"/src/libqccl.so*; do files+=$'\n'"$f"; done
elves=()
while read -r f; do
  [ -n "$f" ] && [ -e "$f" ] || continue
  case "$f" in
    "$build"/*) to="$out/build/${f#"$build"/}" ;;
    "$source"/*) to="$out/source/${f#"$source"/}" ;;
    *) continue ;;
  esac
  [ -d "$f" ] && continue
  mkdir -p "$(dirname "$to")"
  cp -P "$f" "$to"
  [ -L "$f" ] || [ "$(head -c4 "$f" | tail -c3)" != ELF ] || elves+=("$f")
done <<< "$files"

# Their libraries, but the C and C++ runtimes, the driver and NCCL (the machine's).
core='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+|libcuda|libnccl)\.'
for f in "${elves[@]}"; do
  ldd "$f" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
  [[ $name =~ $core ]] && continue
  [[ $path == "$build"/* ]] && continue
  cp -L "$path" "$out/lib/$name"
  # UCX's cross-memory-attach module (shared memory between processes); tcp, sysv and posix are
  # in libuct itself. The InfiniBand modules would need the verbs libraries and their drivers.
  if [[ $name == libucs.so* ]] && [ -e "$(dirname "$path")/ucx/libuct_cma.so.0" ]; then
    cp -L "$(dirname "$path")/ucx/libuct_cma.so.0" "$out/lib/ucx/"
  fi
done

cat > "$out/run.sh" <<'EOF'
#!/usr/bin/env bash
# Runs the bundled GPU-labelled tests here (tools/gpu-bundle.sh): run.sh [CTEST_ARGS...]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
find "$here/build" -name CTestTestfile.cmake.in | while read -r f; do
  sed "s|@BUILD@|$here/build|g; s|@SOURCE@|$here/source|g" "$f" > "${f%.in}"
done
# (awk reads all of ldconfig's list: leaving early would fail the pipe with SIGPIPE)
nccl=$(ldconfig -p 2>/dev/null | awk '/libnccl\.so\.2 / && !found {print $NF; found = 1}')
if [ -z "$nccl" ]; then
  nccl=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib", "libnccl.so.2"))' \
         2>/dev/null || true)
  [ -e "$nccl" ] || nccl=""
fi
# cuFFT likewise (the fft codec's device path loads libcufft.so.12, or CUDA 12's libcufft.so.11)
cufft=$(ldconfig -p 2>/dev/null | awk '/libcufft\.so\.1[12] / && !found {print $NF; found = 1}')
if [ -z "$cufft" ]; then
  cufft=$(python3 -c 'import nvidia.cufft, os, glob; print((glob.glob(os.path.join(list(nvidia.cufft.__path__)[0], "lib", "libcufft.so.1[12]")) or [""])[0])' \
          2>/dev/null || true)
  [ -e "$cufft" ] || cufft=""
fi
export LD_LIBRARY_PATH="$here/lib:$here/build/src${nccl:+:$(dirname "$nccl")}${cufft:+:$(dirname "$cufft")}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export UCX_MODULE_DIR="$here/lib/ucx"
echo "run.sh: NCCL: ${nccl:-not found; the drop-in tests that forward to NCCL will fail}"
echo "run.sh: cuFFT: ${cufft:-not found; codec_cuda_test skips its cuFFT case, device_ranks_n2_cufft* fail naming it}"
cd "$here/build"
if [ $# -eq 0 ]; then set -- -L gpu --output-on-failure; fi
exec ctest "$@"
EOF
chmod +x "$out/run.sh"
echo "gpu-bundle: $(du -sh "$out" | cut -f1) in $out; on the GPU machine: $out/run.sh"
