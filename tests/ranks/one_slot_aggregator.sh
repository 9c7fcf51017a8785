#!/usr/bin/env bash
# IntSGD through one aggregator of one slot (qccl_aggregator --slots 1) while the ranks run ahead of
# each other: contributions queue, and every queued one must reach its chunk's slot when it can (a
# queue drained only up to its first contribution without a slot held another chunk's last
# contribution behind it, and the ranks timed out waiting for that sum).
# With mixed-depths, rank 0 runs at QCCL_PIPELINE_DEPTH=8 and rank 1 at 1: the aggregator must handle
# each rank's chunks in the order they came. With lost, rank 0 kills the aggregator while the ranks run
# plain all-reduces, which must go on.
# usage: one_slot_aggregator.sh QCCL_AGGREGATOR QCCLRUN INTSGD_RANKS_TEST [mixed-depths|lost]
set -euo pipefail
aggregator=$1 qcclrun=$2 test=$3 mode=${4:-}
log=$(mktemp)
"$aggregator" --listen 127.0.0.1:0 --slots 1 --jobs 1 2>"$log" &
pid=$!
trap 'kill "$pid" 2>/dev/null || true; rm -f "$log"' EXIT
address=
for _ in $(seq 100); do
  address=$(sed -n 's/^qccl_aggregator: listening on //p' "$log")
  [[ -n $address ]] && break
  sleep 0.1
done
[[ -n $address ]] || { echo "the aggregator did not say where it listens:"; cat "$log"; exit 1; }
if [[ $mode == mixed-depths ]]; then
  # qcclrun gives every rank the same environment: each picks its depth by its rank.
  "$qcclrun" -n 2 --timeout 200 -x QCCL_AGGREGATORS="$address" -x QCCL_CHUNK_BYTES=4096 -x QCCL_TIMEOUT=20 \
    -- bash -c 'export QCCL_PIPELINE_DEPTH=$(( QCCL_RANK == 0 ? 8 : 1 )); exec "$@"' _ "$test" "[switch-depths]"
elif [[ $mode == lost ]]; then
  "$qcclrun" -n 2 --timeout 200 -x QCCL_AGGREGATORS="$address" -x ONE_SLOT_AGGREGATOR_PID="$pid" -x QCCL_TIMEOUT=20 \
    -- "$test" "[switch-lost]"
else
  "$qcclrun" -n 2 --timeout 200 -x QCCL_AGGREGATORS="$address" -x QCCL_CHUNK_BYTES=4096 -x QCCL_TIMEOUT=20 \
    -- "$test" "[switch-queue]"
fi
