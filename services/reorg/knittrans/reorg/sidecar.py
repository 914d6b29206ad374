"""The reorg sidecar's pipeline (DESIGN.md §2 step 5): assignments in, packed micro-batches out.

For each assignment, in sequence order, and each of its micro-batches, in consumption order, the sidecar
takes a free ring slot (waiting while the ring is full), reads the micro-batch's bytes into it in one batched
store call on a reader thread, packs it, and publishes it. It works one micro-batch at a time, so reading
micro-batch i+1 overlaps the trainers' use of micro-batch i, and the ring bounds how far it runs ahead.

An assignment is acknowledged to its source once every TP rank has released all its micro-batches, not when
they are published: a sidecar that dies with published but unconsumed micro-batches resumes from that
assignment after a restart, and the trainer client skips what it already consumed (by sequence and index).

A micro-batch that cannot be read or packed (a unit missing from the store, bytes that disagree with their
header, data the packer cannot lay out) never stops the sidecar, which would only fail the same way again after
a restart. The sidecar publishes a *failure* in its place, naming the trajectory and the unit (every TP rank
gets it, and the trainer client raises :class:`~knittrans.errors.MiniBatchFailed` for the mini-batch), reports it
to the assignment source (the admission service journals it and shows it in its status), skips the rest of
that mini-batch and goes on with the next one. Transient store errors are retried first (``read_retry_seconds``).
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
from knittrans.reorg.assignments import AssignmentEvent, AssignmentSource, FailureReport, Registration
from knittrans.reorg.failures import blame_by_probing
from knittrans.reorg.metrics import ReorgMetrics
from knittrans.reorg.packing import PackLayout, PackSettings, backbone_layout, encoder_layout, fill_backbone
from knittrans.reorg.reader import MicroBatchReader, ReadOutcome
from knittrans.reorg.ring import SharedMemoryRing, SlotLease
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
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"reorg-read-{consumer}")
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
        try:
            async for event in self._source:
                if acks.done():
                    acks.result()  # acknowledging failed: stop rather than run ahead of the source
                await self._deliver(event)
            await self.ring.finish()
            logger.info("%s: assignment source ended after %d micro-batches", self.consumer, self.ring.published)
            await acks  # finishes once the trainers released everything and the last ack went out
        finally:
            acks.cancel()

    async def _deliver(self, event: AssignmentEvent) -> None:
        if event.consumer != self.consumer:
            raise FailedPrecondition(f"received {event.consumer}'s assignment", field="consumer")
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
        for position in range(count):
            # Decoding and layout run on the reader thread too, keeping the event loop free for the trainers.
            try:
                micro, layout = await loop.run_in_executor(self._executor, self._plan_unit, event, position, encoder)
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
        report = FailureReport(sequence=event.sequence, admission=admission, microbatch_index=position,
                               failure=failure)
        try:
            await self._source.report_failure(report)
        except KnitTransError as report_error:  # the trainers know already; the record is what is lost
            logger.error("%s: could not report the failure of mini-batch %d: %s", self.consumer, event.sequence,
                         report_error)

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
        self._executor.shutdown(wait=True, cancel_futures=True)
        self._reader.close()
