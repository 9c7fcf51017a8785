"""torch Futures completed from qccl requests, by one thread per communicator.

DDP and torch.distributed wait on torch Futures, which nothing in qccl can complete by itself: a
completion thread waits on each request in turn (qcclWait releases the GIL and may be called from
another thread than the one issuing calls) and sets its Future's result, or its exception.  One
thread suffices: a communicator's collectives complete in call order.

A collective that returns qccl.NonFinite has completed, with NaN or Inf where an input held one, the
same on every rank: the Future gets the tensor as gloo's would, so that the framework sees the
non-finite gradients (torch.cuda.amp.GradScaler skips the step) instead of an exception.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Optional

import torch

import qccl


class Completer:
    def __init__(self, name: str):
        self._queue: "queue.SimpleQueue[Optional[tuple]]" = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def future(self, request: Any, value: Any) -> torch.futures.Future:
        """A Future that gets ``value`` when ``request`` completes (at once when it is None)."""
        future: torch.futures.Future = torch.futures.Future()
        if request is None:
            future.set_result(value)
        else:
            self._queue.put((request, future, value))
        return future

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            request, future, value = item
            try:
                request.wait()
            except qccl.NonFinite:
                future.set_result(value)  # NaN/Inf arrive as an exact sum would give them (see below)
            except BaseException as e:  # noqa: BLE001 - handed to whoever waits on the Future
                future.set_exception(e)
            else:
                future.set_result(value)
