"""The ring of K shared-memory slots between a reorg sidecar and its TP ranks (DESIGN.md §6).

A slot holds one packed micro-batch in a segment of its own. The sidecar takes a free slot (waiting while
none is free: back-pressure, never dropped data), fills it, and publishes it under the next ticket. Every TP
rank receives every ticket in order and releases it; a slot is free again once all TP ranks released it.
A micro-batch larger than its slot's segment gets a new, larger segment (a new name, so a trainer never
confuses the generations); the old one is unlinked.

:class:`RingCore` is the bookkeeping alone (no memory, no waiting); :class:`SharedMemoryRing` adds the
segments and asyncio waiting. Everything runs on the sidecar's event loop; only the bytes of a slot being
filled are touched from a reader thread.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import numpy as np

from knittrans.errors import FailedPrecondition, InvalidArgument
from knittrans.shm import OwnedSegment, remove_segments

logger = logging.getLogger(__name__)

D = TypeVar("D")
SEGMENT_GRANULE = 1 << 20
GROWTH_FACTOR = 1.25


@dataclass
class _Published(Generic[D]):
    slot: int
    descriptor: D
    pending: set[int]


@dataclass
class RingCore(Generic[D]):
    """Slots and tickets of one ring: which slots are free, which tickets wait for which TP ranks."""

    slots: int
    tp: int
    _free: deque[int] = field(init=False)
    _filling: set[int] = field(init=False, default_factory=set)
    _published: OrderedDict[int, _Published[D]] = field(init=False, default_factory=OrderedDict)
    _last_ticket: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        for name in ("slots", "tp"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InvalidArgument(f"must be a positive integer, got {value!r}", field=name)
        # Last freed, first reused: a sidecar that needs few slots keeps reusing warm ones (their pages are mapped
        # in the sidecar and in every trainer rank), instead of faulting in every segment of the ring.
        self._free = deque(reversed(range(self.slots)))

    @property
    def occupied(self) -> int:
        """Slots being filled or holding a published micro-batch."""
        return self.slots - len(self._free)

    @property
    def last_ticket(self) -> int:
        return self._last_ticket

    @property
    def outstanding(self) -> int:
        """Published tickets not yet released by every TP rank."""
        return len(self._published)

    def take(self) -> int | None:
        """A free slot to fill, or None when the ring is full."""
        if not self._free:
            return None
        slot = self._free.pop()
        self._filling.add(slot)
        return slot

    def abandon(self, slot: int) -> None:
        """Give back a slot whose filling failed."""
        self._filling.remove(slot)
        self._free.append(slot)

    def publish(self, slot: int, build: Callable[[int], D]) -> tuple[int, D]:
        """Publish a filled slot under the next ticket; ``build(ticket)`` makes its descriptor."""
        if slot not in self._filling:
            raise FailedPrecondition(f"slot {slot} is not being filled")
        ticket = self._last_ticket + 1
        descriptor = build(ticket)
        self._filling.remove(slot)
        self._published[ticket] = _Published(slot=slot, descriptor=descriptor, pending=set(range(self.tp)))
        self._last_ticket = ticket
        return ticket, descriptor

    def release(self, ticket: int, tp_rank: int) -> D | None:
        """One TP rank is done with ``ticket``; returns its descriptor when that freed the slot. Unknown
        tickets and repeated releases are no-ops."""
        if not 0 <= tp_rank < self.tp:
            raise InvalidArgument(f"must be in [0, {self.tp})", field="tp_rank")
        entry = self._published.get(ticket)
        if entry is None or tp_rank not in entry.pending:
            return None
        entry.pending.discard(tp_rank)
        if entry.pending:
            return None
        del self._published[ticket]
        self._free.append(entry.slot)
        return entry.descriptor

    def next_after(self, after_ticket: int, tp_rank: int) -> tuple[int, D] | None:
        """The first ticket after ``after_ticket`` that ``tp_rank`` has not released, if published."""
        for ticket, entry in self._published.items():
            if ticket > after_ticket and tp_rank in entry.pending:
                return ticket, entry.descriptor
        return None


@dataclass
class SlotLease:
    """A slot being filled: write the micro-batch into ``array`` (uint8), then publish or abandon it."""

    slot: int
    segment: str
    array: np.ndarray


class SharedMemoryRing(Generic[D]):
    """K slots of named shared memory with back-pressure (see the module docstring)."""

    def __init__(
        self,
        *,
        slots: int,
        tp: int,
        prefix: str,
        tag: str = "",
        initial_slot_bytes: int = 0,
        on_segment_created: Callable[[memoryview], None] | None = None,
        on_segment_removed: Callable[[memoryview], None] | None = None,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self._core: RingCore[D] = RingCore(slots=slots, tp=tp)
        self._prefix = prefix
        # Names never repeat across runs of a sidecar (a trainer may still map a predecessor's segment).
        self._tag = f"{tag}-" if tag else ""
        self._segments: list[OwnedSegment | None] = [None] * slots
        self._generation = 0
        self._initial = initial_slot_bytes
        self._created = on_segment_created
        self._removed = on_segment_removed
        self._on_change = on_change
        self._changed = asyncio.Condition()
        self._finished = False
        self._closed = False
        removed = remove_segments(prefix)
        if removed:
            logger.warning("removed %d segments a previous sidecar left behind: %s", len(removed), removed[:4])

    @property
    def slots(self) -> int:
        return self._core.slots

    @property
    def tp(self) -> int:
        return self._core.tp

    @property
    def occupied(self) -> int:
        return self._core.occupied

    @property
    def published(self) -> int:
        return self._core.last_ticket

    @property
    def finished(self) -> bool:
        return self._finished

    @property
    def drained(self) -> bool:
        """The source ended and every published micro-batch was released."""
        return self._finished and self._core.outstanding == 0

    def segment_names(self) -> list[str]:
        return [s.name for s in self._segments if s is not None]

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()
        if self._on_change is not None:
            self._on_change()

    async def acquire(self, size: int) -> SlotLease:
        """A free slot of at least ``size`` bytes; waits while the ring is full."""
        async with self._changed:
            while (slot := self._core.take()) is None:
                if self._closed:
                    raise FailedPrecondition("the ring is closed")
                await self._changed.wait()
        try:
            segment = self._segment_for(slot, size)
        except BaseException:
            self._core.abandon(slot)
            raise
        if self._on_change is not None:
            self._on_change()
        return SlotLease(slot=slot, segment=segment.name, array=np.frombuffer(segment.buf, dtype=np.uint8))

    def _segment_for(self, slot: int, size: int) -> OwnedSegment:
        current = self._segments[slot]
        if current is not None and current.size >= size:
            return current
        wanted = max(size, self._initial, int(current.size * GROWTH_FACTOR) if current is not None else 0, 1)
        wanted = -(-wanted // SEGMENT_GRANULE) * SEGMENT_GRANULE
        if current is not None:
            self._drop_segment(current)
        self._generation += 1
        segment = OwnedSegment(f"{self._prefix}{self._tag}s{slot}-g{self._generation}", wanted)
        if self._created is not None:
            try:
                self._created(segment.buf)
            except BaseException:
                segment.unlink()
                raise
        self._segments[slot] = segment
        logger.debug("slot %d has segment %s of %d bytes", slot, segment.name, wanted)
        return segment

    def _drop_segment(self, segment: OwnedSegment) -> None:
        if self._removed is not None:
            try:
                self._removed(segment.buf)
            except Exception:
                logger.exception("could not unregister segment %s", segment.name)
        segment.unlink()

    async def abandon(self, lease: SlotLease) -> None:
        self._core.abandon(lease.slot)
        await self._notify()

    async def publish(self, lease: SlotLease, build: Callable[[int], D]) -> D:
        _, descriptor = self._core.publish(lease.slot, build)
        await self._notify()
        return descriptor

    async def release(self, ticket: int, tp_rank: int) -> D | None:
        """Returns the descriptor when this release freed its slot."""
        freed = self._core.release(ticket, tp_rank)
        if freed is not None:
            await self._notify()
        return freed

    async def finish(self) -> None:
        """The assignment source ended: waiters past the last ticket learn there is nothing more."""
        self._finished = True
        await self._notify()

    def peek(self, after_ticket: int, tp_rank: int) -> D | None:
        """The next descriptor for ``tp_rank`` if it is already published, without waiting."""
        found = self._core.next_after(after_ticket, tp_rank)
        return None if found is None else found[1]

    async def next_after(self, after_ticket: int, tp_rank: int, *, timeout: float) -> D | None:
        """The next descriptor for ``tp_rank``; None on timeout or when the ring finished or closed."""
        if not 0 <= tp_rank < self._core.tp:
            raise InvalidArgument(f"must be in [0, {self._core.tp})", field="tp_rank")

        def ready() -> bool:
            return self._closed or self._finished or self._core.next_after(after_ticket, tp_rank) is not None

        async with self._changed:
            try:
                await asyncio.wait_for(self._changed.wait_for(ready), timeout=max(timeout, 0.0))
            except TimeoutError:
                return None
            found = self._core.next_after(after_ticket, tp_rank)
        return None if found is None else found[1]

    async def close(self) -> None:
        """Unlink every segment; waiters wake up and get nothing."""
        self._closed = True
        for slot, segment in enumerate(self._segments):
            if segment is not None:
                self._drop_segment(segment)
                self._segments[slot] = None
        remove_segments(self._prefix)
        await self._notify()
