"""qccl.torch: the "qccl" torch.distributed backend and the DDP communication hooks, on CPU
tensors, against gloo and against numpy references (run under qcclrun by python_torch_n*)."""

import gc
import os
import subprocess
import sys
import threading
import time
import warnings
from datetime import timedelta

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

import qccl  # noqa: E402
import qccl.torch as qt  # noqa: E402


@pytest.fixture(scope="module")
def world():
    """The default group on the qccl backend, and a gloo group over the same ranks."""
    rank, size = int(os.environ["QCCL_RANK"]), int(os.environ["QCCL_NRANKS"])
    port = int(os.environ["QCCL_ROOT"].rsplit(":", 1)[1]) + 1  # torch's store beside qcclrun's root
    dist.init_process_group("qccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
    gloo = dist.new_group(backend="gloo")
    yield rank, size, gloo
    dist.destroy_process_group()


def test_backend_is_qccl(world):
    assert dist.get_backend() == "qccl"
    assert isinstance(dist.distributed_c10d._get_default_group(), qt.ProcessGroupQccl)


def test_backend_collectives(world):
    rank, n, _ = world
    x = torch.arange(10, dtype=torch.float32) + rank
    dist.all_reduce(x)
    assert torch.equal(x, n * torch.arange(10, dtype=torch.float32) + n * (n - 1) / 2)
    y = torch.tensor([rank], dtype=torch.int64)
    dist.all_reduce(y, op=dist.ReduceOp.MAX)
    assert y.item() == n - 1
    b = torch.full((5,), float(rank))
    dist.broadcast(b, src=n - 1)
    assert torch.all(b == n - 1)
    r = torch.ones(3) * (rank + 1)
    dist.reduce(r, dst=0)
    if rank == 0:
        assert torch.all(r == n * (n + 1) / 2)
    gathered = [torch.zeros(2, 3) for _ in range(n)]
    dist.all_gather(gathered, torch.full((2, 3), float(rank)))
    assert all(torch.all(g == q) for q, g in enumerate(gathered))
    flat = torch.zeros(n * 4)
    dist.all_gather_into_tensor(flat, torch.full((4,), float(rank)))
    assert torch.equal(flat, torch.arange(n).repeat_interleave(4).float())
    out = torch.zeros(4)
    dist.reduce_scatter_tensor(out, torch.arange(n * 4, dtype=torch.float32))
    assert torch.equal(out, n * torch.arange(rank * 4, rank * 4 + 4, dtype=torch.float32))
    out = torch.zeros(2)
    dist.reduce_scatter(out, [torch.full((2,), float(q)) for q in range(n)])
    assert torch.all(out == n * rank)
    a2a = torch.zeros(n * 2)
    dist.all_to_all_single(a2a, torch.arange(n * 2, dtype=torch.float32) + 100 * rank)
    expected = torch.cat([torch.arange(rank * 2, rank * 2 + 2, dtype=torch.float32) + 100 * q for q in range(n)])
    assert torch.equal(a2a, expected)
    outs = [torch.zeros(3) for _ in range(n)]
    dist.all_to_all(outs, [torch.full((3,), float(rank * 10 + q)) for q in range(n)])
    assert all(torch.all(o == q * 10 + rank) for q, o in enumerate(outs))
    dist.barrier()


def test_backend_point_to_point_and_async(world):
    rank, n, _ = world
    if n > 1:
        got = torch.zeros(100)
        sends = dist.isend(torch.full((100,), float(rank)), (rank + 1) % n)
        dist.recv(got, (rank - 1) % n)
        sends.wait()
        assert torch.all(got == (rank - 1) % n)
    polled = dist.all_reduce(torch.ones(5000), async_op=True)
    while not polled.is_completed():  # a status query, never an exception
        pass
    polled.wait()
    assert torch.all(polled.result()[0] == n)
    # The list forms copy into their outputs after the call: done when is_completed() says so.
    gathered = [torch.zeros(3) for _ in range(n)]
    polled = dist.all_gather(gathered, torch.full((3,), float(rank + 1)), async_op=True)
    while not polled.is_completed():
        pass
    assert all(torch.all(g == q + 1) for q, g in enumerate(gathered))
    outs = [torch.zeros(2) for _ in range(n)]
    polled = dist.all_to_all(outs, [torch.full((2,), float(rank * 10 + q)) for q in range(n)], async_op=True)
    while not polled.is_completed():
        pass
    assert all(torch.all(o == q * 10 + rank) for q, o in enumerate(outs))
    polled.wait()
    # wait() after get_future() waits for the operation too (the completion thread holds the request).
    big = torch.ones(1 << 20)
    work = dist.all_reduce(big, async_op=True)
    future = work.get_future()
    work.wait()
    assert work.is_completed() and future.done() and torch.all(big == n)
    works = [dist.all_reduce(torch.ones(1000) * k, async_op=True) for k in range(4)]
    future = works[-1].get_future()
    for w in works[:-1]:
        w.wait()
    assert torch.all(future.wait()[0] == 3 * n)


def test_backend_codec_policy(world):
    rank, n, _ = world
    qt.set_codec("q8", min_bytes=1024)
    try:
        x = torch.from_numpy(np.random.default_rng(rank).uniform(-1, 1, 10_000).astype(np.float32))
        exact = sum(torch.from_numpy(np.random.default_rng(q).uniform(-1, 1, 10_000)) for q in range(n))
        dist.all_reduce(x)
        stats = dist.distributed_c10d._get_default_group().comm.last_stats()
        bound = 0.5 / 255 * n * (n + 1) + 1e-5 * n
        assert float((x.double() - exact).abs().max()) <= bound
        if n > 1:
            assert stats["codec"].startswith("q8:") and stats["compression_ratio"] > 3
        small = torch.ones(10)  # below min_bytes: exact
        dist.all_reduce(small)
        assert torch.all(small == n)
        # Error feedback on fresh temporaries: their states are recycled, never exhausting the budget
        # (a bound of 64 here, for speed), and said once.
        qt.set_codec("q8:ef=on", min_bytes=1024)
        pg = dist.distributed_c10d._get_default_group()
        pg._MAX_STATES = 64
        with pytest.warns(RuntimeWarning, match="error feedback .* restarts"):
            for _ in range(3 * pg._MAX_STATES):
                t = torch.ones(1000 + _)  # a new address and size every time
                dist.all_reduce(t)
                assert torch.allclose(t, torch.full_like(t, n), rtol=1e-2)
        assert len(pg._states) == pg._MAX_STATES
        del pg._MAX_STATES
        # A codec of another method on a tensor that has a state (IntSGD after quantization, also
        # with exact calls between them): its state starts afresh; one of the same name keeps it.
        bucket = torch.ones(4096)
        dist.all_reduce(bucket)
        kept = len(pg._states)
        qt.set_codec("q4:ef=on", min_bytes=1024)
        assert len(pg._states) == kept
        qt.set_codec(None)
        qt.set_codec("int8", min_bytes=1024)
        assert len(pg._states) == 0
        for _ in range(2):
            bucket = torch.ones(4096)
            dist.all_reduce(bucket, op=dist.ReduceOp.AVG)
            assert torch.allclose(bucket, torch.ones(4096), rtol=1e-2)
    finally:
        qt.set_codec(None)


def test_backend_codec_state_only_where_the_codec_keeps_one(world):
    # Every codec got a state per tensor address, whose step the ranks' calls must match: a rank that
    # all-reduced one tensor each step while another allocated a new one failed with Mismatch (and
    # the group broke), also under codecs that keep nothing (q8 without ef).
    rank, n, gloo = world
    group = dist.new_group(backend="qccl", timeout=timedelta(seconds=10))
    try:
        reused, kept = torch.empty(4096), []
        for spec in ("q8", "fp16", "q4:bucket=256,round=stochastic", "int8:alpha=8"):
            qt.set_codec(spec, min_bytes=0, group=group)
            for step in range(3):
                t = reused if rank == 0 else torch.empty(4096)
                kept.append(t)  # the other ranks' tensors: a new address each step
                t.fill_(1.0)
                dist.all_reduce(t, group=group)
                assert torch.allclose(t, torch.full_like(t, n), rtol=1e-2)
            assert len(group._states) == 0
        # A codec with a state keeps one per tensor (the same tensor on every rank here).
        qt.set_codec("q8:ef=on", min_bytes=0, group=group)
        dist.all_reduce(reused, group=group)
        assert len(group._states) == 1
    finally:
        dist.destroy_process_group(group)
    stateless = ("q8", "q4:bucket=256,round=stochastic", "fp16", "none", "q8:ef=off", "int8:alpha=8",
                 "int16:alpha=1e-3,round=nearest", "fft:theta=0.9", "fft:ef=off")
    stateful = ("q8:ef=on", "q4:bucket=256,ef=on", "none:ef=on", "fft:theta=0.9,ef=on", "sign:eta_s=0.01",
                "int8", "int16:alpha=grad", "int32:beta=0.5,alpha=lr")
    assert not any(qt.backend._needs_state(qccl.Codec(spec)) for spec in stateless)
    assert all(qt.backend._needs_state(qccl.Codec(spec)) for spec in stateful)


def test_backend_codec_states_outlast_a_model_of_many_tensors(world):
    # The states of 64 tensors were kept: 65 parameters all-reduced in turn each lost its state just
    # before its next use, so error feedback never ran, and nothing said so.
    rank, n, gloo = world
    group = dist.new_group(backend="qccl")
    try:
        qt.set_codec("q8:ef=on", min_bytes=0, group=group)
        params = [torch.ones(256) for _ in range(65)]
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for step in range(3):
                for p in params:
                    dist.all_reduce(p, group=group)
        assert len(group._states) == 65 and group._next_key == 66  # each made once, none erased
        # Beyond the bound the least recently used go, said once.
        group._MAX_STATES = 65
        others = [torch.ones(256) for _ in range(12)]
        with pytest.warns(RuntimeWarning, match="error feedback .* restarts") as record:
            for p in others:
                dist.all_reduce(p, group=group)
        assert len(group._states) == 65 and group._next_key == 66 + 12
        assert len([w for w in record if "restarts" in str(w.message)]) == 1
    finally:
        dist.destroy_process_group(group)


def _settled_counts(before=None):
    """This process's threads and open files, once no dropped group's destroy is still running."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if not any(t.name.startswith("qccl-pg-destroy") for t in threading.enumerate()):
            counts = threading.active_count(), len(os.listdir("/proc/self/fd"))
            if before is None or (counts[0] <= before[0] and counts[1] <= before[1]):
                return counts
        time.sleep(0.05)
    return threading.active_count(), len(os.listdir("/proc/self/fd"))


def test_backend_destroyed_group_frees_its_thread_and_communicator(world):
    # A destroyed group kept its completion thread and its communicator (its connections and
    # threads) for good: one more thread and some 14 files per new_group and destroy_process_group.
    rank, n, gloo = world

    def cycle():
        group = dist.new_group(backend="qccl")
        t = torch.ones(3)
        dist.all_reduce(t, group=group)
        future = dist.all_reduce(torch.ones(3), group=group, async_op=True).get_future()
        dist.all_reduce(torch.ones(3), group=group, async_op=True)  # a work nobody waits on
        dist.destroy_process_group(group)
        assert torch.all(future.wait()[0] == n)

    cycle()  # whatever the first group opens for good
    gc.collect()
    before = _settled_counts()
    for _ in range(4):
        cycle()
    gc.collect()
    assert _settled_counts(before) == before
    # The communicator that communicator_from_group handed out stays its holder's.
    group = dist.new_group(backend="qccl")
    comm = qt.communicator_from_group(group)
    dist.destroy_process_group(group)
    del group
    gc.collect()
    t = torch.ones(3)
    comm.all_reduce(t)
    assert torch.all(t == n)
    comm.destroy()


_EXIT_CHILD = r"""
import atexit, sys, time
import torch, torch.distributed as dist
import qccl.torch
rank, store, variant = int(sys.argv[1]), sys.argv[2], sys.argv[3]
if variant == "guard" and rank == 0:  # the extension's own protection, without closing the completer at exit
    atexit.unregister(qccl.torch._completion._close_all)
dist.init_process_group("qccl", init_method="file://" + store, rank=rank, world_size=2)
if rank == 1:
    time.sleep(2)  # rank 0 is exiting by then
t = torch.ones(1 << 16)
future = dist.all_reduce(t, async_op=True).get_future()  # completed by the completion thread
if rank == 1:
    assert torch.all(future.wait()[0] == 2)
else:
    time.sleep(0.5)  # the completion thread is waiting in qcclWait when the interpreter finalizes

class SlowExit:
    def __del__(self):
        time.sleep(3)  # keeps rank 0 in the interpreter's finalization while rank 1 arrives

slow = SlowExit()
"""


def test_backend_exit_with_a_future_in_flight(world, tmp_path):
    # A process that exited while its completion thread waited for a get_future() request was
    # aborted (SIGABRT, "terminate called without an active exception") when the request completed
    # during the interpreter's finalization, or left its peer's call to fail: the completers are
    # closed at exit now, and the extension lets a daemon thread end quietly there.
    rank, n, gloo = world
    try:
        if rank == 0:  # two processes of their own, the same for any rank count
            env = {k: v for k, v in os.environ.items() if not k.startswith("QCCL_")}
            env["QCCL_TIMEOUT"] = "30"
            for variant in ("closed at exit", "guard"):
                store = tmp_path / variant.replace(" ", "_")
                children = [subprocess.Popen([sys.executable, "-c", _EXIT_CHILD, str(r), str(store), variant], env=env,
                                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                            for r in range(2)]
                outputs = [child.communicate(timeout=120)[0] for child in children]
                codes = [child.returncode for child in children]
                if variant == "guard":  # rank 0 leaves its request to finalization: only its exit is judged
                    codes, outputs = codes[:1], outputs[:1]
                assert codes == [0] * len(codes), f"{variant}: exit statuses {codes}\n" + "\n".join(outputs)
    finally:
        dist.barrier(group=gloo)


def test_backend_all_gather_input_inside_the_output(world):
    # An input that is a block of the output other than this rank's was refused by qccl on this rank
    # only, while the others entered the collective (and the next call failed with Mismatch).
    rank, n, gloo = world
    k = 3
    group = dist.new_group(backend="qccl", timeout=timedelta(seconds=10))
    try:
        expected = torch.arange(1, n + 1, dtype=torch.float32).repeat_interleave(k)
        for owner in range(n):  # block `owner` on every rank: in place on one of them
            out = torch.zeros(n * k)
            out[owner * k:(owner + 1) * k] = rank + 1
            dist.all_gather_into_tensor(out, out[owner * k:(owner + 1) * k], group=group)
            assert torch.equal(out, expected)
        if n > 1:  # across two blocks
            out = torch.full((n * k,), float(rank + 1))
            dist.all_gather_into_tensor(out, out[1:k + 1], group=group)
            assert torch.equal(out, expected)
        dist.barrier(group=group)  # the communicator is intact
    finally:
        dist.destroy_process_group(group)


def test_backend_all_to_all_checks_its_lists(world):
    # Lists of another length than the ranks' dropped blocks or split the data elsewhere, and blocks
    # of another type were converted silently (torch.cat, copy_).
    rank, n, gloo = world
    with pytest.raises(ValueError, match=f"input_tensor_list: {n + 1} tensors; expected one per rank"):
        dist.all_to_all([torch.zeros(2) for _ in range(n + 1)], [torch.zeros(2) for _ in range(n + 1)])
    with pytest.raises(ValueError, match=f"output_tensor_list: {n + 1} tensors; expected one per rank"):
        dist.all_to_all([torch.zeros(2) for _ in range(n + 1)], [torch.zeros(2) for _ in range(n)])
    pg = dist.distributed_c10d._get_default_group()  # dist.all_to_all checks the types itself
    with pytest.raises(ValueError, match=r"output_tensor_list\[0\]: torch.int32, but input_tensor_list\[0\] is "
                                         r"torch.float32"):
        pg.alltoall([torch.zeros(2, dtype=torch.int32) for _ in range(n)], [torch.zeros(2) for _ in range(n)])
    with pytest.raises(ValueError, match=r"output_tensor_list\[0\]: 3 elements, but input_tensor_list\[0\] has 2"):
        dist.all_to_all([torch.zeros(3) for _ in range(n)], [torch.zeros(2) for _ in range(n)])
    outs = [torch.zeros(2) for _ in range(n)]  # nothing was sent: the communicator is intact
    dist.all_to_all(outs, [torch.full((2,), float(rank * 10 + q)) for q in range(n)])
    assert all(torch.all(o == q * 10 + rank) for q, o in enumerate(outs))


def make_model(seed=0):
    """2.4 MB of parameters: DDP's first bucket holds 1 MB, so its rebuilt buckets are several."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 512), torch.nn.ReLU(),
                               torch.nn.Linear(512, 10))


