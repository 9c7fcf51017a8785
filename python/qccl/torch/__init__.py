"""qccl for PyTorch: DDP communication hooks (:mod:`qccl.torch.hooks`) and the "qccl"
torch.distributed backend (:mod:`qccl.torch.backend`), registered when this module is imported.
Tested with torch 1.13 (Debian 12's python3-torch, CPU)."""

from .backend import ProcessGroupQccl, register_backend, set_codec
from .hooks import CommHookState, allreduce_hook, communicator_from_group

register_backend()

__all__ = ["CommHookState", "ProcessGroupQccl", "allreduce_hook", "communicator_from_group", "register_backend",
           "set_codec"]
