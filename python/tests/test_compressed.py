"""Compressed collectives, codec states and AQ-SGD's delta store from Python: within the codecs'
proven bounds (include/qccl.h and the algorithms' headers), identical bits on every rank, and the
statistics and checkpoints the C API gives."""

import numpy as np
import pytest

import qccl
from conftest import agree, rank_input


def quantization_half_steps(x, bits, bucket=512):
    """Per value, half the step of its bucket under a q<bits> codec: (max - min) / (2^bits - 1) / 2."""
    x = np.asarray(x, np.float64)
    pad = (-x.size) % bucket
    blocks = np.concatenate([x, np.full(pad, x[-1])]).reshape(-1, bucket)
    half = (blocks.max(1) - blocks.min(1)) / (2 ** bits - 1) / 2
    return np.repeat(half, bucket)[:x.size]


@pytest.mark.parametrize("spec,bits", [("q8", 8), ("q4", 4), ("q2", 2)])
@pytest.mark.parametrize("op", ["sum", "avg"])
def test_all_reduce_compressed_within_bound(comm, spec, bits, op):
    n, count = comm.size, 100_003
    inputs = [rank_input(r, count, np.float32, seed=11) for r in range(n)]
    out = np.zeros(count, np.float32)
    comm.all_reduce(inputs[comm.rank], op, out=out, codec=spec)
    exact = np.sum(np.asarray(inputs, np.float64), axis=0)
    # Inputs in [-1, 1]: a partial sum of k inputs is re-encoded at most once per hop with a half step
    # of k / (2^b - 1); summed over the hops, n (n + 1) / 2 of them (the ring's worst case, which
    # bounds the scatter-reduce-allgather's too), plus float32 rounding.
    bound = 0.5 / (2 ** bits - 1) * n * (n + 1) + 1e-5 * n
    if op == "avg":
        exact, bound = exact / n, bound / n + 1e-6
    stats = comm.last_stats()  # before agree(), whose all-gather is the next "last" call
    error = np.abs(out - exact)
    assert error.max() <= bound
    assert agree(comm, out)
    if n > 1:
        assert stats["codec"].startswith(spec)
        # b bits per value plus 8 bytes per 512-value bucket, against 32 bits.
        assert stats["compression_ratio"] == pytest.approx(32 / (bits + 64 / 512), rel=0.02)
        assert error.max() > 0  # the codec ran: q codecs lose something on uniform inputs


def test_error_feedback_state_and_checkpoint(comm):
    n, count = comm.size, 4099
    state = comm.codec_state(count)
    grads = [rank_input(r, count, np.float32, seed=5) for r in range(n)]
    out = np.zeros(count, np.float32)
    # Error feedback (ef=on) conserves what it does not send: over T steps of the same input, the sum
    # of the outputs misses T times the exact average by the final residuals only (every encode's
    # error re-enters the next step; collectives/compressed.h), while without it nearest rounding
    # repeats the same error T times. So at T = 8 the sum's error must stay within two single errors'
    # worth (the final residual; measured: 0.17-0.18 of the error without feedback).
    steps = 8
    total, total_without = np.zeros(count), np.zeros(count)
    for _ in range(steps):
        comm.all_reduce(grads[comm.rank], "avg", out=out, codec="q2:ef=on", state=state)
        total += out
        comm.all_reduce(grads[comm.rank], "avg", out=out, codec="q2")
        total_without += out
    exact = np.mean(np.asarray(grads, np.float64), axis=0)
    with_ef = np.linalg.norm(total - steps * exact)
    without_ef = np.linalg.norm(total_without - steps * exact)
    assert with_ef <= without_ef / 4 or n == 1  # one rank encodes nothing: both are exact
    checkpoint = state.save()
    assert isinstance(checkpoint, bytes) and len(checkpoint) >= 4 * count  # the float32 residual at least
    restored = comm.codec_state(count)
    restored.load(checkpoint)
    a, b = np.zeros(count, np.float32), np.zeros(count, np.float32)
    comm.all_reduce(grads[comm.rank], "avg", out=a, codec="q2:ef=on", state=state)
    comm.all_reduce(grads[comm.rank], "avg", out=b, codec="q2:ef=on", state=restored)
    assert np.array_equal(a, b) or n == 1  # the same residual and step: the same bits
    with pytest.raises(qccl.InvalidArgument):
        comm.codec_state(count + 1).load(checkpoint)
    with pytest.raises(qccl.InvalidArgument):
        comm.all_reduce(grads[comm.rank], "avg", out=out, codec="q8:ef=on")  # ef needs a state