def ddp_gradients(model, group, rank, steps=1, hook_state=None, lr=0.0):
    """Gradients of a DDP copy of ``model`` after ``steps`` steps on rank-specific data."""
    ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=group, bucket_cap_mb=0.02)
    if hook_state is not None:
        ddp.register_comm_hook(hook_state, qt.allreduce_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(100 + rank)
    for _ in range(steps):
        opt.zero_grad()
        x, y = torch.randn(32, 64, generator=gen), torch.randint(0, 10, (32,), generator=gen)
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
    return [p.grad.clone() for p in ddp.parameters()]


def test_ddp_on_the_qccl_backend_equals_gloo(world):
    rank, n, gloo = world
    reference = ddp_gradients(make_model(), gloo, rank)
    on_qccl = ddp_gradients(make_model(), None, rank)
    for a, b in zip(reference, on_qccl):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-7)


def test_ddp_uncompressed_hook_equals_gloo(world):
    rank, n, gloo = world
    reference = ddp_gradients(make_model(), gloo, rank, steps=3, lr=0.1)
    state = qt.CommHookState(None, process_group=gloo)
    hooked = ddp_gradients(make_model(), gloo, rank, steps=3, lr=0.1, hook_state=state)
    for a, b in zip(reference, hooked):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-7)
    state.close()
    state.comm.destroy()


