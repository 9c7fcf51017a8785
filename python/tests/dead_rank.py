"""A dead rank makes the others fail within QCCL_TIMEOUT instead of hanging (run alone, by the
python_dead_rank CTest entry: it breaks the world communicator; pytest does not collect it with the
test_*.py files)."""

import os
import time

import numpy as np
import pytest

import qccl


def test_dead_rank(comm):
    """The last rank exits without a word; the others fail within QCCL_TIMEOUT, not hang."""
    comm.barrier()
    if comm.rank == comm.size - 1:
        os._exit(0)
    timeout = float(os.environ["QCCL_TIMEOUT"])
    started = time.monotonic()
    with pytest.raises((qccl.RemoteError, qccl.Timeout)) as info:
        for _ in range(1000):
            comm.all_reduce(np.ones(1 << 16, np.float32))
    elapsed = time.monotonic() - started
    assert elapsed < timeout + 5
    print(f"rank {comm.rank}: {type(info.value).__name__} after {elapsed:.2f} s: {info.value}", flush=True)
    comm.abort()
    os._exit(0)  # passed; the session fixture would destroy the aborted communicator
