"""The trainer client's two background threads.

The prefetch thread long-polls the sidecar (``NextMicroBatch``) and stages what it publishes ahead of the
training loop, at most ``prefetch`` micro-batches deep; the training loop takes them in order. The release
thread frees consumed slots, so that an RPC costs the training loop nothing, and then drops what it held of
them, so that freeing their tensors and descriptors costs the loop nothing either. It frees the ones the loop let
go of on a tick (``release_interval_seconds``, see :class:`~knittrans.trainer.settings.TrainerSettings`), or at
once when the loop waits for data. While the loop waits for data and nothing is held, the release thread does not
tick: a trainer waiting for rollouts (often most of an RL step) would otherwise wake it a hundred times a second
per client for nothing. The loop's next let-go wakes it. A sidecar that restarts publishes
again what this rank may already have taken: that is released and skipped, by (sequence, micro-batch index).

A new *delivery round* of the sidecar (another TP rank of the consumer restarted mid-mini-batch) withdrew what
this rank had staged of the old round: it is released, and a :class:`RoundRestart` marker goes to the training
loop. A mini-batch the loop is in the middle of then raises :class:`~knittrans.errors.MiniBatchRestarted`; the
sidecar delivers it again from micro-batch 0. A mini-batch the loop finished is not taken again.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import grpc

from knittrans.client.connection import RETRYABLE_CODES, error_from_rpc
from knittrans.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    KnitTransError,
    MiniBatchFailed,
    MiniBatchRestarted,
    Unavailable,
)
from knittrans.retry import Backoff, RetryPolicy
from knittrans.steps import RestorePoint, StepId
from knittrans.trainer.batches import Staged
from knittrans.trainer.descriptor import MicroBatchDescriptor
from knittrans.trainer.settings import DeliveryMode, TrainerSettings, TrainerStats
from knittrans.v1 import reorg_service_pb2 as pb
from knittrans.v1 import reorg_service_pb2_grpc

logger = logging.getLogger(__name__)

# The SDK's retry rules (RETRYABLE_CODES): a sidecar that stops cancels the calls in flight (CANCELLED): like
# UNAVAILABLE, the sidecar is gone for now, and it is an error only once it has not answered for
# sidecar_timeout_seconds. (Our own cancellations end the fetch loop before this is consulted.)
SIDECAR_RETRY = RetryPolicy(initial=0.02, cap=0.5)  # while the sidecar does not answer (restarting?)

_END = object()
# A slot to free: (incarnation, ticket, seconds the loop waited for it, what the release thread lets go of after
# the RPC: the Staged the training loop let go of, so that its tensors and descriptor are not freed on the loop's
# thread when it drops the micro-batch as it takes the next one, or None).
_Release = tuple[str, int, float, Staged | None]
_WAKE: _Release = ("", 0, 0.0, None)  # put on the release queue to make an idle release thread tick again


@dataclass(frozen=True)
class RoundRestart:
    """The sidecar started delivery round ``round`` at ``sequence``: what came before this marker is withdrawn."""

    round: int
    sequence: int


def failure_error(descriptor: MicroBatchDescriptor) -> MiniBatchFailed:
    """The typed error for a failure the sidecar published in place of a micro-batch."""
    failure = descriptor.failure
    assert failure is not None
    return MiniBatchFailed(
        f"mini-batch {descriptor.sequence} (train batch {descriptor.train_batch_index}, mini-batch "
        f"{descriptor.minibatch_index}) could not be delivered to {descriptor.role} dp {descriptor.dp_rank} cp "
        f"{descriptor.cp_rank}: micro-batch {descriptor.microbatch_index}, trajectory {failure.trajectory_id!r}, "
        f"unit {failure.unit_key!r}: {failure.reason}",
        trajectory_id=failure.trajectory_id, unit_key=failure.unit_key, sequence=descriptor.sequence,
        train_batch_index=descriptor.train_batch_index, minibatch_index=descriptor.minibatch_index,
    )


class Prefetcher:
    """Stages the sidecar's micro-batches ahead of the training loop and releases the ones it is done with.

    ``stager`` (:class:`~knittrans.trainer.staging.Stager`) turns a descriptor into tensors; in eager mode it
    copies them out of the slot, which is then released at once."""

    def __init__(self, settings: TrainerSettings, stub: reorg_service_pb2_grpc.ReorgServiceStub, stager: Any,
                 stats: TrainerStats, *, interrupt: Callable[[], None],
                 restored_step: StepId | RestorePoint | None = None) -> None:
        """``interrupt`` ends the long poll in flight (closing the channel ``stub`` calls on): :meth:`stop` calls it
        once the release thread sent what it had."""
        self._settings = settings
        self._stub = stub
        self._stager = stager
        self._stats = stats
        self._eager = settings.mode is DeliveryMode.EAGER
        # Staged micro-batches (and markers, errors) in order, and, in iter mode, one token per place left in the
        # prefetch depth: the prefetch thread takes a token before it queues an item, the loop gives one back as
        # it takes an item. Both are C-level queues: taking a micro-batch runs no Python lock or condition code,
        # which costs the training loop most at a micro-batch boundary, where its caches are cold.
        self._queue: queue.SimpleQueue[Staged | BaseException | object] = queue.SimpleQueue()
        self._room: queue.SimpleQueue[None] | None = None
        if not self._eager:
            self._room = queue.SimpleQueue()
            for _ in range(settings.prefetch):
                self._room.put(None)
        self._stop = threading.Event()
        self._release_queue: queue.SimpleQueue[_Release | None] = queue.SimpleQueue()
        self._held: deque[_Release] = deque()  # let go of by the loop; freed on the next tick
        self._loop_waiting = False  # the loop waits for data, so it lets go of nothing until it has some
        self._release_idle = False  # the release thread waits without a tick: a let-go must wake it
        self._interrupt = interrupt
        # Fixed for this client's life: a new session of the same TP rank tells the sidecar the rank restarted.
        self.session = uuid.uuid4().hex
        self.completed_through = 0  # the training loop finished every mini-batch up to this sequence
        # Delivery rounds this client learnt of, counted before anything of the new round is staged, so a
        # mini-batch in a later pass (it takes nothing more) sees a restart by comparing with its first Staged.
        self.rounds_started = 0
        # Set while each mini-batch is iterated several times: a later pass takes nothing, so a prefetch thread
        # blocked on a full queue asks the sidecar for its delivery round instead of waiting for the loop.
        self.watch_rounds = False
        self._restored = _restored_step_message(restored_step)
        tp_rank = settings.tp_rank
        self._fetcher = threading.Thread(target=self._fetch_loop, name=f"knittrans-prefetch-tp{tp_rank}", daemon=True)
        self._releaser = threading.Thread(target=self._release_loop, name=f"knittrans-release-tp{tp_rank}",
                                          daemon=True)
        self._fetcher.start()
        self._releaser.start()

    def stop(self) -> None:
        """Send the releases queued, end the long poll in flight, and wait (a bounded time) for both threads."""
        self._stop.set()
        self._free_held()
        self._release_queue.put(None)
        self._releaser.join(timeout=self._settings.poll_seconds + 2)
        self._interrupt()
        self._fetcher.join(timeout=self._settings.poll_seconds + 2)

    # ---- the training loop's side ------------------------------------------------------------------------

    def take(self) -> Staged | None:
        """The first micro-batch of the next mini-batch; None once the sidecar's stream ended. Raises what
        stopped the prefetch thread."""
        while True:
            item = self._take_item()
            if isinstance(item, RoundRestart):
                continue  # between mini-batches: nothing of the loop's was withdrawn
            if item is not None and item.descriptor.sequence <= self.completed_through:
                self.release(item)  # a new round delivers again what this rank already finished
                continue
            return item

    def _take_item(self, within: int | None = None) -> Staged | RoundRestart | None:
        """``within``: the sequence of the mini-batch the loop is partway through, if it is."""
        try:
            item: object = self._queue.get_nowait()
            waited = 0.0  # it was staged: taking it is not waiting for data (even if the GIL then makes us wait)
        except queue.Empty:
            item, waited = self._wait_for_item(within)
        if self._room is not None:
            self._room.put(None)
        if type(item) is Staged:
            item.waited = waited
            stats = self._stats
            stats.micro_batches += 1
            stats.waited_seconds += waited
            return item
        if item is _END:
            return None
        if isinstance(item, BaseException):
            raise item
        assert isinstance(item, RoundRestart)
        return item

    def _wait_for_item(self, within: int | None) -> tuple[object, float]:
        """The next item, once the prefetch thread queues it; and how long the loop waited for it."""
        started = time.perf_counter()
        stall_warning = self._settings.stall_warning_seconds if within is not None else 0.0
        self._loop_waiting = True
        self._free_held()  # a slot held back may be what the sidecar needs to publish the next one
        try:
            while True:
                try:
                    return self._queue.get(timeout=0.5), time.perf_counter() - started
                except queue.Empty:
                    if not self._fetcher.is_alive() and self._queue.empty():
                        raise Unavailable("the prefetch thread stopped", field="sidecar") from None
                    if stall_warning and time.perf_counter() - started > stall_warning:
                        stall_warning = 0.0  # once a wait
                        logger.warning(
                            "waited %.0f s for the next micro-batch of mini-batch %d from reorg sidecar %s, which "
                            "is admitted and being read; still waiting. `kill -USR1` the sidecar and the admission "
                            "service to log their threads' stacks", time.perf_counter() - started, within,
                            self._settings.target)
        finally:
            self._loop_waiting = False

    def take_next_of(self, sequence: int) -> Staged:
        """The next micro-batch of mini-batch ``sequence``; raises MiniBatchRestarted if it was restarted."""
        staged = self._take_item(within=sequence)
        if isinstance(staged, RoundRestart):
            raise MiniBatchRestarted(
                f"mini-batch {sequence} was restarted (delivery round {staged.round}): a TP rank of this consumer "
                "restarted in the middle of it; drop its partial gradient, it comes again from micro-batch 0",
                sequence=sequence)
        if staged is None or staged.descriptor.sequence != sequence:
            raise FailedPrecondition(
                f"mini-batch {sequence} ended early: the sidecar "
                + ("ended its stream" if staged is None else f"moved on to {staged.descriptor.sequence}")
            )
        return staged

    def restarted_since(self, rounds_before: int) -> bool:
        """A delivery round began after the ``rounds_before``-th (a micro-batch's ``Staged.rounds_before``): its
        mini-batch comes again from micro-batch 0."""
        return self.rounds_started > rounds_before

    def own(self, staged: Staged) -> None:
        """Make ``staged``'s tensors this process's own, so they outlive its slot (several passes)."""
        if not staged.owned:
            staged.tensors = self._stager.own(staged.tensors)
            staged.owned = True

    def release(self, staged: Staged) -> None:
        """Free ``staged``'s slot now."""
        if staged.released:
            return
        staged.released = True
        self._send_release(staged.descriptor, waited=staged.waited, keep=staged)

    def let_go(self, staged: Staged) -> None:
        """The training loop is done with ``staged``: its slot is freed on the release thread's next tick, or now
        if the loop had to wait for it (data is what the loop waits on, so the sidecar needs the slot)."""
        if staged.released:
            return
        if staged.waited > 0 or not self._settings.release_interval_seconds:
            self.release(staged)
            return
        staged.released = True
        self._held.append((staged.descriptor.incarnation, staged.descriptor.ticket, staged.waited, staged))
        if self._release_idle:  # read after the append: see _next_release
            self._release_queue.put(_WAKE)

    # ---- the prefetch thread -----------------------------------------------------------------------------

    def _put(self, item: object) -> bool:
        while not self._stop.is_set():
            if self._reserve_room():
                self._queue.put(item)
                return True
        return False

    def _reserve_room(self) -> bool:
        """Take a place in the prefetch depth, waiting for one a bounded time (so that a stop is seen)."""
        if self._room is None:
            return True
        try:
            self._room.get(timeout=0.2)
            return True
        except queue.Empty:
            return False

    def _fetch_loop(self) -> None:
        try:
            self._fetch()
        except BaseException as error:  # handed to the training loop, which raises it
            if not isinstance(error, KnitTransError):
                logger.exception("the prefetch thread failed")
            self._put(error)

    def _fetch(self) -> None:
        settings = self._settings
        incarnation = ""
        delivery_round = 0
        after = 0
        last_key: tuple[int, int] = (0, -1)
        partway = False  # the last micro-batch handed to the loop was not the last of its mini-batch
        unreachable = Backoff(replace(SIDECAR_RETRY, deadline=settings.sidecar_timeout_seconds), start_now=False)
        idle_since = time.monotonic()
        while not self._stop.is_set():
            request = pb.NextMicroBatchRequest(tp_rank=settings.tp_rank, after_ticket=after, incarnation=incarnation,
                                               session=self.session)
            if self._restored is not None and not incarnation:  # until the restored delivery has begun
                request.restored_step.CopyFrom(self._restored)
            try:
                # A blocking call, not a future: each future call on an otherwise idle channel starts a thread to
                # wait for its completion, one per micro-batch, competing with the training loop for the GIL.
                response = self._stub.NextMicroBatch(request, timeout=settings.poll_seconds)
            except grpc.RpcError as error:
                if self._stop.is_set():
                    return
                if error.code() not in RETRYABLE_CODES:
                    raise error_from_rpc(error) from None
                delay = unreachable.next_delay()
                if delay is None:
                    raise Unavailable(
                        f"reorg sidecar {settings.target} has not answered for {unreachable.failing_for():.1f}s "
                        f"({error.code().name}: {error.details()})", field="sidecar",
                    ) from None
                time.sleep(delay)
                continue
            unreachable.reset()
            if incarnation and response.incarnation == incarnation and response.delivery_round > delivery_round:
                # Withdrawn before any descriptor of the new round could be published: give back the slots now.
                delivery_round = response.delivery_round
                last_key, partway = (0, -1), False
                if not self._new_round(delivery_round, response.descriptor.sequence):
                    return
            if response.HasField("descriptor"):
                descriptor = MicroBatchDescriptor.from_proto(response.descriptor)
                if descriptor.incarnation != incarnation:
                    if incarnation:
                        logger.warning("reorg sidecar %s restarted (incarnation %s); skipping what was consumed",
                                       settings.target, descriptor.incarnation)
                        self._stats.restarts_seen += 1
                    incarnation = descriptor.incarnation
                    delivery_round = descriptor.delivery_round
                elif descriptor.delivery_round > delivery_round:
                    delivery_round = descriptor.delivery_round
                    last_key, partway = (0, -1), False  # the loop skips what it finished; the rest comes again
                    if not self._new_round(delivery_round, descriptor.sequence):
                        return
                after = descriptor.ticket
                # A restarted sidecar that cannot read the mini-batch this rank is partway through fails it at a
                # micro-batch the rank may have taken already: the failure still ends the mini-batch, never skipped.
                ends_partway = descriptor.failure is not None and partway and descriptor.sequence == last_key[0]
                if descriptor.key <= last_key and not ends_partway:
                    self._stats.skipped_after_restart += 1
                    self._send_release(descriptor, waited=-1.0)
                    continue
                if descriptor.failure is not None:
                    failed = Staged(descriptor=descriptor, tensors={}, failure=failure_error(descriptor),
                                    rounds_before=self.rounds_started)
                    if self._eager:
                        self._send_release(descriptor, waited=-1.0)
                        failed.released = True
                    last_key, partway = max(last_key, descriptor.key), False
                    idle_since = time.monotonic()
                    if not self._put(failed):
                        return
                    continue
                try:
                    tensors, event, owned = self._stager.stage(descriptor)
                except Unavailable as error:  # its segment vanished: the sidecar died; its successor re-publishes
                    logger.warning("%s; waiting for the sidecar to come back", error)
                    continue
                staged = Staged(descriptor=descriptor, tensors=tensors, event=event, owned=owned,
                                rounds_before=self.rounds_started)
                if self._eager:
                    self._send_release(descriptor, waited=-1.0)
                    staged.released = True
                last_key, partway = descriptor.key, not descriptor.last_in_minibatch
                idle_since = time.monotonic()
                queued_in = self._put_watching_rounds(staged, incarnation, delivery_round)
                if queued_in is None:
                    return
                if queued_in > delivery_round:  # a round began while it waited for room: it was withdrawn
                    self.release(staged)
                    delivery_round, last_key, partway = queued_in, (0, -1), False
                    if not self._new_round(delivery_round, descriptor.sequence):
                        return
            elif response.end_of_stream:
                self._put(_END)
                return
            elif settings.wait_timeout_seconds and time.monotonic() - idle_since > settings.wait_timeout_seconds:
                raise DeadlineExceeded(f"no micro-batch from {settings.target} for "
                                       f"{settings.wait_timeout_seconds:.1f}s", field="sidecar")

    def _put_watching_rounds(self, item: Staged, incarnation: str, delivery_round: int) -> int | None:
        """Queue ``item``: the delivery round it was queued in, or a later round that began while it waited for
        room (``watch_rounds``; then it was not queued), or None when stopped."""
        probed = time.monotonic()
        while not self._stop.is_set():
            if self._reserve_room():
                self._queue.put(item)
                return delivery_round
            if not self.watch_rounds or time.monotonic() - probed < 0.5:
                continue
            probed = time.monotonic()
            try:
                status = self._stub.GetReorgStatus(pb.GetReorgStatusRequest(), timeout=self._settings.poll_seconds)
            except grpc.RpcError:
                continue  # the fetch loop finds out what became of the sidecar once it may poll again
            if status.incarnation == incarnation and status.delivery_round > delivery_round:
                return int(status.delivery_round)
        return None

    def _new_round(self, delivery_round: int, sequence: int) -> bool:
        logger.warning("reorg sidecar %s started delivery round %d: a TP rank of the consumer restarted in the "
                       "middle of a mini-batch; it comes again from micro-batch 0", self._settings.target,
                       delivery_round)
        self.rounds_started += 1
        put = self._withdraw_staged(RoundRestart(round=delivery_round, sequence=sequence))
        self._stats.minibatch_restarts += 1  # after the marker is queued: a loop that waits for it finds it
        return put

    def _withdraw_staged(self, marker: RoundRestart) -> bool:
        """Release what is staged of the old round (the loop has not taken it) and queue ``marker``."""
        kept: list[object] = []
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if self._room is not None:
                self._room.put(None)
            if isinstance(item, Staged):
                self.release(item)
            else:
                kept.append(item)
        return all(self._put(item) for item in [*kept, marker])

    # ---- the release thread ------------------------------------------------------------------------------

    def _send_release(self, descriptor: MicroBatchDescriptor, *, waited: float, keep: Staged | None = None) -> None:
        self._release_queue.put((descriptor.incarnation, descriptor.ticket, waited, keep))

    def _free_held(self) -> None:
        """Queue what the loop let go of, to be freed now (from the loop's thread, this wakes the release thread)."""
        while True:
            try:
                self._release_queue.put(self._held.popleft())
            except IndexError:
                return

    def _next_release(self) -> _Release | None:
        """The next slot to free: one queued, or on the tick, those held back. Without a tick while the loop waits
        for data with nothing held. The idle flag is set before the held slots are looked at again and read by
        :meth:`let_go` after its append, so a let-go either is seen here or finds the flag and wakes the thread."""
        interval = self._settings.release_interval_seconds or None
        while True:
            self._release_idle = interval is not None and self._loop_waiting and not self._held
            idle = self._release_idle and self._loop_waiting and not self._held  # looked at again after the flag
            try:
                item = self._release_queue.get(timeout=None if idle else interval)
            except queue.Empty:
                self._free_held()
                continue
            finally:
                self._release_idle = False
            if item is not _WAKE:
                return item

    def _release_loop(self) -> None:
        tp_rank = self._settings.tp_rank
        while (item := self._next_release()) is not None:
            incarnation, ticket, waited, staged = item
            self._release(pb.ReleaseMicroBatchRequest(request_id=f"{incarnation}/{ticket}/{tp_rank}",
                                                      tp_rank=tp_rank, ticket=ticket, waited_seconds=waited,
                                                      incarnation=incarnation))
            # The last references to what the loop let go of, most likely: its tensors are freed here, not
            # while this thread waits for the next release, nor on the loop's thread.
            del item, staged

    def _release(self, request: pb.ReleaseMicroBatchRequest) -> None:
        """Free one slot, asking again until the sidecar answers. A release dropped after one failed call (the
        sidecar paused past the call's deadline: stopped, starved of CPU, in a long collection) left its slot
        occupied for good: with the ring full, the sidecar published nothing more and the rank waited for its next
        micro-batch forever, with nothing logged. A repeated release is a no-op; a successor sidecar (another
        incarnation) ignores it. Once stopping, the call is made once."""
        settings = self._settings
        failing: Backoff | None = None  # made at the first failure: nearly every release is answered at once
        warned = False
        while True:
            try:
                self._stub.ReleaseMicroBatch(request, timeout=settings.poll_seconds)
                return
            except grpc.RpcError as error:
                if self._stop.is_set():
                    return
                if error.code() not in RETRYABLE_CODES:
                    logger.warning("reorg sidecar %s refused the release of ticket %d: %s %s", settings.target,
                                   request.ticket, error.code().name, error.details())
                    return
                if failing is None:
                    failing = Backoff(replace(SIDECAR_RETRY, deadline=settings.sidecar_timeout_seconds))
                delay = failing.next_delay()
                if delay is None:  # still trying: the prefetch thread raises if the sidecar stays unreachable
                    if not warned:
                        logger.warning("reorg sidecar %s has not answered the release of ticket %d for %.0f s (%s); "
                                       "asking again", settings.target, request.ticket, failing.failing_for(),
                                       error.code().name)
                        warned = True
                    delay = SIDECAR_RETRY.cap
            if self._stop.wait(delay):
                return


def _restored_step_message(restored_step: StepId | RestorePoint | None) -> pb.RestoredStep | None:
    if restored_step is None:
        return None
    if restored_step is RestorePoint.BEFORE_FIRST_STEP:
        return pb.RestoredStep(before_first_step=True)
    assert isinstance(restored_step, StepId)
    return pb.RestoredStep(train_batch_index=restored_step.train_batch_index,
                           minibatch_index=restored_step.minibatch_index)