def local_gradients(model, rank):
    """The gradients of ``model`` on this rank's first batch, without DDP (what it all-reduces)."""
    gen = torch.Generator().manual_seed(100 + rank)
    x, y = torch.randn(32, 64, generator=gen), torch.randint(0, 10, (32,), generator=gen)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    return [p.grad for p in model.parameters()]


@pytest.mark.parametrize("codec,bits", [("q8:ef=on", 8), ("q4:ef=on", 4)])
def test_ddp_quantized_hook_within_bound(world, codec, bits):
    rank, n, gloo = world
    reference = ddp_gradients(make_model(), gloo, rank)
    state = qt.CommHookState(codec, process_group=gloo)
    hooked = ddp_gradients(make_model(), gloo, rank, hook_state=state)
    # Every input of the all-reduce is within M of zero, M the largest local gradient on any rank.
    m = torch.tensor([max(float(g.abs().max()) for g in local_gradients(make_model(), rank))])
    dist.all_reduce(m, op=dist.ReduceOp.MAX, group=gloo)
    # The average of n inputs: partial sums of k inputs re-encoded with half a step of k M / (2^b - 1)
    # over at most n hops (the ring; the scatter-reduce-allgather's bound is lower), divided by n.
    bound = float(m) * (n + 1) / (2 * (2 ** bits - 1)) * (1 + 1e-5) + 1e-7
    worst = max(float((a - b).abs().max()) for a, b in zip(reference, hooked))
    assert worst <= bound
    if n > 1:
        assert worst > 0  # the codec ran
    state.close()
    state.comm.destroy()


