"""Running the SDK's async core from code without an event loop.

Each client has one core, written as coroutines (:mod:`knittrans.aio`). Its I/O is behind a small interface with
two implementations: one that awaits (grpc.aio, a store call in an executor) and one that blocks the calling
thread and never suspends. The sync clients run the core's coroutines on the blocking one with
:func:`run_to_completion`: no event loop and no thread hop, so a sync call costs what a plain blocking call
costs, and both clients follow the same steps, retry rules and error mapping.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

T = TypeVar("T")


def run_to_completion(awaitable: Awaitable[T]) -> T:
    """The result of an awaitable that never suspends (one whose I/O blocks instead)."""
    step: Callable[[None], Any] = awaitable.__await__().send
    try:
        step(None)
    except StopIteration as done:
        return cast(T, done.value)
    raise RuntimeError("a blocking call suspended: it needs an event loop")
