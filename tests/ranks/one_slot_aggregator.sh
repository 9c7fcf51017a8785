#!/usr/bin/env bash
# IntSGD through one aggregator of one slot (qccl_aggregator --slots 1) while the ranks run ahead of
# each other: contributions queue, and every queued one must reach its chunk's slot when it can (a
# queue drained only up to its first contribution without a slot held another chunk's last
# contribution behind it, and the ranks timed out waiting for that sum).
# usage: one_slot_aggregator.sh QCCL_AGGREGATOR QCCLRUN INTSGD_RANKS_TEST
set -euo pipefail
aggregator=$1 qcclrun=$2 test=$3
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
"$qcclrun" -n 2 --timeout 200 -x QCCL_AGGREGATORS="$address" -x QCCL_CHUNK_BYTES=4096 -x QCCL_TIMEOUT=20 \
  -- "$test" "[switch-queue]"
