"""Codecs and the state they keep across steps.

A codec is named by a spec string, ``name[:key=value,...]`` (``"q8"``, ``"q4:bucket=256,ef=on"``,
``"sign:eta_s=0.01"``, ``"int8"``, ``"fft:theta=0.9"``, ``"aq4:channels=1600"``); README.md and
``qccl.h`` list every codec and key.  Collectives accept the string or a :class:`Codec`.
"""

from __future__ import annotations

import functools

from . import _qccl
from .errors import unsigned


class Codec:
    """A parsed codec spec.  An unknown name, key or value raises :class:`qccl.InvalidArgument`."""

    __slots__ = ("_codec",)

    def __init__(self, spec: str):
        self._codec = _qccl.Codec(spec)

    @classmethod
    def _wrap(cls, codec: "_qccl.Codec") -> "Codec":
        """A Codec around one the extension made (learned levels)."""
        wrapped = cls.__new__(cls)
        wrapped._codec = codec
        return wrapped

    @property
    def spec(self) -> str:
        """The spec it was made from; for learned levels, the canonical spec naming them
        (``qcclCodecGetSpec``), which :class:`Codec` reads back as the same codec."""
        return self._codec.spec

    def __repr__(self) -> str:
        return f"qccl.Codec({self.spec!r})"


@functools.lru_cache(maxsize=256)
def _parse(spec: str) -> Codec:
    return Codec(spec)


def as_codec(codec: "str | Codec | None") -> Codec | None:
    """``codec`` as a :class:`Codec` (specs parsed once and cached)."""
    if codec is None or isinstance(codec, Codec):
        return codec
    if not isinstance(codec, str):
        from .errors import InvalidArgument
        raise InvalidArgument(f"codec: a {type(codec).__name__}; pass a spec string such as 'q8' or a qccl.Codec")
    return _parse(codec)


class CodecState:
    """What a codec keeps for one tensor across steps (the error-feedback residual, Marsit's
    compensation, IntSGD's moving average, the step that keys random rounding).  Made by
    :meth:`qccl.Communicator.codec_state` or :meth:`CodecStore.get`.  ``save()`` gives bytes for a
    checkpoint (``state_dict``-friendly) and ``load()`` restores them into a state of the same size."""

    __slots__ = ("_state", "_owner")

    def __init__(self, state: "_qccl.CodecState", owner: object):
        self._state = state
        self._owner = owner  # the communicator or store, kept alive with the state

    def save(self) -> bytes:
        return self._state.save()

    def load(self, checkpoint: bytes) -> None:
        self._state.load(checkpoint)

    def set_learning_rate(self, lr: float) -> None:
        """IntSGD with ``alpha=lr``: the learning rate of the state's next steps."""
        self._state.set_learning_rate(lr)


class CodecStore:
    """Codec states by a 64-bit key (a parameter's or a gradient bucket's), for frameworks that
    compress many tensors: calls on different keys run concurrently, calls on one key in call order.
    ``budget`` bounds the states' memory in bytes (0: only the communicator's
    QCCL_CODEC_STATE_BUDGET).  Thread-safe."""

    __slots__ = ("_store", "_comm")

    def __init__(self, store: "_qccl.CodecStore", comm: object):
        self._store = store
        self._comm = comm

    def get(self, key: int, count: int) -> CodecState:
        """The state of ``key``, made for ``count`` values at its first get."""
        return CodecState(self._store.get(unsigned(key, "key"), unsigned(count, "count")), self)

    def erase(self, key: int) -> None:
        self._store.erase(unsigned(key, "key"))

    def save(self) -> bytes:
        return self._store.save()

    def load(self, checkpoint: bytes) -> None:
        self._store.load(checkpoint)


class DeltaStore:
    """AQ-SGD's keyed message store for one direction of a pipeline link (see
    :meth:`qccl.Communicator.delta_send`).  ``codec`` is an aq codec (``"aq4:channels=H"``),
    ``row_values`` the values per key, ``store_dtype`` the type of the kept rows (``"float16"``, the
    paper's, ``"bfloat16"`` or ``"float32"``), ``budget`` the rows' memory bound in bytes (0: none),
    ``evict`` whether the least recently used keys make room, ``id`` the same number at both ends,
    ``file`` a path for a store larger than memory: its rows then live in a new file made there and
    unlinked at once (an existing path is refused), mapped into memory (``qcclDeltaStoreSetFile``),
    ``store_bits`` 2 .. 8 to keep m as low-bit codes with a float16 scale per channel
    (``qcclDeltaStoreSetLowBits``; both ends the same).  Calls on one store run one after the other in
    call order, and its settings and ``load`` are refused while calls on it are in flight."""

    __slots__ = ("_store", "row_values")

    def __init__(self, codec: "str | Codec", row_values: int, store_dtype: str = "float16", *, budget: int = 0,
                 evict: bool = False, id: int = 0, file: "str | None" = None, store_bits: int = 0):
        from ._buffers import DTYPE_NAMES
        from .errors import InvalidArgument
        by_name = {v: k for k, v in DTYPE_NAMES.items()}
        if store_dtype not in ("float16", "bfloat16", "float32"):
            raise InvalidArgument(f"store_dtype: '{store_dtype}'; pass 'float16', 'bfloat16' or 'float32'")
        self._store = _qccl.DeltaStore(as_codec(codec)._codec, unsigned(row_values, "row_values"), by_name[store_dtype],
                                       unsigned(budget, "budget"), evict, unsigned(id, "id", 32))
        if unsigned(store_bits, "store_bits", 31):
            self._store.set_low_bits(store_bits)
        if file is not None:
            self._store.set_file(str(file))
        self.row_values = row_values

    def set_warmup(self, on: bool) -> None:
        """While on, every row is sent whole (the paper's first epoch)."""
        self._store.set_warmup(on)

    def info(self) -> dict:
        """keys, bytes, sequence, last_message_bytes, last_full_rows."""
        return self._store.info()

    def save(self) -> bytes:
        return self._store.save()

    def load(self, checkpoint: bytes) -> None:
        self._store.load(checkpoint)
