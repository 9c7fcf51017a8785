"""A torch.distributed backend named "qccl", for CPU tensors.

    import qccl.torch                              # registers the backend
    dist.init_process_group("qccl")                # torchrun, or MASTER_ADDR/PORT, RANK, WORLD_SIZE
    qccl.torch.set_codec("q8", min_bytes=1 << 20)  # optional: compress large float all-reduces

Every collective of torch.distributed that a Python process group can serve runs on a qccl
communicator: all_reduce, broadcast, reduce, all_gather, all_gather_into_tensor, reduce_scatter,
reduce_scatter_tensor, all_to_all, all_to_all_single (equal splits), barrier, send and recv.
(torch 1.13 does not route gather and scatter to Python process groups: they raise there.)  The
ranks' unique id travels through the store that init_process_group made.  A codec set with
:func:`set_codec` compresses the group's all_reduce calls on float32/float16/bfloat16 tensors of at
least ``min_bytes`` (op SUM or AVG; ``sign``, Marsit, estimates the average update and raises on SUM,
so DDP, which sums, takes it through the communication hook, qccl.torch.hooks).  A codec that keeps
a state (``ef=on``, ``sign``, int8 .. int32 with an adaptive alpha) keeps one per tensor, by address
and size (the 1024 most recently used; a codec of another method starts them afresh: q4 after q8
keeps them, int8 after q8 does not), so every rank must all-reduce its tensors at matching
addresses (see :func:`set_codec`); the others keep none.  Errors are qccl's exceptions; a failed work
raises its error at every wait() and leaves the outputs of the list forms untouched.

send and recv take tag 0 only: qccl matches a peer's messages in call order, and another tag raises
InvalidArgument.  The communicator's timeout is the one given to init_process_group (or new_group)
when it differs from torch's default (30 minutes, which torch passes when none is given); else
QCCL_TIMEOUT, or qccl's default (300 s).  A group that torch drops (destroy_process_group, and the
last reference gone) ends its completion thread and destroys its communicator, in the background
(see _Resources).
"""

from __future__ import annotations

import atexit
import threading
import warnings
import weakref
from collections import OrderedDict
from datetime import timedelta
from typing import Any, List, Optional

import torch
import torch.distributed as dist

import qccl
from qccl.codec import as_codec

from ._completion import Completer

_ProcessGroup = torch._C._distributed_c10d.ProcessGroup
_Work = torch._C._distributed_c10d.Work
_CODEC_TYPES = (torch.float32, torch.float16, torch.bfloat16)
# What init_process_group and new_group pass when the user gave no timeout.
_TORCH_DEFAULT_TIMEOUT = getattr(getattr(dist, "constants", None), "default_pg_timeout", timedelta(minutes=30))


def _op(op: Any) -> str:
    for name in ("SUM", "PRODUCT", "MAX", "MIN", "AVG", "BAND", "BOR", "BXOR", "PREMUL_SUM"):
        if hasattr(dist.ReduceOp, name) and op == getattr(dist.ReduceOp, name):
            if name in ("BAND", "BOR", "BXOR", "PREMUL_SUM"):
                op = f"ReduceOp.{name}"
                break
            return {"PRODUCT": "prod"}.get(name, name.lower())
    raise qccl.InvalidArgument(f"op: {op} is not supported by the qccl backend (SUM, PRODUCT, MAX, MIN, AVG)")


