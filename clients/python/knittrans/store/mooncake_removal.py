"""Removing Mooncake units that readers still lease, without making the deleter wait.

The master refuses to remove a leased unit (-706) until its lease ends (``default_kv_lease_ttl``). The store
hands such units to :class:`LeasedRemovals`, whose background thread retries until they are gone; meanwhile the
store treats them as deleted. A rewrite of such a key removes the old unit itself first, waiting for its lease,
so that the background removal cannot take the new unit.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

from knittrans.errors import StoreError
from knittrans.retry import Backoff, RetryPolicy
from knittrans.store.mooncake_errors import MooncakeCode, mooncake_error
from knittrans.types import UnitKey

logger = logging.getLogger(__name__)

LEASED = (MooncakeCode.OBJECT_HAS_LEASE, MooncakeCode.OBJECT_HAS_REPLICATION_TASK)
_REMOVED = (MooncakeCode.OK, MooncakeCode.OBJECT_NOT_FOUND)
# Waiting for leases on deleted units to expire.
_LEASE_RETRY = RetryPolicy(initial=0.05, cap=1.0)


class LeasedRemovals:
    """The units deleted while leased, until they are gone from the store.

    ``client`` is the store's ``MooncakeDistributedStore`` and ``client_lock`` the lock that serialises its
    calls; ``lease_retry_seconds`` bounds how long a rewrite or :meth:`drain` waits for a lease."""

    def __init__(self, client: Any, client_lock: threading.RLock, lease_retry_seconds: float) -> None:
        self._client = client
        self._client_lock = client_lock
        self._lease_retry_seconds = lease_retry_seconds
        # Keys deleted while leased, removed by the reaper thread; guarded by _changed.
        self._pending: dict[UnitKey, None] = {}
        self._changed = threading.Condition(threading.Lock())
        self._reaper: threading.Thread | None = None
        self._stop_reaping = False
        # The reaper's last round got no answer about any key (the master is gone or unreachable): waiting for
        # leases to end is then pointless, and a stopping process must not wait out the whole bound for it.
        self._unreachable = False

    def pending(self, keys: Iterable[UnitKey]) -> set[UnitKey]:
        """Which of ``keys`` are deleted but not removed yet (to the store, they no longer exist)."""
        with self._changed:
            return {key for key in keys if key in self._pending}

    def count(self) -> int:
        with self._changed:
            return len(self._pending)

    def schedule(self, keys: Sequence[UnitKey]) -> None:
        with self._changed:
            self._pending.update(dict.fromkeys(keys))
            self._unreachable = False  # until the reaper asks about these too
            if self._reaper is None:  # the reaper clears this under the same lock when it ends
                self._reaper = threading.Thread(target=self._reap, name="knittrans-mooncake-removal", daemon=True)
                self._reaper.start()
            self._changed.notify_all()
        logger.debug("%d deleted units are leased by readers; removing them in the background", len(keys))

    def wait_removed(self, keys: Sequence[UnitKey]) -> None:
        wanted = set(keys)
        with self._changed:
            self._changed.wait_for(lambda: wanted.isdisjoint(self._pending) or self._unreachable,
                                   timeout=self._lease_retry_seconds)
            still = sorted(wanted.intersection(self._pending))
            if still and self._unreachable:
                raise StoreError(f"{len(still)} deleted units cannot be removed: the store does not answer",
                                 field=still[0])
            if still:
                raise StoreError(f"{len(still)} deleted units are still leased after "
                                 f"{self._lease_retry_seconds:.1f}s", field=still[0])

    def remove_before_rewrite(self, keys: Sequence[UnitKey]) -> None:
        """Rewriting a key deleted under a lease: remove the old unit first (waiting for its lease), so the
        background removal cannot take the new one."""
        with self._changed:
            mine = [key for key in keys if key in self._pending]
            for key in mine:
                del self._pending[key]
        remaining = mine
        backoff = Backoff(replace(_LEASE_RETRY, deadline=self._lease_retry_seconds))
        while remaining:
            with self._client_lock:
                codes = self._client.batch_remove(remaining, False)
            for key, code in zip(remaining, codes, strict=True):
                if code not in _REMOVED and code not in LEASED:
                    self.schedule(remaining)
                    raise mooncake_error(code, key=key, operation="batch_remove")
            remaining = [k for k, c in zip(remaining, codes, strict=True) if c in LEASED]
            if remaining and not backoff.sleep():
                self.schedule(remaining)
                raise StoreError(
                    f"cannot rewrite {len(remaining)} deleted units still leased after "
                    f"{self._lease_retry_seconds:.1f}s",
                    field=remaining[0],
                )

    def drain(self) -> None:
        """Give leased removals up to ``lease_retry_seconds`` to finish (no time at all once the store stops
        answering), then stop the reaper."""
        with self._changed:
            self._changed.wait_for(lambda: not self._pending or self._unreachable, timeout=self._lease_retry_seconds)
            left = len(self._pending)
            self._stop_reaping = True
            self._changed.notify_all()
            reaper = self._reaper
        if reaper is not None:
            reaper.join()
        if left and self._unreachable:
            logger.warning("%d deleted units stay in the store: it does not answer", left)
        elif left:
            logger.warning("%d deleted units were still leased after %.1fs and stay in the store", left,
                           self._lease_retry_seconds)

    def _reap(self) -> None:
        """Retry removing leased units, with back-off, until none is left or close() gives up on them."""
        delays = _LEASE_RETRY.delays()
        while True:
            with self._changed:
                if self._stop_reaping or not self._pending:
                    self._reaper = None
                    return
            with self._client_lock:  # taken before reading the pending keys: a rewrite pops its keys under it
                with self._changed:
                    keys = list(self._pending)
                if not keys:
                    continue
                try:
                    codes = self._client.batch_remove(keys, False)
                except Exception:  # a transient client failure must not kill the thread that owes removals
                    logger.exception("mooncake batch_remove of %d deleted units failed; retrying", len(keys))
                    codes = [MooncakeCode.INTERNAL_ERROR] * len(keys)
            unexpected = [(k, c) for k, c in zip(keys, codes, strict=True) if c not in _REMOVED and c not in LEASED]
            if unexpected:
                logger.warning("removing %d deleted units failed (first %r: %s); retrying", len(unexpected),
                               unexpected[0][0], mooncake_error(unexpected[0][1], key=unexpected[0][0],
                                                                 operation="batch_remove"))
            with self._changed:
                for key, code in zip(keys, codes, strict=True):
                    if code in _REMOVED:
                        self._pending.pop(key, None)
                self._unreachable = len(unexpected) == len(keys)
                self._changed.notify_all()  # wakes drain() and wait_removed()
                if not self._pending:
                    continue
                self._changed.wait(timeout=next(delays))
