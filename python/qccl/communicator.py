"""Communicators and collectives on numpy arrays and torch CPU tensors.

Semantics are the C API's (``include/qccl.h``), named after torch.distributed's where they overlap.
Every collective must be called by every rank of the communicator in the same order with matching
arguments; a rank that passes another count, datatype, op or root makes the call fail with
:class:`qccl.Mismatch` on every rank.  Arrays are used in place (never copied): a blocking call may
reuse them when it returns, a non-blocking one (``async_op=True``) returns a :class:`Request` that
holds them until it completes (and their buffer exports: a bytearray or array.array cannot be resized
meanwhile, BufferError).  Calls release the GIL while they run.
"""

from __future__ import annotations

import contextlib
import enum
import operator
import warnings
from typing import Any, Iterator, Optional, Sequence

from . import _qccl
from ._buffers import Buffer, describe, require_count, same_type
from .codec import Codec, CodecState, CodecStore, DeltaStore, as_codec
from .errors import InvalidArgument, unsigned

Request = _qccl.Request
SPLIT_NOCOLOR = -1


class ReduceOp(enum.IntEnum):
    """``qcclRedOp_t``.  Collectives also take the names as strings (``"sum"``, ``"avg"``, ...)."""

    SUM = 0
    PROD = 1
    MAX = 2
    MIN = 3
    AVG = 4


_OP_NAMES = {op.name.lower(): int(op) for op in ReduceOp}


def _op(op: "ReduceOp | str | int") -> int:
    # By exact type, not by a lookup that takes whatever compares equal to a value: True, 2.0, or
    # torch's RedOpType, whose numbers are other ops' here (its AVG is 1, qccl's PROD).
    kind = type(op)
    if kind is ReduceOp:
        return op._value_
    if kind is int:
        if 0 <= op < len(ReduceOp):
            return op
    elif isinstance(op, str) and not isinstance(op, enum.Enum):
        value = _OP_NAMES.get(op)
        if value is None:
            raise InvalidArgument(f"op: '{op}'; pass one of sum, prod, max, min, avg")
        return value
    hint = "; torch's ReduceOp numbers the ops otherwise" if kind.__module__.startswith("torch") else ""
    raise InvalidArgument(f"op: {op!r} is not a qccl.ReduceOp, one of its names (sum, prod, max, min, avg) or "
                          f"its int value{hint}")


def _codec(codec: "str | Codec | None"):
    if codec is None:
        return None
    return as_codec(codec)._codec


def _state(state: Optional[CodecState]):
    if state is None:
        return None
    if not isinstance(state, CodecState):
        raise InvalidArgument(f"state: a {type(state).__name__}; pass a qccl.CodecState "
                              f"(Communicator.codec_state or CodecStore.get)")
    return state._state


def _segments(segments: Optional[Sequence[tuple[int, bool]]]):
    if segments is None:
        return None
    return [(unsigned(count, "segments' count"), bool(exact)) for count, exact in segments]


def get_unique_id(address: Optional[str] = None) -> bytes:
    """A new communicator's identity (``qcclGetUniqueId``): call it on one process, copy the bytes
    to every rank by any side channel, then :meth:`Communicator.from_unique_id` on each.  Starts the
    bootstrap root in this process.

    With ``address`` ("host:port", ``qcclGetUniqueIdFromAddress``): every process that names the same
    root makes the same bytes, and nothing starts here; rank 0's ``from_unique_id`` starts the root on
    that port of its host, which the address must name."""
    if address is not None and (not isinstance(address, str) or "\0" in address):
        raise InvalidArgument(f"address: {address!r} is not a str without NUL (\"host:port\")")
    return _qccl.get_unique_id(address)


