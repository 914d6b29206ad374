"""A thread at the lowest CPU priority that makes blocking calls for other threads, which sleep meanwhile.

Mooncake's client (the PyPI wheel, built without event-driven completion) waits for a transfer by polling its
status in a loop: the calling thread spins on a CPU for as long as the transfer takes, in competition with the
threads that move the bytes (the client's own transport workers, the segment owner's) and with everything else
on the node. Calls made through :class:`IdleWaiter` spin on a ``SCHED_IDLE`` thread instead, which the kernel
runs only on CPU time no other thread of its scheduling group wants (its cgroup, or where the kernel has
autogroups, its session); the caller blocks on a future and uses no CPU.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from typing import TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")


def _lower_priority() -> None:
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError) as error:  # not Linux, or a policy the sandbox refuses: spin at normal priority
        logger.info("transfers wait at normal CPU priority (SCHED_IDLE unavailable: %s)", error)


class IdleWaiter:
    """Runs one call at a time on its ``SCHED_IDLE`` thread; exceptions reach the caller."""

    def __init__(self, name: str) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name, initializer=_lower_priority)

    def run(self, call: Callable[..., T], *args: object) -> T:
        future = self._executor.submit(call, *args)
        try:
            return future.result()
        except BaseException:
            # An interrupt raised in the caller (KeyboardInterrupt, a signal handler's exception) must not hand it
            # back buffers the call is still writing into: the exception waits for the call to end.
            wait([future])
            raise

    def close(self) -> None:
        self._executor.shutdown(wait=True)
