"""Journaled changes of the admission service: one lock, records appended at the next sequence, and what to do
when a write's outcome is unknown.

Each record goes to the journal at the next sequence, fenced (see journal.py). When a write's outcome is unknown
(Redis timed out or went away) the holder keeps the lock, so no other change is decided, and reads the journal's
tail until Redis answers: a record that is there happened and is applied; one that is not did not, and the call
fails UNAVAILABLE (an admission is decided again). Mutating calls wait for the lock at most
``mutation_wait_seconds``, then fail UNAVAILABLE; reads go on.

Every ``snapshot_every`` records the ledger is snapshotted into the journal, which drops the records the snapshot
includes (see journal.py); recovery restores the snapshot and replays only the records after it. A snapshot is
taken under the same lock as the changes, so never while a write's outcome is unknown, and the journal takes it
only if it ends at the snapshot's sequence (so never over a write the service does not know of).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from knittrans.admission.service.block_merge import merge_due, merge_small_blocks, note_small_block
from knittrans.admission.service.ingest.report import Classified
from knittrans.admission.service.journal import (
    Journal,
    JournalFenced,
    JournalOutcomeUnknown,
    StoredSnapshot,
    is_next,
    same_bytes,
)
from knittrans.admission.service.ledger import AdmissionLedger, Applied
from knittrans.admission.service.snapshot import StoredFingerprints, restore_ledger, snapshot_of
from knittrans.errors import KnitTransError, Unavailable
from knittrans.v1 import journal_pb2, snapshot_pb2

logger = logging.getLogger(__name__)

DEFAULT_MUTATION_WAIT = 10.0  # seconds a mutating call waits for the lock before it fails UNAVAILABLE
FORGET_SLICE = 64  # released trajectories fingerprinted per turn of the event loop (tens of microseconds each)
SETTLE_BACKOFF = (0.05, 1.0)  # seconds between reads of the journal's tail while Redis does not answer


def stored_fingerprints(stored: StoredSnapshot | None) -> StoredFingerprints:
    if stored is None:
        return StoredFingerprints()
    snapshot = snapshot_pb2.AdmissionSnapshot.FromString(stored.state)
    return StoredFingerprints(chunks=snapshot.fingerprint_chunks, count=snapshot.fingerprint_count)


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
        snapshot_every: int = 0,
    ) -> None:
        self._journal = journal
        self._ledger = ledger
        self._after = after  # acts on a change applied from the journal's tail (another writer's records)
        self._mutation_wait = mutation_wait_seconds
        self._closed = closed
        self.lock = asyncio.Lock()
        self._applied_sequence = 0  # the last journal record applied to the ledger
        self._settling = False  # a journal write's outcome is unknown and its tail is being read
        self._forgetting = False  # a chain of _forget_released_rows is queued or running
        self._snapshot_every = snapshot_every if journal.keeps_records else 0  # records; 0: no snapshots
        self._snapshot_sequence = 0  # the last record the stored snapshot includes (or the last attempt's)
        self._stored: StoredFingerprints | None = StoredFingerprints()  # None: unknown until read again
        self.snapshot_due = asyncio.Event()

    @property
    def applied_sequence(self) -> int:
        return self._applied_sequence

    async def recover(self) -> int:
        """Restore the stored snapshot, if any, then apply the journal's records after it; returns how many
        records were applied. Must run before anything else touches the ledger."""
        stored = await self._journal.read_snapshot()
        if stored is not None:
            self._restore(stored)
            logger.info("restored the snapshot of journal record %d", self._applied_sequence)
        count = 0
        async for record in self._journal.replay(after=self._applied_sequence):
            if self.apply(record) is not None:
                count += 1
        return count

    def _restore(self, stored: StoredSnapshot) -> None:
        snapshot = snapshot_pb2.AdmissionSnapshot.FromString(stored.state)
        self._stored = restore_ledger(self._ledger, snapshot, stored.chunks)
        self._applied_sequence = self._snapshot_sequence = snapshot.sequence

    def snapshot_is_due(self) -> bool:
        every = self._snapshot_every
        return bool(every) and self._applied_sequence - self._snapshot_sequence >= every

    async def keep_snapshots(self) -> None:
        """Background task: snapshot the ledger whenever ``snapshot_every`` records were applied since the last
        snapshot (or the last attempt: a failed one is tried again after as many records)."""
        while True:
            await self.snapshot_due.wait()
            self.snapshot_due.clear()
            async with self.lock:
                if self.snapshot_is_due():
                    await self.snapshot()

    async def snapshot(self) -> bool:
        """Store a snapshot of the ledger at the last applied record; must hold the lock. False if the journal
        refused it or Redis did not answer (nothing is lost: the records stay until a snapshot is taken)."""
        sequence = self._applied_sequence
        self._snapshot_sequence = sequence
        try:
            if self._stored is None:  # an earlier attempt's outcome is unknown: see what is stored
                self._stored = stored_fingerprints(await self._journal.read_snapshot())
            snapshot = snapshot_of(self._ledger, sequence, self._stored)
            chunk = b"" if snapshot.new_chunk is None else snapshot.new_chunk.SerializeToString()
            await self._journal.write_snapshot(sequence, snapshot.state.SerializeToString(), self._stored.chunks,
                                               chunk)
        except (JournalOutcomeUnknown, JournalFenced, Unavailable) as exc:
            self._stored = None
            logger.warning("no snapshot of journal record %d: %s", sequence, exc)
            return False
        self._stored = snapshot.stored
        logger.info("snapshot of journal record %d stored (%d bytes); the records up to it are dropped", sequence,
                    snapshot.state.ByteSize() + len(chunk))
        return True

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
            loop = asyncio.get_running_loop()
            if merge_due(self._ledger):  # queued after whatever the call woke (assignment streams): block_merge
                loop.call_soon(self._merge_small_blocks)
            if self._ledger.released_rows_held and not self._forgetting:  # after the answer that released them
                self._forgetting = True
                loop.call_soon(self._forget_released_rows)

    def _merge_small_blocks(self) -> None:
        if not self.lock.locked():  # else the call that holds it merges when it lets go
            merge_small_blocks(self._ledger)

    def _forget_released_rows(self) -> None:
        """A slice at a time (one such chain at once), so that no call waits behind a whole mini-batch's
        fingerprints. It goes on while a call holds the lock (unlike a block merge, it moves no live row, and a
        service that is never idle must still let go of released rows): it only drops released rows and adds
        fingerprints, which a call in the middle of its journal write never reads back."""
        self._ledger.forget_released_rows(FORGET_SLICE)
        if self._ledger.released_rows_held:
            asyncio.get_running_loop().call_soon(self._forget_released_rows)
        else:
            self._forgetting = False

    def apply(self, record: journal_pb2.JournalRecord, prepared: Classified | None = None) -> Applied | None:
        """Apply a journaled record to the ledger, once: None if its sequence was applied already."""
        if not is_next(self._applied_sequence, record.sequence):
            return None
        applied = self._ledger.apply(record, prepared)
        note_small_block(self._ledger)
        self._applied_sequence = record.sequence
        if self._snapshot_every and record.sequence - self._snapshot_sequence >= self._snapshot_every:
            self.snapshot_due.set()
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