@contextlib.contextmanager
def group() -> Iterator[None]:
    """Calls inside are queued and started together when the block ends (``qcclGroupStart/End``),
    which blocks until they complete; e.g. two ranks that send to each other. The group keeps the
    arrays of its calls (blocking ones too, and those of requests dropped inside it) until then.
    A communicator cannot be destroyed inside the block."""
    _qccl.group_start()
    ok = False
    try:
        yield
        ok = True
    finally:
        if ok:
            _qccl.group_end()
        else:
            with contextlib.suppress(Exception):
                _qccl.group_end()


class Communicator:
    """A group of ranks running collectives together (``qcclComm_t``).

    Make one with :meth:`from_env` (qcclrun, torchrun, mpirun, srun) or :meth:`from_unique_id`.
    Destroying is collective: use ``with`` (which destroys on a normal exit and aborts when an
    exception leaves the block), or call :meth:`destroy` on every rank.

    Settings (each None: its ``QCCL_*`` variable, else the README's default): ``timeout`` seconds
    without progress before failing (QCCL_TIMEOUT), ``chunk_bytes`` (QCCL_CHUNK_BYTES),
    ``pipeline_depth`` (QCCL_PIPELINE_DEPTH), ``algorithms`` ("allreduce=ring", QCCL_ALGO), ``codec``
    (compress plain all_reduce calls, QCCL_CODEC), ``codec_min_bytes`` (QCCL_CODEC_MIN_BYTES).
    """

    def __init__(self, handle: "_qccl.Comm"):
        self._comm = handle
        self._rank = handle.rank
        self._size = handle.size

    # ---- Construction and lifetime ------------------------------------------------------------------
    @classmethod
    def from_env(cls, **settings: Any) -> "Communicator":
        """The world communicator from the launcher's environment (collective), in this order:
        QCCL_RANK/QCCL_NRANKS/QCCL_ROOT (qcclrun), RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT
        (torchrun), OMPI_COMM_WORLD_RANK/SIZE (mpirun), SLURM_PROCID/NTASKS (srun, the root from
        QCCL_ROOT or MASTER_*).  With none set: a single-rank communicator.  Rank 0 listens on the
        root's port: beside torch.distributed, whose store holds MASTER_PORT, use
        :func:`qccl.torch.communicator_from_group` instead."""
        return cls(_qccl.Comm.init_env(settings))

    @classmethod
    def from_unique_id(cls, unique_id: bytes, rank: int, size: int, **settings: Any) -> "Communicator":
        """Joins the communicator of :func:`get_unique_id`'s bytes as ``rank`` of ``size``
        (collective: blocks until every rank has joined, or the timeout)."""
        return cls(_qccl.Comm.init_rank(size, bytes(unique_id), rank, settings))

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def size(self) -> int:
        return self._size

    def split(self, color: Optional[int], key: Optional[int] = None, **settings: Any) -> Optional["Communicator"]:
        """Collective over every rank (``qcclCommSplit``): ranks passing the same ``color`` form a new
        communicator, ranked by ``key`` (default: their rank here); ``color=None`` joins none and
        returns None.  The settings default to this communicator's."""
        handle = self._comm.split(SPLIT_NOCOLOR if color is None else color,
                                  self._rank if key is None else key, settings)
        return None if handle is None else Communicator(handle)

    def destroy(self) -> None:
        """Collective: finishes outstanding operations and waits (up to the timeout) for every rank."""
        self._comm.destroy()

    def abort(self) -> None:
        """Local: fails every outstanding operation, tells the peers, frees the communicator."""
        self._comm.abort()

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self._comm.alive:
            return
        if exc_type is None:
            self.destroy()
        else:
            self.abort()

    def __del__(self) -> None:
        comm = getattr(self, "_comm", None)
        if comm is not None and comm.alive:
            warnings.warn(f"qccl.Communicator (rank {self._rank} of {self._size}) was never destroyed; use "
                          f"'with' or call destroy() on every rank", ResourceWarning, stacklevel=2)

    def __repr__(self) -> str:
        state = "" if self._comm.alive else ", destroyed"
        return f"<qccl.Communicator rank {self._rank} of {self._size}{state}>"

    def check_async_error(self) -> None:
        """Raises the error that broke the communicator, if one did (never blocks)."""
        self._comm.check_async_error()

    def last_stats(self) -> dict:
        """What the last completed collective did on this rank: wire_bytes_sent/received, seconds,
        sequence, algorithm, compression_ratio, encode/decode/wire_seconds, codec, int_alpha,
        clipped_values, largest_integer, inter_node_bytes_sent, and where the time went:
        reduce_seconds, transport_seconds, wait_seconds, wakeups (qcclStats_t in qccl.h)."""
        return self._comm.last_stats()

    # ---- Codec state ----------------------------------------------------------------------------
    def codec_state(self, count: int) -> CodecState:
        """A codec state for one tensor of ``count`` values (error feedback, Marsit, IntSGD)."""
        return CodecState(self._comm.codec_state(unsigned(count, "count")), self)

    def codec_store(self, budget: int = 0) -> CodecStore:
        """Codec states by key (``budget`` bytes at most; 0: the communicator's budget only)."""
        return CodecStore(self._comm.codec_store(unsigned(budget, "budget")), self)

    def learn_levels(self, codec: "str | Codec", data: Any = None, *, epochs: int = 10, root: int = 0) -> Codec:
        """QSDP's learned levels for a q codec, fitted to root's ``data`` (collective; others may
        pass None): a new codec whose levels every rank shares."""
        c = as_codec(codec)
        if data is None:
            address, count, dtype = 0, 0, 7
        else:
            b = describe(data, "data", writable=False)
            address, count, dtype = b.address, b.count, b.dtype
        return Codec._wrap(self._comm.learn_levels(c._codec, address, count, dtype, epochs, root))

    # ---- Collectives ----------------------------------------------------------------------------
    def all_reduce(self, tensor: Any, op: "ReduceOp | str" = ReduceOp.SUM, *, out: Any = None,
                   codec: "str | Codec | None" = None, state: Optional[CodecState] = None,
                   async_op: bool = False) -> Optional[Request]:
        """``out`` (or ``tensor``, in place) = op over ranks of ``tensor``.  With a ``codec``:
        compressed (float32/float16/bfloat16, sum or avg; ``state`` for error feedback, Marsit and
        IntSGD), every rank ends with identical bits within the codec's bound."""
        src = describe(tensor, "tensor", writable=out is None)
        dst = src if out is None else self._out(out, src, "out", src.count, "the size of tensor")
        return self._comm.all_reduce(src.address, dst.address, src.count, src.dtype, _op(op), _codec(codec),
                                     _state(state), async_op, (src, dst, state))

    def broadcast(self, tensor: Any, src: int = 0, *, out: Any = None, async_op: bool = False) -> Optional[Request]:
        """Rank ``src``'s ``tensor`` into every rank's ``out`` (or ``tensor``, in place)."""
        self._peer(src, "src")
        send = describe(tensor, "tensor", writable=out is None)
        dst = send if out is None else self._out(out, send, "out", send.count, "the size of tensor")
        return self._comm.broadcast(send.address, dst.address, send.count, send.dtype, src, async_op,
                                    (send, dst))

    def reduce(self, tensor: Any, dst: int = 0, op: "ReduceOp | str" = ReduceOp.SUM, *, out: Any = None,
               async_op: bool = False) -> Optional[Request]:
        """op over ranks of ``tensor``, into ``out`` (or ``tensor``) on rank ``dst`` only."""
        self._peer(dst, "dst")
        send = describe(tensor, "tensor", writable=out is None and self._rank == dst)
        recv = send
        if out is not None and self._rank == dst:
            recv = self._out(out, send, "out", send.count, "the size of tensor")
        return self._comm.reduce(send.address, recv.address, send.count, send.dtype, _op(op), dst, async_op,
                                 (send, recv))

    def all_gather(self, output: Any, input: Any, *, codec: "str | Codec | None" = None,
                   state: Optional[CodecState] = None, segments: Optional[Sequence[tuple[int, bool]]] = None,
                   async_op: bool = False) -> Optional[Request]:
        """``output`` (size x the input's elements) = every rank's ``input`` in rank order
        (torch's all_gather_into_tensor).  In place when ``input`` is this rank's block of
        ``output``.  With a ``codec``: compressed; ``segments`` = [(count, exact), ...] cuts the
        block into runs, each sent with the codec or exactly (QSDP's per-layer compression)."""
        send = describe(input, "input", writable=False)
        recv = self._out(output, send, "output", send.count * self._size, f"{self._size} ranks x input's size")
        return self._comm.all_gather(send.address, recv.address, send.count, send.dtype, _codec(codec),
                                     _state(state), _segments(segments), async_op,
                                     (recv, send, state))

    def reduce_scatter(self, output: Any, input: Any, op: "ReduceOp | str" = ReduceOp.SUM, *,
                       codec: "str | Codec | None" = None, state: Optional[CodecState] = None,
                       segments: Optional[Sequence[tuple[int, bool]]] = None,
                       async_op: bool = False) -> Optional[Request]:
        """``output`` = op over ranks of block ``rank`` of ``input`` (size blocks of output's
        elements; torch's reduce_scatter_tensor).  Codec and segments as for :meth:`all_gather`."""
        send = describe(input, "input", writable=False)
        recv = describe(output, "output", writable=True)
        same_type(send, recv, "input", "output")
        require_count(send, "input", recv.count * self._size, f"{self._size} ranks x output's size")
        return self._comm.reduce_scatter(send.address, recv.address, recv.count, send.dtype, _op(op), _codec(codec),
                                         _state(state), _segments(segments), async_op,
                                         (recv, send, state))

    def all_to_all(self, output: Any, input: Any, *, async_op: bool = False) -> Optional[Request]:
        """Block r of ``input`` goes to rank r, which receives it as its block ``rank`` of ``output``
        (torch's all_to_all_single with equal splits)."""
        send = describe(input, "input", writable=False)
        if send.count % self._size:
            raise InvalidArgument(f"input: {send.count} elements do not split into {self._size} equal blocks")
        recv = self._out(output, send, "output", send.count, "the size of input")
        return self._comm.all_to_all(send.address, recv.address, send.count // self._size, send.dtype, async_op,
                                     (recv, send))

    def gather(self, tensor: Any, output: Any = None, dst: int = 0, *, async_op: bool = False) -> Optional[Request]:
        """Every rank's ``tensor`` into rank ``dst``'s ``output`` in rank order (others pass None)."""
        self._peer(dst, "dst")
        send = describe(tensor, "tensor", writable=False)
        recv = None
        if self._rank == dst:
            if output is None:
                raise InvalidArgument(f"output: None on the root (rank {dst}), which receives every rank's tensor")
            recv = self._out(output, send, "output", send.count * self._size, f"{self._size} ranks x tensor's size")
        return self._comm.gather(send.address, 0 if recv is None else recv.address, send.count, send.dtype, dst,
                                 async_op, (send, recv))

    def scatter(self, tensor: Any, input: Any = None, src: int = 0, *, async_op: bool = False) -> Optional[Request]:
        """Block ``rank`` of rank ``src``'s ``input`` into every rank's ``tensor`` (others pass None)."""
        self._peer(src, "src")
        recv = describe(tensor, "tensor", writable=True)
        send = None
        if self._rank == src:
            if input is None:
                raise InvalidArgument(f"input: None on the root (rank {src}), which sends every rank's block")
            send = describe(input, "input", writable=False)
            same_type(recv, send, "tensor", "input")
            require_count(send, "input", recv.count * self._size, f"{self._size} ranks x tensor's size")
        return self._comm.scatter(0 if send is None else send.address, recv.address, recv.count, recv.dtype, src,
                                  async_op, (recv, send))

    def send(self, tensor: Any, dst: int, *, codec: "str | Codec | None" = None,
             async_op: bool = False) -> Optional[Request]:
        """Sends ``tensor`` to rank ``dst``, which calls :meth:`recv` with the same size, type and
        codec.  Two ranks sending to each other use ``async_op=True`` or :func:`qccl.group`."""
        self._peer(dst, "dst")
        b = describe(tensor, "tensor", writable=False)
        return self._comm.send(b.address, b.count, b.dtype, dst, _codec(codec), async_op, b)

    def recv(self, tensor: Any, src: int, *, codec: "str | Codec | None" = None,
             async_op: bool = False) -> Optional[Request]:
        """Receives rank ``src``'s :meth:`send` into ``tensor``."""
        self._peer(src, "src")
        b = describe(tensor, "tensor", writable=True)
        return self._comm.recv(b.address, b.count, b.dtype, src, _codec(codec), async_op, b)

    def isend(self, tensor: Any, dst: int, *, codec: "str | Codec | None" = None) -> Request:
        return self.send(tensor, dst, codec=codec, async_op=True)

    def irecv(self, tensor: Any, src: int, *, codec: "str | Codec | None" = None) -> Request:
        return self.recv(tensor, src, codec=codec, async_op=True)

    def delta_send(self, tensor: Any, keys: Sequence[int], store: DeltaStore, dst: int, *,
                   async_op: bool = False) -> Optional[Request]:
        """AQ-SGD's keyed delta send: row r of ``tensor`` (len(keys) rows of the store's row_values)
        for sample ``keys[r]``; a key the store holds is sent as the quantized change since its
        last message, the others whole.  Rank ``dst`` calls :meth:`delta_recv`.  Calls on one store
        run one after the other in call order; with ``async_op=True`` the call returns a
        :class:`Request` (the tensor stays qccl's until it completes), and inside :func:`qccl.group`
        it starts at the group's end."""
        self._peer(dst, "dst")
        b = describe(tensor, "tensor", writable=False)
        keys = self._keys(keys, b, store)
        return self._comm.delta_send(b.address, keys, b.dtype, store._store, dst, async_op, (b, store))

    def delta_recv(self, tensor: Any, keys: Sequence[int], store: DeltaStore, src: int, *,
                   async_op: bool = False) -> Optional[Request]:
        """Receives rank ``src``'s :meth:`delta_send` (same keys, in order) into ``tensor``."""
        self._peer(src, "src")
        b = describe(tensor, "tensor", writable=True)
        keys = self._keys(keys, b, store)
        return self._comm.delta_recv(b.address, keys, b.dtype, store._store, src, async_op, (b, store))

    def barrier(self) -> None:
        """Returns on no rank before every rank has called it."""
        import array
        token = array.array("i", [0])
        self.all_reduce(token)

    # ---- Helpers --------------------------------------------------------------------------------
    def _peer(self, rank: Any, name: str) -> None:
        """Refuses a root or peer that is not a rank here, naming the argument as the caller passed it
        (qccl's own message would say root or peer)."""
        try:
            value = operator.index(rank)  # int, numpy's integers, ...
        except TypeError:
            value = None
        if isinstance(rank, bool) or value is None or not 0 <= value < self._size:
            raise InvalidArgument(f"{name}: {rank!r} is not a rank of this communicator (0..{self._size - 1})")

    @staticmethod
    def _out(x: Any, like: Buffer, name: str, count: int, why: str) -> Buffer:
        b = describe(x, name, writable=True)
        same_type(like, b, "the input", name)
        require_count(b, name, count, why)
        return b

    @staticmethod
    def _keys(keys: Sequence[int], b: Buffer, store: DeltaStore) -> list[int]:
        keys = [unsigned(k, "keys' key") for k in keys]
        require_count(b, "tensor", len(keys) * store.row_values, f"{len(keys)} keys x {store.row_values} values")
        return keys
