"""Stop signals that must not cut the start of a child process in half.

The command-line drivers (``knittrans demo``, ``knittrans up``) turn SIGINT and SIGTERM into an exception raised in
their main thread, so that every ``finally`` stops what they started. Raised after ``fork`` but before the driver
recorded the child (inside :class:`subprocess.Popen`, which waits there for the child's ``exec``, or just after it,
before the child joined its group), that exception left a child nobody stopped: it ran on until the driver itself
exited, and a rollout worker started that way wrote into the file store after the clean-up had removed it.

So the sections that start a child and record it run under :func:`stop_deferred`, and the drivers' handlers raise
through :func:`raise_stop`: inside such a section the exception waits for the section's end.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class _Deferral:
    def __init__(self) -> None:
        self.depth = 0
        self.pending: BaseException | None = None


# Python runs signal handlers in the main thread only, so only the main thread's sections defer anything; a section
# is per process as signal handlers are.
_MAIN_THREAD = _Deferral()


@contextmanager
def stop_deferred() -> Iterator[None]:
    """Hold back a stop signal's exception (see :func:`raise_stop`) until the end of this section."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _MAIN_THREAD.depth += 1
    try:
        yield
    finally:
        _MAIN_THREAD.depth -= 1
        if _MAIN_THREAD.depth == 0 and _MAIN_THREAD.pending is not None:
            pending, _MAIN_THREAD.pending = _MAIN_THREAD.pending, None
            raise pending  # the user's stop wins over whatever else ended the section; that stays its __context__


def raise_stop(stop: BaseException) -> None:
    """From a signal handler: raise ``stop`` now, or, inside :func:`stop_deferred`, as the section ends (the first
    one held back is the one raised)."""
    if _MAIN_THREAD.depth:
        if _MAIN_THREAD.pending is None:
            _MAIN_THREAD.pending = stop
        return
    _MAIN_THREAD.pending = None
    raise stop
