"""What a collective needs of an array: its address, element count and qccl datatype, checked.

Arrays are used in place, never copied: numpy arrays (and bytearray, memoryview, array.array) through
the buffer protocol, torch tensors through ``data_ptr()`` (which also covers bfloat16, a type numpy
lacks).  Refused with :class:`qccl.InvalidArgument` naming the argument: non-contiguous arrays,
read-only arrays where qccl writes, device tensors, and types qccl does not carry.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from . import _qccl
from .errors import InvalidArgument


class DataType:
    """``qcclDataType_t`` (NCCL's numbering)."""

    INT8 = 0
    UINT8 = 1
    INT32 = 2
    UINT32 = 3
    INT64 = 4
    UINT64 = 5
    FLOAT16 = 6
    FLOAT32 = 7
    FLOAT64 = 8
    BFLOAT16 = 9


DTYPE_NAMES = {0: "int8", 1: "uint8", 2: "int32", 3: "uint32", 4: "int64", 5: "uint64", 6: "float16",
               7: "float32", 8: "float64", 9: "bfloat16"}

# By name, without importing torch. torch.uint32 and torch.uint64 came with torch 2.3; torch.uint16
# (and int16) have no qccl type.
_TORCH_TYPES = {"torch.int8": DataType.INT8, "torch.uint8": DataType.UINT8, "torch.int32": DataType.INT32,
                "torch.uint32": DataType.UINT32, "torch.int64": DataType.INT64, "torch.uint64": DataType.UINT64,
                "torch.float16": DataType.FLOAT16, "torch.float32": DataType.FLOAT32,
                "torch.float64": DataType.FLOAT64, "torch.bfloat16": DataType.BFLOAT16}


# Buffer(address, count, dtype, itemsize[, owner]): the first element's address, the element count,
# the DataType and the bytes per element (a struct sequence the extension makes; read it by name), and
# what keeps the memory while qccl uses it (the object's buffer export, or the tensor):
# the calls keep the Buffers, not the arrays, until they complete.
Buffer = _qccl.Buffer
_ndarray = np.ndarray


def is_torch_tensor(x: Any) -> bool:
    # Without importing torch (the package works without it): a tensor exists only once torch has
    # been imported. By isinstance, so that subclasses of torch.Tensor defined elsewhere are tensors.
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, getattr(torch, "Tensor", ()))


def describe(x: Any, name: str, *, writable: bool) -> Buffer:
    """The buffer of ``x`` (argument ``name`` in messages), checked for qccl's use."""
    if type(x) is not _ndarray and is_torch_tensor(x):
        return _describe_torch(x, name)
    return _qccl.describe(x, name, writable)  # the buffer protocol, checked in C++


def _describe_torch(t: Any, name: str) -> Buffer:
    if t.device.type != "cpu":
        raise InvalidArgument(f"{name}: a tensor on {t.device}; the Python package takes CPU tensors (move it "
                              f"with .cpu(); device memory is in qccl's C API, not yet in this package)")
    if str(t.layout) != "torch.strided":
        raise InvalidArgument(f"{name}: a {t.layout} tensor; pass a dense (torch.strided) one")
    if not t.is_contiguous():
        raise InvalidArgument(f"{name}: the tensor is not contiguous (strides {tuple(t.stride())}); pass "
                              f"t.contiguous()")
    # A lazy negation (t.neg() of a view, torch >= 1.10) keeps the values' negatives in memory, which
    # qccl would reduce as they are: max would be the negation of min.
    if getattr(t, "is_neg", None) is not None and t.is_neg():
        raise InvalidArgument(f"{name}: a negative view (its memory holds the values negated); pass "
                              f"t.resolve_neg()")
    dtype = _TORCH_TYPES.get(str(t.dtype))
    if dtype is None:
        raise InvalidArgument(f"{name}: {t.dtype} is not a qccl datatype (int8, uint8, int32, uint32, int64, "
                              f"uint64, float16, bfloat16, float32, float64)")
    return Buffer((t.data_ptr(), t.numel(), dtype, t.element_size(), t))


def same_type(a: Buffer, b: Buffer, name_a: str, name_b: str) -> None:
    if a.dtype != b.dtype:
        raise InvalidArgument(f"{name_b}: {DTYPE_NAMES[b.dtype]}, but {name_a} is {DTYPE_NAMES[a.dtype]}; "
                              f"both must have one datatype")


def require_count(b: Buffer, name: str, count: int, why: str) -> None:
    if b.count != count:
        raise InvalidArgument(f"{name}: {b.count} elements, expected {count} ({why})")
