"""The gRPC shell of the admission service: translate, journal, apply, publish.

Every state change follows the same path under one lock: build a journal record, append it (Redis when
configured), apply it to the :class:`AdmissionLedger`, then act on what changed (wake assignment streams,
queue unit deletions, update metrics). After every input the engine is asked for decisions until it waits.

Changes go through :class:`~knittrans.admission.service.journaled.JournaledCommits`: fenced appends, and a write
whose outcome is unknown is found out from the journal's tail, never decided again over. Mutating calls fail
UNAVAILABLE after ``mutation_wait_seconds`` without the lock; reads go on.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor

from grpc import aio

from knittrans.admission.engine import decisions_until_wait
from knittrans.admission.engine.decisions import Admit, Wait
from knittrans.admission.service import reservation_gc
from knittrans.admission.service.assignment_messages import AssignmentMessages
from knittrans.admission.service.attachments import attach_fields, ready_for, role_verdict
from knittrans.admission.service.block_merge import note_small_block
from knittrans.admission.service.checkpoints import check_streamable, report_checkpoint
from knittrans.admission.service.deleter import UnitDeleter
from knittrans.admission.service.gc_pacing import collect_young_objects
from knittrans.admission.service.heap import release_free_heap
from knittrans.admission.service.ingest.report import Classified, classify
from knittrans.admission.service.ingest.reservations import check_reservations
from knittrans.admission.service.journal import Journal
from knittrans.admission.service.journaled import DEFAULT_MUTATION_WAIT, JournaledCommits
from knittrans.admission.service.ledger import AdmissionLedger, AdmittedMiniBatch, Applied, Verdict
from knittrans.admission.service.metrics import AdmissionMetrics
from knittrans.admission.service.node_watch import NodeConsumers, node_response_bytes
from knittrans.admission.service.plans import MiniBatchPlans
from knittrans.admission.service.records import failure_consumer, record_for
from knittrans.admission.service.responses import (
    outcome_counts,
    report_response,
    status_response,
    verdict_response,
)
from knittrans.admission.service.unfinished_steps import DEFAULT_UNFINISHED_STEP_WARNING, UnfinishedStepWarnings
from knittrans.admission.service.wake import WakeTimer
from knittrans.errors import FailedPrecondition, InvalidArgument, KnitTransError, Unavailable
from knittrans.types import MAX_ID_LENGTH, ConsumerId, TrajectoryId
from knittrans.v1 import admission_service_pb2 as pb
from knittrans.v1 import admission_service_pb2_grpc, journal_pb2
from knittrans.wire import consumer_from_proto, topology_to_proto, within

logger = logging.getLogger(__name__)

_STAGES = (pb.PROGRESS_STAGE_VERIFIED, pb.PROGRESS_STAGE_DELIVERED, pb.PROGRESS_STAGE_OPTIMIZER_STEP)
# A small mini-batch's part is built on the loop: a hand-off to the builder thread (and the lock it takes) costs
# more than the build, and report-to-assignment latency is what consumers wait on.
INLINE_BUILD_TRAJECTORIES = 256
MAX_VERDICT_WAIT = 60.0  # seconds one WaitMiniBatchVerdict call may wait
MAX_FAILURE_REASON = 1024  # characters
RETRY_ADMISSION_AFTER = 0.5  # seconds before an admission that could not be journaled is decided again
_OUTCOME_NAMES = {pb.REPORT_OUTCOME_ACCEPTED: "accepted", pb.REPORT_OUTCOME_DUPLICATE: "duplicate",
                  pb.REPORT_OUTCOME_CONFLICT: "conflict"}


def _consumer(message, field: str) -> ConsumerId:
    return within(field, lambda: consumer_from_proto(message))


class AdmissionServicer(admission_service_pb2_grpc.AdmissionServiceServicer):
    def __init__(
        self,
        *,
        ledger: AdmissionLedger,
        journal: Journal,
        metrics: AdmissionMetrics,
        job: str,
        delete_keys: Callable[[list[str]], None] | None = None,
        delete_batch_size: int = 1024,
        mutation_wait_seconds: float = DEFAULT_MUTATION_WAIT,
        unreported_unit_ttl_seconds: float = reservation_gc.DEFAULT_UNREPORTED_UNIT_TTL,
        unfinished_step_warning_seconds: float = DEFAULT_UNFINISHED_STEP_WARNING,
        clock: Callable[[], float] = time.time,
        snapshot_every: int = 0,
    ) -> None:
        self._unit_ttl = unreported_unit_ttl_seconds
        self._unfinished_steps = UnfinishedStepWarnings(unfinished_step_warning_seconds)
        self._ledger = ledger
        self._journal = journal
        self._metrics = metrics
        self._job = job
        self._clock = clock
        self._commits = JournaledCommits(journal=journal, ledger=ledger, after=self._after,
                                         mutation_wait_seconds=mutation_wait_seconds, closed=lambda: self._closed,
                                         snapshot_every=snapshot_every)
        self._lock = self._commits.lock
        self._published = asyncio.Condition()
        self._verdicts = asyncio.Condition()  # notified when a mini-batch's verdict is decided
        self._deleter = UnitDeleter(delete_keys=delete_keys, batch_size=delete_batch_size,
                                    pending=lambda: ledger.pending_deletes, lock=self._lock, commit=self._commit,
                                    clock=clock, on_deleted=metrics.released_units.inc)
        self._background: list[asyncio.Task] = []
        self._wake = WakeTimer(self._timed_admission, clock=clock)  # timed decisions, e.g. relax_after
        # Consumers' assignments are built here, one mini-batch at a time, off the event loop: the report that
        # admitted a mini-batch (journaled already) is answered while they are built, and each stream sends its
        # part as soon as it is ready. One thread, so a mini-batch's shared views are never built twice at once.
        self._builder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="assignments")
        self._messages = AssignmentMessages(self._builder, inline_trajectories=INLINE_BUILD_TRAJECTORIES)
        # Plans are made on the same thread, before their messages; what they read is taken on the loop.
        self._plans = MiniBatchPlans(ledger, self._builder, inline_trajectories=INLINE_BUILD_TRAJECTORIES)
        self._last_admission_at: float | None = None
        self._failure: str = ""
        self._closed = False

    # -- lifecycle -------------------------------------------------------------------------------------

    async def recover(self) -> int:
        """Rebuild the ledger from the journal's snapshot and the records after it; returns how many records were
        replayed."""
        started = time.monotonic()
        count = await self._commits.recover()
        release_free_heap()  # what parsing the snapshot and replaying took is not held for the service's life
        self._deleter.enqueue(self._ledger.pending_deletes)
        if self._commits.applied_sequence:
            logger.info(
                "recovered %d journal records in %.3fs: %d mini-batches admitted, version %d",
                count, time.monotonic() - started, self._ledger.next_sequence - 1, self._ledger.version,
            )
        async with self._lock:
            await self._admit_until_wait()
        self._refresh_gauges()
        return count

    def start_background(self) -> None:
        self._background.append(asyncio.create_task(self._deleter.run(), name="delete-released"))
        self._background.append(asyncio.create_task(self._tick_gauges(), name="gauges"))
        self._background.append(asyncio.create_task(self._commits.keep_snapshots(), name="snapshots"))
        self._background.append(asyncio.create_task(reservation_gc.collect_expired(
            ledger=self._ledger, mutating=self._commits.mutating, commit=self._commit, clock=self._clock,
            ttl_seconds=self._unit_ttl), name="expire-reservations"))

    async def close(self) -> None:
        self._closed = True
        await self._wake.close()
        for task in self._background:
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        self._builder.shutdown(wait=False, cancel_futures=True)
        async with self._published:
            self._published.notify_all()
        async with self._verdicts:
            self._verdicts.notify_all()

    # -- the commit path -------------------------------------------------------------------------------

    async def _commit(self, record: journal_pb2.JournalRecord) -> Applied:
        await self._commits.append(record)
        applied = self._commits.apply(record) or Applied()
        await self._after(applied, record.at)
        return applied

    async def _commit_admission(self, record: journal_pb2.JournalRecord, admit: Admit) -> Applied:
        """Commit an admission, planning its mini-batch while the journal writes the record: the plan reads only
        the metadata, and the assignments are dispatched only once the record is durable and applied. A large
        mini-batch is planned off the loop, so the report that admitted it is answered without waiting for it."""
        writing = asyncio.ensure_future(self._commits.append(record))
        await asyncio.sleep(0)  # let the write go out before planning (a small mini-batch's) takes the loop
        ahead = self._plans.ahead(admit.trajectory_ids)
        await writing
        applied = self._commits.apply(record) or Applied()
        if applied.admitted is not None and ahead is not None:
            self._plans.adopt(applied.admitted, ahead)
        await self._after(applied, record.at)
        return applied

    async def _commit_report(self, report: Classified) -> Applied:
        at = self._clock()
        if self._journal.keeps_records:
            record = report.record(at)
            await self._commits.append(record)
            applied = self._commits.apply(record, report) or Applied()
        else:  # nothing would keep the record: apply the report without building it
            applied = self._ledger.apply_report(at, report)
            note_small_block(self._ledger)
        await self._after(applied, at)
        return applied

    async def _after(self, applied: Applied, at: float) -> None:
        metrics = self._metrics
        if applied.attached or (applied.decided is not None and self._ledger.settings.topology.roles):
            async with self._published:  # a trainer role may be dispatched a mini-batch now (attachments)
                self._published.notify_all()
        if applied.admitted is not None:
            self._plans.start(applied.admitted)  # a large one off the loop, before any stream asks
            async with self._published:
                self._published.notify_all()
            # The woken assignment streams run once this call yields: its response goes first. (Yielding here made
            # the report wait for every stream's message to be built and written: tens of milliseconds with
            # hundreds of streams.)
            self._on_admitted(applied.admitted, at)
        if applied.dropped:
            metrics.dropped.labels(applied.drop_reason.value).inc(len(applied.dropped))
        self._deleter.enqueue(applied.freed_keys)
        if applied.version_changed:
            metrics.policy_version.set(self._ledger.version)
        if applied.decided is not None:
            async with self._verdicts:
                self._verdicts.notify_all()
        if applied.failure is not None:
            failure = applied.failure
            if applied.failed_minibatch:
                metrics.failed_minibatches.inc()
            logger.error(
                "consumer %s could not deliver mini-batch %d (train batch %d, mini-batch %d, micro-batch %d): "
                "trajectory %r, unit %r: %s", failure_consumer(failure), failure.sequence, failure.train_batch_index,
                failure.minibatch_index, failure.microbatch_index, failure.trajectory_id, failure.unit_key,
                failure.reason,
            )

    def _on_admitted(self, minibatch: AdmittedMiniBatch, at: float) -> None:
        metrics = self._metrics
        metrics.admitted_minibatches.inc()
        admission = minibatch.admission
        previous = self._last_admission_at
        if previous is not None:
            metrics.wait_seconds.observe(max(0.0, at - previous))
        self._last_admission_at = at
        by_source: dict[str, int] = {}
        for trajectory_id in minibatch.trajectory_ids:
            source, _, oldest = self._ledger.row_summary(trajectory_id)
            by_source[source] = by_source.get(source, 0) + 1
            metrics.staleness.observe(admission.train_version - oldest)
        for source, count in by_source.items():
            metrics.admitted_trajectories.labels(source).inc(count)
        logger.info(
            "admitted mini-batch %d/%d of train batch %d (%d trajectories, sequence %d)",
            admission.minibatch_index + 1, admission.num_minibatches, admission.train_batch_index,
            len(minibatch.trajectory_ids), minibatch.sequence,
        )

    def _stop_admission(self, failure: str) -> None:
        """Admission stops here until a change lets the engine decide otherwise; said once per distinct failure."""
        if failure != self._failure:
            logger.error("admission stopped: %s", failure)
        self._failure = failure

    async def _admit_until_wait(self) -> None:
        """Carry out the engine's decisions until it waits, each journaled before it applies; must hold the lock."""
        ledger = self._ledger
        now = self._clock()
        decisions = decisions_until_wait(ledger.engine, now, ledger.version)
        moved: tuple[float, int] | None = None
        while True:
            try:
                decision = decisions.send(moved)  # on the first step, the same as next()
            except KnitTransError as exc:  # e.g. on_starvation: fail; reports stay acknowledged
                self._stop_admission(str(exc))
                return
            if isinstance(decision, Admit):
                try:
                    ledger.engine.check_admit(decision)
                except KnitTransError as exc:  # journaled, it would fail every restart's replay the same way
                    self._stop_admission(f"the state refuses the engine's admission of mini-batch "
                                         f"{decision.minibatch_index + 1} of train batch "
                                         f"{decision.train_batch_index}: {exc}")
                    return
            self._failure = ""
            record = record_for(decision, now, ledger.last_wait)
            if record is not None:
                try:
                    if isinstance(decision, Admit) and self._journal.keeps_records:
                        applied = await self._commit_admission(record, decision)
                    else:
                        applied = await self._commit(record)
                except Unavailable as exc:  # not journaled, so not decided: decide again shortly
                    logger.warning("%s; admission decides again in %.1fs", exc, RETRY_ADMISSION_AFTER)
                    self._wake.at(self._clock() + RETRY_ADMISSION_AFTER)
                    return
                if applied.changed_blocking:
                    logger.info("admission waiting: %s (%s)", decision.reason, getattr(decision, "detail", ""))
            if isinstance(decision, Wait):
                self._wake.at(decision.wake_at)
                self._refresh_gauges()
                return
            now = self._clock()  # the journal write took time
            moved = (now, ledger.version)

    async def _timed_admission(self) -> None:
        async with self._lock:
            await self._admit_until_wait()

    # -- RPCs ------------------------------------------------------------------------------------------

    async def ReportTrajectories(self, request: pb.ReportTrajectoriesRequest, context: aio.ServicerContext):
        async with self._commits.mutating():
            try:
                report = classify(request, self._ledger)
            except InvalidArgument:
                count = len(request.batch.trajectory_ids) if request.HasField("batch") else len(request.trajectories)
                self._metrics.reports.labels("invalid").inc(count)
                raise
            if report.accepted_rows:
                await self._commit_report(report)
            await self._admit_until_wait()
        for outcome, count in outcome_counts(report).items():
            self._metrics.reports.labels(_OUTCOME_NAMES[outcome]).inc(count)
        collect_young_objects()  # before answering: the reporter's next call then finds no collection under way
        return report_response(report)

    async def ReportScheduled(self, request: pb.ReportScheduledRequest, context: aio.ServicerContext):
        if request.count > 10_000_000:
            raise InvalidArgument("is implausibly large", field="count")
        async with self._commits.mutating():
            record = journal_pb2.JournalRecord(at=self._clock(), scheduled=request)
            if not (request.request_id and request.request_id in self._ledger.scheduled_requests):
                await self._commit(record)
                await self._admit_until_wait()
        return pb.ReportScheduledResponse(total_scheduled=self._ledger.scheduled.get(request.rollout_step, 0))

    async def RegisterConsumer(self, request: pb.RegisterConsumerRequest, context: aio.ServicerContext):
        consumer = _consumer(request.consumer, "consumer")
        self._ledger.check_consumer(consumer)
        return pb.RegisterConsumerResponse(
            topology=topology_to_proto(self._ledger.settings.topology.view_of(consumer.role)),
            acknowledged_sequence=self._ledger.acknowledged[consumer],
            job=self._job,
            num_minibatches=self._ledger.settings.engine.num_minibatches,
        )

    async def WatchAssignments(
        self, request: pb.WatchAssignmentsRequest, context: aio.ServicerContext
    ) -> AsyncIterator[pb.WatchAssignmentsResponse]:
        consumer = _consumer(request.consumer, "consumer")
        self._ledger.check_consumer(consumer)
        role = consumer.role
        async for minibatch in self._dispatchable(self._checked_start(request.after_sequence), (role,)):
            dispatch = await self._plans.dispatch(minibatch, role)  # off the loop unless small
            # Serialised once per DP rank (the boundary sends bytes as they are); built off the loop.
            yield await self._messages.response(minibatch, dispatch, consumer,
                                                include_trajectory_ids=request.include_trajectory_ids)

    async def WatchNodeAssignments(
        self, request: pb.WatchNodeAssignmentsRequest, context: aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        node = NodeConsumers(consumers=tuple(_consumer(c, f"consumers[{i}]") for i, c in enumerate(request.consumers)))
        for position, consumer in enumerate(node.consumers):
            self._ledger.check_consumer(consumer, f"consumers[{position}]")
        async for minibatch in self._dispatchable(self._checked_start(request.after_sequence), node.roles):
            for group, positions_of in node.groups.items():
                dispatch = await self._plans.dispatch(minibatch, node.role_of(group))
                async for ready in self._messages.ready_batches(minibatch, dispatch, list(positions_of)):
                    yield node_response_bytes([(positions_of[key], data) for key, data in ready])

    async def _dispatchable(self, after: int, roles: tuple[str, ...]) -> AsyncIterator[AdmittedMiniBatch]:
        """The admitted mini-batches after ``after``, in sequence order, each as soon as the consumers of every
        role of ``roles`` may be dispatched it; ends when the service closes."""
        while True:
            async with self._published:
                await self._published.wait_for(
                    lambda last=after: self._closed or all(self._ready_after(last, role) for role in roles))
                if self._closed:
                    return
                pending = self._ledger.pending_after(after)
            for minibatch in pending:  # in sequence order
                if not all(ready_for(self._ledger, minibatch, role) for role in roles):
                    break  # a trainer role's fields are not all attached yet: wait for them
                yield minibatch
                after = minibatch.sequence

    def _checked_start(self, after: int) -> int:
        if after >= self._ledger.next_sequence + 1_000_000:
            raise InvalidArgument("is far beyond the last assignment", field="after_sequence")
        check_streamable(self._ledger, after)
        return after

    def _ready_after(self, after: int, role: str) -> bool:
        """Whether the mini-batch after ``after`` is admitted and may be dispatched to consumers of ``role``."""
        if self._ledger.next_sequence - 1 <= after:
            return False
        following = self._ledger.minibatches.get(after + 1)
        return following is None or ready_for(self._ledger, following, role)

    async def ReportProgress(self, request: pb.ReportProgressRequest, context: aio.ServicerContext):
        consumer = _consumer(request.consumer, "consumer")
        self._ledger.check_consumer(consumer)
        if request.stage not in _STAGES:
            raise InvalidArgument("must be VERIFIED, DELIVERED or OPTIMIZER_STEP", field="stage")
        if not 1 <= request.sequence < self._ledger.next_sequence:
            raise InvalidArgument(
                f"no assignment {request.sequence} (last is {self._ledger.next_sequence - 1})", field="sequence"
            )
        async with self._commits.mutating():
            if request.stage == pb.PROGRESS_STAGE_VERIFIED and not self._ledger.awaits_verification(
                    consumer, request.sequence):
                return pb.ReportProgressResponse(released=False)  # a repeat, or the verdict is in: nothing to journal
            applied = await self._commit(journal_pb2.JournalRecord(at=self._clock(), progress=request))
        if applied.released is not None:
            logger.info("released mini-batch %d (%d units freed)", applied.released.sequence, len(applied.freed_keys))
        return pb.ReportProgressResponse(released=applied.released is not None)

    async def ReportConsumerFailure(self, request: pb.ReportConsumerFailureRequest, context: aio.ServicerContext):
        failure = request.failure
        consumer = _consumer(failure.consumer, "failure.consumer")
        self._ledger.check_consumer(consumer)
        if not 1 <= failure.sequence < self._ledger.next_sequence:
            raise InvalidArgument(
                f"no assignment {failure.sequence} (last is {self._ledger.next_sequence - 1})", field="failure.sequence"
            )
        for name in ("trajectory_id", "unit_key"):
            if len(getattr(failure, name)) > MAX_ID_LENGTH:
                raise InvalidArgument(f"longer than {MAX_ID_LENGTH} characters", field=f"failure.{name}")
        if len(failure.reason) > MAX_FAILURE_REASON:
            raise InvalidArgument(f"longer than {MAX_FAILURE_REASON} characters", field="failure.reason")
        async with self._commits.mutating():
            if (consumer, failure.sequence) in self._ledger.failure_keys:
                return pb.ReportConsumerFailureResponse(recorded=False)
            record = journal_pb2.JournalRecord(at=self._clock(), consumer_failure=request)
            minibatch = self._ledger.minibatches.get(failure.sequence)
            if minibatch is not None:  # the service's own indices, whatever the consumer sent
                record.consumer_failure.failure.train_batch_index = minibatch.admission.train_batch_index
                record.consumer_failure.failure.minibatch_index = minibatch.admission.minibatch_index
            await self._commit(record)
        return pb.ReportConsumerFailureResponse(recorded=True)

    async def WaitMiniBatchVerdict(self, request: pb.WaitMiniBatchVerdictRequest, context: aio.ServicerContext):
        timeout = request.timeout_seconds
        if not (math.isfinite(timeout) and 0 <= timeout <= MAX_VERDICT_WAIT):
            raise InvalidArgument(f"must be between 0 and {MAX_VERDICT_WAIT:g} seconds", field="timeout_seconds")
        sequence, role = request.sequence, request.role
        if role:  # an unknown role is INVALID_ARGUMENT naming it
            within("role", lambda: ConsumerId(role=role, dp_rank=0).check_within(self._ledger.settings.topology))
        verdict, failure = role_verdict(self._ledger, sequence, role)
        if verdict is Verdict.PENDING and timeout > 0:
            async with self._verdicts:
                try:
                    await asyncio.wait_for(self._verdicts.wait_for(
                        lambda: self._closed or role_verdict(self._ledger, sequence, role)[0] is not Verdict.PENDING),
                        timeout)
                except TimeoutError:
                    pass
            verdict, failure = role_verdict(self._ledger, sequence, role)
        return verdict_response(verdict, failure, self._ledger.unverified(sequence, role))

    async def AttachFields(self, request: pb.AttachFieldsRequest, context: aio.ServicerContext):
        return await attach_fields(request, ledger=self._ledger, commits=self._commits, commit=self._commit,
                                   clock=self._clock)

    async def ReportCheckpoint(self, request: pb.ReportCheckpointRequest, context: aio.ServicerContext):
        return await report_checkpoint(request, ledger=self._ledger, commits=self._commits, commit=self._commit,
                                       clock=self._clock)

    async def AdvanceVersion(self, request: pb.AdvanceVersionRequest, context: aio.ServicerContext):
        async with self._commits.mutating():
            ledger = self._ledger
            if request.new_version > ledger.version:
                admitted_up_to = ledger.engine.train_version
                if request.new_version > admitted_up_to:
                    raise FailedPrecondition(
                        f"version {request.new_version} is ahead of the admitted train batches (next trains at "
                        f"{admitted_up_to})",
                        field="new_version",
                    )
                await self._commit(journal_pb2.JournalRecord(at=self._clock(), version=request))
                # What the new version lets the engine admit is admitted once this call is answered: the caller is
                # the training loop of global rank 0, which would otherwise wait for the next mini-batch's
                # admission (its journal write and planning) at every train batch's end.
                self._wake.at(self._clock())
            return pb.AdvanceVersionResponse(version=ledger.version)

    async def ReserveUnits(self, request: pb.ReserveUnitsRequest, context: aio.ServicerContext):
        wanted = {key for r in request.reservations for key in (*r.multimodal_keys, *r.unit_keys)}
        while True:
            async with self._commits.mutating():
                if self._deleter.deleting.isdisjoint(wanted):
                    check_reservations(request, self._ledger.index, limit=self._ledger.settings.max_report_batch)
                    reported = [r.trajectory_id for r in request.reservations
                                if self._ledger.is_reported(TrajectoryId(r.trajectory_id))]
                    new = sum(r.trajectory_id not in reported
                              and self._ledger.index.reservation(TrajectoryId(r.trajectory_id)) is None
                              for r in request.reservations)
                    if new:
                        now = self._clock()
                        reserved = reservation_gc.stamped(request, now, self._unit_ttl)  # expires_at, absolute
                        await self._commit(journal_pb2.JournalRecord(at=now, reserved=reserved))
                    return pb.ReserveUnitsResponse(reserved=new, already_reported=reported)
                ended = self._deleter.ended
            # A unit being deleted now may be gone or not when the deletion ends: wait, so that the caller's write
            # that follows this reservation finds it absent and stores it again.
            await ended.wait()

    async def CancelReservations(self, request: pb.CancelReservationsRequest, context: aio.ServicerContext):
        if len(request.trajectory_ids) > self._ledger.settings.max_report_batch:
            raise InvalidArgument("too many trajectory ids in one request", field="trajectory_ids")
        freed: tuple[str, ...] = ()
        async with self._commits.mutating():
            held = [t for t in request.trajectory_ids if self._ledger.index.reservation(TrajectoryId(t)) is not None]
            if held:
                cancelled = pb.CancelReservationsRequest(request_id=request.request_id, trajectory_ids=held)
                record = journal_pb2.JournalRecord(at=self._clock(), reservations_cancelled=cancelled)
                freed = (await self._commit(record)).freed_keys
        # A failed submit leaves nothing behind: answer once the units nobody references any more are deleted.
        await self._deleter.wait_gone(freed)
        return pb.CancelReservationsResponse(cancelled=len(held))

    async def GetStatus(self, request: pb.GetStatusRequest, context: aio.ServicerContext):
        return status_response(self._ledger, failure=self._failure, now=self._clock())

    # -- background work -------------------------------------------------------------------------------

    async def _tick_gauges(self) -> None:
        while True:
            self._refresh_gauges()
            await asyncio.sleep(1.0)

    def _refresh_gauges(self) -> None:
        now = self._clock()
        self._metrics.refresh(self._ledger, now=now)
        self._unfinished_steps.check(self._ledger, now=now)
