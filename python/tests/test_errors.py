"""Bad input raises a clean exception, the same on every rank, with the argument named; ranks that
disagree fail with Mismatch on every rank; a dead rank makes the others fail within QCCL_TIMEOUT
(dead_rank.py, a CTest entry of its own: it breaks the world communicator)."""

import enum
import threading
import time

import numpy as np
import pytest

import qccl


def test_local_errors_leave_the_communicator_intact(comm):
    x = np.ones(10, np.float32)
    with pytest.raises(qccl.InvalidArgument, match="tensor: element format 'h'"):
        comm.all_reduce(np.ones(10, np.int16))
    with pytest.raises(qccl.InvalidArgument, match="not C-contiguous"):
        comm.all_reduce(np.ones((10, 10), np.float32)[:, 0])
    readonly = np.ones(10, np.float32)
    readonly.flags.writeable = False
    with pytest.raises(qccl.InvalidArgument, match="read-only"):
        comm.all_reduce(readonly)
    comm.all_reduce(readonly, out=x)  # a read-only input is fine out of place
    with pytest.raises(qccl.InvalidArgument, match="out: 9 elements, expected 10"):
        comm.all_reduce(x, out=np.ones(9, np.float32))
    with pytest.raises(qccl.InvalidArgument, match="out: float64, but the input is float32"):
        comm.all_reduce(x, out=np.ones(10, np.float64))
    with pytest.raises(qccl.InvalidArgument, match="output: .* elements, expected"):
        comm.all_gather(np.zeros(comm.size * 10 + 1, np.float32), x)
    with pytest.raises(qccl.InvalidArgument, match="not an array"):
        comm.all_reduce([1.0, 2.0])
    with pytest.raises(qccl.InvalidArgument, match="tensor: a numpy.ndarray whose memory qccl cannot use"):
        comm.all_reduce(np.zeros(4, "M8[s]"))  # numpy exports no buffer of datetime64 (a bare ValueError)
    with pytest.raises(qccl.InvalidArgument, match="op: 'median'"):
        comm.all_reduce(x, "median")
    with pytest.raises(qccl.InvalidArgument, match=rf"src: {comm.size} is not a rank .*\(0\.\.{comm.size - 1}\)"):
        comm.broadcast(x, comm.size)
    with pytest.raises(qccl.InvalidArgument, match="dst: -1 is not a rank"):
        comm.reduce(x, -1)
    with pytest.raises(qccl.InvalidArgument, match="dst: 1.5 is not a rank"):
        comm.send(x, 1.5)
    with pytest.raises(qccl.InvalidArgument, match="src: True is not a rank"):
        comm.recv(x, True)
    with pytest.raises(qccl.InvalidArgument, match=f"dst: {comm.size} is not a rank"):
        comm.gather(x, None, comm.size)
    comm.broadcast(x, np.int64(comm.size - 1))  # numpy's integers are ranks too
    with pytest.raises(qccl.InvalidArgument, match="qcclAllReduceCompressed.*datatype"):
        comm.all_reduce(np.ones(10, np.int32), codec="q8")  # codecs take floating types only
    with pytest.raises(ValueError):  # the subclasses are the built-in exceptions too
        comm.all_reduce(x, codec="q99")
    state = comm.codec_state(10)
    with pytest.raises(qccl.InvalidArgument, match="state: given without a codec"):
        comm.all_reduce(x, state=state)
    with pytest.raises(qccl.InvalidArgument, match="segments: given without a codec"):
        comm.all_gather(np.zeros(comm.size * 10, np.float32), x, segments=[(10, True)])
    for setting, value in (("chunk_bytes", 1.5), ("timeout", "long"), ("codec", 8)):
        with pytest.raises(qccl.InvalidArgument, match=f"config: {setting} = {value!r} is not"):
            comm.split(0, **{setting: value})  # refused on every rank before any message
    # -1 and INT_MIN are qcclConfig_t's 'not set': from Python they are refused, not the default.
    for setting, value in (("timeout", -1), ("codec_min_bytes", -1.0), ("chunk_bytes", -2**31),
                           ("pipeline_depth", -2**31)):
        with pytest.raises(qccl.InvalidArgument, match=rf"config: {setting} = {value!r} is negative"):
            comm.split(0, **{setting: value})
    with pytest.raises(qccl.InvalidArgument, match="op: True is not a qccl.ReduceOp"):
        comm.all_reduce(x, True)  # not PROD
    # Counts, sizes and keys: negative, bool or too wide values are qccl's refusal naming them.
    store = comm.codec_store()
    delta = qccl.DeltaStore("aq4:channels=4", 4)
    for call, message in ((lambda: comm.codec_state(-1), "count: -1 is out of range"),
                          (lambda: comm.codec_store(-5), "budget: -5 is out of range"),
                          (lambda: store.get(-1, 4), "key: -1 is out of range"),
                          (lambda: store.get(1, 2.5), "count: 2.5 is not an integer"),
                          (lambda: store.erase(2**64), "key: 18446744073709551616 is out of range"),
                          (lambda: qccl.DeltaStore("aq4:channels=4", -4), "row_values: -4 is out of range"),
                          (lambda: qccl.DeltaStore("aq4:channels=4", 4, id=2**32),
                           r"id: 4294967296 is out of range \[0, 2\^32\)"),
                          (lambda: comm.delta_send(np.ones(4, np.float32), [-3], delta, 0), "keys' key: -3"),
                          (lambda: comm.all_gather(np.zeros(comm.size * 10, np.float32), x, codec="q8",
                                                   segments=[(-10, True)]), "segments' count: -10")):
        with pytest.raises(qccl.InvalidArgument, match=message):
            call()
    comm.all_reduce(x)  # still usable
    assert np.all(x == comm.size * comm.size)  # out=x above held size (the read-only ones), now summed again