def test_codec_store_by_key(comm):
    store = comm.codec_store()
    s1, s2 = store.get(1, 1000), store.get(2, 500)
    x, y = np.ones(1000, np.float32), np.ones(500, np.float32)
    comm.all_reduce(x, "avg", codec="q8:ef=on", state=s1)
    comm.all_reduce(y, "avg", codec="q8:ef=on", state=s2)
    assert np.allclose(x, 1, atol=1e-2) and np.allclose(y, 1, atol=1e-2)
    with pytest.raises(qccl.InvalidArgument):
        store.get(1, 999)  # key 1 holds 1000 values
    checkpoint = store.save()
    store.erase(2)
    with pytest.raises(qccl.InvalidArgument):
        store.erase(2)
    store.load(checkpoint)
    store.get(2, 500)


def test_marsit_and_intsgd(comm):
    n, count = comm.size, 20_000
    u = rank_input(comm.rank, count, np.float32, seed=9)
    state = comm.codec_state(count)
    out = np.zeros(count, np.float32)
    comm.all_reduce(u, "avg", out=out, codec="sign:eta_s=0.01,k=0", state=state)  # k=0: every round a sign round
    eta = np.float32(0.01)
    assert set(np.unique(out).tolist()) <= {-eta, eta} or n == 1
    assert agree(comm, out)
    # IntSGD with a fixed alpha: each value within 1/alpha of the average, identical bits everywhere.
    alpha = 1000.0
    comm.all_reduce(u, "avg", out=out, codec=f"int32:alpha={alpha:g},round=nearest")
    exact = np.mean([rank_input(r, count, np.float32, seed=9) for r in range(n)], axis=0, dtype=np.float64)
    assert np.abs(out - exact).max() <= 0.5 / alpha + 1e-6 or n == 1
    assert agree(comm, out)


def test_all_gather_and_reduce_scatter_compressed(comm):
    n, count = comm.size, 3001
    inputs = [rank_input(r, count, np.float32, seed=13) for r in range(n)]
    out = np.zeros(count * n, np.float32)
    comm.all_gather(out, inputs[comm.rank], codec="q4")
    for r in range(n):
        block = out[r * count:(r + 1) * count]
        assert np.all(np.abs(block - inputs[r]) <= quantization_half_steps(inputs[r], 4) * (1 + 1e-6) + 1e-7)
    assert agree(comm, out)
    # Segments: the first 1000 values exactly, the rest through the codec.
    comm.all_gather(out, inputs[comm.rank], codec="q4", segments=[(1000, True), (count - 1000, False)])
    for r in range(n):
        assert np.array_equal(out[r * count:r * count + 1000], inputs[r][:1000])
    rs_inputs = [rank_input(r, count * n, np.float32, seed=17) for r in range(n)]
    block = np.zeros(count, np.float32)
    comm.reduce_scatter(block, rs_inputs[comm.rank], "sum", codec="q8")
    mine = slice(comm.rank * count, (comm.rank + 1) * count)
    exact = np.sum([x[mine].astype(np.float64) for x in rs_inputs], axis=0)
    bound = sum(quantization_half_steps(rs_inputs[r][mine], 8) for r in range(n) if r != comm.rank)
    assert np.all(np.abs(block - exact) <= bound * (1 + 1e-6) + 1e-5 * n)


def test_send_recv_compressed(comm):
    if comm.size == 1:
        pytest.skip("needs two ranks")
    if comm.rank > 1:
        return
    rows, channels = 64, 100
    x = rank_input(0, rows * channels, np.float32, seed=21)
    if comm.rank == 0:
        comm.send(x, 1, codec=f"aq4:channels={channels}")
    else:
        got = np.zeros_like(x)
        comm.recv(got, 0, codec=f"aq4:channels={channels}")
        # aq4, nearest: within s / 2^4 per channel, and s / 2^3 + 2^-11 m at the top of the grid.
        s = np.abs(x.reshape(rows, channels)).max(0)
        bound = np.tile(s / 8 + 2.0 ** -11 * s, rows) + 1e-7
        assert np.all(np.abs(got - x) <= bound)
        assert comm.last_stats()["wire_bytes_received"] < x.nbytes / 6