def test_ddp_hook_survives_bucket_rebuild_and_checkpoints(world):
    rank, n, gloo = world
    state = qt.CommHookState("q8:ef=on", process_group=gloo)
    ddp_gradients(make_model(), gloo, rank, steps=4, lr=0.05, hook_state=state)
    # DDP's first iteration has one bucket (in reverse parameter order); the rebuilt ones are several,
    # each with its own key, and the first iteration's key is erased.
    buckets = len(state._layouts)
    assert buckets >= 2 and len(state._keys) == buckets and not state._stale
    assert 1 not in state._layouts
    checkpoint = state.state_dict()
    assert isinstance(checkpoint["store"], bytes) and len(checkpoint["store"]) > 0
    state.load_state_dict(checkpoint)
    state.close()
    state.comm.destroy()


def test_ddp_marsit_and_intsgd_hooks(world):
    rank, n, gloo = world
    state = qt.CommHookState("sign:eta_s=0.001,k=0", process_group=gloo)
    grads = ddp_gradients(make_model(), gloo, rank, hook_state=state)
    values = torch.cat([g.reshape(-1) for g in grads]).unique()
    if n > 1:
        assert set(values.tolist()) <= {-0.0010000000474974513, 0.0010000000474974513}
    state.close()
    state.comm.destroy()
    # IntSGD's first round is an exact float all-reduce (no alpha0): the gradients are plain DDP's.
    reference = ddp_gradients(make_model(), gloo, rank)
    state = qt.CommHookState("int8", process_group=gloo)
    grads = ddp_gradients(make_model(), gloo, rank, hook_state=state)
    for a, b in zip(reference, grads):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-7)
    state.close()
    state.comm.destroy()