class _QcclWork(_Work):
    """A torch Work over qccl requests (None: already complete).

    C++ callers (DDP's reducer, its parameter checks) reach wait() and get_future() through torch's
    trampoline, which finds these Python overrides only while the Python object lives; torch 1.13
    keeps just the C++ part, so without a reference the call would fall through to the base
    Work::wait, which waits forever. The process group holds each work until one of the two is
    called (or, for works nobody waits on, until it has completed and many newer ones exist)."""

    def __init__(self, pg: "ProcessGroupQccl", requests: List[Any], result: List[torch.Tensor], after=None):
        super().__init__()
        # The group's _Resources, not the group: a work held by the group that referenced it made a
        # cycle, which kept a dropped group (and its communicator) until the garbage collector ran.
        self._resources, self._requests, self._result, self._after = pg._resources, requests, result, after
        self._future: Optional[torch.futures.Future] = None
        # The failure, kept: every wait() raises it, as qccl's Request does (a wait that returned
        # after one had raised would hand out outputs that the call never wrote).
        self._error: Optional[qccl.QcclError] = None
        self._resources.hold(self)

    def wait(self, timeout: Optional[timedelta] = None) -> bool:
        self._resources.release(self)
        if self._future is not None:  # get_future handed the request to the completion thread
            self._future.wait()
            return True
        self._complete()
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        if self._future is not None:
            return self._future.done()
        for request in self._requests:
            try:
                if request is not None and not request.is_completed():
                    return False
            except qccl.QcclError:  # completed, failed: _complete keeps it for wait()
                pass
        self._complete()  # the outputs, before saying so
        return True

    def _complete(self) -> None:
        """Waits for the requests, then copies the results into the outputs, only when all succeeded."""
        for request in self._requests:
            if request is not None:
                try:
                    request.wait()
                except qccl.NonFinite:
                    pass  # completed, NaN/Inf where an input held one, as gloo's sum gives them
                except qccl.QcclError as e:
                    self._error = self._error or e
        self._requests = []
        after, self._after = self._after, None
        if after is not None and self._error is None:
            after()

    def result(self) -> List[torch.Tensor]:
        return self._result

    def get_future(self) -> torch.futures.Future:
        self._resources.release(self)
        if self._future is None:
            if self._after is not None or len(self._requests) > 1 or self._error is not None:
                self._complete()  # rare: complete it here, a failure into the future
                self._future = torch.futures.Future()
                if self._error is not None:
                    self._future.set_exception(self._error)
                else:
                    self._future.set_result(self._result)
            else:
                self._future = self._resources.completer.future(self._requests[0] if self._requests else None,
                                                          self._result)
            self._requests = []
        return self._future