@pytest.mark.parametrize("in_file", [False, True])
def test_delta_send_recv(comm, in_file, tmp_path):
    if comm.size == 1:
        pytest.skip("needs two ranks")
    if comm.rank > 1:
        return
    rows, width = 8, 256
    # with in_file, the receiver keeps its rows in a file (the file tier); the messages are the same
    path = tmp_path / f"rows{comm.rank}"
    store = qccl.DeltaStore(f"aq4:channels={width}", width, "float16", id=7,
                            file=str(path) if in_file and comm.rank == 1 else None)
    assert not path.exists()  # the file tier's file has no name: nothing outlives the store
    keys = list(range(100, 100 + rows))
    rng = np.random.default_rng(3)
    base = rng.standard_normal((rows, width)).astype(np.float32)
    got = np.zeros_like(base)
    for epoch in range(3):
        x = base + 0.01 * epoch  # a sample's activations change little between epochs
        if comm.rank == 0:
            comm.delta_send(x, keys, store, 1)
        else:
            comm.delta_recv(got, keys, store, 0)
            if epoch == 0:  # first sight: sent whole, in the store's float16
                assert np.array_equal(got, x.astype(np.float16).astype(np.float32))
            else:  # m += Q(x - m): within the delta's quantization step of x, plus float16 rounding
                assert np.abs(got - x).max() <= 0.02 / 8 + 2.0 ** -10 * np.abs(x).max()
        info = store.info()
        assert info["keys"] == rows
        assert info["last_full_rows"] == (rows if epoch == 0 else 0)
    with pytest.raises(qccl.InvalidArgument):
        comm.delta_send(np.zeros((rows, width + 1), np.float32), keys, store, 1)  # the row size is the store's
    with pytest.raises(qccl.InvalidUsage):
        store._store.set_file(str(path))  # it holds keys: its rows stay where they are
    with pytest.raises(qccl.SystemFailure, match="nonexistent"):
        qccl.DeltaStore(f"aq4:channels={width}", width, file=str(tmp_path / "nonexistent" / "rows"))
    kept = tmp_path / f"kept{comm.rank}"
    kept.write_text("a user's data")
    with pytest.raises(qccl.SystemFailure, match="exists"):
        qccl.DeltaStore(f"aq4:channels={width}", width, file=str(kept))
    assert kept.read_text() == "a user's data"  # an existing file is never truncated or removed


def test_delta_send_recv_async(comm):
    """Non-blocking delta calls on one store, waited for last first, give the blocking calls' bits."""
    if comm.size == 1:
        pytest.skip("needs two ranks")
    if comm.rank > 1:
        return
    rows, width, epochs = 4, 128, 4
    spec = f"aq3:channels={width},round=stochastic,seed=2"
    blocking, nonblocking = (qccl.DeltaStore(spec, width, "float16", id=8) for _ in range(2))
    keys = list(range(rows))
    base = np.random.default_rng(4).standard_normal((rows, width)).astype(np.float32)
    inputs = [base + 0.02 * e for e in range(epochs)]
    want = [np.zeros_like(base) for _ in range(epochs)]
    got = [np.full_like(base, -1.0) for _ in range(epochs)]
    for e in range(epochs):
        if comm.rank == 0:
            comm.delta_send(inputs[e], keys, blocking, 1)
        else:
            comm.delta_recv(want[e], keys, blocking, 0)
    if comm.rank == 0:
        requests = [comm.delta_send(inputs[e], keys, nonblocking, 1, async_op=True) for e in range(epochs)]
    else:
        requests = [comm.delta_recv(got[e], keys, nonblocking, 0, async_op=True) for e in range(epochs)]
    for r in reversed(requests):
        r.wait()
    assert nonblocking.info()["sequence"] == epochs
    assert nonblocking.save() == blocking.save()
    if comm.rank == 1:
        for e in range(epochs):
            assert np.array_equal(got[e], want[e])


