"""Deleting released units from the store, in batches, then journaling that they are gone.

The deleter owns the queue of released keys and what reservations and cancellations wait on: the keys whose
deletion is under way (a reservation of one of them waits until it ended, so the write that follows the
reservation finds the unit absent and stores it again), and a condition notified whenever deleted units were
journaled (a cancellation answers once the units nobody references any more are gone).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Collection

from knittrans.errors import KnitTransError, Unavailable
from knittrans.v1 import journal_pb2

logger = logging.getLogger(__name__)

RETRY_SECONDS = 1.0


class UnitDeleter:
    def __init__(
        self,
        *,
        delete_keys: Callable[[list[str]], None] | None,
        batch_size: int,
        pending: Callable[[], Collection[str]],
        lock: asyncio.Lock,
        commit: Callable[[journal_pb2.JournalRecord], Awaitable[object]],
        clock: Callable[[], float],
        on_deleted: Callable[[int], None],
    ) -> None:
        self._delete_keys = delete_keys
        self._batch_size = batch_size
        self._pending = pending
        self._lock = lock
        self._commit = commit
        self._clock = clock
        self._on_deleted = on_deleted
        # Released keys in release order. A mini-batch's release queues them in one call (thousands of keys at
        # 4,096 trajectories: queued one by one they cost the releasing report milliseconds of queue operations).
        self._waiting: deque[str] = deque()
        self._queued = asyncio.Event()
        self.deleting: frozenset[str] = frozenset()
        self.ended = asyncio.Event()
        self.ended.set()
        self.done = asyncio.Condition()

    def enqueue(self, keys: Collection[str]) -> None:
        if keys:
            self._waiting.extend(keys)
            self._queued.set()

    async def wait_gone(self, keys: Collection[str]) -> None:
        """Until none of ``keys`` is still pending deletion."""
        async with self.done:
            await self.done.wait_for(lambda: all(key not in self._pending() for key in keys))

    async def run(self) -> None:
        """Forever (until cancelled). A key referenced again after its release (a reservation, or a report,
        revived it) is no longer pending and is skipped."""
        waiting = self._waiting
        while True:
            await self._queued.wait()
            queued = [waiting.popleft() for _ in range(min(self._batch_size, len(waiting)))]
            if not waiting:
                self._queued.clear()
            async with self._lock:
                pending = self._pending()
                keys = [key for key in dict.fromkeys(queued) if key in pending]
                if not keys:
                    continue
                self.deleting = frozenset(keys)
                self.ended.clear()
            try:
                if not await self._delete_and_journal(keys):
                    await asyncio.sleep(RETRY_SECONDS)
                    self.enqueue(keys)
                    continue
                self._on_deleted(len(keys))
                async with self.done:
                    self.done.notify_all()
            finally:
                self.deleting = frozenset()
                self.ended.set()

    async def _delete_and_journal(self, keys: list[str]) -> bool:
        if self._delete_keys is not None:
            try:
                await asyncio.to_thread(self._delete_keys, keys)
            except KnitTransError as exc:
                logger.warning("deleting %d released units failed, retrying later: %s", len(keys), exc)
                return False
        try:
            async with self._lock:
                deleted = journal_pb2.UnitsDeleted(keys=keys)
                await self._commit(journal_pb2.JournalRecord(at=self._clock(), deleted=deleted))
        except Unavailable as exc:  # still pending: deleted again (which finds them gone) and journaled
            logger.warning("journaling %d deleted units failed, retrying later: %s", len(keys), exc)
            return False
        return True
