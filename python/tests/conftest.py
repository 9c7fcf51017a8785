"""Fixtures for the Python tests, which run as one pytest process per rank under qcclrun
(python/CMakeLists.txt registers them with CTest): every rank runs the same tests in the same order,
so their collectives match.  A test that fails on one rank fails that rank's pytest, and qcclrun's
exit status with it."""

import os

import numpy as np
import pytest

import qccl


@pytest.fixture(scope="session")
def comm():
    c = qccl.Communicator.from_env()
    yield c
    c.destroy()


def rank_input(rank: int, count: int, dtype, seed: int = 0) -> np.ndarray:
    """Rank ``rank``'s input: any rank can make any other's, for the references."""
    rng = np.random.default_rng(seed * 1000 + rank)
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return rng.uniform(-1, 1, count).astype(dtype)
    if dtype.kind == "u":
        return rng.integers(0, 50, count).astype(dtype)
    return rng.integers(-50, 50, count).astype(dtype)


def agree(comm, array) -> bool:
    """True on every rank when every rank holds the same bytes in ``array`` (all-gathered)."""
    mine = np.frombuffer(np.ascontiguousarray(array).tobytes(), dtype=np.uint8)
    every = np.zeros((comm.size, mine.size), dtype=np.uint8)
    comm.all_gather(every, mine)
    return bool(np.all(every == every[0]))


def torch_or_skip():
    return pytest.importorskip("torch")


expected_size = int(os.environ.get("QCCL_NRANKS", "1"))
