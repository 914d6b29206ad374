"""The ring of K shared-memory slots between a reorg sidecar and its TP ranks (DESIGN.md §6).

A slot holds one packed micro-batch in a segment of its own. The sidecar takes a free slot (waiting while
none is free: back-pressure, never dropped data), fills it, and publishes it under the next ticket. Every TP
rank receives every ticket in order and releases it; a slot is free again once all TP ranks released it.
A micro-batch larger than its slot's segment gets a new, larger segment (a new name, so a trainer never
confuses the generations); the old one is unlinked.

When a trainer rank restarts in the middle of a mini-batch, the sidecar *withdraws* what it published from that
mini-batch on (:meth:`RingCore.withdraw`) and publishes it again. A withdrawn ticket is never handed out again;
its slot is free once every TP rank that was handed it released it (a rank that asks for tickets after it never
received it, and a restarted rank's old process holds nothing).

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
    withdrawn: bool = False


@dataclass(frozen=True)
class Released(Generic[D]):
    """What a release did: ``descriptor`` is the released micro-batch when it counts (a live ticket this rank
    had not released yet), ``freed`` whether its slot is free again."""

    descriptor: D | None
    freed: bool


@dataclass
class RingCore(Generic[D]):
    """Slots and tickets of one ring: which slots are free, which tickets wait for which TP ranks."""

    slots: int
    tp: int
    _free: deque[int] = field(init=False)
    _filling: set[int] = field(init=False, default_factory=set)
    _published: OrderedDict[int, _Published[D]] = field(init=False, default_factory=OrderedDict)
    _last_ticket: int = field(init=False, default=0)
    _handed: dict[int, int] = field(init=False, default_factory=dict)  # TP rank -> the last ticket handed to it

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

    def publish(self, slot: int, build: Callable[[int], D], *, skip: frozenset[int] = frozenset()) -> tuple[int, D]:
        """Publish a filled slot under the next ticket; ``build(ticket)`` makes its descriptor. TP ranks in
        ``skip`` never get it (they already had all of its mini-batch); at least one rank must."""
        if slot not in self._filling:
            raise FailedPrecondition(f"slot {slot} is not being filled")
        pending = set(range(self.tp)) - skip
        if not pending:
            raise InvalidArgument("every TP rank would skip it", field="skip")
        ticket = self._last_ticket + 1
        descriptor = build(ticket)
        self._filling.remove(slot)
        self._published[ticket] = _Published(slot=slot, descriptor=descriptor, pending=pending)
        self._last_ticket = ticket
        return ticket, descriptor

    def release(self, ticket: int, tp_rank: int) -> Released[D]:
        """One TP rank is done with ``ticket``. Unknown tickets and repeated releases are no-ops; a withdrawn
        ticket only frees its slot."""
        if not 0 <= tp_rank < self.tp:
            raise InvalidArgument(f"must be in [0, {self.tp})", field="tp_rank")
        entry = self._published.get(ticket)
        if entry is None or tp_rank not in entry.pending:
            return Released(descriptor=None, freed=False)
        entry.pending.discard(tp_rank)
        counted = None if entry.withdrawn else entry.descriptor
        if entry.pending:
            return Released(descriptor=counted, freed=False)
        del self._published[ticket]
        self._free.append(entry.slot)
        return Released(descriptor=counted, freed=True)

    def next_after(self, after_ticket: int, tp_rank: int) -> tuple[int, D] | None:
        """The first live ticket after ``after_ticket`` that ``tp_rank`` has not released, if published."""
        for ticket, entry in self._published.items():
            if ticket > after_ticket and tp_rank in entry.pending and not entry.withdrawn:
                return ticket, entry.descriptor
        return None

    def hand_out(self, ticket: int, tp_rank: int) -> None:
        """``ticket`` was handed to ``tp_rank``: if it is withdrawn later, the rank still holds it."""
        self._handed[tp_rank] = max(self._handed.get(tp_rank, 0), ticket)

    def forget_unreceived(self, after_ticket: int, tp_rank: int) -> bool:
        """``tp_rank`` asks for tickets after ``after_ticket``, so it never received a withdrawn ticket past it
        (an answer that was lost on the way): it will not release those. Returns whether a slot came free."""
        freed = False
        for ticket in [t for t, e in self._published.items() if e.withdrawn and t > after_ticket]:
            freed |= self._drop(ticket, {tp_rank})
        if tp_rank in self._handed:
            self._handed[tp_rank] = min(self._handed[tp_rank], after_ticket)
        return freed

    def withdraw(self, first: Callable[[D], bool], *, restarted: int) -> int:
        """Withdraw every published ticket from the first whose descriptor satisfies ``first`` on: none is handed
        out again. A TP rank still holds one only if it was handed it, and ``restarted`` (a new process) holds
        none. Returns how many tickets were withdrawn."""
        start = next((t for t, e in self._published.items() if not e.withdrawn and first(e.descriptor)), None)
        if start is None:
            return 0
        withdrawn = [t for t, e in self._published.items() if t >= start and not e.withdrawn]
        for ticket in withdrawn:
            entry = self._published[ticket]
            entry.withdrawn = True
            holders = {r for r in entry.pending if r != restarted and self._handed.get(r, 0) >= ticket}
            self._drop(ticket, entry.pending - holders)
        self._handed.pop(restarted, None)
        return len(withdrawn)

    def _drop(self, ticket: int, ranks: set[int]) -> bool:
        entry = self._published[ticket]
        entry.pending -= ranks
        if entry.pending:
            return False
        del self._published[ticket]
        self._free.append(entry.slot)
        return True


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
        self._withdrawals = 0
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

    def _drop_segment(self, segment: OwnedSegment, *, unregister: bool = True) -> None:
        if unregister and self._removed is not None:
            try:
                self._removed(segment.buf)
            except Exception:
                logger.exception("could not unregister segment %s", segment.name)
        segment.unlink()

    async def abandon(self, lease: SlotLease) -> None:
        self._core.abandon(lease.slot)
        await self._notify()

    async def publish(self, lease: SlotLease, build: Callable[[int], D], *,
                      skip: frozenset[int] = frozenset()) -> D:
        _, descriptor = self._core.publish(lease.slot, build, skip=skip)
        await self._notify()
        return descriptor

    async def release(self, ticket: int, tp_rank: int) -> Released[D]:
        released = self._core.release(ticket, tp_rank)
        if released.freed:
            await self._notify()
        return released

    async def withdraw(self, first: Callable[[D], bool], *, restarted: int) -> int:
        """See :meth:`RingCore.withdraw`."""
        count = self._core.withdraw(first, restarted=restarted)
        self._withdrawals += 1
        await self._notify()
        return count

    async def finish(self) -> None:
        """The assignment source ended: waiters past the last ticket learn there is nothing more."""
        self._finished = True
        await self._notify()

    def peek(self, after_ticket: int, tp_rank: int) -> D | None:
        """The next descriptor for ``tp_rank`` if it is already published, without waiting."""
        found = self._core.next_after(after_ticket, tp_rank)
        return None if found is None else found[1]

    async def next_after(self, after_ticket: int, tp_rank: int, *, timeout: float) -> D | None:
        """The next descriptor for ``tp_rank``; None on timeout, after a withdrawal (the caller should learn of it
        at once) or when the ring finished or closed."""
        if not 0 <= tp_rank < self._core.tp:
            raise InvalidArgument(f"must be in [0, {self._core.tp})", field="tp_rank")
        withdrawals = self._withdrawals

        def ready() -> bool:
            return (self._closed or self._finished or self._withdrawals != withdrawals
                    or self._core.next_after(after_ticket, tp_rank) is not None)

        if self._core.forget_unreceived(after_ticket, tp_rank):
            await self._notify()
        async with self._changed:
            try:
                await asyncio.wait_for(self._changed.wait_for(ready), timeout=max(timeout, 0.0))
            except TimeoutError:
                return None
            found = self._core.next_after(after_ticket, tp_rank)
        if found is None:
            return None
        self._core.hand_out(found[0], tp_rank)
        return found[1]

    async def close(self, *, unregister: bool = True) -> None:
        """Unlink every segment; waiters wake up and get nothing. ``unregister=False`` leaves the segments
        registered with the store: a store call still in flight may write into them, and the store would make
        their unregistering wait for it."""
        self._closed = True
        for slot, segment in enumerate(self._segments):
            if segment is not None:
                self._drop_segment(segment, unregister=unregister)
                self._segments[slot] = None
        remove_segments(self._prefix)
        await self._notify()
