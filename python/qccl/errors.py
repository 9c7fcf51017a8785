"""qccl's result codes as exceptions.

Every failed qccl call raises a subclass of :class:`QcclError` whose ``code`` is the C API's
``qcclResult_t`` and whose message is the library's own line, naming the call, the argument and the
value.  The subclasses also derive from the matching built-in exception, so that ``except
ValueError`` or ``except TimeoutError`` catch what a Python programmer expects.

Blast radius, as in ``qccl.h``: after :class:`InvalidArgument` or :class:`InvalidUsage` nothing was
sent and the communicator is intact; after :class:`Mismatch`, :class:`RemoteError`,
:class:`Timeout` or :class:`Aborted` the communicator is unusable (abort it); :class:`NonFinite`
means a compressed collective completed with NaN or Inf in its outputs, the same on every rank, and
the communicator is intact.
"""

from __future__ import annotations

import enum
import operator


class Result(enum.IntEnum):
    """``qcclResult_t``."""

    SUCCESS = 0
    INVALID_ARGUMENT = 1
    INVALID_USAGE = 2
    MISMATCH = 3
    REMOTE_ERROR = 4
    TIMEOUT = 5
    ABORTED = 6
    SYSTEM_ERROR = 7
    INTERNAL_ERROR = 8
    IN_PROGRESS = 9
    NON_FINITE = 10


class QcclError(RuntimeError):
    """A qccl call failed.  ``code`` is a :class:`Result`, ``message`` the library's line."""

    code: Result = Result.INTERNAL_ERROR

    def __init__(self, message: str, code: Result | None = None):
        super().__init__(message)
        if code is not None:
            self.code = Result(code)
        self.message = message

    def __str__(self) -> str:
        return f"{self.message} [{self.code.name.lower()}]"


class InvalidArgument(QcclError, ValueError):
    """A bad argument; nothing was sent and the communicator is intact."""

    code = Result.INVALID_ARGUMENT


class InvalidUsage(QcclError):
    """A bad call sequence (a destroyed communicator, a call inside a group that groups refuse)."""

    code = Result.INVALID_USAGE


class Mismatch(QcclError):
    """Ranks called different collectives or passed different arguments; abort the communicator."""

    code = Result.MISMATCH


class RemoteError(QcclError, ConnectionError):
    """A peer died, left or reported an error; abort the communicator."""

    code = Result.REMOTE_ERROR


class Timeout(QcclError, TimeoutError):
    """No progress for QCCL_TIMEOUT seconds; abort the communicator."""

    code = Result.TIMEOUT


class Aborted(QcclError):
    """The communicator was aborted."""

    code = Result.ABORTED


class SystemFailure(QcclError, OSError):
    """A system call or the network failed (``qcclSystemError``)."""

    code = Result.SYSTEM_ERROR


class InternalError(QcclError):
    """A bug in qccl."""

    code = Result.INTERNAL_ERROR


class NonFinite(QcclError, ArithmeticError):
    """A compressed collective's outputs hold NaN or Inf (the same on every rank)."""

    code = Result.NON_FINITE


_BY_CODE = {cls.code: cls for cls in (InvalidArgument, InvalidUsage, Mismatch, RemoteError, Timeout, Aborted,
                                      SystemFailure, InternalError, NonFinite)}


def error_for(code: int, message: str) -> QcclError:
    """The exception for a result code (the extension raises what this returns)."""
    cls = _BY_CODE.get(code)
    if cls is not None:
        return cls(message)
    known = code in Result._value2member_map_
    return QcclError(message if known else f"{message} (result code {code})",
                     Result(code) if known else Result.INTERNAL_ERROR)


def unsigned(value: object, name: str, bits: int = 64) -> int:
    """``value`` as a count, size or key of the C API (an unsigned integer of ``bits`` bits); anything
    else (a negative number, a bool, a float, a string) raises :class:`InvalidArgument` naming ``name``."""
    try:
        number = operator.index(value)  # int, numpy's integers, ...
    except TypeError:
        raise InvalidArgument(f"{name}: {value!r} is not an integer") from None
    if isinstance(value, bool) or not 0 <= number < 1 << bits:
        raise InvalidArgument(f"{name}: {value!r} is out of range [0, 2^{bits})")
    return number