def test_backend_errors(world):
    rank, n, _ = world
    if n > 1:
        sizes = [2] + [1] * (n - 1)
        with pytest.raises(qccl.InvalidArgument, match="equal splits"):
            dist.all_to_all_single(torch.zeros(n + 1), torch.zeros(n + 1), output_split_sizes=sizes,
                                   input_split_sizes=sizes)
    with pytest.raises(qccl.InvalidArgument, match="not contiguous"):
        dist.all_reduce(torch.ones(4, 4).t())
    with pytest.raises(qccl.InvalidArgument, match="not the qccl backend"):
        qt.set_codec("q8", group=world[2])
    with pytest.raises(qccl.InvalidArgument, match="op: ReduceOp.BAND is not supported"):
        dist.all_reduce(torch.ones(4, dtype=torch.int32), op=dist.ReduceOp.BAND)


def test_backend_checks_lists_and_tags(world):
    # As gloo: a list that is not one tensor per rank of the input's type and shape (all_gather), or
    # blocks of another size than the output (reduce_scatter), raise; they dropped blocks, broadcast
    # them into the outputs or reduced other ranges. Tags other than 0 raise: qccl matches a peer's
    # messages in call order, and differently tagged ones landed in each other's tensors.
    rank, n, _ = world
    x = torch.full((2,), 1.5)
    cases = [([torch.zeros(2)] * (n + 1), f"tensor_list: {n + 1} tensors; expected one per rank"),
             ([torch.zeros(1, 2)] * n, r"tensor_list\[0\]: shape \(1, 2\), but tensor's is \(2,\)")]
    if n > 1:
        cases.append(([torch.zeros(2)] * (n - 1), f"tensor_list: {n - 1} tensors; expected one per rank"))
    for outputs, message in cases:
        with pytest.raises(ValueError, match=message):
            dist.all_gather(outputs, x)
    with pytest.raises(ValueError, match=r"tensor_list\[0\]: torch.int32, but tensor is torch.float32"):
        pg = dist.distributed_c10d._get_default_group()  # dist.all_gather checks the types itself
        pg.allgather([[torch.zeros(2, dtype=torch.int32)] * n], [x])
    blocks = [torch.ones(2) for _ in range(n)]
    blocks[-1] = torch.ones(3)
    if n > 1:
        blocks[0] = torch.ones(1)  # the total is right
    with pytest.raises(ValueError, match=f"input_list\\[{0 if n > 1 else n - 1}\\]: . elements, but output has 2"):
        dist.reduce_scatter(torch.zeros(2), blocks)
    with pytest.raises(ValueError, match=f"input_list: {n + 1} tensors; expected one per rank"):
        dist.reduce_scatter(torch.zeros(2), [torch.ones(2)] * (n + 1))
    if n > 1:
        for call in (lambda: dist.isend(x, (rank + 1) % n, tag=1), lambda: dist.irecv(x, (rank - 1) % n, tag=2),
                     lambda: dist.send(x, (rank + 1) % n, tag=3), lambda: dist.recv(x, (rank - 1) % n, tag=4)):
            with pytest.raises(qccl.InvalidArgument, match="tag=.; the qccl backend .* takes tag 0 only"):
                call()
    dist.barrier()  # nothing was sent: the communicator is intact
    gathered = [torch.zeros(2) for _ in range(n)]
    dist.all_gather(gathered, torch.full((2,), float(rank)))
    assert all(torch.all(g == q) for q, g in enumerate(gathered))


