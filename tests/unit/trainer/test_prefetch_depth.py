"""The prefetch thread stages at most ``prefetch`` micro-batches ahead of the training loop (plus the one it holds
while it waits for room), hands them over in the sidecar's order, and a stop ends it while it waits for room.

The sidecar is a stand-in for its RPC surface that publishes an endless mini-batch at once; the stager records
what it staged. The oracle is counted from outside: after the loop took k micro-batches, the thread staged
exactly k + prefetch + 1 of them, whatever the depth and however the takes are spaced."""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from knittrans.trainer.descriptor import MicroBatchDescriptor
from knittrans.trainer.prefetch import Prefetcher
from knittrans.trainer.settings import DeliveryMode, TrainerSettings, TrainerStats
from knittrans.v1 import reorg_service_pb2 as pb
from tests.unit.trainer.test_release_thread import Closed

ENDLESS = 10**6


class PublishingSidecar:
    """Publishes micro-batch ``after_ticket`` + 1 of one endless mini-batch as soon as it is asked for."""

    def __init__(self) -> None:
        self.closed = threading.Event()

    def NextMicroBatch(self, request: pb.NextMicroBatchRequest, timeout: float | None = None
                       ) -> pb.NextMicroBatchResponse:
        if self.closed.is_set():
            raise Closed()
        ticket = request.after_ticket + 1
        descriptor = MicroBatchDescriptor(
            ticket=ticket, incarnation="i", sequence=1, train_batch_index=0, minibatch_index=0, num_minibatches=1,
            train_version=0, microbatch_index=ticket - 1, num_microbatches=ENDLESS, last_in_minibatch=False,
            minibatch_loss_tokens=1, microbatch_loss_tokens=1, segment="seg", slot=0, used_bytes=0, tensors=(),
            role="backbone", dp_rank=0, cp_rank=0, cp=1, tp=1)
        return pb.NextMicroBatchResponse(descriptor=descriptor.to_proto(), incarnation="i")

    def ReleaseMicroBatch(self, request: pb.ReleaseMicroBatchRequest, timeout: float | None = None) -> None:
        return None


class CountingStager:
    def __init__(self) -> None:
        self.staged: list[int] = []

    def stage(self, descriptor: MicroBatchDescriptor) -> tuple[dict[str, object], None, bool]:
        self.staged.append(descriptor.ticket)
        return {}, None, False


def wait_until(condition, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.005)
    return condition()


def settle(stager: CountingStager) -> int:
    """What the prefetch thread staged once it stopped staging (it waits for room)."""
    before = -1
    while len(stager.staged) != before:
        before = len(stager.staged)
        time.sleep(0.05)
    return before


@settings(max_examples=8, deadline=None)
@given(depth=st.integers(1, 4), takes=st.lists(st.integers(0, 3), min_size=1, max_size=4))
def test_the_thread_stays_prefetch_deep_ahead_of_the_loop(depth: int, takes: list[int]) -> None:
    sidecar, stager = PublishingSidecar(), CountingStager()
    prefetcher = Prefetcher(TrainerSettings(sidecar="unix:/nowhere.sock", prefetch=depth, poll_seconds=60.0),
                            sidecar, stager, TrainerStats(), interrupt=sidecar.closed.set)
    try:
        taken: list[int] = []
        for burst in takes:
            for _ in range(burst):
                staged = prefetcher.take() if not taken else prefetcher.take_next_of(1)
                assert staged is not None
                taken.append(staged.descriptor.ticket)
            assert wait_until(lambda: len(stager.staged) >= len(taken) + depth + 1)
            assert settle(stager) == len(taken) + depth + 1
        assert taken == list(range(1, len(taken) + 1))  # in the sidecar's order, none skipped
    finally:
        prefetcher.stop()


@pytest.mark.parametrize("mode", [DeliveryMode.ITER, DeliveryMode.EAGER])
def test_a_stop_ends_a_thread_that_waits_for_room(mode: DeliveryMode) -> None:
    sidecar, stager = PublishingSidecar(), CountingStager()
    settings_ = TrainerSettings(sidecar="unix:/nowhere.sock", prefetch=1, poll_seconds=60.0, mode=mode)
    prefetcher = Prefetcher(settings_, sidecar, stager, TrainerStats(), interrupt=sidecar.closed.set)
    assert wait_until(lambda: len(stager.staged) >= 2)
    started = time.monotonic()
    prefetcher.stop()
    assert time.monotonic() - started < 5
    assert not prefetcher._fetcher.is_alive()
