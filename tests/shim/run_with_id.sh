#!/usr/bin/env bash
# Runs a multi-rank NCCL-API test with a fresh NCCL_TEST_ID_FILE, through which rank 0 hands the first
# unique id to the others: removed first, so that no rank can read a previous run's id.
#   run_with_id.sh ID_FILE LAUNCHER ARGS...
set -euo pipefail
export NCCL_TEST_ID_FILE=$1
shift
rm -f "$NCCL_TEST_ID_FILE" "$NCCL_TEST_ID_FILE.tmp"
exec "$@"