class ProcessGroupQccl(_ProcessGroup):
    """torch.distributed's process group on a qccl communicator (``self.comm``)."""

    def __init__(self, store: Any, rank: int, size: int, timeout: timedelta):
        super().__init__(rank, size)
        if rank == 0:
            store.set("qccl/unique_id", qccl.get_unique_id())
        unique_id = store.get("qccl/unique_id")
        self.comm = qccl.Communicator.from_unique_id(unique_id, rank, size, timeout=_timeout_seconds(timeout))
        self.codec: Optional[qccl.Codec] = None
        self.min_bytes = 0
        self._codec_state = False  # whether self.codec keeps a state per tensor (_needs_state)
        self._store = None
        self._states: "OrderedDict[tuple, tuple]" = OrderedDict()  # tensor -> (store key, state), LRU first
        self._states_method = ""  # the method of the codecs whose states those are
        self._next_key = 1
        self._evicted = False  # a state was evicted (warned once)
        self._resources = _Resources(self.comm, Completer(f"qccl-pg-{rank}"))
        # torch drops a destroyed group (destroy_process_group) without telling it: the teardown runs
        # when the group is freed, not at exit (where the completers close by themselves).
        weakref.finalize(self, self._resources.close).atexit = False

    def getBackendName(self) -> str:
        return "qccl"

    def set_codec(self, codec: "str | qccl.Codec | None", min_bytes: int = 0) -> None:
        codec = as_codec(codec)
        # A state belongs to one method (quantization, Marsit, IntSGD, fft): a codec of another
        # method starts every tensor's state afresh.
        if codec is not None and _method(codec) != self._states_method:
            for key, _ in self._states.values():
                self._store.erase(key)
            self._states.clear()
            self._states_method = _method(codec)
        self.codec, self.min_bytes = codec, min_bytes
        self._codec_state = codec is not None and _needs_state(codec)
        if self._codec_state and self._store is None:
            self._store = self.comm.codec_store()

    # ---- Collectives ---------------------------------------------------------------------------
    def allreduce(self, tensors: List[torch.Tensor], opts: Any) -> _Work:
        tensor = self._one(tensors, "allreduce")
        op = _op(opts.reduceOp)
        if (self.codec is not None and op in ("sum", "avg") and tensor.dtype in _CODEC_TYPES
                and tensor.numel() * tensor.element_size() >= self.min_bytes and tensor.numel() > 0):
            state = self._state_for(tensor) if self._codec_state else None  # stateless codecs: no step to match
            request = self.comm.all_reduce(tensor, op, codec=self.codec, state=state, async_op=True)
        else:
            request = self.comm.all_reduce(tensor, op, async_op=True)
        return _QcclWork(self, [request], tensors)

    def broadcast(self, tensors: List[torch.Tensor], opts: Any) -> _Work:
        tensor = self._one(tensors, "broadcast")
        return _QcclWork(self, [self.comm.broadcast(tensor, opts.rootRank, async_op=True)], tensors)

    def reduce(self, tensors: List[torch.Tensor], opts: Any) -> _Work:
        tensor = self._one(tensors, "reduce")
        return _QcclWork(self, [self.comm.reduce(tensor, opts.rootRank, _op(opts.reduceOp), async_op=True)], tensors)

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> _Work:
        # An input inside the output elsewhere than this rank's block (in place) is refused by qccl on
        # this rank alone, while the others enter the collective: copied instead, as gloo reads it.
        if _overlaps(input, output) and input.data_ptr() != output.data_ptr() + self.rank() * _nbytes(input):
            input = input.clone()
        return _QcclWork(self, [self.comm.all_gather(output, input, async_op=True)], [output])

    def allgather(self, outputs: List[List[torch.Tensor]], inputs: List[torch.Tensor], opts: Any = None) -> _Work:
        tensor = self._one(inputs, "allgather")
        # As gloo checks them: a list of another length, or outputs of another type or shape, would
        # drop blocks or broadcast them into the outputs (copy_), silently.
        self._one(outputs, "allgather's output lists")
        self._blocks(outputs[0], "tensor_list", tensor, "tensor", shape=True)
        flat = torch.empty((self.size(),) + tuple(tensor.shape), dtype=tensor.dtype)
        request = self.comm.all_gather(flat, tensor.contiguous(), async_op=True)

        def scatter_out():
            for r, out in enumerate(outputs[0]):
                out.copy_(flat[r])
        return _QcclWork(self, [request], outputs[0], after=scatter_out)

    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> _Work:
        op = "sum" if opts is None else _op(opts.reduceOp)
        return _QcclWork(self, [self.comm.reduce_scatter(output, input, op, async_op=True)], [output])

    def reduce_scatter(self, outputs: List[torch.Tensor], inputs: List[List[torch.Tensor]], opts: Any) -> _Work:
        output = self._one(outputs, "reduce_scatter")
        # Blocks of unequal sizes with the right total would reduce other ranges than the ranks' own.
        self._one(inputs, "reduce_scatter's input lists")
        self._blocks(inputs[0], "input_list", output, "output", shape=False)
        flat = torch.cat([t.reshape(-1) for t in inputs[0]])
        request = self.comm.reduce_scatter(output, flat, _op(opts.reduceOp), async_op=True)
        return _QcclWork(self, [request], outputs)

    def alltoall_base(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: List[int],
                      input_split_sizes: List[int], opts: Any = None) -> _Work:
        if output_split_sizes or input_split_sizes:
            equal = output.shape[0] // self.size() if output.dim() else 0
            if any(s != equal for s in list(output_split_sizes) + list(input_split_sizes)):
                raise qccl.InvalidArgument("all_to_all_single: the qccl backend takes equal splits only "
                                           f"(input {list(input_split_sizes)}, output {list(output_split_sizes)})")
        return _QcclWork(self, [self.comm.all_to_all(output, input, async_op=True)], [output])

    def alltoall(self, outputs: List[torch.Tensor], inputs: List[torch.Tensor], opts: Any = None) -> _Work:
        # As gloo checks them: lists of another length dropped blocks (zip) or split the data at other
        # places, and torch.cat promoted a block of another type silently.
        like = inputs[0] if inputs else None  # a list of another length raises before its use
        self._blocks(inputs, "input_tensor_list", like, "input_tensor_list[0]", shape=False)
        self._blocks(outputs, "output_tensor_list", like, "input_tensor_list[0]", shape=False)
        flat_in = torch.cat([t.reshape(-1) for t in inputs])
        flat_out = torch.empty_like(flat_in)
        request = self.comm.all_to_all(flat_out, flat_in, async_op=True)

        def scatter_out():
            for out, block in zip(outputs, flat_out.chunk(self.size())):
                out.copy_(block.reshape(out.shape))
        return _QcclWork(self, [request], outputs, after=scatter_out)

    def barrier(self, opts: Any = None) -> _Work:
        self.comm.barrier()
        return _QcclWork(self, [], [])

    def send(self, tensors: List[torch.Tensor], dst: int, tag: int) -> _Work:
        tensor = self._one(tensors, "send")
        _no_tag(tag, "send")
        return _QcclWork(self, [self.comm.send(tensor, dst, async_op=True)], tensors)

    def recv(self, tensors: List[torch.Tensor], src: int, tag: int) -> _Work:
        tensor = self._one(tensors, "recv")
        _no_tag(tag, "recv")
        return _QcclWork(self, [self.comm.recv(tensor, src, async_op=True)], tensors)

    # ---- Helpers -------------------------------------------------------------------------------
    @staticmethod
    def _one(tensors: List[torch.Tensor], what: str) -> torch.Tensor:
        if len(tensors) != 1:
            raise qccl.InvalidArgument(f"{what}: {len(tensors)} tensors; the qccl backend takes one per call "
                                       f"(one device per process)")
        return tensors[0]

    def _blocks(self, blocks: List[torch.Tensor], name: str, like: torch.Tensor, like_name: str, shape: bool) -> None:
        """Refuses a list of blocks that is not one per rank, each of ``like``'s type and shape (or size)."""
        if len(blocks) != self.size():
            raise qccl.InvalidArgument(f"{name}: {len(blocks)} tensors; expected one per rank ({self.size()})")
        for i, block in enumerate(blocks):
            if block.dtype != like.dtype:
                raise qccl.InvalidArgument(f"{name}[{i}]: {block.dtype}, but {like_name} is {like.dtype}")
            if shape and block.shape != like.shape:
                raise qccl.InvalidArgument(f"{name}[{i}]: shape {tuple(block.shape)}, but {like_name}'s is "
                                           f"{tuple(like.shape)}")
            if not shape and block.numel() != like.numel():
                raise qccl.InvalidArgument(f"{name}[{i}]: {block.numel()} elements, but {like_name} has "
                                           f"{like.numel()}")

    # States kept at most: more than a model's parameters that are all-reduced one by one, usually;
    # the store's byte budget (QCCL_CODEC_STATE_BUDGET) bounds them too.
    _MAX_STATES = 1024

    def _state_for(self, tensor: torch.Tensor) -> qccl.CodecState:
        # A state per tensor (address, size, type): DDP's buckets and a model's parameters come back
        # every step at the same address, on every rank. Temporaries do not: the least recently used
        # states beyond _MAX_STATES are erased, so that they cannot exhaust the codec-state budget; a
        # tensor whose state went starts afresh (its error feedback restarts), which is said once.
        key = (tensor.data_ptr(), tensor.numel(), str(tensor.dtype))
        entry = self._states.get(key)
        if entry is None:
            if len(self._states) >= self._MAX_STATES:
                _, (old_key, _) = self._states.popitem(last=False)
                self._store.erase(old_key)
                if not self._evicted:
                    self._evicted = True
                    warnings.warn(f"qccl backend: more than {self._MAX_STATES} tensors all-reduced with codec "
                                  f"{self.codec.spec!r}: the least recently used ones' codec states are erased, "
                                  f"and their error feedback (or Marsit's, IntSGD's state) restarts from zero; "
                                  f"all-reduce the same tensors every step (DDP's buckets: qccl.torch.allreduce_hook)",
                                  RuntimeWarning, stacklevel=2)
            entry = self._states[key] = (self._next_key, self._store.get(self._next_key, tensor.numel()))
            self._next_key += 1
        else:
            self._states.move_to_end(key)
        return entry[1]


