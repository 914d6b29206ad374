"""Journaled changes of the admission service: one lock, records appended at the next sequence, and what to do
when a write's outcome is unknown.

Each record goes to the journal at the next sequence, fenced (see journal.py). When a write's outcome is unknown
(Redis timed out or went away) the holder keeps the lock, so no other change is decided, and reads the journal's
tail until Redis answers: a record that is there happened and is applied; one that is not did not, and the call
fails UNAVAILABLE (an admission is decided again). Mutating calls wait for the lock at most
``mutation_wait_seconds``, then fail UNAVAILABLE; reads go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from knittrans.admission.service.ingest.report import Classified
from knittrans.admission.service.journal import Journal, JournalFenced, JournalOutcomeUnknown, is_next, same_bytes
from knittrans.admission.service.ledger import AdmissionLedger, Applied
from knittrans.errors import KnitTransError, Unavailable
from knittrans.v1 import journal_pb2

logger = logging.getLogger(__name__)

DEFAULT_MUTATION_WAIT = 10.0  # seconds a mutating call waits for the lock before it fails UNAVAILABLE
SETTLE_BACKOFF = (0.05, 1.0)  # seconds between reads of the journal's tail while Redis does not answer


class JournaledCommits:
    """The lock every change holds, and the journal position the ledger has reached."""

    def __init__(
        self,
        *,
        journal: Journal,
        ledger: AdmissionLedger,
        after: Callable[[Applied, float], Awaitable[None]],
        mutation_wait_seconds: float = DEFAULT_MUTATION_WAIT,
        closed: Callable[[], bool] = lambda: False,
    ) -> None:
        self._journal = journal
        self._ledger = ledger
        self._after = after  # acts on a change applied from the journal's tail (another writer's records)
        self._mutation_wait = mutation_wait_seconds
        self._closed = closed
        self.lock = asyncio.Lock()
        self._applied_sequence = 0  # the last journal record applied to the ledger
        self._settling = False  # a journal write's outcome is unknown and its tail is being read

    @contextlib.asynccontextmanager
    async def mutating(self) -> AsyncIterator[None]:
        """The lock, for a mutating call: UNAVAILABLE if it is not free within ``mutation_wait_seconds`` (the
        holder may be waiting for Redis to tell whether a journal write happened)."""
        try:
            if self.lock.locked():
                await asyncio.wait_for(self.lock.acquire(), self._mutation_wait)
            else:  # free: taken at once (wait_for would start a task per call)
                await self.lock.acquire()
        except TimeoutError:
            why = "waiting to learn whether a journal write happened" if self._settling else "busy"
            raise Unavailable(f"the admission service is {why}; retry") from None
        try:
            yield
        finally:
            self.lock.release()

    def apply(self, record: journal_pb2.JournalRecord, prepared: Classified | None = None) -> Applied | None:
        """Apply a journaled record to the ledger, once: None if its sequence was applied already."""
        if not is_next(self._applied_sequence, record.sequence):
            return None
        applied = self._ledger.apply(record, prepared)
        self._applied_sequence = record.sequence
        return applied

    async def append(self, record: journal_pb2.JournalRecord) -> None:
        """Journal ``record`` at the next sequence; must hold the lock. Returns once the record is in the journal
        (the caller applies it). Raises Unavailable once it is known not to be, after applying whatever the
        journal holds in its place: a change is never decided again over a write whose outcome is unknown."""
        record.sequence = self._applied_sequence + 1
        try:
            await self._journal.append(record)
            return
        except JournalOutcomeUnknown as exc:
            logger.warning("%s; changes wait until the journal's tail tells whether it happened", exc)
            cause: KnitTransError = exc
        except JournalFenced as exc:
            logger.warning("%s; applying the journal's tail", exc)
            cause = exc
        if await self._settle(record):
            logger.warning("journal record %d was written after all; applying it", record.sequence)
            return
        logger.warning("journal record %d was not written: the change did not happen", record.sequence)
        raise Unavailable(f"the change was not journaled ({cause.message}); retry") from cause

    async def _settle(self, record: journal_pb2.JournalRecord) -> bool:
        """Read the journal after the last applied record until Redis answers. True if ``record`` is next there;
        otherwise apply what is there (another writer's records, or none) and return False."""
        self._settling = True
        delay, longest = SETTLE_BACKOFF
        try:
            while True:
                try:
                    tail = [r async for r in self._journal.replay(after=self._applied_sequence)]
                    break
                except Unavailable as exc:
                    if self._closed():
                        raise
                    logger.info("journal tail not readable yet (%s); again in %.2fs", exc, delay)
                    await asyncio.sleep(delay)
                    delay = min(2 * delay, longest)
        finally:
            self._settling = False
        if tail and same_bytes(tail[0], record):
            return True
        for journaled in tail:
            applied = self.apply(journaled)
            if applied is not None:
                await self._after(applied, journaled.at)
        return False
