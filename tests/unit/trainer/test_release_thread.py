"""The release thread sleeps without a tick while the training loop waits for data, and a slot let go of
meanwhile (from another thread: a framework that reports its optimizer step off the loop's thread, say) still
reaches the sidecar on the next tick. The sidecar is a stand-in for its RPC surface: ``NextMicroBatch`` blocks
until the client closes, so the loop's take waits for as long as the test likes; ``ReleaseMicroBatch`` records
the tickets it is sent. A release that got no answer (a retryable status) is asked again, in order; one the
sidecar refused is not."""

from __future__ import annotations

import threading
import time
import weakref

import grpc
import pytest

from knittrans.trainer.batches import Staged
from knittrans.trainer.descriptor import MicroBatchDescriptor
from knittrans.trainer.prefetch import Prefetcher
from knittrans.trainer.settings import TrainerSettings, TrainerStats


class Closed(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.CANCELLED


class SidecarWithNothingToPublish:
    def __init__(self) -> None:
        self.closed = threading.Event()
        self.released: list[int] = []

    def NextMicroBatch(self, request, timeout=None):
        self.closed.wait()
        raise Closed()

    def ReleaseMicroBatch(self, request, timeout=None):
        self.released.append(request.ticket)


def staged(ticket: int) -> Staged:
    descriptor = MicroBatchDescriptor(
        ticket=ticket, incarnation="i", sequence=1, train_batch_index=0, minibatch_index=0, num_minibatches=1,
        train_version=0, microbatch_index=0, num_microbatches=1, last_in_minibatch=True, minibatch_loss_tokens=1,
        microbatch_loss_tokens=1, segment="seg", slot=0, used_bytes=0, tensors=(), role="backbone", dp_rank=0,
        cp_rank=0, cp=1, tp=1)
    return Staged(descriptor=descriptor, tensors={})


def test_a_slot_let_go_of_while_the_loop_waits_is_freed_on_the_next_tick() -> None:
    sidecar = SidecarWithNothingToPublish()
    settings = TrainerSettings(sidecar="unix:/nowhere.sock", release_interval_seconds=0.01, poll_seconds=60.0)
    prefetcher = Prefetcher(settings, sidecar, None, TrainerStats(), interrupt=sidecar.closed.set)
    loop = threading.Thread(target=lambda: _take_until_closed(prefetcher), daemon=True)
    loop.start()
    try:
        time.sleep(0.5)  # the loop waits for data: the release thread stops ticking at its next tick
        prefetcher.let_go(staged(7))  # not waited for: held back until the next tick
        deadline = time.monotonic() + 10
        while not sidecar.released and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sidecar.released == [7], "the let-go must wake a release thread that stopped ticking"
    finally:
        prefetcher.stop()
        loop.join(timeout=10)


def _take_until_closed(prefetcher: Prefetcher) -> None:
    try:
        prefetcher.take()
    except Exception:  # the prefetch thread stopped with the client: the loop's wait ends
        return


class SidecarThatAnswersReleasesWhenAllowed(SidecarWithNothingToPublish):
    """Holds each release RPC until the test allows answers: the release thread then still holds what it frees."""

    def __init__(self) -> None:
        super().__init__()
        self.may_answer = threading.Event()

    def ReleaseMicroBatch(self, request, timeout=None):
        self.may_answer.wait(timeout=30)
        super().ReleaseMicroBatch(request, timeout)


class TensorStandIn:
    """Something a micro-batch's tensors dict holds, whose freeing the test can watch."""


def test_what_the_loop_lets_go_of_is_freed_on_the_release_thread_not_the_loops() -> None:
    # Freeing a micro-batch's tensor views and descriptor costs the loop tens of microseconds per rank at each
    # micro-batch boundary (measured in benchmarks/transfer.py); the release thread does it after the RPC.
    sidecar = SidecarThatAnswersReleasesWhenAllowed()
    settings = TrainerSettings(sidecar="unix:/nowhere.sock", release_interval_seconds=0.01, poll_seconds=60.0)
    prefetcher = Prefetcher(settings, sidecar, None, TrainerStats(), interrupt=sidecar.closed.set)
    freed_on: list[str] = []
    try:
        # Ticket 3 is held back for the next tick; the loop waited for ticket 4, so it is released at once.
        for ticket, waited in ((3, 0.0), (4, 0.5)):
            micro = staged(ticket)
            micro.waited = waited
            tensor = TensorStandIn()
            weakref.finalize(tensor, lambda: freed_on.append(threading.current_thread().name))
            micro.tensors = {"input_ids": tensor}
            del tensor
            prefetcher.let_go(micro)
            del micro  # the loop drops the micro-batch as it moves on to the next one
        assert freed_on == []
        sidecar.may_answer.set()
        deadline = time.monotonic() + 10
        while len(freed_on) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sorted(sidecar.released) == [3, 4]
        assert freed_on == [f"knittrans-release-tp{settings.tp_rank}"] * 2
    finally:
        sidecar.may_answer.set()
        prefetcher.stop()


class Refusing(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode) -> None:
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return "refused by the stand-in"


class SidecarThatFailsReleases(SidecarWithNothingToPublish):
    """Fails the first ``failures`` calls for each ticket in ``failing`` with ``code``; records what it answers."""

    def __init__(self, code: grpc.StatusCode, failing: set[int], failures: int) -> None:
        super().__init__()
        self._code = code
        self._left = {ticket: failures for ticket in failing}
        self.calls: list[int] = []

    def ReleaseMicroBatch(self, request, timeout=None):
        self.calls.append(request.ticket)
        if self._left.get(request.ticket, 0) > 0:
            self._left[request.ticket] -= 1
            raise Refusing(self._code)
        super().ReleaseMicroBatch(request, timeout)


@pytest.mark.parametrize(("code", "asked_again"), [
    (grpc.StatusCode.DEADLINE_EXCEEDED, True),  # the sidecar paused past the call's deadline
    (grpc.StatusCode.UNAVAILABLE, True),
    (grpc.StatusCode.CANCELLED, True),  # a sidecar stopping cancels the calls in flight
    (grpc.StatusCode.INVALID_ARGUMENT, False),  # an answer: asking again gets the same one
    (grpc.StatusCode.FAILED_PRECONDITION, False),
])
def test_a_release_that_got_no_answer_is_asked_again_in_order_and_a_refusal_is_not(code: grpc.StatusCode,
                                                                                    asked_again: bool) -> None:
    sidecar = SidecarThatFailsReleases(code, failing={2}, failures=3)
    settings = TrainerSettings(sidecar="unix:/nowhere.sock", release_interval_seconds=0.0, poll_seconds=60.0)
    prefetcher = Prefetcher(settings, sidecar, None, TrainerStats(), interrupt=sidecar.closed.set)
    try:
        for ticket in (1, 2, 3):
            micro = staged(ticket)
            micro.waited = 0.5
            prefetcher.let_go(micro)
        deadline = time.monotonic() + 10
        while 3 not in sidecar.released and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        prefetcher.stop()
    if asked_again:
        assert sidecar.released == [1, 2, 3]  # each freed once, in the order let go of
        assert sidecar.calls == [1, 2, 2, 2, 2, 3]
    else:
        assert sidecar.released == [1, 3]
        assert sidecar.calls == [1, 2, 3]