def _no_tag(tag: int, what: str) -> None:
    # qccl matches a peer's messages in call order, with no tags: messages of other tags, sent and
    # received in different orders, would land in each other's tensors.
    if tag != 0:
        raise qccl.InvalidArgument(f"{what}: tag={tag}; the qccl backend matches a peer's sends and recvs in "
                                   f"call order and takes tag 0 only")


def _timeout_seconds(timeout: Optional[timedelta]) -> Optional[float]:
    """The communicator's timeout from torch's, or None: QCCL_TIMEOUT's (else qccl's default).  torch
    passes its default (default_pg_timeout, 30 minutes) when the user gave none, so that value counts
    as none given: qccl's timeout finds a rank that stopped calling, which 30 minutes would put off."""
    if timeout is None or timeout == _TORCH_DEFAULT_TIMEOUT:
        return None
    return timeout.total_seconds()


class _Resources:
    """What a process group's works share with it, and its teardown: the communicator, the
    completion thread and the works held for torch (see _QcclWork).  It holds no reference to the
    group, so that a group torch drops is freed at once, and close() runs then.

    close() completes this rank's outstanding calls on the group (works nobody waited on), ends the
    completion thread (its queued futures complete first), then destroys the communicator in a
    thread of its own.  Destroy, not abort: abort is local, but it fails the peers' unfinished
    point-to-point calls, also those between two other ranks (a rank that reached
    destroy_process_group first broke the others' sends and receives still in flight).  Destroy is
    collective: it waits (up to the communicator's timeout) for every rank's destroy, which comes when
    that rank frees the group, a moment that differs between ranks (the garbage collector, a user's
    variable still holding it), hence the thread, which the program does not wait for.  In a correct
    program every rank drops the group and the destroys meet; a rank that keeps it makes the others'
    destroys time out, with a RuntimeWarning.  At exit, the destroys still waiting are waited for (up
    to the timeout): one cut short by the exit would fail the peers' destroys.  The communicator
    stays when ``communicator_from_group`` handed it out (a CommHookState's): its holder ends it."""

    _MAX_HELD = 256

    def __init__(self, comm: qccl.Communicator, completer: Completer):
        self.comm, self.completer = comm, completer
        self.held: dict = {}  # id -> _QcclWork
        self.comm_handed_out = False

    def hold(self, work: _QcclWork) -> None:
        if len(self.held) >= self._MAX_HELD:
            for key in [k for k, w in self.held.items() if w.is_completed()]:
                del self.held[key]
        self.held[id(work)] = work

    def release(self, work: _QcclWork) -> None:
        self.held.pop(id(work), None)

    def close(self) -> None:
        held, self.held = list(self.held.values()), {}
        for work in held:
            try:
                work._complete()  # a failure stays the work's, for its wait()
            except Exception:  # noqa: BLE001 - a list form's copy: its wait() would have raised it; go on
                pass
        self.completer.close()
        if not self.comm_handed_out and self.comm._comm.alive:
            thread = threading.Thread(target=_destroy, args=(self.comm,), name=f"qccl-pg-destroy-{self.comm.rank}",
                                      daemon=True)
            _destroying.add(thread)
            thread.start()


