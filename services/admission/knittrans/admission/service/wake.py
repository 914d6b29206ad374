"""The admission service's timer for decisions that come due with time (a wait that ends, e.g. ``relax_after``)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

logger = logging.getLogger(__name__)

RETRY_AFTER_ERROR = 5.0  # seconds before a timed admission that failed otherwise is tried again


class WakeTimer:
    """Runs ``action`` at the last time it was set to; one that fails is tried again, not left for the next call
    to find. Its tasks are kept referenced until they end, so none is collected or leaves an unread error."""

    def __init__(self, action: Callable[[], Awaitable[None]], *, clock: Callable[[], float]) -> None:
        self._action = action
        self._clock = clock
        self._handle: asyncio.TimerHandle | None = None
        self._running: set[asyncio.Task[None]] = set()
        self._closed = False

    def at(self, wake_at: float | None) -> None:
        """Run at ``wake_at`` (the clock's time) instead of any earlier setting; None cancels."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if wake_at is None or self._closed:
            return
        delay = max(0.0, wake_at - self._clock())
        self._handle = asyncio.get_running_loop().call_later(delay, self._start)

    def _start(self) -> None:
        if self._closed:
            return
        task = asyncio.ensure_future(self._run())
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _run(self) -> None:
        try:
            await self._action()
        except asyncio.CancelledError:
            raise
        except Exception:  # not the journal (the action retries that itself): a bug, so not too often
            logger.exception("timed admission failed; trying again in %.1fs", RETRY_AFTER_ERROR)
            self.at(self._clock() + RETRY_AFTER_ERROR)

    async def close(self) -> None:
        self._closed = True
        if self._handle is not None:
            self._handle.cancel()
        for task in self._running:
            task.cancel()
        await asyncio.gather(*self._running, return_exceptions=True)
