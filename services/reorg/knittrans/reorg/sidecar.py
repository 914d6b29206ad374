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
failure). Only the publication of the mini-batch's first micro-batch waits for the verdict: assignments keep
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
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import os
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from knittrans.errors import FailedPrecondition, InvalidArgument, KnitTransError
from knittrans.plan import EncoderMicroBatchAssignment, MicroBatchAssignment
from knittrans.reorg.assignments import AssignmentEvent, AssignmentSource, FailureReport, Registration, Verdict
from knittrans.reorg.failures import blame, blame_by_probing
from knittrans.reorg.metrics import ReorgMetrics
from knittrans.reorg.packing import PackLayout, PackSettings, backbone_layout, encoder_layout, fill_backbone
from knittrans.reorg.reader import MicroBatchReader, ReadOutcome
from knittrans.reorg.ring import SharedMemoryRing, SlotLease
from knittrans.reorg.verification import verify_part
from knittrans.store.protocol import UnitStore
from knittrans.trainer.descriptor import MicroBatchDescriptor, MiniBatchFailure
from knittrans.types import ConsumerId

logger = logging.getLogger(__name__)


class DeliveryTracker:
    """Which assignment sequences are fully consumed, acknowledged strictly in order."""

    def __init__(self) -> None:
        self._outstanding: OrderedDict[int, int] = OrderedDict()
        self._last = 0

    def expect(self, sequence: int, microbatches: int) -> list[int]:
        if sequence <= self._last:
            raise InvalidArgument(f"sequence {sequence} is not after {self._last}", field="sequence")
        self._last = sequence
        self._outstanding[sequence] = microbatches
        return self._ready()

    def cut_short(self, sequence: int, dropped: int) -> list[int]:
        """``dropped`` micro-batches of ``sequence`` will never be published (its mini-batch failed)."""
        if sequence in self._outstanding:
            self._outstanding[sequence] -= dropped
        return self._ready()

    def released(self, sequence: int) -> list[int]:
        """One micro-batch of ``sequence`` was released by every TP rank; returns the sequences now complete."""
        if sequence not in self._outstanding:
            return []
        self._outstanding[sequence] -= 1
        return self._ready()

    def _ready(self) -> list[int]:
        done = []
        while self._outstanding:
            sequence, remaining = next(iter(self._outstanding.items()))
            if remaining > 0:
                break
            self._outstanding.popitem(last=False)
            done.append(sequence)
        return done


def new_incarnation() -> str:
    return f"{os.getpid()}-{time.time_ns()}"