_destroying: set = set()  # the threads of _destroy still running


def _destroy(comm: qccl.Communicator) -> None:
    try:
        comm.destroy()
    except qccl.QcclError as e:
        warnings.warn(f"qccl backend: the communicator of a dropped process group (rank {comm.rank} of "
                      f"{comm.size}) ended with an error: {e}", RuntimeWarning)
    finally:
        _destroying.discard(threading.current_thread())


@atexit.register
def _finish_destroys() -> None:
    # A destroy left running at exit would end with the process, and the peers' destroys, waiting
    # for this rank's, would fail: they meet first (or time out).
    for thread in list(_destroying):
        thread.join()


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.data_ptr() < b.data_ptr() + _nbytes(b) and b.data_ptr() < a.data_ptr() + _nbytes(a)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _needs_state(codec: "qccl.Codec | str") -> bool:
    """Whether a codec keeps a state across calls, which every rank must pass for the same tensor:
    error feedback (ef=on), sign (Marsit's compensation), int8 .. int32 with an adaptive alpha
    (alpha=grad, the default, or alpha=lr).  The others (q8, fp16, int8:alpha=0.5, ...) run without
    one: a state would only add a step that the ranks' calls must match.  From the spec, which qccl
    parses strictly (exact keys and values, each once)."""
    name, _, keys = (codec if isinstance(codec, str) else codec.spec).partition(":")
    settings = dict(token.partition("=")[::2] for token in keys.split(",") if token)
    if settings.get("ef") == "on" or name == "sign":
        return True
    return name in ("int8", "int16", "int32") and settings.get("alpha", "grad") in ("grad", "lr")


