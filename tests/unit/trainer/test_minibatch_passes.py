"""The pass bookkeeping of :class:`knittrans.trainer.MiniBatch` (``mini_batches(passes=n)``), against a naive
reference: a feed that hands out one mini-batch's micro-batches once, records what is taken, copied and
released, and can start a delivery round (a TP rank's restart) at a chosen moment.

The reference: every pass iterated to its end yields the micro-batches 0..k-1 in order, with the bytes pass 0
yielded; each is taken from the feed once and released once; the last one's slot is released only when the
last pass ends (or the mini-batch is drained or restarted); a restart during any pass raises MiniBatchRestarted
and releases everything held.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from knittrans.errors import FailedPrecondition, InvalidArgument, MiniBatchRestarted
from knittrans.trainer.batches import MiniBatch, MiniBatchFeed, Staged
from knittrans.trainer.descriptor import MicroBatchDescriptor


def descriptor(index: int, count: int) -> MicroBatchDescriptor:
    return MicroBatchDescriptor(
        ticket=index + 1, incarnation="i", sequence=7, train_batch_index=1, minibatch_index=2, num_minibatches=4,
        train_version=1, microbatch_index=index, num_microbatches=count, last_in_minibatch=index == count - 1,
        minibatch_loss_tokens=10, microbatch_loss_tokens=1, segment="seg", slot=index, used_bytes=0, tensors=(),
        role="backbone", dp_rank=0, cp_rank=0, cp=1, tp=1)


class Sidecar:
    """One mini-batch of ``count`` micro-batches, each a slot whose bytes the sidecar reuses once released."""

    def __init__(self, count: int, *, restart_after_yields: int | None = None) -> None:
        self.count = count
        self.slots = [bytearray(f"micro-{i}".encode()) for i in range(count)]
        self.staged = [Staged(descriptor=descriptor(i, count), tensors={"bytes": self.slots[i]}) for i in range(count)]
        self.taken = 1  # the first is handed to the MiniBatch by the client
        self.released: list[int] = []
        self.rounds = 0
        self.restart_after_yields = restart_after_yields
        self.yields = 0

    def take_next_of(self, sequence: int) -> Staged:
        assert sequence == 7
        if self.rounds:
            raise MiniBatchRestarted("restarted", sequence=sequence)
        assert self.taken < self.count, "took past the end of the mini-batch"
        self.taken += 1
        return self.staged[self.taken - 1]

    def release(self, staged: Staged) -> None:
        if staged.released:
            return
        staged.released = True
        index = staged.descriptor.microbatch_index
        self.released.append(index)
        self.slots[index][:] = b"reused!!"  # the sidecar fills the slot with the next micro-batch

    def own(self, staged: Staged) -> None:
        if not staged.owned:
            staged.tensors = {"bytes": bytes(staged.tensors["bytes"])}
            staged.owned = True

    def ready(self, staged: Staged) -> None:
        self.yields += 1
        if self.restart_after_yields is not None and self.yields > self.restart_after_yields:
            self.rounds += 1  # a TP rank restarted: a new delivery round began

    def feed(self, completed: list[int]) -> MiniBatchFeed:
        return MiniBatchFeed(take_next_of=self.take_next_of, ready_for_use=self.ready, release=self.release,
                             complete=lambda mini: completed.append(mini.sequence), context=lambda s: None,  # type: ignore[arg-type,return-value]
                             own=self.own, restarted_since=lambda rounds_before: self.rounds > rounds_before)


def expected(count: int) -> list[bytes]:
    return [f"micro-{i}".encode() for i in range(count)]


@settings(max_examples=200, deadline=None)
@given(count=st.integers(1, 6), passes=st.integers(1, 4), data=st.data())
def test_every_full_pass_yields_the_same_micro_batches_each_taken_and_released_once(count: int, passes: int,
                                                                                    data: st.DataObject) -> None:
    sidecar = Sidecar(count)
    completed: list[int] = []
    mini = MiniBatch(sidecar.feed(completed), sidecar.staged[0], passes=passes)
    # Each pass is left after a random number of micro-batches (count: to its end); the last pass always ends.
    stops = [data.draw(st.integers(0, count)) for _ in range(passes - 1)] + [count]
    for number, stop in enumerate(stops):
        seen: list[bytes] = []
        micros = iter(mini)  # a pass left after 0 micro-batches was begun all the same
        for micro in micros if stop else ():
            seen.append(bytes(micro["bytes"]))
            if len(seen) == stop < count:
                break
        assert seen == expected(count)[:stop]
        if number < passes - 1:
            assert count - 1 not in sidecar.released  # the last slot is held while passes remain
            with pytest.raises(FailedPrecondition):
                mini.complete()
    assert sorted(sidecar.released) == list(range(count))  # each released exactly once, the last after the end
    assert sidecar.released[-1] == count - 1
    assert sidecar.taken == count
    mini.complete()
    assert completed == [7]
    with pytest.raises(FailedPrecondition):
        iter(mini)  # no pass beyond those asked for
    mini.drain()
    assert sorted(sidecar.released) == list(range(count))


@settings(max_examples=100, deadline=None)
@given(count=st.integers(1, 6), passes=st.integers(2, 4), data=st.data())
def test_a_restart_in_any_pass_raises_and_releases_everything(count: int, passes: int, data: st.DataObject) -> None:
    # A round that begins during the very last micro-batch of the last pass is past it: the step is taken (as
    # with one pass, where a restart after the last micro-batch was taken does not reach the mini-batch).
    restart_after = data.draw(st.integers(0, count * passes - 2))
    sidecar = Sidecar(count, restart_after_yields=restart_after)
    mini = MiniBatch(sidecar.feed([]), sidecar.staged[0], passes=passes)
    yielded = 0
    with pytest.raises(MiniBatchRestarted) as raised:
        for _ in range(passes):
            for _micro in mini:
                yielded += 1
    assert yielded == restart_after + 1  # the micro-batch during which the round began was the last one
    assert raised.value.sequence == 7 and raised.value.minibatch_index == 2
    assert mini.restarted
    mini.drain()
    assert sidecar.taken == len(set(sidecar.released))
    assert len(sidecar.released) == len(set(sidecar.released))  # nothing released twice
    assert set(sidecar.released) == set(range(sidecar.taken))  # whatever was taken was given back


def test_a_mini_batch_never_iterated_is_drained_once_and_nothing_is_kept() -> None:
    sidecar = Sidecar(3)
    mini = MiniBatch(sidecar.feed([]), sidecar.staged[0], passes=3)
    mini.drain()
    assert sidecar.released == [0, 1, 2]
    assert not any(s.owned for s in sidecar.staged)  # nobody iterates it again: no copies


def test_a_later_pass_after_an_abandoned_first_takes_the_rest_once() -> None:
    sidecar = Sidecar(4)
    mini = MiniBatch(sidecar.feed([]), sidecar.staged[0], passes=2)
    first = iter(mini)
    assert bytes(next(first)["bytes"]) == b"micro-0"  # pass 0 left after one micro-batch
    assert [bytes(m["bytes"]) for m in mini] == expected(4)  # pass 1 still yields them all, from the copies
    assert sorted(sidecar.released) == [0, 1, 2, 3] and sidecar.taken == 4


def test_passes_must_be_a_positive_integer() -> None:
    sidecar = Sidecar(1)
    for passes in (0, -1, True, 1.5):
        with pytest.raises(InvalidArgument) as raised:
            MiniBatch(sidecar.feed([]), sidecar.staged[0], passes=passes)  # type: ignore[arg-type]
        assert raised.value.field == "passes"
