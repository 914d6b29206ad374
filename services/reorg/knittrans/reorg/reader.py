"""Reads one micro-batch's units through the unit store: exactly the planned bytes, in one batched call,
straight into the slot where the packed layout allows (see :mod:`knittrans.reorg.packing`).

Counts the bytes the plan needed against the bytes the store reports it moved, so over-reading would show.
Transient store errors are retried with back-off; a missing unit is not (the plan names only units the
admission service still holds, so it means lost data and must surface).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from knittrans.errors import StoreError, StoreFullError
from knittrans.reorg.packing import Destination, PackLayout
from knittrans.retry import Backoff, RetryPolicy
from knittrans.store.protocol import UnitRead, UnitStore

logger = logging.getLogger(__name__)
# Transient store errors on reads and size queries: retried for the reader's retry_seconds.
STORE_RETRY = RetryPolicy(initial=0.05, cap=2.0)

_SCRATCH_GRANULE = 1 << 20


@dataclass(frozen=True, kw_only=True)
class ReadOutcome:
    bytes_needed: int
    bytes_read: int  # what the store moved
    seconds: float
    attempts: int


class MicroBatchReader:
    """One reader per sidecar; not thread-safe (the sidecar reads one micro-batch at a time)."""

    def __init__(
        self,
        store: UnitStore,
        *,
        retry_seconds: float = 30.0,
        clock: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        self._store = store
        self._retry_seconds = retry_seconds
        self._clock = clock
        self._abandoned = threading.Event()
        self._sleep = sleep or self._abandoned.wait
        self._scratch = np.zeros(0, dtype=np.uint8)
        self.read_calls = 0

    @property
    def store(self) -> UnitStore:
        return self._store

    def scratch(self, size: int) -> np.ndarray:
        """The scratch buffer, grown (and registered with the store) to hold at least ``size`` bytes."""
        if self._scratch.nbytes < size:
            if self._scratch.nbytes:
                self._store.unregister_buffer(self._scratch)
            self._scratch = np.zeros(-(-size // _SCRATCH_GRANULE) * _SCRATCH_GRANULE, dtype=np.uint8)
            self._store.register_buffer(self._scratch)
        return self._scratch

    def read(self, layout: PackLayout, slot: np.ndarray) -> ReadOutcome:
        """Read every placement of ``layout`` into ``slot`` (uint8) or the scratch buffer, in one batched call."""
        scratch = self.scratch(layout.scratch_bytes)
        reads = []
        for placement in layout.reads:
            target = slot if placement.destination is Destination.SLOT else scratch
            view = target[placement.offset : placement.offset + placement.byte_length]
            reads.append(UnitRead.of(placement.key, view, placement.ranges))
        started = self._clock()
        backoff = Backoff(replace(STORE_RETRY, deadline=self._retry_seconds), clock=self._clock)
        attempts = 0
        before = self._store.stats.snapshot().moved_bytes  # failed attempts' bytes count too
        while True:
            attempts += 1
            try:
                counts = self._store.get_many_into(reads) if reads else []
                break
            except StoreFullError:
                raise
            except StoreError as error:
                delay = backoff.next_delay()
                if delay is None or self._abandoned.is_set():
                    raise
                logger.warning("store read failed (%s); retrying in %.2fs", error, delay)
                self._sleep(delay)
                if self._abandoned.is_set():
                    raise
        moved = self._store.stats.snapshot().moved_bytes - before
        if reads:
            self.read_calls += 1
        for placement, count in zip(layout.reads, counts, strict=True):
            if count != placement.byte_length:
                raise StoreError(f"read {count} bytes, the plan needs {placement.byte_length}", field=placement.key)
        return ReadOutcome(bytes_needed=layout.needed_bytes, bytes_read=moved, seconds=self._clock() - started,
                           attempts=attempts)

    def abandon(self) -> None:
        """Retry no more: the sidecar is stopping. A read that fails from now on raises its error at once."""
        self._abandoned.set()

    def close(self) -> None:
        if self._scratch.nbytes:
            self._store.unregister_buffer(self._scratch)
            self._scratch = np.zeros(0, dtype=np.uint8)
