"""Ring bookkeeping: slots, tickets, TP releases, back-pressure, segment growth and cleanup; in-order acks."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from knittrans.errors import FailedPrecondition, InvalidArgument
from knittrans.reorg.ring import Released, RingCore, SharedMemoryRing
from knittrans.reorg.rounds import RankProgress
from knittrans.reorg.sidecar import DeliveryTracker
from knittrans.shm import AttachedSegment, list_segments, segment_prefix


def test_a_slot_is_free_again_only_when_every_tp_rank_released_it() -> None:
    core: RingCore[str] = RingCore(slots=2, tp=3)
    a, b = core.take(), core.take()
    assert (a, b) == (0, 1) and core.take() is None  # full
    t1, _ = core.publish(a, lambda t: f"d{t}")
    core.publish(b, lambda t: f"d{t}")
    assert core.occupied == 2
    assert core.release(t1, 0) == Released(descriptor="d1", freed=False)
    assert core.release(t1, 0) == Released(descriptor=None, freed=False)  # twice is a no-op
    assert not core.release(t1, 2).freed
    assert core.take() is None
    assert core.release(t1, 1) == Released(descriptor="d1", freed=True)
    assert core.take() == a
    assert core.release(99, 0) == Released(descriptor=None, freed=False)  # unknown tickets are no-ops
    with pytest.raises(InvalidArgument):
        core.release(t1, 3)


def test_every_tp_rank_gets_every_ticket_in_order_from_where_it_stands() -> None:
    core: RingCore[str] = RingCore(slots=3, tp=2)
    for _ in range(3):
        core.publish(core.take(), lambda t: f"d{t}")
    assert core.next_after(0, 0) == (1, "d1")
    core.release(1, 0)
    assert core.next_after(0, 0) == (2, "d2")  # a restarted rank skips what it released
    assert core.next_after(0, 1) == (1, "d1")
    assert core.next_after(3, 1) is None


def test_publishing_a_slot_not_being_filled_fails() -> None:
    core: RingCore[str] = RingCore(slots=1, tp=1)
    with pytest.raises(FailedPrecondition):
        core.publish(0, lambda t: "x")
    slot = core.take()
    core.abandon(slot)
    assert core.take() == slot


@settings(max_examples=60, deadline=None)
@given(slots=st.integers(1, 4), tp=st.integers(1, 3), actions=st.lists(st.integers(0, 10), max_size=60))
def test_ring_invariants_under_random_use(slots, tp, actions) -> None:
    core: RingCore[int] = RingCore(slots=slots, tp=tp)
    released: dict[int, set[int]] = {}
    for action in actions:
        if action < 4:
            slot = core.take()
            if slot is not None:
                ticket, _ = core.publish(slot, lambda t: t)
                released[ticket] = set()
        else:
            rank = action % tp
            found = core.next_after(0, rank)
            if found is not None:
                ticket, _ = found
                released[ticket].add(rank)
                freed = core.release(ticket, rank).freed
                assert freed == (released[ticket] == set(range(tp)))
        outstanding = [t for t, ranks in released.items() if ranks != set(range(tp))]
        assert core.occupied == len(outstanding) <= slots
        assert core.outstanding == len(outstanding)


def test_delivery_is_acknowledged_in_sequence_order() -> None:
    tracker = DeliveryTracker()
    assert tracker.expect(1, 2) == []
    assert tracker.expect(2, 1) == []
    assert tracker.released(2) == []  # 1 is still open
    assert tracker.released(1) == []
    assert tracker.released(1) == [1, 2]
    assert tracker.expect(3, 0) == [3]  # an assignment without micro-batches is delivered at once
    with pytest.raises(InvalidArgument):
        tracker.expect(3, 1)


async def test_full_ring_blocks_until_released_and_segments_grow_and_vanish() -> None:
    prefix = segment_prefix(f"test-{uuid.uuid4().hex[:8]}", "ring")
    created: list[int] = []
    ring: SharedMemoryRing[str] = SharedMemoryRing(slots=1, tp=2, prefix=prefix,
                                                   on_segment_created=lambda buf: created.append(buf.nbytes))
    try:
        lease = await ring.acquire(100)
        lease.array[:5] = [1, 2, 3, 4, 5]
        await ring.publish(lease, lambda t: f"{lease.segment}#{t}")
        attached = AttachedSegment(lease.segment)
        assert bytes(attached.buf[:5]) == b"\x01\x02\x03\x04\x05"
        attached.close()

        waiting = asyncio.create_task(ring.acquire(3 << 20))  # back-pressure: no free slot
        await asyncio.sleep(0.05)
        assert not waiting.done()
        assert await ring.next_after(0, 0, timeout=1) == f"{lease.segment}#1"
        await ring.release(1, 0)
        await asyncio.sleep(0.05)
        assert not waiting.done()
        await ring.release(1, 1)
        bigger = await asyncio.wait_for(waiting, timeout=2)
        assert bigger.segment != lease.segment and bigger.array.nbytes >= 3 << 20  # a new, larger generation
        assert list_segments(prefix) == [bigger.segment]
        assert len(created) == 2
        assert await ring.next_after(1, 0, timeout=0.05) is None  # nothing published yet
    finally:
        await ring.close()
    assert list_segments(prefix) == []


async def test_a_new_ring_removes_a_crashed_predecessors_segments() -> None:
    from knittrans.shm import OwnedSegment

    prefix = segment_prefix(f"test-{uuid.uuid4().hex[:8]}", "ring")
    OwnedSegment(f"{prefix}s0-g1", 4096)  # left behind: nobody unlinks it
    assert list_segments(prefix)
    ring: SharedMemoryRing[str] = SharedMemoryRing(slots=2, tp=1, prefix=prefix)
    assert list_segments(prefix) == []
    await ring.close()


def test_withdrawn_tickets_are_never_handed_out_again_and_free_once_their_holders_release_them() -> None:
    core: RingCore[tuple[int, int]] = RingCore(slots=3, tp=2)
    for key in ((1, 0), (1, 1), (2, 0)):
        core.publish(core.take(), lambda t, k=key: k)
    for rank in (0, 1):  # both ranks were handed the first two tickets
        for ticket in (1, 2):
            core.hand_out(ticket, rank)
    core.release(1, 0)
    core.release(1, 1)
    assert core.withdraw(lambda key: key[0] >= 1, restarted=1) == 2  # tickets 2 and 3
    assert core.next_after(0, 0) is None and core.next_after(0, 1) is None
    # Rank 1 restarted: its old process holds nothing. Ticket 3 was never handed to rank 0: its slot is free.
    assert core.occupied == 1
    assert core.release(2, 0) == Released(descriptor=None, freed=True)  # a withdrawn release counts for nothing
    assert core.occupied == 0


def test_a_rank_that_asks_past_a_withdrawn_ticket_never_received_it() -> None:
    core: RingCore[int] = RingCore(slots=2, tp=1)
    for _ in range(2):
        core.publish(core.take(), lambda t: t)
    core.hand_out(1, 0)
    core.hand_out(2, 0)  # the answer was lost on its way
    core.withdraw(lambda d: True, restarted=99)
    assert core.occupied == 2
    assert core.forget_unreceived(1, 0)
    assert core.occupied == 1
    core.publish(core.take(), lambda t: t, skip=frozenset())
    assert core.next_after(1, 0) == (3, 3)


def test_rank_progress_sees_restarts_and_who_skips_what_in_a_new_round() -> None:
    ranks = RankProgress()
    assert not ranks.called_from(0, "a") and not ranks.called_from(1, "b")
    assert not ranks.called_from(0, "a") and not ranks.called_from(0, "")
    ranks.released(0, 1, last_in_minibatch=True)
    ranks.released(0, 2, last_in_minibatch=False)
    ranks.released(1, 1, last_in_minibatch=False)
    assert ranks.partway == {0, 1}
    assert ranks.called_from(1, "b2")  # a new process of TP rank 1
    assert ranks.rewind([1, 2]) == {1: frozenset({0}), 2: frozenset()}
    assert ranks.partway == frozenset()
