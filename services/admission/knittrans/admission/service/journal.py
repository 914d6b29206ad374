"""Where admission state changes are recorded before they take effect.

``memory`` keeps nothing (the embedded default: a restart starts empty). ``redis://`` appends every record
to one Redis list; AOF with ``appendfsync always`` on the server makes an acknowledged append durable.

Appends are fenced. Every record carries its sequence (its position in the journal, from 1), and one Lua script
appends it only if the journal ends at the previous sequence, so a crash or a retry leaves either the whole
record at its place or nothing, and never a record twice. A write whose reply is lost (a time-out, a dropped
connection, Redis restarting) may or may not have happened: :class:`JournalOutcomeUnknown` says so, and the
caller reads the journal's tail to find out before it changes anything else (see the servicer's ``_append``).

A snapshot of the state after some record (``write_snapshot``) is stored next to the list, with the content
fingerprints added since the previous snapshot as one more chunk, and the list drops the records it includes; one
Lua script does all three, fenced like an append (see :mod:`.snapshot` and docs/failures.md).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from knittrans.errors import Aborted, ConfigError, FailedPrecondition, Unavailable
from knittrans.v1 import journal_pb2

logger = logging.getLogger(__name__)

LOAD_CHUNK = 1000
DEFAULT_TIMEOUT_SECONDS = 10.0

# KEYS: the record list, the key holding the journal's last sequence. ARGV: the sequence, the record's bytes.
# The end key, not the list's length, says where the journal ends, so that a journal truncated at its head
# keeps its numbering (the list then holds sequences end - LLEN + 1 .. end); a journal written before appends
# were fenced has no end key and ends at its length.
_APPEND_SCRIPT = """
local length = redis.call('LLEN', KEYS[1])
local last = tonumber(redis.call('GET', KEYS[2]) or length)
local sequence = tonumber(ARGV[1])
if sequence == last + 1 then
  redis.call('RPUSH', KEYS[1], ARGV[2])
  redis.call('SET', KEYS[2], sequence)
  return {1, sequence}
end
if sequence <= last and sequence > last - length then
  if redis.call('LINDEX', KEYS[1], sequence - (last - length) - 1) == ARGV[2] then
    return {2, last}
  end
  return {3, last}
end
return {4, last}
"""


# KEYS: the record list, the end key, the snapshot key, the fingerprint chunk list. ARGV: the snapshot's sequence,
# its bytes, the number of chunks the previous snapshot included, the new chunk's bytes ('' for none). Fenced like
# an append: taken only if the journal ends at the snapshot's sequence (so no write the writer is unsure of, and
# no other writer's record, lies beyond it) and the chunks are the ones the writer knows. The snapshot, its chunk
# and the truncation of the records it includes happen together or not at all; recovery would also skip records
# the snapshot includes, were any left.
_SNAPSHOT_SCRIPT = """
local length = redis.call('LLEN', KEYS[1])
local last = tonumber(redis.call('GET', KEYS[2]) or length)
if tonumber(ARGV[1]) ~= last then
  return {4, last}
end
if redis.call('LLEN', KEYS[4]) ~= tonumber(ARGV[3]) then
  return {5, last}
end
if ARGV[4] ~= '' then
  redis.call('RPUSH', KEYS[4], ARGV[4])
end
redis.call('SET', KEYS[3], ARGV[2])
redis.call('SET', KEYS[2], last)
redis.call('LTRIM', KEYS[1], length, -1)
return {1, last}
"""


@dataclass(frozen=True)
class StoredSnapshot:
    """The stored snapshot's bytes and the fingerprint chunks stored with it, in order."""

    state: bytes
    chunks: list[bytes]


class AppendOutcome(StrEnum):
    APPENDED = "appended"
    ALREADY_THERE = "already there"  # the same bytes at that sequence: an earlier attempt of this append landed


class FenceViolation(StrEnum):
    DIFFERENT_RECORD = "a different record is at that sequence"
    ENDS_ELSEWHERE = "the journal does not end at the previous sequence"
    OTHER_CHUNKS = "the stored fingerprint chunks are not the ones the writer knows"