def test_backend_failed_work_raises_at_every_wait(world):
    # A failed work's error comes back at every wait(), and the list forms never copy the failed
    # call's scratch into their outputs (a second wait() returned True and copied it).
    rank, n, gloo = world
    if n == 1:
        pytest.skip("needs two ranks to mismatch")
    # A group of its own, which the mismatch breaks; of two ranks, so that neither learns of the
    # failure before it has made its call (which would raise then).
    group = dist.new_group(ranks=[0, 1], backend="qccl")
    try:
        if rank < 2:
            outputs = [torch.full((2 + rank,), -1.0) for _ in range(2)]
            work = dist.all_gather(outputs, torch.full((2 + rank,), 7.0), group=group, async_op=True)
            for _ in range(3):
                with pytest.raises(qccl.Mismatch):
                    work.wait()
            assert work.is_completed()
            with pytest.raises(qccl.Mismatch):
                work.get_future().wait()
            assert all(torch.all(o == -1.0) for o in outputs)
    finally:
        if rank < 2:
            group.comm.abort()
        dist.barrier(group=gloo)


def test_backend_timeout_is_qccl_s_unless_given(world):
    # torch passes its default timeout (30 minutes) when none is given: that one must leave the
    # communicator's to QCCL_TIMEOUT (it overrode it: a rank that stopped calling went unnoticed for
    # 30 minutes); a timeout given explicitly applies.
    rank, n, gloo = world
    if n == 1:
        pytest.skip("needs a rank that does not come")
    saved = os.environ["QCCL_TIMEOUT"]
    os.environ["QCCL_TIMEOUT"] = "2"
    try:
        default = dist.new_group(backend="qccl")
    finally:
        os.environ["QCCL_TIMEOUT"] = saved
    given = dist.new_group(backend="qccl", timeout=timedelta(seconds=2))
    for group in (default, given):
        try:
            if rank == 0:  # the others never come
                started = time.monotonic()
                work = dist.all_reduce(torch.ones(4), group=group, async_op=True)
                while not work.is_completed() and time.monotonic() - started < 30:
                    time.sleep(0.05)
                assert work.is_completed(), "still waiting after 30 s"
                with pytest.raises(qccl.Timeout):
                    work.wait()
        finally:
            dist.barrier(group=gloo)
            group.comm.abort()