def incarnation_tag(incarnation: str) -> str:
    """A short token of an incarnation for segment names."""
    return hashlib.blake2b(incarnation.encode(), digest_size=4).hexdigest()


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
        self._retained = retained_minibatches
        self._bytes_read = 0
        self._bytes_needed = 0
        self.acknowledged_sequence = registration.acknowledged_sequence
        encoder = consumer.encoder_name
        self.tp = registration.topology.encoder(encoder).tp if encoder else registration.topology.backbone.tp
        self.cp = registration.topology.backbone.cp
        metrics.slots.set(ring.slots)

    @property
    def counters(self) -> SidecarCounters:
        return SidecarCounters(published=self.ring.published, bytes_read=self._bytes_read,
                               bytes_needed=self._bytes_needed, read_calls=self._reader.read_calls,
                               acknowledged_sequence=self.acknowledged_sequence)

    def context(self, sequence: int) -> AssignmentEvent | None:
        return self._contexts.get(sequence)

    # ---- pipeline -------------------------------------------------------------------------------------------

    async def run(self) -> None:
        """Consume the source until it ends (then let the trainers drain the ring) or the task is cancelled."""
        acks = asyncio.create_task(self._acknowledge_in_order(), name=f"acks-{self.consumer}")
        arrived: asyncio.Queue[tuple[AssignmentEvent, asyncio.Task[Verdict]] | Exception | None] = asyncio.Queue()
        intake = asyncio.create_task(self._take_assignments(arrived), name=f"intake-{self.consumer}")
        try:
            while (item := await arrived.get()) is not None:
                if isinstance(item, Exception):
                    raise item
                if acks.done():
                    acks.result()  # acknowledging failed: stop rather than run ahead of the source
                await self._deliver(*item)
            await self.ring.finish()
            logger.info("%s: assignment source ended after %d micro-batches", self.consumer, self.ring.published)
            await acks  # finishes once the trainers released everything and the last ack went out
        finally:
            acks.cancel()
            intake.cancel()
            for task in list(self._judging):
                task.cancel()

    async def _take_assignments(
        self, arrived: asyncio.Queue[tuple[AssignmentEvent, asyncio.Task[Verdict]] | Exception | None]
    ) -> None:
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
        assigned_at = event.received_at or time.time()
        self._contexts[event.sequence] = event
        while len(self._contexts) > self._retained:
            self._contexts.popitem(last=False)
        encoder = self.consumer.encoder_name is not None
        # An assignment without micro-batches (say, an encoder's in a mini-batch without images) still goes out as
        # one empty micro-batch: every consumer's trainers see every mini-batch and report its optimizer step.
        count = max(event.num_units, 1)
        for sequence in self._tracker.expect(event.sequence, count):
            self._acks.put_nowait(sequence)
        loop = asyncio.get_running_loop()
        # Micro-batch 0 is decoded and laid out while the verdict is decided (its reads wait for the verdict).
        first = loop.run_in_executor(self._executor, self._plan_unit, event, 0, encoder)
        first.add_done_callback(lambda done: done.cancelled() or done.exception())  # retrieved below, or dropped
        waiting_since = time.perf_counter()
        verdict = await judging
        self._metrics.verdict_wait_seconds.observe(time.perf_counter() - waiting_since)
        if verdict.failure is not None:
            admission = event.admission
            logger.error("%s: skipping mini-batch %d (train batch %d, mini-batch %d): trajectory %r, unit %r: %s",
                         self.consumer, event.sequence, admission.train_batch_index, admission.minibatch_index,
                         verdict.failure.trajectory_id, verdict.failure.unit_key, verdict.failure.reason)
            await self._publish_failure(event, 0, count, verdict.failure)
            return
        for position in range(count):
            # Decoding and layout run on the reader thread too, keeping the event loop free for the trainers.
            try:
                micro, layout = await (first if position == 0 else
                                       loop.run_in_executor(self._executor, self._plan_unit, event, position, encoder))
            except Exception as error:
                await self._fail(event, position, count, None, None, error)
                return
            lease = await self.ring.acquire(max(layout.used_bytes, 1))
            try:
                outcome, pack_seconds = await loop.run_in_executor(self._executor, self._fill, layout, micro, lease)
            except Exception as error:
                await self.ring.abandon(lease)
                await self._fail(event, position, count, micro, layout, error)
                return
            except BaseException:
                await self.ring.abandon(lease)
                raise
            self._account(outcome, pack_seconds)
            build = functools.partial(self._descriptor, event=event, micro=micro, position=position,
                                      count=count, layout=layout, lease=lease, assigned_at=assigned_at)
            await self.ring.publish(lease, build)
            self._metrics.published.inc()
            self._metrics.slots_occupied.set(self.ring.occupied)

    async def _fail(
        self,
        event: AssignmentEvent,
        position: int,
        count: int,
        micro: MicroBatchAssignment | EncoderMicroBatchAssignment | None,
        layout: PackLayout | None,
        error: Exception,
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
        await self._publish_failure(event, position, count, failure)
        await self._report(FailureReport(sequence=event.sequence, admission=admission, microbatch_index=position,
                                         failure=failure))

    async def _publish_failure(self, event: AssignmentEvent, position: int, count: int,
                               failure: MiniBatchFailure) -> None:
        """Publish ``failure`` as micro-batch ``position`` of the mini-batch, its last: the rest is left out."""
        for sequence in self._tracker.cut_short(event.sequence, count - position - 1):
            self._acks.put_nowait(sequence)
        lease = await self.ring.acquire(1)
        empty = MicroBatchAssignment(index=0, last=True, num_loss_tokens=0, items=())
        build = functools.partial(
            self._descriptor, event=event, micro=empty, position=position, count=count,
            layout=PackLayout(tensors=(), used_bytes=0, scratch_bytes=0, reads=(), item_offsets=(), num_tokens=0),
            lease=lease, assigned_at=event.received_at or time.time(), failure=failure,
        )
        await self.ring.publish(lease, build)
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

    def _descriptor(
        self,
        ticket: int,
        *,
        event: AssignmentEvent,
        micro: MicroBatchAssignment | EncoderMicroBatchAssignment,
        position: int,
        count: int,
        layout: PackLayout,
        lease: SlotLease,
        assigned_at: float,
        failure: MiniBatchFailure | None = None,
    ) -> MicroBatchDescriptor:
        admission = event.admission
        backbone = isinstance(micro, MicroBatchAssignment)
        encoder_inputs = () if backbone or failure is not None or not event.num_units \
            else event.encoder_input_messages(position)
        return MicroBatchDescriptor(
            ticket=ticket,
            incarnation=self.incarnation,
            sequence=event.sequence,
            train_batch_index=admission.train_batch_index,
            minibatch_index=admission.minibatch_index,
            num_minibatches=admission.num_minibatches,
            train_version=admission.train_version,
            microbatch_index=position,
            num_microbatches=count,
            last_in_minibatch=position == count - 1 or failure is not None,
            minibatch_loss_tokens=event.global_loss_tokens,
            microbatch_loss_tokens=micro.num_loss_tokens if backbone else 0,
            segment=lease.segment,
            slot=lease.slot,
            used_bytes=layout.used_bytes,
            tensors=layout.tensors,
            role=self.consumer.role,
            dp_rank=self.consumer.dp_rank,
            cp_rank=self.consumer.cp_rank,
            cp=self.cp,
            tp=self.tp,
            trajectory_ids=tuple(i.trajectory.trajectory_id for i in micro.items) if backbone else (),
            trajectory_indices=tuple(i.trajectory_index for i in micro.items) if backbone else (),
            encodings=layout.encodings,
            encoder_input_messages=encoder_inputs,
            assigned_at=assigned_at,
            published_at=time.time(),
            failure=failure,
        )

    # ---- releases and acknowledgements ----------------------------------------------------------------------

    async def release(self, ticket: int, tp_rank: int, *, waited_seconds: float) -> bool:
        if waited_seconds >= 0:
            self._metrics.trainer_wait_seconds.observe(waited_seconds)
        freed = await self.ring.release(ticket, tp_rank)
        self._metrics.slots_occupied.set(self.ring.occupied)
        if freed is None:
            return False
        for sequence in self._tracker.released(freed.sequence):
            self._acks.put_nowait(sequence)
        return True

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

    async def close(self) -> None:
        self._verifier.shutdown(wait=True, cancel_futures=True)
        self._executor.shutdown(wait=True, cancel_futures=True)
        self._reader.close()
