"""The reorg sidecar's pipeline (DESIGN.md §2 step 5): assignments in, packed micro-batches out.

For each assignment, in sequence order, and each of its micro-batches, in consumption order, the sidecar
takes a free ring slot (waiting while the ring is full), reads the micro-batch's bytes into it in one batched
store call on a reader thread, packs it, and publishes it. It works one micro-batch at a time, so reading
micro-batch i+1 overlaps the trainers' use of micro-batch i, and the ring bounds how far it runs ahead.

An assignment is acknowledged to its source once every TP rank has released all its micro-batches, not when
they are published: a sidecar that dies with published but unconsumed micro-batches resumes from that
assignment after a restart, and the trainer client skips what it already consumed (by sequence and index).

Every planned consumer sees a mini-batch whole or not at all (DESIGN.md §9). As soon as an assignment arrives,
the sidecar verifies its part against the store (every unit present, with the size its header says: one
metadata query, :mod:`knittrans.reorg.verification`) and reports the outcome to the assignment source: verified,
or a failure naming the trajectory and the unit. It then waits for the source's verdict on the mini-batch (the
admission service gives it once every consumer, encoders included, verified it, or as soon as one reported a
failure). Only the publication of the mini-batch's first micro-batch waits for the verdict: that micro-batch is
read and packed into a slot meanwhile (and the slot given back if the verdict fails), and assignments keep
arriving and being verified while earlier mini-batches are read, published and consumed, and verifying needs
no trainer to consume anything, so sidecars waiting on each other's verdicts cannot deadlock. On a FAILED
verdict the sidecar publishes a *failure* instead of any micro-batch of the mini-batch (every TP rank of every
consumer gets it, and the trainer client raises :class:`~knittrans.errors.MiniBatchFailed` naming the trajectory
and the unit) and goes on with the next mini-batch.

A micro-batch that still cannot be read or packed after a good verdict (bytes damaged with their length kept,
data the packer cannot lay out) never stops the sidecar either, which would only fail the same way again after
a restart: it publishes the failure in that micro-batch's place (only its own TP ranks get it, possibly after
earlier micro-batches of the mini-batch), reports it to the assignment source (the admission service journals
it and shows it in its status), skips the rest of that mini-batch and goes on with the next one. Transient
store errors are retried first (``read_retry_seconds``).

A trainer rank that restarts in the middle of a mini-batch starts a new delivery round
(:mod:`knittrans.reorg.rounds`): the mini-batches not yet released by every TP rank are delivered again from
their first micro-batch, rebuilt from the store (their units are held until their optimizer step is reported).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import os
import time
from collections import OrderedDict, deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from knittrans.errors import FailedPrecondition, KnitTransError
from knittrans.plan import EncoderMicroBatchAssignment, MicroBatchAssignment
from knittrans.reorg.assignments import AssignmentEvent, AssignmentSource, FailureReport, Registration, Verdict
from knittrans.reorg.descriptors import Describer
from knittrans.reorg.failures import blame, blame_by_probing
from knittrans.reorg.metrics import ReorgMetrics
from knittrans.reorg.packing import PackLayout, PackSettings, backbone_layout, encoder_layout, fill_backbone
from knittrans.reorg.reader import MicroBatchReader, ReadOutcome
from knittrans.reorg.ring import SharedMemoryRing, SlotLease
from knittrans.reorg.rounds import BEFORE_FIRST_STEP_INDICES, DeliveryTracker, RankProgress
from knittrans.reorg.verification import verify_part
from knittrans.store.protocol import UnitStore
from knittrans.trainer.descriptor import MicroBatchDescriptor, MiniBatchFailure
from knittrans.types import ConsumerId

logger = logging.getLogger(__name__)

_Delivery = tuple[AssignmentEvent, "asyncio.Task[Verdict]"]
_WAKE = object()  # a new delivery round has assignments to deliver again


def new_incarnation() -> str:
    return f"{os.getpid()}-{time.time_ns()}"


def incarnation_tag(incarnation: str) -> str:
    """A short token of an incarnation for segment names."""
    return hashlib.blake2b(incarnation.encode(), digest_size=4).hexdigest()


@dataclass(frozen=True, kw_only=True)
class _Filled:
    """A micro-batch read and packed into a slot, not yet published."""

    micro: MicroBatchAssignment | EncoderMicroBatchAssignment
    layout: PackLayout
    lease: SlotLease


@dataclass(frozen=True, kw_only=True)
class _Unfilled:
    """A micro-batch that could not be decoded, laid out, read or packed (its slot, if it had one, is free)."""

    micro: MicroBatchAssignment | EncoderMicroBatchAssignment | None
    layout: PackLayout | None
    error: Exception


@dataclass(frozen=True, kw_only=True)
class SidecarCounters:
    published: int
    bytes_read: int
    bytes_needed: int
    read_calls: int
    acknowledged_sequence: int


class Sidecar:
    """One consumer's pipeline; runs on the event loop that also serves its endpoint."""

    def __init__(
        self,
        *,
        consumer: ConsumerId,
        registration: Registration,
        source: AssignmentSource,
        store: UnitStore,
        ring: SharedMemoryRing[MicroBatchDescriptor],
        pack: PackSettings,
        metrics: ReorgMetrics,
        incarnation: str,
        retained_minibatches: int = 16,
        read_retry_seconds: float = 30.0,
    ) -> None:
        self.consumer = consumer
        self.job = registration.job
        self.topology = registration.topology
        self.incarnation = incarnation
        self.ring = ring
        self._source = source
        self._store = store
        self._pack = pack
        self._metrics = metrics
        self._reader = MicroBatchReader(store, retry_seconds=read_retry_seconds)
        self._read_retry_seconds = read_retry_seconds
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"reorg-read-{consumer}")
        # Verifying runs on a thread of its own, so a mini-batch's check never queues behind the reads of the one
        # before it.
        self._verifier = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"reorg-verify-{consumer}")
        self._judging: set[asyncio.Task] = set()
        self._tracker = DeliveryTracker()
        self._acks: asyncio.Queue[int] = asyncio.Queue()
        self._contexts: OrderedDict[int, AssignmentEvent] = OrderedDict()
        self._admitted: OrderedDict[int, tuple[str, ...]] = OrderedDict()  # GetMiniBatch's, per sequence
        self._retained = retained_minibatches
        self._arrived: asyncio.Queue[_Delivery | Exception | object | None] = asyncio.Queue()
        self._round = 0
        self._ranks = RankProgress()
        self._in_flight: OrderedDict[int, _Delivery] = OrderedDict()  # delivering or delivered, not yet acked
        self._again: deque[_Delivery] = deque()  # to deliver again in this round, before what arrives next
        self._skip: dict[int, frozenset[int]] = {}  # sequence -> TP ranks that already had all of it
        self._intake: asyncio.Task | None = None
        self._num_minibatches = registration.num_minibatches
        self._bytes_read = 0
        self._bytes_needed = 0
        self.acknowledged_sequence = registration.acknowledged_sequence
        encoder = consumer.encoder_name
        self.tp = registration.topology.encoder(encoder).tp if encoder else registration.topology.backbone.tp
        self.cp = registration.topology.backbone.cp
        metrics.slots.set(ring.slots)
        self._describe = Describer(incarnation=incarnation, consumer=consumer, cp=self.cp, tp=self.tp)

    @property
    def counters(self) -> SidecarCounters:
        return SidecarCounters(published=self.ring.published, bytes_read=self._bytes_read,
                               bytes_needed=self._bytes_needed, read_calls=self._reader.read_calls,
                               acknowledged_sequence=self.acknowledged_sequence)

    @property
    def delivery_round(self) -> int:
        return self._round

    def context(self, sequence: int) -> AssignmentEvent | None:
        return self._contexts.get(sequence)

    async def admitted_trajectory_ids(self, sequence: int) -> tuple[str, ...]:
        """Every trajectory of a mini-batch, asked of the source once per sequence (only GetMiniBatch needs them)."""
        if sequence not in self._admitted:
            self._admitted[sequence] = await self._source.admitted_trajectory_ids(sequence)
            while len(self._admitted) > self._retained:
                self._admitted.popitem(last=False)
        return self._admitted[sequence]

    # ---- pipeline -------------------------------------------------------------------------------------------

    async def run(self) -> None:
        """Consume the source until it ends (then let the trainers drain the ring) or the task is cancelled."""
        acks = asyncio.create_task(self._acknowledge_in_order(), name=f"acks-{self.consumer}")
        self._intake = asyncio.create_task(self._take_assignments(self._arrived), name=f"intake-{self.consumer}")
        try:
            while True:
                if self._again:
                    item: object = self._again.popleft()
                elif (item := await self._arrived.get()) is _WAKE:
                    continue
                if item is None:
                    break
                if isinstance(item, Exception):
                    raise item
                if acks.done():
                    acks.result()  # acknowledging failed: stop rather than run ahead of the source
                assert isinstance(item, tuple)
                await self._deliver(*item)
            await self.ring.finish()
            logger.info("%s: assignment source ended after %d micro-batches", self.consumer, self.ring.published)
            await acks  # finishes once the trainers released everything and the last ack went out
        finally:
            acks.cancel()
            if self._intake is not None:
                self._intake.cancel()
            for task in list(self._judging):
                task.cancel()

    async def _take_assignments(self, arrived: asyncio.Queue[_Delivery | Exception | object | None]) -> None:
        """Take every assignment as it arrives and start judging it at once, however far delivery lags behind:
        a verdict then never waits on this sidecar's trainers (the queue is bounded by what the admission
        service admits ahead)."""
        try:
            async for event in self._source:
                if event.consumer != self.consumer:
                    raise FailedPrecondition(f"received {event.consumer}'s assignment", field="consumer")
                judging = asyncio.create_task(self._judge(event), name=f"judge-{self.consumer}-{event.sequence}")
                self._judging.add(judging)
                judging.add_done_callback(self._judging.discard)
                arrived.put_nowait((event, judging))
            arrived.put_nowait(None)
        except Exception as error:  # the delivery loop raises it, after delivering what arrived before it
            arrived.put_nowait(error)

    async def _judge(self, event: AssignmentEvent) -> Verdict:
        """Verify this consumer's part of the mini-batch, report the outcome, and wait for the verdict."""
        loop = asyncio.get_running_loop()
        try:
            found = await loop.run_in_executor(
                self._verifier, functools.partial(verify_part, event, self._store,
                                                  retry_seconds=self._read_retry_seconds))
        except Exception as error:  # the store could not answer, even after retries: the mini-batch fails
            failure, position = blame(None, error), 0
        else:
            failure, position = (None, 0) if found is None else (found.failure, found.microbatch_index)
        if failure is None:
            await self._source.report_verified(event.sequence)
        else:
            admission = event.admission
            logger.error("%s: mini-batch %d (train batch %d, mini-batch %d) fails verification at micro-batch %d: "
                         "trajectory %r, unit %r: %s", self.consumer, event.sequence, admission.train_batch_index,
                         admission.minibatch_index, position, failure.trajectory_id, failure.unit_key,
                         failure.reason)
            self._metrics.failed_minibatches.inc()
            if not await self._report(FailureReport(sequence=event.sequence, admission=admission,
                                                    microbatch_index=position, failure=failure)):
                return Verdict(failure=failure)  # no verdict will count it: at least this consumer's ranks know
        verdict = await self._source.wait_verdict(event.sequence)
        if verdict.ok and failure is not None:  # a previous incarnation of this sidecar verified it
            logger.error("%s: mini-batch %d was judged OK before this failure; failing it on this consumer only",
                         self.consumer, event.sequence)
            return Verdict(failure=failure)
        return verdict

    async def _deliver(self, event: AssignmentEvent, judging: asyncio.Task[Verdict]) -> None:
        """Publish the assignment's micro-batches in order; returns early (abandoning what it was filling) when a
        new delivery round starts meanwhile: the round delivers it again."""
        round_ = self._round
        assigned_at = event.received_at or time.time()
        self._contexts[event.sequence] = event
        self._contexts.move_to_end(event.sequence)
        while len(self._contexts) > self._retained:
            self._contexts.popitem(last=False)
        self._in_flight[event.sequence] = (event, judging)
        encoder = self.consumer.encoder_name is not None
        # An assignment without micro-batches (say, an encoder's in a mini-batch without images) still goes out as
        # one empty micro-batch: every consumer's trainers see every mini-batch and report its optimizer step.
        count = max(event.num_units, 1)
        self._delivered(self._tracker.expect(event.sequence, count))
        # Micro-batch 0 is decoded, read and packed into a slot while the verdict is decided: only its publication
        # waits for the verdict, so a mini-batch whose verdict comes last is not read after it.
        early = asyncio.create_task(self._fill_unit(event, 0, encoder), name=f"early-{self.consumer}-{event.sequence}")
        waiting_since = time.perf_counter()
        try:
            verdict = await judging
        except BaseException:
            early.cancel()
            raise
        self._metrics.verdict_wait_seconds.observe(time.perf_counter() - waiting_since)
        if self._round != round_ or verdict.failure is not None:
            await self._discard(await early)
            if self._round != round_:
                return
            assert verdict.failure is not None
            admission = event.admission
            logger.error("%s: skipping mini-batch %d (train batch %d, mini-batch %d): trajectory %r, unit %r: %s",
                         self.consumer, event.sequence, admission.train_batch_index, admission.minibatch_index,
                         verdict.failure.trajectory_id, verdict.failure.unit_key, verdict.failure.reason)
            await self._publish_failure(event, 0, count, verdict.failure, round_)
            return
        for position in range(count):
            filled = await (early if position == 0 else self._fill_unit(event, position, encoder))
            if position == 0 and isinstance(filled, _Unfilled) and self._round == round_:
                # Read before the verdict: the verdict, not that read, says whether the data is there.
                logger.info("%s: mini-batch %d's first micro-batch could not be read before its verdict (%s); the "
                            "verdict is good, reading it again", self.consumer, event.sequence, filled.error)
                filled = await self._fill_unit(event, 0, encoder)
            if self._round != round_:
                await self._discard(filled)
                return
            if isinstance(filled, _Unfilled):
                await self._fail(event, position, count, filled.micro, filled.layout, filled.error, round_)
                return
            build = functools.partial(self._describe.descriptor, event=event, micro=filled.micro, position=position,
                                      count=count, layout=filled.layout, lease=filled.lease,
                                      assigned_at=assigned_at, delivery_round=round_)
            await self.ring.publish(filled.lease, build, skip=self._skip.get(event.sequence, frozenset()))
            self._metrics.published.inc()
            self._metrics.slots_occupied.set(self.ring.occupied)

    async def _fill_unit(self, event: AssignmentEvent, position: int, encoder: bool) -> _Filled | _Unfilled:
        """Decode and lay out micro-batch ``position`` (decoding and layout run on the reader thread too, keeping
        the event loop free for the trainers), take a slot for it (waiting while the ring is full), and read and
        pack it into the slot, unpublished."""
        loop = asyncio.get_running_loop()
        try:
            micro, layout = await loop.run_in_executor(self._executor, self._plan_unit, event, position, encoder)
        except Exception as error:
            return _Unfilled(micro=None, layout=None, error=error)
        lease = await self.ring.acquire(max(layout.used_bytes, 1))
        try:
            outcome, pack_seconds = await loop.run_in_executor(self._executor, self._fill, layout, micro, lease)
        except Exception as error:
            await self.ring.abandon(lease)
            return _Unfilled(micro=micro, layout=layout, error=error)
        except BaseException:
            await self.ring.abandon(lease)
            raise
        self._account(outcome, pack_seconds)  # the bytes were moved, whether or not they are published
        return _Filled(micro=micro, layout=layout, lease=lease)

    async def _discard(self, filled: _Filled | _Unfilled) -> None:
        if isinstance(filled, _Filled):
            await self.ring.abandon(filled.lease)

    async def _fail(
        self,
        event: AssignmentEvent,
        position: int,
        count: int,
        micro: MicroBatchAssignment | EncoderMicroBatchAssignment | None,
        layout: PackLayout | None,
        error: Exception,
        round_: int,
    ) -> None:
        """Micro-batch ``position`` of ``event`` cannot be read or packed: publish the failure in its place (the
        last of its mini-batch here), report it, and leave the rest of the mini-batch out."""
        loop = asyncio.get_running_loop()
        failure = await loop.run_in_executor(self._executor, blame_by_probing, micro, layout, self._store, error)
        admission = event.admission
        logger.error("%s: cannot deliver mini-batch %d (train batch %d, mini-batch %d), micro-batch %d: trajectory "
                     "%r, unit %r: %s; skipping the mini-batch", self.consumer, event.sequence,
                     admission.train_batch_index, admission.minibatch_index, position, failure.trajectory_id,
                     failure.unit_key, failure.reason, exc_info=not isinstance(error, KnitTransError))
        self._metrics.failed_minibatches.inc()
        await self._publish_failure(event, position, count, failure, round_)
        await self._report(FailureReport(sequence=event.sequence, admission=admission, microbatch_index=position,
                                         failure=failure))

    async def _publish_failure(self, event: AssignmentEvent, position: int, count: int,
                               failure: MiniBatchFailure, round_: int) -> None:
        """Publish ``failure`` as micro-batch ``position`` of the mini-batch, its last: the rest is left out."""
        if self._round != round_:
            return
        lease = await self.ring.acquire(1)
        if self._round != round_:
            await self.ring.abandon(lease)
            return
        self._delivered(self._tracker.cut_short(event.sequence, count - position - 1))
        empty = MicroBatchAssignment(index=0, last=True, num_loss_tokens=0, items=())
        build = functools.partial(
            self._describe.descriptor, event=event, micro=empty, position=position, count=count,
            delivery_round=round_,
            layout=PackLayout(tensors=(), used_bytes=0, scratch_bytes=0, reads=(), item_offsets=(), num_tokens=0),
            lease=lease, assigned_at=event.received_at or time.time(), failure=failure,
        )
        await self.ring.publish(lease, build, skip=self._skip.get(event.sequence, frozenset()))
        self._metrics.slots_occupied.set(self.ring.occupied)

    async def _report(self, report: FailureReport) -> bool:
        try:
            await self._source.report_failure(report)
        except KnitTransError as report_error:  # the trainers learn it anyway; the record is what is lost
            logger.error("%s: could not report the failure of mini-batch %d: %s", self.consumer, report.sequence,
                         report_error)
            return False
        return True

    def _plan_unit(
        self, event: AssignmentEvent, position: int, encoder: bool
    ) -> tuple[MicroBatchAssignment | EncoderMicroBatchAssignment, PackLayout]:
        """Decode one micro-batch of the assignment (one at a time: micro-batch 0 goes out first) and lay it out."""
        if event.num_units == 0:
            empty: MicroBatchAssignment | EncoderMicroBatchAssignment = (
                EncoderMicroBatchAssignment(index=0, last=True, encodings=()) if encoder
                else MicroBatchAssignment(index=0, last=True, num_loss_tokens=0, items=()))
            micro = empty
        else:
            micro = event.unit(position)
        if encoder:
            assert isinstance(micro, EncoderMicroBatchAssignment)
            return micro, encoder_layout(micro)
        assert isinstance(micro, MicroBatchAssignment)
        return micro, backbone_layout(micro, cp=self.cp, settings=self._pack)

    def _fill(
        self, layout: PackLayout, micro: MicroBatchAssignment | EncoderMicroBatchAssignment, lease: SlotLease
    ) -> tuple[ReadOutcome, float]:
        """Runs on the reader thread: read into the slot, then pack in place."""
        outcome = self._reader.read(layout, lease.array)
        started = time.perf_counter()
        if isinstance(micro, MicroBatchAssignment):
            fill_backbone(layout, micro, lease.array, self._reader.scratch(layout.scratch_bytes), settings=self._pack)
        return outcome, time.perf_counter() - started

    def _account(self, outcome: ReadOutcome, pack_seconds: float) -> None:
        self._bytes_read += outcome.bytes_read
        self._bytes_needed += outcome.bytes_needed
        self._metrics.bytes_read.inc(outcome.bytes_read)
        self._metrics.bytes_needed.inc(outcome.bytes_needed)
        self._metrics.read_seconds.observe(outcome.seconds)
        self._metrics.pack_seconds.observe(pack_seconds)

    # ---- releases and acknowledgements ----------------------------------------------------------------------

    async def release(self, ticket: int, tp_rank: int, *, waited_seconds: float) -> bool:
        if waited_seconds >= 0:
            self._metrics.trainer_wait_seconds.observe(waited_seconds)
        released = await self.ring.release(ticket, tp_rank)
        self._metrics.slots_occupied.set(self.ring.occupied)
        descriptor = released.descriptor
        if descriptor is not None:
            self._ranks.released(tp_rank, descriptor.sequence, descriptor.last_in_minibatch)
            if released.freed:
                self._delivered(self._tracker.released(descriptor.sequence))
        return released.freed

    def _delivered(self, sequences: list[int]) -> None:
        """Every TP rank released all of ``sequences``: acknowledge them (in order) and forget them here."""
        for sequence in sequences:
            self._in_flight.pop(sequence, None)
            self._skip.pop(sequence, None)
            self._acks.put_nowait(sequence)

    async def trainer_called(self, tp_rank: int, session: str, restored: tuple[int, int] | None = None) -> None:
        """A trainer process of ``tp_rank`` asks for micro-batches from ``session``. A new session of a rank
        that called before is a restart: if a TP rank is partway through a mini-batch, start a new delivery
        round (see :mod:`knittrans.reorg.rounds`). A process restored from a checkpoint holding step
        ``restored`` (train batch, mini-batch) gets the mini-batches after it again."""
        if restored is not None:
            if self._ranks.restores(tp_rank, session, restored):
                await self._restore(tp_rank, restored)
            return
        if not self._ranks.called_from(tp_rank, session) or not self._ranks.partway or not self._in_flight:
            return
        start = next(iter(self._in_flight))
        self._round += 1
        withdrawn = await self.ring.withdraw(lambda d: d.sequence >= start, restarted=tp_rank)
        again = [*self._in_flight.values(), *self._again]
        self._skip = self._ranks.rewind(event.sequence for event, _ in again)
        self._tracker.rewind(start)
        self._in_flight.clear()
        self._again = deque(again)
        self._arrived.put_nowait(_WAKE)
        self._metrics.slots_occupied.set(self.ring.occupied)
        logger.warning("%s: TP rank %d restarted in the middle of a mini-batch; delivery round %d delivers "
                       "mini-batch %d and what follows again from micro-batch 0 (%d published micro-batches "
                       "withdrawn)", self.consumer, tp_rank, self._round, start, withdrawn)

    async def _restore(self, tp_rank: int, step: tuple[int, int]) -> None:
        """Withdraw everything published and stream the assignments after ``step`` again, as a new round."""
        after = step[0] * self._num_minibatches + step[1] + 1  # sequences count mini-batches from 1
        self._round += 1
        if self._intake is not None:
            self._intake.cancel()
        while not self._arrived.empty():
            self._arrived.get_nowait()
        withdrawn = await self.ring.withdraw(lambda d: True, restarted=tp_rank)
        self._tracker.rewind(1)
        self._in_flight.clear()
        self._again.clear()
        self._skip = {}
        self._source.restart_after(after)
        if self._intake is not None:
            self._intake = asyncio.create_task(self._take_assignments(self._arrived), name=f"intake-{self.consumer}")
        self._arrived.put_nowait(_WAKE)
        self._metrics.slots_occupied.set(self.ring.occupied)
        restored = ("no checkpoint (the job's initial state)" if step == BEFORE_FIRST_STEP_INDICES
                    else f"a checkpoint at train batch {step[0]}, mini-batch {step[1]}")
        logger.warning("%s: TP rank %d restored %s; delivery round %d delivers mini-batch %d and what follows again "
                       "(%d published micro-batches withdrawn)", self.consumer, tp_rank, restored, self._round,
                       after + 1, withdrawn)

    async def _acknowledge_in_order(self) -> None:
        while True:
            if self.ring.drained and self._acks.empty():
                return
            try:
                sequence = await asyncio.wait_for(self._acks.get(), timeout=0.5)
            except TimeoutError:
                continue
            await self._source.acknowledge(sequence)
            self.acknowledged_sequence = max(self.acknowledged_sequence, sequence)
            logger.debug("%s: acknowledged sequence %d", self.consumer, sequence)

    async def stop_reading(self, timeout: float) -> bool:
        """Start no more store calls and retry none, then wait up to ``timeout`` for those in flight; True once
        none is. A read from a store whose peers died (a killed job stops all at once) can take Mooncake's
        transfer time-out to fail, and the caller must not free the buffers it writes into before then."""
        self._reader.abandon()
        drained = []
        for executor in (self._verifier, self._executor):
            drained.append(asyncio.wrap_future(executor.submit(lambda: None)))  # runs after the work in flight
            executor.shutdown(wait=False, cancel_futures=False)
        done, _ = await asyncio.wait(drained, timeout=timeout)
        return len(done) == len(drained)

    async def close(self) -> None:
        """After :meth:`stop_reading` returned True."""
        self._reader.close()

