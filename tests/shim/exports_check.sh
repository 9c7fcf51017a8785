#!/usr/bin/env bash
# The drop-in exports what NCCL exports: every dynamic symbol of the toolkit's libnccl.so.2, each ncclX
# with its pncclX twin, none with an ELF symbol version, and every NCCL entry point that nccl-tests and
# PyTorch reference (the lists of specs/nccl-abi.md section 1.6).
#   exports_check.sh LIBQCCL_NCCL LIBNCCL_SO_2
set -euo pipefail
shim=$1 real=$2
status=0
exports() { nm -D --defined-only "$1" | awk '{ print $3 }' | sort -u; }

missing=$(comm -23 <(exports "$real") <(exports "$shim"))
if [[ -n $missing ]]; then
  echo "exported by $real but not by $shim:"; echo "$missing"; status=1
fi

# ncclX and pncclX come in pairs (ncclResetDebugInitInternal is NCCL's one unpaired export).
while read -r sym; do
  [[ $sym == ncclResetDebugInitInternal ]] && continue
  if [[ $sym == nccl* ]] && ! exports "$shim" | grep -qx "p$sym"; then echo "no twin: p$sym"; status=1; fi
  if [[ $sym == pnccl* ]] && ! exports "$shim" | grep -qx "${sym#p}"; then echo "no twin: ${sym#p}"; status=1; fi
done < <(exports "$shim")

# Only NCCL's names, and no version node (NCCL's libnccl.map is anonymous).
others=$(exports "$shim" | grep -vE '^p?nccl' || true)
if [[ -n $others ]]; then echo "exports beyond nccl*/pnccl*:"; echo "$others"; status=1; fi
if nm -D --defined-only "$shim" | awk '{ print $3 }' | grep -q '@'; then echo "versioned symbols:"; nm -D --defined-only "$shim" | grep '@'; status=1; fi

# nccl-tests v2.14.1 and HEAD, and PyTorch ProcessGroupNCCL's runtime calls (specs/nccl-abi.md 1.6), with
# NCCL 2.29's host functions among them (nccl-tests HEAD's ncclGetLsaPointer, ncclGetLsaMultimemPointer and
# ncclGetLocalPointer are device functions of nccl_device.h, which no library exports).
consumers=(
  ncclAllGather ncclAllReduce ncclBcast ncclBroadcast ncclCommAbort ncclCommCount ncclCommDeregister
  ncclCommDestroy ncclCommGetAsyncError ncclCommInitAll ncclCommInitRank ncclCommRegister ncclCommUserRank
  ncclGetErrorString ncclGetLastError ncclGetUniqueId ncclGetVersion ncclGroupEnd ncclGroupStart ncclMemAlloc
  ncclMemFree ncclRecv ncclRedOpCreatePreMulSum ncclRedOpDestroy ncclReduce ncclReduceScatter ncclSend
  ncclCommInitRankConfig ncclAlltoAll ncclGather ncclScatter ncclCommWindowRegister ncclCommWindowDeregister
  ncclDevCommCreate ncclDevCommDestroy ncclTeamWorld ncclTeamLsa ncclTeamRail ncclTeamRankToWorld
  ncclTeamRankToLsa ncclCommSplit ncclCommFinalize ncclCommInitRankScalable ncclGroupSimulateEnd
  ncclCommCuDevice
  ncclCommQueryProperties ncclGetLsaMultimemDevicePointer ncclGetPeerDevicePointer ncclGetLsaDevicePointer)
for sym in "${consumers[@]}"; do
  exports "$shim" | grep -qx "$sym" || { echo "missing for nccl-tests/PyTorch: $sym"; status=1; }
done

((status == 0)) && echo "exports_check: $(exports "$shim" | wc -l) symbols, every one of $real's and the consumers'"
exit $status
