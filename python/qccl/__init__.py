"""qccl: collectives with compression fused into their pipeline chunks, from Python.

    import numpy as np, qccl
    with qccl.Communicator.from_env() as comm:          # under qcclrun, torchrun, mpirun or srun
        grad = np.ones(1 << 20, dtype=np.float32)
        comm.all_reduce(grad, "avg", codec="q8")         # 4x fewer bytes on the wire
        print(comm.last_stats()["compression_ratio"])

Arrays are numpy arrays (or any buffer-protocol object) and torch CPU tensors, used in place.
``qccl.torch`` adds DDP communication hooks and a ``"qccl"`` torch.distributed backend; it imports
torch, this package does not.
"""

from . import _qccl
from ._buffers import DataType
from .codec import Codec, CodecState, CodecStore, DeltaStore
from .communicator import SPLIT_NOCOLOR, Communicator, ReduceOp, Request, get_unique_id, group
from .errors import (Aborted, InternalError, InvalidArgument, InvalidUsage, Mismatch, NonFinite, QcclError,
                     RemoteError, Result, SystemFailure, Timeout, error_for)

_qccl._set_error_factory(error_for)


def version() -> str:
    """The library's version, "major.minor.patch"."""
    v = _qccl.version()
    return f"{v // 10000}.{v // 100 % 100}.{v % 100}"


__version__ = version()

__all__ = ["Aborted", "Codec", "CodecState", "CodecStore", "Communicator", "DataType", "DeltaStore",
           "InternalError", "InvalidArgument", "InvalidUsage", "Mismatch", "NonFinite", "QcclError", "ReduceOp",
           "RemoteError", "Request", "Result", "SPLIT_NOCOLOR", "SystemFailure", "Timeout", "get_unique_id",
           "group", "version"]