class JournalFenced(Aborted):
    """The journal refused a record: it does not end where the writer thought. Another writer, or a write the
    writer lost track of, moved it on; the writer must read the tail before it changes anything."""

    def __init__(self, sequence: int, journal_end: int, violation: FenceViolation) -> None:
        super().__init__(f"journal record {sequence} refused: {violation.value} (the journal ends at {journal_end})")
        self.sequence = sequence
        self.journal_end = journal_end
        self.violation = violation


class JournalOutcomeUnknown(Unavailable):
    """An append whose reply never came: the record may or may not be in the journal."""

    def __init__(self, sequence: int, cause: str) -> None:
        super().__init__(f"journal record {sequence}: outcome unknown ({cause})")
        self.sequence = sequence


class JournalGap(FailedPrecondition):
    """A record beyond the next expected sequence: the journal lost the records in between."""

    def __init__(self, applied: int, sequence: int) -> None:
        missing = f"{applied + 1}" if sequence == applied + 2 else f"{applied + 1}..{sequence - 1}"
        super().__init__(f"journal record {sequence} follows record {applied}: records {missing} are missing")
        self.applied = applied
        self.sequence = sequence


def record_bytes(record: journal_pb2.JournalRecord) -> bytes:
    """A record as the journal stores it: deterministic, so that the same record always has the same bytes (map
    fields in any order) and a re-sent append is recognised."""
    return record.SerializeToString(deterministic=True)


def same_bytes(a: journal_pb2.JournalRecord, b: journal_pb2.JournalRecord) -> bool:
    return record_bytes(a) == record_bytes(b)


def is_next(applied: int, sequence: int) -> bool:
    """Whether the record at ``sequence`` is the next to apply after ``applied``: False if it was applied already
    (replay is idempotent), :class:`JournalGap` if records are missing before it."""
    if sequence <= applied:
        return False
    if sequence != applied + 1:
        raise JournalGap(applied, sequence)
    return True


class Journal(Protocol):
    # False when append keeps nothing: callers may then skip building records (the state still changes only by
    # applying them, as AdmissionLedger.apply_report documents).
    keeps_records: bool

    async def append(self, record: journal_pb2.JournalRecord) -> AppendOutcome:
        """Put ``record`` at ``record.sequence``. Raises :class:`JournalFenced` if the journal does not end at the
        sequence before (nothing was written), :class:`JournalOutcomeUnknown` if the reply was lost."""
        ...

    def replay(self, after: int = 0) -> AsyncIterator[journal_pb2.JournalRecord]:
        """The records after sequence ``after``, in order, each with its sequence set; :class:`Unavailable` if
        the journal cannot be read."""
        ...

    async def read_snapshot(self) -> StoredSnapshot | None:
        """The stored snapshot, if any; :class:`Unavailable` if it cannot be read."""
        ...

    async def write_snapshot(self, sequence: int, state: bytes, chunks_before: int, new_chunk: bytes) -> None:
        """Store a snapshot of the state after record ``sequence`` with one more fingerprint chunk (``b""``: none),
        and drop the records it includes. Raises :class:`JournalFenced` (nothing written) unless the journal ends
        at ``sequence`` and holds ``chunks_before`` chunks, :class:`JournalOutcomeUnknown` if the reply was lost."""
        ...

    async def close(self) -> None: ...


class MemoryJournal:
    """Embedded mode: state lives only in the process."""

    keeps_records = False

    async def append(self, record: journal_pb2.JournalRecord) -> AppendOutcome:
        return AppendOutcome.APPENDED

    async def replay(self, after: int = 0) -> AsyncIterator[journal_pb2.JournalRecord]:
        return
        yield  # pragma: no cover  (makes this an async generator)

    async def read_snapshot(self) -> StoredSnapshot | None:
        return None

    async def write_snapshot(self, sequence: int, state: bytes, chunks_before: int, new_chunk: bytes) -> None:
        return None

    async def close(self) -> None:
        return None