def test_op_is_qccl_s_only(comm):
    # Only a qccl.ReduceOp, its name or an int of its value: the others were looked up by what they
    # compare equal to (2.0 as MAX, an IntEnum of another type by its value).
    class Numbered(enum.IntEnum):
        AVG = 1
    x = np.full(4, comm.rank + 1.0, np.float32)
    for op in (2.0, np.int64(2), Numbered.AVG, 5, -1, None, b"sum"):
        with pytest.raises(qccl.InvalidArgument, match=r"op: .* is not a qccl.ReduceOp, one of its names"):
            comm.all_reduce(x, op)
    n = comm.size
    for op, expected in ((qccl.ReduceOp.MAX, n), ("min", 1), (4, (n + 1) / 2), (0, n * (n + 1) / 2)):
        x[:] = comm.rank + 1.0
        comm.all_reduce(x, op)
        assert np.all(x == expected), op


def test_error_carries_code_and_message(comm):
    with pytest.raises(qccl.QcclError) as info:
        comm.all_reduce(np.ones(3, np.float32), codec="q8:bucket=7")
    assert info.value.code == qccl.Result.INVALID_ARGUMENT
    assert "bucket" in info.value.message
    assert "[invalid_argument]" in str(info.value)


def test_torch_errors(comm):
    torch = pytest.importorskip("torch")
    with pytest.raises(qccl.InvalidArgument, match="not contiguous"):
        comm.all_reduce(torch.ones(4, 4).t())
    with pytest.raises(qccl.InvalidArgument, match="torch.complex64 is not a qccl datatype"):
        comm.all_reduce(torch.ones(4, dtype=torch.complex64))
    with pytest.raises(qccl.InvalidArgument, match="sparse"):
        comm.all_reduce(torch.ones(4).to_sparse())
    with pytest.raises(qccl.InvalidArgument, match="torch.int16 is not a qccl datatype .*uint32, int64, uint64"):
        comm.all_reduce(torch.ones(4, dtype=torch.int16))
    if hasattr(torch, "_neg_view"):  # torch >= 1.10: a lazy negation's memory holds the negatives
        with pytest.raises(qccl.InvalidArgument, match="negative view.*resolve_neg"):
            comm.all_reduce(torch._neg_view(torch.ones(4)))
    # torch's ops are numbered otherwise (its AVG is 1, qccl's PROD): refused, not taken for another.
    dist = pytest.importorskip("torch.distributed")
    x = np.full(4, 3.0, np.float32)
    for op in (dist.ReduceOp.RedOpType.AVG, dist.ReduceOp.MAX, dist.ReduceOp.SUM):
        with pytest.raises(qccl.InvalidArgument, match="torch's ReduceOp numbers the ops otherwise"):
            comm.all_reduce(x, op)
    assert np.all(x == 3.0)


def test_mismatch_fails_on_every_rank(comm):
    if comm.size == 1:
        pytest.skip("needs two ranks")
    sub = comm.split(0)  # a communicator of its own: a mismatch breaks it
    count = 16 if sub.rank == 0 else 32
    started = time.monotonic()
    with pytest.raises(qccl.Mismatch, match="count"):
        sub.all_reduce(np.ones(count, np.float32))
    assert time.monotonic() - started < 30  # detected, not timed out
    with pytest.raises(qccl.QcclError):
        sub.check_async_error()
    sub.abort()
    with pytest.raises(qccl.InvalidUsage, match="destroyed or aborted"):
        sub.all_reduce(np.ones(count, np.float32))
    comm.barrier()  # the world communicator is unaffected


def test_request_keeps_its_failure(comm):
    # Every wait() and is_completed() after a failure raises it (the second returned as if done).
    if comm.size == 1:
        pytest.skip("needs two ranks")
    # Two ranks, so that neither learns of the failure before it has made its call.
    sub = comm.split(0 if comm.rank < 2 else None)
    if sub is not None:
        count = 16 if sub.rank == 0 else 32
        request = sub.all_reduce(np.ones(count, np.float32), async_op=True)
        with pytest.raises(qccl.Mismatch, match="count"):
            request.wait()
        for check in (request.wait, request.is_completed, request.wait):
            with pytest.raises(qccl.Mismatch, match="count"):
                check()
        sub.abort()
    comm.barrier()


def test_context_manager_aborts_on_exception(comm):
    sub = comm.split(0)
    with pytest.raises(RuntimeError, match="user code"):
        with sub:
            raise RuntimeError("user code failed")
    assert "destroyed" in repr(sub)
    comm.barrier()


def test_abort_releases_a_destroy_blocked_in_another_thread(comm):
    """qccl.h: an abort from another thread ends a destroy waiting for the other ranks (it raises
    Aborted); the binding kept no handle for the abort once destroy() had begun."""
    if comm.size == 1:
        pytest.skip("a destroy of one rank waits for nobody")
    sub = comm.split(0)
    if comm.rank == 0:
        raised = []

        def destroy():
            try:
                sub.destroy()  # waits for the other ranks, who destroy nothing yet
            except qccl.QcclError as e:
                raised.append(e)

        thread = threading.Thread(target=destroy)
        thread.start()
        time.sleep(0.5)  # the thread is in qcclCommDestroy's closing barrier by now
        sub.abort()
        thread.join(timeout=30)
        assert not thread.is_alive()
        assert len(raised) == 1 and isinstance(raised[0], qccl.Aborted), raised
    comm.barrier()
    if comm.rank != 0:
        sub.abort()  # rank 0 left it
