#!/usr/bin/env bash
# Installs the Debian packages qccl needs to build, test and benchmark, skipping those present.
# Usage: tools/install-deps.sh            (as root, or with sudo available)
set -euo pipefail

packages=(
  cmake ninja-build g++ ccache pkg-config   # build
  libucx-dev ucx-utils                      # transport (UCX 1.13 in Debian 12)
  libhwloc-dev                              # topology
  libhwy-dev                                # vectorised kernels with run-time dispatch (Highway)
  libkissfft-dev                            # the fft codec's host FFT (KissFFT, BSD)
  libfftw3-dev                              # the fft codec's host FFT with -DQCCL_FFTW=ON (FFTW, GPL; the ASan build uses it)
  catch2                                    # tests
  clang libclang-rt-14-dev                  # the wire fuzzer (libFuzzer)
  iproute2                                  # qcclrun --netem: ip, tc
  python3-dev pybind11-dev                  # the Python package (python/)
  python3-numpy python3-pytest python3-torch  # its tests, the torch hooks and backend (torch 1.13, CPU)
  python3-matplotlib python3-sklearn        # the training demonstration (python/examples/)
  openmpi-bin libopenmpi-dev libgloo-dev    # peers measured by perf/run_perf.sh
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

sudo=""
if [[ $(id -u) != 0 ]]; then
  command -v sudo >/dev/null || { echo "install-deps: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
  sudo="sudo"
fi
echo "install-deps: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