class RedisJournal:
    keeps_records = True

    def __init__(self, url: str, *, job: str, timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS) -> None:
        import redis.asyncio as redis_asyncio
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        # No retries inside the client: a blindly re-sent write after a lost reply is exactly the uncertain
        # outcome the caller must resolve itself (the fence makes a re-send harmless, but the caller must know).
        self._client = redis_asyncio.Redis.from_url(
            url, socket_timeout=timeout_seconds, socket_connect_timeout=timeout_seconds, retry=Retry(NoBackoff(), 0)
        )
        self.key = f"knittrans:{job}:journal"
        self.end_key = f"{self.key}:end"
        self.snapshot_key = f"{self.key}:snapshot"
        self.chunks_key = f"{self.key}:fingerprints"
        self._append_script = self._client.register_script(_APPEND_SCRIPT)
        self._snapshot_script = self._client.register_script(_SNAPSHOT_SCRIPT)

    async def append(self, record: journal_pb2.JournalRecord) -> AppendOutcome:
        import redis

        sequence = record.sequence
        if sequence < 1:
            raise FailedPrecondition(f"journal record without a sequence: {record.WhichOneof('change')}")
        try:
            code, end = await self._append_script(keys=[self.key, self.end_key],
                                                  args=[sequence, record_bytes(record)])
        except redis.RedisError as exc:  # whatever failed, the script may have run: only the tail can tell
            raise JournalOutcomeUnknown(sequence, f"{type(exc).__name__}: {exc}") from exc
        if code == 1:
            return AppendOutcome.APPENDED
        if code == 2:
            return AppendOutcome.ALREADY_THERE
        violation = FenceViolation.DIFFERENT_RECORD if code == 3 else FenceViolation.ENDS_ELSEWHERE
        raise JournalFenced(sequence, int(end), violation)

    async def end(self) -> tuple[int, int]:
        """(the journal's last sequence, how many records the list holds)."""
        import redis

        try:
            async with self._client.pipeline(transaction=True) as pipe:
                last, length = await pipe.get(self.end_key).llen(self.key).execute()
        except redis.RedisError as exc:
            raise Unavailable(f"cannot read the Redis journal: {exc}") from exc
        length = int(length)
        return (length if last is None else int(last)), length

    async def replay(self, after: int = 0) -> AsyncIterator[journal_pb2.JournalRecord]:
        import redis

        last, length = await self.end()
        first = last - length  # the sequence before the list's first record
        if after < first:
            raise FailedPrecondition(f"journal records {after + 1}..{first} are no longer in the journal")
        start = after - first  # list index of record after + 1
        while start < length:
            try:
                chunk = await self._client.lrange(self.key, start, min(start + LOAD_CHUNK, length) - 1)
            except redis.RedisError as exc:
                raise Unavailable(f"cannot read the Redis journal: {exc}") from exc
            for offset, raw in enumerate(chunk):
                record = journal_pb2.JournalRecord.FromString(raw)
                position = first + start + offset + 1
                if record.sequence == 0:  # written before appends were fenced
                    record.sequence = position
                elif record.sequence != position:
                    raise FailedPrecondition(f"journal record {record.sequence} is at position {position}")
                yield record
            if not chunk:
                return
            start += len(chunk)

    async def read_snapshot(self) -> StoredSnapshot | None:
        import redis

        try:
            async with self._client.pipeline(transaction=True) as pipe:
                state, chunks = await pipe.get(self.snapshot_key).lrange(self.chunks_key, 0, -1).execute()
        except redis.RedisError as exc:
            raise Unavailable(f"cannot read the Redis journal's snapshot: {exc}") from exc
        return None if state is None else StoredSnapshot(state=state, chunks=chunks)

    async def write_snapshot(self, sequence: int, state: bytes, chunks_before: int, new_chunk: bytes) -> None:
        import redis

        try:
            code, end = await self._snapshot_script(
                keys=[self.key, self.end_key, self.snapshot_key, self.chunks_key],
                args=[sequence, state, chunks_before, new_chunk])
        except redis.RedisError as exc:
            raise JournalOutcomeUnknown(sequence, f"snapshot: {type(exc).__name__}: {exc}") from exc
        if code != 1:
            violation = FenceViolation.ENDS_ELSEWHERE if code == 4 else FenceViolation.OTHER_CHUNKS
            raise JournalFenced(sequence, int(end), violation)

    async def close(self) -> None:
        await self._client.aclose()


def open_journal(state: str, *, job: str, timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS) -> Journal:
    if state in ("", "memory"):
        return MemoryJournal()
    if state.startswith(("redis://", "rediss://", "unix://")):
        return RedisJournal(state, job=job, timeout_seconds=timeout_seconds)
    raise ConfigError(f"must be 'memory' or a redis:// URL, got {state!r}", field="state")
