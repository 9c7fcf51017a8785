"""The Python API's collectives against numpy references (float64 for floating types), on every
rank count qcclrun starts them with."""

import time
import weakref

import numpy as np
import pytest

import qccl
from conftest import agree, expected_size, rank_input

DTYPES = [np.int8, np.uint8, np.int32, np.uint32, np.int64, np.uint64, np.float16, np.float32, np.float64]
OPS = ["sum", "prod", "max", "min", "avg"]


def reference(op, inputs, dtype):
    dtype = np.dtype(dtype)
    wide = [x.astype(np.float64 if dtype.kind == "f" else np.int64) for x in inputs]
    n = len(inputs)
    if op == "sum":
        r = np.sum(wide, axis=0)
    elif op == "prod":
        r = np.prod(wide, axis=0)
    elif op == "max":
        r = np.max(wide, axis=0)
    elif op == "min":
        r = np.min(wide, axis=0)
    else:
        s = np.sum(wide, axis=0)
        if dtype.kind == "f":
            r = s / n
        else:  # the sum wraps in the datatype, then divides toward zero
            s = s.astype(dtype).astype(np.int64)
            r = np.sign(s) * (np.abs(s) // n)
    if dtype.kind == "f":
        return r
    return r.astype(dtype)  # integer results wrap, as qccl's do (two's complement)


def tolerance(op, dtype, n, magnitude):
    eps = {np.dtype(np.float16): 2.0 ** -11, np.dtype(np.float32): 2.0 ** -24,
           np.dtype(np.float64): 2.0 ** -53}[np.dtype(dtype)]
    # Each of the n - 1 operations rounds once in the datatype, and the result once more.
    return 2 * n * eps * magnitude + (0 if op != "avg" else eps)


def test_identity(comm):
    assert comm.size == expected_size
    assert 0 <= comm.rank < comm.size
    assert f"rank {comm.rank} of {comm.size}" in repr(comm)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("inplace", [True, False], ids=["inplace", "out"])
def test_all_reduce(comm, dtype, op, inplace):
    count = 1003  # odd: not a multiple of the rank count or of any chunk
    inputs = [rank_input(r, count, dtype) for r in range(comm.size)]
    if op == "prod" and np.dtype(dtype).kind == "f":
        inputs = [x / 2 + np.asarray(1, dtype) for x in inputs]  # keep the product in range: [0.5, 1.5]
    mine = inputs[comm.rank].copy()
    if inplace:
        comm.all_reduce(mine, op)
        result = mine
    else:
        result = np.empty_like(mine)
        comm.all_reduce(mine, op, out=result)
        assert np.array_equal(mine, inputs[comm.rank]), "out-of-place all_reduce changed its input"
    expected = reference(op, inputs, dtype)
    if np.dtype(dtype).kind == "f":
        magnitude = max(1.0, float(np.max(np.abs(expected))))
        np.testing.assert_allclose(result.astype(np.float64), expected, rtol=0,
                                   atol=tolerance(op, dtype, comm.size, magnitude))
    else:
        assert np.array_equal(result, expected)
    assert agree(comm, result)
    stats = comm.last_stats()
    assert stats["sequence"] > 0 or comm.size == 1


def test_zero_count(comm):
    empty = np.zeros(0, dtype=np.float32)
    assert comm.all_reduce(empty) is None
    assert comm.broadcast(empty, 0) is None
    assert comm.all_gather(np.zeros(0, dtype=np.float32), empty) is None
    request = comm.all_reduce(empty, async_op=True)
    request.wait()
    assert request.is_completed()


@pytest.mark.parametrize("inplace", [True, False], ids=["inplace", "out"])
def test_broadcast(comm, inplace):
    for root in range(comm.size):
        data = rank_input(root, 777, np.float32, seed=3)
        mine = data.copy() if comm.rank == root else np.full(777, np.nan, np.float32)
        if inplace:
            comm.broadcast(mine, root)
            assert np.array_equal(mine, data)
        else:
            out = np.zeros(777, np.float32)
            comm.broadcast(mine, root, out=out)
            assert np.array_equal(out, data)


def test_reduce(comm):
    inputs = [rank_input(r, 513, np.int32) for r in range(comm.size)]
    for root in range(comm.size):
        mine = inputs[comm.rank].copy()
        comm.reduce(mine, root, "sum")
        if comm.rank == root:
            assert np.array_equal(mine, np.sum(inputs, axis=0, dtype=np.int32))
        out = np.zeros(513, np.int32)
        comm.reduce(inputs[comm.rank], root, "max", out=out)
        if comm.rank == root:
            assert np.array_equal(out, np.max(inputs, axis=0))


def test_all_gather(comm):
    n = comm.size
    inputs = [rank_input(r, 301, np.float64) for r in range(n)]
    out = np.zeros(301 * n)
    comm.all_gather(out, inputs[comm.rank])
    assert np.array_equal(out, np.concatenate(inputs))
    # In place: the input is this rank's block of the output.
    out = np.zeros((n, 301))
    out[comm.rank] = inputs[comm.rank]
    comm.all_gather(out, out[comm.rank])
    assert np.array_equal(out, np.stack(inputs))


def test_reduce_scatter(comm):
    n = comm.size
    inputs = [rank_input(r, 257 * n, np.int64) for r in range(n)]
    out = np.zeros(257, np.int64)
    comm.reduce_scatter(out, inputs[comm.rank], "sum")
    total = np.sum(inputs, axis=0)
    assert np.array_equal(out, total[comm.rank * 257:(comm.rank + 1) * 257])


def test_all_to_all(comm):
    n = comm.size
    inputs = [rank_input(r, 33 * n, np.uint32) for r in range(n)]
    out = np.zeros(33 * n, np.uint32)
    comm.all_to_all(out, inputs[comm.rank])
    expected = np.concatenate([inputs[r][comm.rank * 33:(comm.rank + 1) * 33] for r in range(n)])
    assert np.array_equal(out, expected)


def test_gather_scatter(comm):
    n = comm.size
    inputs = [rank_input(r, 65, np.float32) for r in range(n)]
    for root in range(n):
        out = np.zeros(65 * n, np.float32) if comm.rank == root else None
        comm.gather(inputs[comm.rank], out, root)
        if comm.rank == root:
            assert np.array_equal(out, np.concatenate(inputs))
        block = np.zeros(65, np.float32)
        comm.scatter(block, np.concatenate(inputs) if comm.rank == root else None, root)
        assert np.array_equal(block, inputs[comm.rank])


def test_send_recv_ring(comm):
    n, r = comm.size, comm.rank
    if n == 1:
        pytest.skip("needs two ranks")
    data = rank_input(r, 4099, np.float32, seed=7)
    got = np.zeros(4099, np.float32)
    send = comm.isend(data, (r + 1) % n)
    recv = comm.irecv(got, (r - 1) % n)
    recv.wait()
    send.wait()
    assert np.array_equal(got, rank_input((r - 1) % n, 4099, np.float32, seed=7))
    # The same exchange, blocking, inside a group.
    got[:] = 0
    with qccl.group():
        comm.send(data, (r + 1) % n)
        comm.recv(got, (r - 1) % n)
    assert np.array_equal(got, rank_input((r - 1) % n, 4099, np.float32, seed=7))


def test_nonblocking_in_order(comm):
    arrays = [np.full(10000, comm.rank + k, np.float64) for k in range(6)]
    requests = [comm.all_reduce(a, async_op=True) for a in arrays]
    for request in reversed(requests):
        request.wait()
    assert all(request.is_completed() for request in requests)
    base = comm.size * (comm.size - 1) / 2
    for k, a in enumerate(arrays):
        assert np.all(a == base + k * comm.size)


def test_request_keeps_arrays_alive(comm):
    array = np.ones(1 << 16, np.float32)
    alive = weakref.ref(array)
    request = comm.all_reduce(array, async_op=True)
    del array  # the request's reference is now the only one
    assert alive() is not None
    request.wait()
    assert alive() is None  # released once the operation has completed


def test_group_keeps_arrays_until_its_end(comm):
    # qccl runs a group's calls at its end: the arrays of blocking calls and of requests dropped
    # inside it must live until then (they were freed first: the receiver got other bytes).
    n, r = comm.size, comm.rank
    if n == 1:
        pytest.skip("needs two ranks")
    count = 1 << 20
    got, dropped_got = np.zeros(count, np.float32), np.zeros(count, np.float32)
    with qccl.group():
        comm.send(np.full(count, r + 7.0, np.float32), (r + 1) % n)  # a temporary
        comm.recv(got, (r - 1) % n)
        comm.isend(np.full(count, r + 70.0, np.float32), (r + 1) % n)  # request dropped at once
        request = comm.irecv(dropped_got, (r - 1) % n)
        del request
        # Other arrays take the freed memory, if it was freed.
        scratch = [np.full(count, -1.0, np.float32) for _ in range(4)]
    assert np.all(got == (r - 1) % n + 7.0)
    assert np.all(dropped_got == (r - 1) % n + 70.0)  # the dropped request completed with the group
    assert all(np.all(s == -1.0) for s in scratch)
    with qccl.group():
        with pytest.raises(qccl.InvalidUsage, match="inside qccl.group"):
            comm.destroy()
    comm.barrier()  # still usable


def test_held_arrays_cannot_be_resized(comm):
    # A request, and a group until its end, holds the buffer export of the arrays it uses: a
    # bytearray or array.array resized meanwhile moved its memory away from under qccl, which then
    # read freed memory (a crash, for large arrays).
    import array
    n = comm.size
    b = bytearray(1 << 16)
    request = comm.all_reduce(b, "max", async_op=True)
    with pytest.raises(BufferError):
        b.extend(bytes(1 << 16))
    request.wait()
    b.extend(bytes(16))  # released once the operation has completed
    a = array.array("f", [1.0] * 1000)
    with qccl.group():
        comm.all_reduce(a)  # blocking, but run at the group's end
        with pytest.raises(BufferError):
            a.append(2.0)
    a.append(2.0)
    assert a[0] == n and a[999] == n and a[1000] == 2.0
    comm.all_reduce(b, "max")  # a blocking call's export ends with it
    b.extend(bytes(16))


def test_barrier(comm):
    # Rank 0 arrives late: no other rank may leave the barrier before it has arrived.
    comm.barrier()
    if comm.rank == 0:
        time.sleep(0.5)
    started = time.monotonic()
    comm.barrier()
    if comm.rank != 0:
        assert time.monotonic() - started >= 0.2


def test_split(comm):
    n, r = comm.size, comm.rank
    sub = comm.split(r % 2, key=-r)  # ranked by descending rank
    members = [q for q in range(n) if q % 2 == r % 2]
    assert sub.size == len(members)
    assert sub.rank == len(members) - 1 - members.index(r)
    x = np.array([r], np.int64)
    sub.all_reduce(x)
    assert x[0] == sum(members)
    sub.destroy()
    none = comm.split(None if r == 0 else 1)
    assert (none is None) == (r == 0)
    if none is not None:
        assert none.size == n - 1
        none.destroy()


def test_from_unique_id(comm):
    uid = np.zeros(qccl._qccl.UNIQUE_ID_BYTES, np.uint8)
    if comm.rank == 0:
        uid[:] = np.frombuffer(qccl.get_unique_id(), np.uint8)
    comm.broadcast(uid, 0)
    with qccl.Communicator.from_unique_id(uid.tobytes(), comm.rank, comm.size, timeout=30) as other:
        assert (other.rank, other.size) == (comm.rank, comm.size)
        x = np.ones(5, np.float32)
        other.all_reduce(x)
        assert np.all(x == comm.size)


def test_unique_id_from_an_address(comm):
    # Rank 0 finds a free loopback port and tells it; every rank makes the id itself.
    port = np.zeros(1, np.int32)
    if comm.rank == 0:
        import socket
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port[0] = s.getsockname()[1]
    comm.broadcast(port, 0)
    address = f"127.0.0.1:{int(port[0])}"
    uid = qccl.get_unique_id(address)
    first = np.frombuffer(uid, np.uint8).copy()
    comm.broadcast(first, 0)
    assert first.tobytes() == uid  # made alike, not copied
    with qccl.Communicator.from_unique_id(uid, comm.rank, comm.size, timeout=30) as other:
        x = np.ones(3, np.float32)
        other.all_reduce(x)
        assert np.all(x == comm.size)
    with pytest.raises(qccl.InvalidArgument, match="port 0 cannot be the root's port"):
        qccl.get_unique_id("127.0.0.1:0")
    with pytest.raises(qccl.InvalidArgument, match="address: 5 is not a str"):
        qccl.get_unique_id(5)
    with pytest.raises(qccl.InvalidArgument, match="is not a str without NUL"):
        qccl.get_unique_id(address + "\0junk")


def test_buffer_protocol_objects(comm):
    import array
    a = array.array("d", [1.0, 2.0])
    comm.all_reduce(a)
    assert list(a) == [comm.size, 2.0 * comm.size]
    b = bytearray([1, 2, 3])
    comm.all_reduce(b, "max")
    assert list(b) == [1, 2, 3]


def test_torch_tensors(comm):
    torch = pytest.importorskip("torch")
    n = comm.size
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.int64):
        inputs = [torch.from_numpy(rank_input(r, 999, np.float32)).to(dtype) if dtype.is_floating_point
                  else torch.from_numpy(rank_input(r, 999, np.int64)) for r in range(n)]
        mine = inputs[comm.rank].clone()
        comm.all_reduce(mine)
        exact = torch.stack([x.double() for x in inputs]).sum(0)
        eps = {torch.float32: 2 ** -24, torch.bfloat16: 2 ** -8, torch.float16: 2 ** -11, torch.int64: 0}[dtype]
        assert float((mine.double() - exact).abs().max()) <= 2 * n * eps * max(1.0, float(exact.abs().max()))
    # Subclasses of torch.Tensor are tensors (they were refused as "not an array").
    class Tagged(torch.Tensor):
        pass
    tagged = torch.ones(5).as_subclass(Tagged)
    comm.all_reduce(tagged)
    assert torch.all(tagged == n)
    # torch 2.3 added uint32 and uint64, qccl types that numpy arrays carry too (made and read through
    # byte views: torch's operators on them are few).
    for name, numpy_type in (("uint32", np.uint32), ("uint64", np.uint64)):
        if hasattr(torch, name):
            t = torch.from_numpy(np.full(7, comm.rank + 1, numpy_type).view(np.uint8)).view(getattr(torch, name))
            comm.all_reduce(t)
            assert np.all(t.view(torch.uint8).numpy().view(numpy_type) == n * (n + 1) // 2)
    # A view into a larger tensor is contiguous and used in place.
    big = torch.zeros(4, 10)
    big[2] = comm.rank + 1
    comm.all_reduce(big[2])
    assert torch.all(big[2] == n * (n + 1) / 2) and torch.all(big[0] == 0)