def _method(codec: "qccl.Codec | str") -> str:
    """The method whose state a codec (or spec) keeps, from its name (README's codec table):
    quantization for none, fp16, bf16 and q1 .. q8, IntSGD for int8 .. int32; sign and fft are their own."""
    name = (codec if isinstance(codec, str) else codec.spec).split(":", 1)[0]
    if name in ("none", "fp16", "bf16") or (name[:1] == "q" and name[1:].isdigit()):
        return "quantized"
    return "intsgd" if name.startswith("int") else name


def _create(store: Any, rank: int, size: int, timeout: timedelta) -> ProcessGroupQccl:
    return ProcessGroupQccl(store, rank, size, timeout)


def register_backend() -> None:
    """Registers "qccl" with torch.distributed (done when qccl.torch is imported)."""
    if getattr(dist.Backend, "QCCL", None) is None:
        dist.Backend.register_backend("qccl", _create)


def set_codec(codec: "str | qccl.Codec | None", min_bytes: int = 0, group: Any = None) -> None:
    """Compresses the qccl process group's float all_reduce calls of at least ``min_bytes`` with
    ``codec`` (None: exact again).  ``group``: the default group when None.

    A codec that keeps a state across calls (error feedback ``ef=on``; ``sign``, Marsit; int8, int16,
    int32 with an adaptive alpha, ``alpha=grad`` (the default) or ``alpha=lr``) keeps one per tensor,
    found by the tensor's address, size and type, and each call must meet the other ranks' calls on
    states at the same step (qccl fails it with ``Mismatch`` otherwise, which breaks the group).  So
    with such a codec every rank must all-reduce its tensors at matching addresses: the same tensors
    every step, as a model's gradients or DDP's buckets; a tensor one rank allocates anew each step
    while another reuses one gets states at different steps.  For DDP, the communication hook
    (qccl.torch.allreduce_hook), which keys the states by bucket, is the way.  The 1024 most recently
    used states are kept (and the codec-state budget, QCCL_CODEC_STATE_BUDGET, bounds their bytes):
    beyond that the least recently used are erased, their tensors' error feedback restarting from
    zero, with a RuntimeWarning the first time.  Codecs without a state (q8, fp16, int8:alpha=0.5,
    ...) take none and have no such requirement."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    if not isinstance(pg, ProcessGroupQccl):
        raise qccl.InvalidArgument(f"group: a {type(pg).__name__}, not the qccl backend's process group "
                                   f"(dist.init_process_group('qccl'))")
    pg.set_codec(codec, min_bytes)
