"""The admission service's hold on its job: one service per job name at a time (DESIGN.md §9).

With Redis state the lease is the key ``knittrans:<job>:lease``, set with ``NX`` and an expiry, whose value names
the holder (:class:`knittrans.job.Holder`). The service renews it every third of ``lease_ttl_seconds``. A second
service of the job is refused, naming the holder, while the lease lives; it may take the lease over at once only if
the holder ran on the same machine and its process is gone (a restart after a crash, as in a pod), else once the
holder stops renewing and the key expires. A holder that finds its key expired (Redis stalled or restarted past
the expiry) and nobody else holding it sets it again; one that finds another holder has lost the job and stops.
The journal's fenced appends keep the state whole even then: a stale writer cannot append past the journal.

With in-memory state the lease is a lock file in the job's run directory (:class:`knittrans.job.FileLease`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from dataclasses import dataclass, field

from knittrans.errors import Aborted, Unavailable
from knittrans.job import FileLease, Holder, JobLeaseHeld, job_run_directory

logger = logging.getLogger(__name__)

# KEYS: the lease key. ARGV: the value the caller expects there, the new value, the expiry (ms). Sets the lease if
# nobody holds it or it holds the expected value, and returns ""; else returns the holder's value.
_SWAP_SCRIPT = """
local current = redis.call('GET', KEYS[1])
if (not current) or current == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return ''
end
return current
"""
# KEYS: the lease key. ARGV: this holder's value. Deletes the lease only if it is still this holder's.
_RELEASE_SCRIPT = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


class JobLeaseLost(Aborted):
    """Another service took this service's job: this one must stop changing anything."""


def lease_key(job: str) -> str:
    return f"knittrans:{job}:lease"


def _value(holder: Holder, token: str) -> str:
    return f"{token} {holder.to_json()}"


def _holder_of(value: bytes | str) -> Holder | None:
    text = value.decode() if isinstance(value, bytes) else value
    return Holder.from_json(text.partition(" ")[2])


@dataclass
class RedisLease:
    """A held lease in Redis (see the module docstring); :meth:`keep` renews it until released or lost."""

    key: str
    value: str
    ttl_ms: int
    _client: object
    lost: asyncio.Event = field(default_factory=asyncio.Event)
    lost_to: Holder | None = None

    @classmethod
    async def claim(cls, url: str, *, job: str, ttl_seconds: float, timeout_seconds: float) -> RedisLease:
        import redis
        import redis.asyncio as redis_asyncio

        client = redis_asyncio.Redis.from_url(url, socket_timeout=timeout_seconds,
                                              socket_connect_timeout=timeout_seconds)
        key = lease_key(job)
        holder = Holder.this_process()
        value = _value(holder, uuid.uuid4().hex)
        ttl_ms = max(int(ttl_seconds * 1000), 1)
        swap = client.register_script(_SWAP_SCRIPT)
        try:
            expected = ""
            while True:
                current = await swap(keys=[key], args=[expected, value, ttl_ms])
                if not current:
                    break
                previous = _holder_of(current)
                if previous is None or not previous.provably_gone():
                    raise JobLeaseHeld(f"job {job!r}", previous, where=f"Redis key {key}")
                logger.warning("taking over job %r from %s, which is gone", job, previous.describe())
                expected = current.decode() if isinstance(current, bytes) else current
        except redis.RedisError as exc:
            await client.aclose()
            raise Unavailable(f"cannot claim job {job!r} in Redis: {exc}") from exc
        except BaseException:
            await client.aclose()
            raise
        logger.info("holding job %r (Redis key %s, expiry %d ms)", job, key, ttl_ms)
        return cls(key=key, value=value, ttl_ms=ttl_ms, _client=client)

    async def keep(self) -> None:
        """Renew every third of the expiry until cancelled; on loss, set :attr:`lost` and return."""
        import redis

        swap = self._client.register_script(_SWAP_SCRIPT)  # type: ignore[attr-defined]
        while True:
            await asyncio.sleep(self.ttl_ms / 3000)
            try:
                current = await swap(keys=[self.key], args=[self.value, self.value, self.ttl_ms])
            except redis.RedisError as exc:  # Redis stalls or restarts: try again, the expiry allows it
                logger.warning("cannot renew the job lease %s: %s", self.key, exc)
                continue
            if current:
                self.lost_to = _holder_of(current)
                who = self.lost_to.describe() if self.lost_to else "another process"
                logger.error("lost the job lease %s to %s: this service stops", self.key, who)
                self.lost.set()
                return

    async def release(self) -> None:
        import redis

        try:
            await self._client.register_script(_RELEASE_SCRIPT)(keys=[self.key], args=[self.value])  # type: ignore[attr-defined]
        except redis.RedisError as exc:  # it expires by itself
            logger.warning("cannot release the job lease %s: %s", self.key, exc)
        finally:
            await self._client.aclose()  # type: ignore[attr-defined]


class HeldJob:
    """The service's lease, whichever kind; :attr:`lost` is set if another service took the job."""

    def __init__(self, *, redis_lease: RedisLease | None = None, file_lease: FileLease | None = None) -> None:
        self._redis = redis_lease
        self._file = file_lease
        self._keeper: asyncio.Task | None = None
        self.lost = redis_lease.lost if redis_lease is not None else asyncio.Event()

    def start(self) -> None:
        if self._redis is not None and self._keeper is None:
            self._keeper = asyncio.create_task(self._redis.keep(), name="job-lease")

    def lost_error(self) -> JobLeaseLost:
        holder = self._redis.lost_to if self._redis is not None else None
        return JobLeaseLost(f"the job was taken by {holder.describe() if holder else 'another process'}")

    async def release(self) -> None:
        if self._keeper is not None:
            self._keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keeper
        if self._redis is not None:
            await self._redis.release()  # deletes the key only while it is still this service's
        if self._file is not None:
            self._file.release()
            with contextlib.suppress(OSError):
                self._file.path.parent.rmdir()  # only if no sidecar's socket is in it


async def claim_job(state: str, *, job: str, ttl_seconds: float, timeout_seconds: float) -> HeldJob:
    """Hold ``job`` for this service, or raise :class:`~knittrans.job.JobLeaseHeld` naming the live holder."""
    if state.startswith(("redis://", "rediss://", "unix://")):
        return HeldJob(redis_lease=await RedisLease.claim(state, job=job, ttl_seconds=ttl_seconds,
                                                          timeout_seconds=timeout_seconds))
    lease = FileLease.claim(job_run_directory(job) / "admission.lease", what=f"job {job!r}")
    return HeldJob(file_lease=lease)
