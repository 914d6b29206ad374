"""Where admission state changes are recorded before they take effect.

``memory`` keeps nothing (the embedded default: a restart starts empty). ``redis://`` appends every record
to one Redis list with a single RPUSH, which is atomic, so a crash leaves either the whole record or none;
AOF with ``appendfsync always`` on the server makes an acknowledged append durable.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Protocol

from knittrans.errors import ConfigError, Unavailable
from knittrans.v1 import journal_pb2

logger = logging.getLogger(__name__)

LOAD_CHUNK = 1000


class Journal(Protocol):
    # False when append keeps nothing: callers may then skip building records (the state still changes only by
    # applying them, as AdmissionLedger.apply_report documents).
    keeps_records: bool

    async def append(self, record: journal_pb2.JournalRecord) -> None: ...

    def replay(self) -> AsyncIterator[journal_pb2.JournalRecord]: ...

    async def close(self) -> None: ...


class MemoryJournal:
    """Embedded mode: state lives only in the process."""

    keeps_records = False

    async def append(self, record: journal_pb2.JournalRecord) -> None:
        return None

    async def replay(self) -> AsyncIterator[journal_pb2.JournalRecord]:
        return
        yield  # pragma: no cover  (makes this an async generator)

    async def close(self) -> None:
        return None


class RedisJournal:
    keeps_records = True

    def __init__(self, url: str, *, job: str) -> None:
        import redis.asyncio as redis_asyncio

        self._client = redis_asyncio.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=5)
        self.key = f"knittrans:{job}:journal"

    async def append(self, record: journal_pb2.JournalRecord) -> None:
        import redis

        try:
            await self._client.rpush(self.key, record.SerializeToString())
        except redis.RedisError as exc:
            raise Unavailable(f"cannot append to the Redis journal: {exc}") from exc

    async def replay(self) -> AsyncIterator[journal_pb2.JournalRecord]:
        start = 0
        while True:
            chunk = await self._client.lrange(self.key, start, start + LOAD_CHUNK - 1)
            for raw in chunk:
                yield journal_pb2.JournalRecord.FromString(raw)
            if len(chunk) < LOAD_CHUNK:
                return
            start += LOAD_CHUNK

    async def length(self) -> int:
        return int(await self._client.llen(self.key))

    async def close(self) -> None:
        await self._client.aclose()


def open_journal(state: str, *, job: str) -> Journal:
    if state in ("", "memory"):
        return MemoryJournal()
    if state.startswith(("redis://", "rediss://", "unix://")):
        return RedisJournal(state, job=job)
    raise ConfigError(f"must be 'memory' or a redis:// URL, got {state!r}", field="state")