def test_non_finite_gradients_pass_through_as_gloo_gives_them(world):
    """A NaN on one rank reaches every rank's gradients, as plain DDP's sum gives it, instead of an
    exception (GradScaler relies on seeing it)."""
    rank, n, gloo = world
    model = make_model()
    ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=gloo)
    state = qt.CommHookState("q8:ef=on", process_group=gloo)
    ddp.register_comm_hook(state, qt.allreduce_hook)
    x, y = torch.randn(4, 64), torch.randint(0, 10, (4,))
    scale = float("nan") if rank == 0 else 1.0
    (torch.nn.functional.cross_entropy(ddp(x), y) * scale).backward()
    assert all(torch.isnan(p.grad).any() for p in model.parameters())
    state.close()
    state.comm.destroy()
    qt.set_codec("q8")
    try:
        t = torch.ones(2048) * (float("nan") if rank == 0 else 1.0)
        dist.all_reduce(t)
        assert torch.isnan(t).all()
    finally:
        qt.set_codec(None)


def test_ddp_fft_hook(world):
    """The fft codec through the hook: keeping every bin (theta=1e-5: K = ceil((1 - theta) B) = B for
    the B < 100,000 bins of a segment; theta=0 itself runs the exact ring, and no fallback to it) at
    16 bits per part, the average comes back within the range floats' rounding."""
    rank, n, gloo = world
    if n == 1:
        pytest.skip("one rank encodes nothing")
    reference = ddp_gradients(make_model(), gloo, rank)
    state = qt.CommHookState("fft:theta=1e-5,bits=16,mant=10,max=auto,round=nearest,fallback=off",
                             process_group=gloo)
    grads = ddp_gradients(make_model(), gloo, rank, hook_state=state)
    # Each rank's spectrum parts are rounded to 10-bit mantissas (relative error <= 2^-11) and the
    # orthonormal FFT keeps norms, so the average's error norm is at most 2^-11 times the mean of the
    # ranks' gradient norms (over every bucket at once, by Minkowski), plus float32 rounding.
    local = torch.cat([g.reshape(-1) for g in local_gradients(make_model(), rank)])
    norms = torch.tensor([float(local.norm())], dtype=torch.float64)
    dist.all_reduce(norms, group=gloo)
    exact = torch.cat([a.reshape(-1) for a in reference])
    error = float((exact - torch.cat([b.reshape(-1) for b in grads])).norm())
    assert error <= 2.0 ** -11 * float(norms) / n + 1e-5 * float(exact.norm()) + 1e-7
    assert error > 0  # the codec ran (no fallback)
    state.close()
    state.comm.destroy()


class FakeBucket:
    def __init__(self, index, params, last):
        self._index, self._params, self._last = index, params, last
        self._buffer = torch.cat([p.reshape(-1) for p in params])

    def buffer(self):
        return self._buffer

    def index(self):
        return self._index

    def parameters(self):
        return self._params

    def is_last(self):
        return self._last


def test_hook_keys_follow_buckets_and_are_never_reused(world):
    rank, n, gloo = world
    state = qt.CommHookState("q8:ef=on", process_group=gloo)
    a, b, c = (torch.zeros(4) for _ in range(3))

    def iteration(*buckets):
        keys = []
        for i, params in enumerate(buckets):
            bucket = FakeBucket(i, params, i == len(buckets) - 1)
            keys.append(state.key_for(bucket))
            state.store.get(keys[-1], 4)
        state._end_iteration()
        return keys

    assert iteration([a, b, c]) == [1]          # DDP's first iteration: one bucket
    assert iteration([c], [a, b]) == [2, 3]     # rebuilt: new keys; key 1 erased at the end
    with pytest.raises(qccl.InvalidArgument):
        state.store.erase(1)
    assert iteration([c], [b, a]) == [2, 4]     # a new bucket after an erase: a fresh key, not 3 again
    with pytest.raises(qccl.InvalidArgument):
        state.store.erase(3)
    # A resumed process: other tensors (other addresses) of the same sizes. Its rebuilt buckets take
    # the checkpoint's keys, and so their states; its first iteration's bucket a fresh key.
    checkpoint = state.state_dict()
    state.close()
    resumed = qt.CommHookState("q8:ef=on", comm=state.comm)
    resumed.load_state_dict(checkpoint)
    a, b, c = (torch.zeros(4) for _ in range(3))
    state = resumed
    assert iteration([a, b, c]) == [5]
    assert iteration([c], [b, a]) == [2, 4]
    assert checkpoint["store"] == resumed.store.save()  # the states used are the checkpoint's, untouched
    resumed.close()
    resumed.comm.destroy()


