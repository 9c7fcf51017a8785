"""torch Futures completed from qccl requests, by one thread per communicator.

DDP and torch.distributed wait on torch Futures, which nothing in qccl can complete by itself: a
completion thread waits on each request in turn (qcclWait releases the GIL and may be called from
another thread than the one issuing calls) and sets its Future's result, or its exception.  One
thread suffices: a communicator's collectives complete in call order.

A collective that returns qccl.NonFinite has completed, with NaN or Inf where an input held one, the
same on every rank: the Future gets the tensor as gloo's would, so that the framework sees the
non-finite gradients (torch.cuda.amp.GradScaler skips the step) instead of an exception.

The thread is a daemon (a program that never closes its completer still exits), but it must not be
waiting in qcclWait when the interpreter finalizes: a daemon thread that takes the GIL back then is
ended, which aborted the process (SIGABRT) when a request completed during shutdown.  Every live
completer is therefore closed at exit (atexit), after its queued requests have completed, as the
works the process groups hold wait for theirs; a completer dropped without close() lets its thread
finish the queue and end.
"""

from __future__ import annotations

import atexit
import queue
import threading
import weakref
from typing import Any, Optional

import torch

import qccl


class Completer:
    def __init__(self, name: str):
        self._queue: "queue.SimpleQueue[Optional[tuple]]" = queue.SimpleQueue()
        # The thread holds the queue, not the completer, so that dropping the completer ends it.
        self._thread = threading.Thread(target=_run, args=(self._queue,), name=name, daemon=True)
        self._closed = False
        self._thread.start()
        weakref.finalize(self, self._queue.put, None).atexit = False  # dropped: at exit _close_all joins it
        _live.add(self)

    def future(self, request: Any, value: Any) -> torch.futures.Future:
        """A Future that gets ``value`` when ``request`` completes (at once when it is None)."""
        future: torch.futures.Future = torch.futures.Future()
        if request is None:
            future.set_result(value)
        else:
            self._queue.put((request, future, value))
        return future

    def close(self) -> None:
        """Completes the queued requests' futures, then ends the thread (again: nothing)."""
        if self._closed:
            return
        self._closed = True
        _live.discard(self)
        self._queue.put(None)
        # A future's callback (run by the thread) may drop the last reference to its own completer.
        if self._thread is not threading.current_thread():
            self._thread.join()


def _run(requests: "queue.SimpleQueue[Optional[tuple]]") -> None:
    while True:
        item = requests.get()
        if item is None:
            return
        request, future, value = item
        try:
            request.wait()
        except qccl.NonFinite:
            future.set_result(value)  # NaN/Inf arrive as an exact sum would give them (see above)
        except BaseException as e:  # noqa: BLE001 - handed to whoever waits on the Future
            future.set_exception(e)
        else:
            future.set_result(value)
        del item, request, future, value  # not kept while waiting for the next one


_live: "weakref.WeakSet[Completer]" = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for completer in list(_live):
        completer.close()
