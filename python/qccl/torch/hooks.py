"""DDP communication hooks that all-reduce gradient buckets through qccl's compressed collectives.

    state = qccl.torch.CommHookState("q8:ef=on")          # or "q4:ef=on", "sign:eta_s=0.002", "int8", ...
    model = torch.nn.parallel.DistributedDataParallel(model)
    model.register_comm_hook(state, qccl.torch.allreduce_hook)

The hook averages each bucket over the ranks with the state's codec, non-blocking (backward goes on
while the bucket travels).  Whatever backend DDP was initialised with (gloo, nccl, qccl): the state
makes its own qccl communicator over the same ranks (or takes the qccl process group's).  Each
bucket keeps its codec state (error-feedback residual, Marsit's compensation, IntSGD's moving
average) in a keyed store, under a key for the bucket's parameters: DDP rebuilds its buckets after
the first iteration, and the new buckets get new keys (their residual starts at zero; a bucket
whose parameters went to rebuilt ones is erased at the end of the iteration that rebuilt it).  One
state may serve several DDP models (a GAN's two, say): their buckets hold other parameters.  Buckets
of other types than float32/float16/bfloat16, and those smaller than ``min_bytes``, are averaged
exactly.

Codecs (README.md lists every key): ``q8:ef=on`` and ``q4:ef=on`` (quantization with error
feedback), ``sign:eta_s=E`` (Marsit: every gradient value becomes +-E, the magnitude of a sign step;
``k=K`` makes every K-th step a full-precision average), ``int8`` (IntSGD: integers summed exactly,
the scale adapted from the gradients), ``fft:theta=0.9,ef=on`` (FFT sparsification), ``none``.
"""

import warnings
from typing import Any, Optional

import torch
import torch.distributed as dist

import qccl
from qccl.codec import as_codec

from ._completion import Completer

_CODEC_TYPES = (torch.float32, torch.float16, torch.bfloat16)


def communicator_from_group(group: Any = None, **settings: Any) -> qccl.Communicator:
    """A qccl communicator over the ranks of a torch.distributed process group (the default group
    when None): the qccl backend's own (which the group's teardown then leaves alone: it is the
    caller's to destroy), or a new one whose unique id travels through the group.
    Collective over the group.  Without torch.distributed initialised: :meth:`Communicator.from_env`."""
    if not dist.is_available() or not dist.is_initialized():
        return qccl.Communicator.from_env(**settings)
    from .backend import ProcessGroupQccl
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    if isinstance(pg, ProcessGroupQccl) and not settings:
        pg._resources.comm_handed_out = True  # the group's teardown leaves it to its new holder
        return pg.comm
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    unique_id = [qccl.get_unique_id() if rank == 0 else None]
    global_rank = getattr(dist, "get_global_rank", None) or dist.distributed_c10d._get_global_rank  # torch < 2.0
    root = 0 if group is None else global_rank(group, 0)
    dist.broadcast_object_list(unique_id, src=root, group=group)
    return qccl.Communicator.from_unique_id(unique_id[0], rank, size, **settings)