def test_hook_checkpoint_follows_the_parameters_order(world):
    # DDP's first iteration and its rebuilt one can have a bucket of the same index and sizes whose
    # parameters come in another order: a resumed process's first bucket must not take the rebuilt
    # one's residual (it would add it to other parameters), and the rebuilt one must get it.
    rank, n, gloo = world
    comm = qt.communicator_from_group(gloo)
    state = qt.CommHookState("q8:ef=on", comm=comm)
    a, b, c = (torch.zeros(4) for _ in range(3))
    assert state.key_for(FakeBucket(0, [a, b, c], True)) == 1
    state.store.get(1, 12)
    state._end_iteration()
    assert state.key_for(FakeBucket(0, [a, c, b], True)) == 2
    state.store.get(2, 12)
    state._end_iteration()
    checkpoint = state.state_dict()
    state.close()
    resumed = qt.CommHookState("q8:ef=on", comm=comm)
    resumed.load_state_dict(checkpoint)
    a, b, c = (torch.zeros(4) for _ in range(3))
    assert resumed.key_for(FakeBucket(0, [a, b, c], True)) == 3
    assert resumed.key_for(FakeBucket(0, [a, c, b], True)) == 2
    resumed.close()
    # An older qccl's checkpoint named buckets by index and sizes: its states are dropped, with a
    # warning, not kept for ever in the store's budget.
    older = dict(checkpoint, buckets={2: (0, (4, 4, 4))})
    again = qt.CommHookState("q8:ef=on", comm=comm)
    with pytest.warns(UserWarning, match="bucket 2 is of an older format"):
        again.load_state_dict(older)
    with pytest.raises(qccl.InvalidArgument):
        again.store.erase(2)
    again.close()
    comm.destroy()


def test_hook_refuses_a_checkpoint_of_another_method(world):
    # A q8:ef=on checkpoint loaded into an int8 state was accepted, and the first backward failed.
    rank, n, gloo = world
    comm = qt.communicator_from_group(gloo)
    state = qt.CommHookState("q8:ef=on", comm=comm)
    state.key_for(FakeBucket(0, [torch.zeros(4)], True))
    state.store.get(1, 4)
    checkpoint = state.state_dict()
    state.close()
    for codec in ("int8", "sign:eta_s=0.01", None):
        other = qt.CommHookState(codec, comm=comm)
        with pytest.raises(qccl.InvalidArgument, match="a checkpoint of codec 'q8:ef=on', another method's"):
            other.load_state_dict(checkpoint)
        with pytest.raises(qccl.InvalidArgument):
            other.store.erase(1)  # nothing loaded
        other.close()
    same = qt.CommHookState("q4:ef=on", comm=comm)  # quantization too: its states continue
    same.load_state_dict(checkpoint)
    same.store.erase(1)
    same.close()
    comm.destroy()


def test_hook_keys_of_buckets_with_empty_parameters(world):
    # Parameters without values share the address 0: two buckets that hold one each did not overlap,
    # but their ordinals did, so each erased the other's state every iteration.
    rank, n, gloo = world
    state = qt.CommHookState("q8:ef=on", process_group=gloo)
    a, b, empty1, empty2 = torch.zeros(4), torch.zeros(4), torch.zeros(0), torch.zeros(0)
    for step in range(3):
        assert state.key_for(FakeBucket(0, [a, empty1], False)) == 1
        assert state.key_for(FakeBucket(1, [empty2, b], True)) == 2
        state.store.get(1, 4), state.store.get(2, 4)
        state._end_iteration()
    state.close()
    state.comm.destroy()


def test_hook_state_shared_by_two_models(world):
    # Two DDP models on one state: each one's last bucket ends an iteration, and neither erases the
    # other's keys (their states would restart every step).
    rank, n, gloo = world
    state = qt.CommHookState("q8:ef=on", process_group=gloo)
    generator, discriminator = [torch.zeros(4), torch.zeros(4)], [torch.zeros(4)]
    for step in range(3):
        for model in (generator, discriminator):
            for i, p in enumerate(model):
                state.all_reduce(FakeBucket(i, [p], i == len(model) - 1)).wait()
    assert sorted(state._layouts) == [1, 2, 3]
    for key in (1, 2, 3):
        state.store.erase(key)  # all still there
    state.close()
    state.comm.destroy()