def test_delta_both_directions_in_a_group(comm):
    """A stage's activations forward and the next stage's deltas back, each end in its own order,
    inside one qccl.group(): no deadlock, and each arrives within its codec's reach."""
    if comm.size == 1:
        pytest.skip("needs two ranks")
    if comm.rank > 1:
        return
    rows, width = 4, 64
    spec = f"aq4:channels={width}"
    forward, backward = qccl.DeltaStore(spec, width, id=1), qccl.DeltaStore(spec, width, id=2)
    keys = [10, 11, 12, 13]
    mine = np.random.default_rng(comm.rank).standard_normal((rows, width)).astype(np.float32)
    theirs = np.random.default_rng(1 - comm.rank).standard_normal((rows, width)).astype(np.float32)
    for step in range(3):
        got = np.zeros_like(mine)
        sent = mine + 0.01 * step
        with qccl.group():
            if comm.rank == 0:
                comm.delta_send(sent, keys, forward, 1)
                comm.delta_recv(got, keys, backward, 1)
            else:
                comm.delta_recv(got, keys, forward, 0)
                comm.delta_send(sent, keys, backward, 0)
        want = theirs + 0.01 * step
        if step == 0:  # whole rows, in the stores' float16
            assert np.array_equal(got, want.astype(np.float16).astype(np.float32))
        else:  # within a 4-bit step of the change's largest magnitude, plus float16 rounding of m
            assert np.abs(got - want).max() <= 0.02 / 8 + 2.0 ** -10 * np.abs(want).max()


def test_delta_store_low_bits(comm):
    if comm.size == 1:
        pytest.skip("needs two ranks")
    if comm.rank > 1:
        return
    tokens, width = 16, 64  # a key's row: 16 tokens of 64 channels
    store = qccl.DeltaStore(f"aq4:channels={width}", tokens * width, id=3, store_bits=4)
    rng = np.random.default_rng(8)
    x = rng.standard_normal((2, tokens * width)).astype(np.float32)
    got = np.zeros_like(x)
    for epoch in range(2):
        if comm.rank == 0:
            comm.delta_send(x + 0.01 * epoch, [5, 6], store, 1)
        else:
            comm.delta_recv(got, [5, 6], store, 0)
    # m as 4-bit codes and a float16 scale per channel: 2 keys x (16 x 64 / 2 + 64 x 2) bytes
    assert store.info()["bytes"] == 2 * (tokens * width // 2 + width * 2)
    if comm.rank == 1:
        # m (4-bit, nearest) errs by at most max|x| / 8 per channel, so the delta x + 0.01 - m spans at
        # most s = max|x| / 8 + 0.01, and its 4-bit code errs by s / 8 (+ the scale's float16 rounding)
        s = np.abs(x).max() / 8 + 0.01 + 1e-3
        assert np.abs(got - (x + 0.01)).max() <= s / 8 * (1 + 2.0 ** -11) + 1e-6
    with pytest.raises(qccl.InvalidArgument):
        qccl.DeltaStore(f"aq4:channels={width}", width, store_bits=1)


def test_learned_levels(comm):
    data = rank_input(0, 1 << 14, np.float32, seed=2) ** 3  # peaked near 0
    learned = comm.learn_levels("q3", data if comm.rank == 0 else None, epochs=3, root=0)
    assert learned.spec.startswith("q3:") and ",levels=0/" in learned.spec
    x = np.array(data)
    comm.all_reduce(x, "avg", codec=learned)
    assert agree(comm, x)
    # Its spec reads back as the same codec (a hook's state_dict saves it): the same bits.
    y = np.array(data)
    comm.all_reduce(y, "avg", codec=qccl.Codec(learned.spec))
    assert np.array_equal(x, y)


def test_codec_parsing():
    assert qccl.Codec("q8").spec == "q8"
    with pytest.raises(qccl.InvalidArgument, match="q9"):
        qccl.Codec("q9")
    with pytest.raises(qccl.InvalidArgument, match="bogus"):
        qccl.Codec("q8:bogus=1")