class CommHookState:
    """The state of :func:`allreduce_hook`: the communicator, the codec, the keyed codec states.

    ``codec``: a spec string or :class:`qccl.Codec` (None: exact averaging through qccl).
    ``comm``: a qccl communicator over DDP's ranks (default: :func:`communicator_from_group` of
    ``process_group``).  ``min_bytes``: smaller buckets are averaged exactly.  ``budget``: bytes
    the codec states may take (0: the communicator's QCCL_CODEC_STATE_BUDGET).
    ``state_dict()``/``load_state_dict()`` checkpoint the codec states (bytes).
    """

    def __init__(self, codec: "str | qccl.Codec | None" = "q8:ef=on", comm: Optional[qccl.Communicator] = None, *,
                 process_group: Any = None, min_bytes: int = 0, budget: int = 0):
        self.codec = as_codec(codec)
        self.comm = comm if comm is not None else communicator_from_group(process_group)
        self.min_bytes = min_bytes
        self.store = self.comm.codec_store(budget)
        self._completer = Completer(f"qccl-hook-{self.comm.rank}")
        self._keys: dict = {}         # bucket signature -> store key
        self._layouts: dict = {}      # store key -> its parameters' ordinals, for checkpoints
        self._restored: dict = {}     # a checkpoint's parameter ordinals -> store key
        self._ordinals: dict = {}     # parameter address -> ordinal: the order of first sight
        self._stale: set = set()      # keys of rebuilt buckets, erased at the end of the iteration
        self._next_key = 1            # keys are never reused, also after an erase

    def key_for(self, bucket: Any) -> int:
        # The parameters' addresses name a bucket across DDP's rebuild; its index alone does not.
        params = bucket.parameters()
        signature = (bucket.index(), tuple(p.data_ptr() for p in params))
        key = self._keys.get(signature)
        if key is None:
            # A checkpoint's bucket is known by its parameters' ordinals, the order in which this
            # state first saw them: the addresses were another process's, and a bucket's index and
            # sizes may be another bucket's (DDP's first iteration has the same parameters in
            # another order). DDP hands the hook its buckets in index order, and its first buckets
            # follow the model's parameters, so every process of the model numbers them alike.
            # (A parameter without values has no address of its own, and no place in the buffer.)
            layout = tuple(self._ordinals.setdefault(p.data_ptr(), len(self._ordinals)) for p in params if p.numel())
            # The buckets that held these parameters were rebuilt: nothing runs on them once this
            # iteration began (DDP waited for the last), and they are erased at its end.
            taken = set(layout)
            self._stale.update(k for k, held in self._layouts.items() if taken.intersection(held))
            key = self._restored.pop(layout, None)
            if key is None:
                key = self._next_key
                self._next_key += 1
            self._keys[signature], self._layouts[key] = key, layout
        return key

    def all_reduce(self, bucket: Any) -> torch.futures.Future:
        tensor = bucket.buffer()
        if (self.codec is None or tensor.dtype not in _CODEC_TYPES
                or tensor.numel() * tensor.element_size() < self.min_bytes):
            request = self.comm.all_reduce(tensor, "avg", async_op=True)
        else:
            key = self.key_for(bucket)
            state = self.store.get(key, tensor.numel())
            request = self.comm.all_reduce(tensor, "avg", codec=self.codec, state=state, async_op=True)
        if bucket.is_last():
            self._end_iteration()
        return self._completer.future(request, tensor)

    def _end_iteration(self) -> None:
        for key in self._stale:
            self.store.erase(key)
            self._layouts.pop(key, None)
        self._keys = {s: k for s, k in self._keys.items() if k not in self._stale}
        self._stale = set()

    def state_dict(self) -> dict:
        return {"codec": None if self.codec is None else self.codec.spec, "store": self.store.save(),
                "buckets": {key: layout for key, layout in self._layouts.items()}, "next_key": self._next_key}

    def load_state_dict(self, state: dict) -> None:
        """The codec states of ``state_dict()``, each for the bucket of the same parameters in the
        same order when DDP builds it (in this process or a resumed one).  A checkpoint of a codec of
        another method (README's codec table: int8 after q8:ef=on, say) is refused, before anything
        changes: its states are not this codec's, and the first backward would fail on them."""
        if "codec" in state and _method_of(state["codec"]) != _method_of(self.codec):
            ours = None if self.codec is None else self.codec.spec
            raise qccl.InvalidArgument(f"state: a checkpoint of codec {state['codec']!r}, another method's than this "
                                       f"state's codec {ours!r}; load it into a CommHookState of its codec")
        self.store.load(state["store"])
        buckets = state.get("buckets", {})
        self._restored = {}
        for key, layout in buckets.items():
            if all(isinstance(ordinal, int) for ordinal in layout):
                self._restored[tuple(layout)] = key
            else:  # an older qccl's (index, sizes): no bucket can be told by it, so its state goes
                self.store.erase(key)
                warnings.warn(f"qccl CommHookState: the checkpoint's bucket {key} is of an older format "
                              f"(index and sizes): its codec state starts afresh")
        self._next_key = max([self._next_key, state.get("next_key", 1)] + [key + 1 for key in buckets])

    def close(self) -> None:
        """Stops the completion thread (the communicator stays the caller's)."""
        self._completer.close()


def _method_of(codec: "str | qccl.Codec | None") -> str:
    from .backend import _method
    return "exact" if codec is None else _method(codec)  # None: exact averaging, which keeps no state


# DDP checks these annotations (not from __future__: it compares them with the classes).
def allreduce_hook(state: CommHookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: the bucket averaged over the ranks through ``state``'s codec."""
    return state.all_reduce(bucket)
