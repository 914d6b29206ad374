"""The gRPC shell of the admission service: translate, journal, apply, publish.

Every state change follows the same path under one lock: build a journal record, append it (Redis when
configured), apply it to the :class:`AdmissionLedger`, then act on what changed (wake assignment streams,
queue unit deletions, update metrics). After every input the engine is asked for decisions until it waits.

Each record goes to the journal at the next sequence, fenced (see journal.py). When a write's outcome is unknown
(Redis timed out or went away) the service keeps the lock, so no other change is decided, and reads the journal's
tail until Redis answers: a record that is there happened and is applied; one that is not did not, and the call
fails UNAVAILABLE (an admission is decided again). Mutating calls wait for the lock at most
``mutation_wait_seconds``, then fail UNAVAILABLE; reads go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import math
import time
from collections.abc import AsyncIterator, Callable

from grpc import aio

from knittrans.admission.engine import decisions_until_wait
from knittrans.admission.engine.decisions import Admit, BlockingReason, Wait
from knittrans.admission.service.ingest.report import Classified, classify
from knittrans.admission.service.ingest.reservations import check_reservations
from knittrans.admission.service.journal import (
    Journal,
    JournalFenced,
    JournalOutcomeUnknown,
    is_next,
    same_bytes,
)
from knittrans.admission.service.ledger import AdmissionLedger, AdmittedMiniBatch, Applied, Verdict, failure_consumer
from knittrans.admission.service.metrics import AdmissionMetrics
from knittrans.admission.service.responses import (
    assignment_response,
    outcome_counts,
    report_response,
    status_response,
    verdict_response,
)
from knittrans.errors import FailedPrecondition, InvalidArgument, KnitTransError, Unavailable
from knittrans.types import MAX_ID_LENGTH, ConsumerId, TrajectoryId
from knittrans.v1 import admission_service_pb2 as pb
from knittrans.v1 import admission_service_pb2_grpc, journal_pb2
from knittrans.wire import consumer_from_proto, topology_to_proto, within

logger = logging.getLogger(__name__)

_STAGES = (pb.PROGRESS_STAGE_VERIFIED, pb.PROGRESS_STAGE_DELIVERED, pb.PROGRESS_STAGE_OPTIMIZER_STEP)
MAX_VERDICT_WAIT = 60.0  # seconds one WaitMiniBatchVerdict call may wait
MAX_FAILURE_REASON = 1024  # characters
YOUNG_COLLECTION = 2_000  # objects allocated since the last collection
DEFAULT_MUTATION_WAIT = 10.0  # seconds a mutating call waits for the lock before it fails UNAVAILABLE
SETTLE_BACKOFF = (0.05, 1.0)  # seconds between reads of the journal's tail while Redis does not answer
RETRY_ADMISSION_AFTER = 0.5  # seconds before an admission that could not be journaled is decided again
RETRY_AFTER_ERROR = 5.0  # seconds before a timed admission that failed otherwise is tried again
_OUTCOME_NAMES = {pb.REPORT_OUTCOME_ACCEPTED: "accepted", pb.REPORT_OUTCOME_DUPLICATE: "duplicate",
                  pb.REPORT_OUTCOME_CONFLICT: "conflict"}


def collect_young_objects() -> None:
    """Collect the young generation now if it has grown: a report leaves thousands of new objects (the ledger's
    entries), and collecting them at the end of the call, once its assignments went out, keeps the pause off the
    report-to-assignment path (see app.tune_garbage_collector). Older generations are collected here too, as
    often as the collector's thresholds ask for relative to young collections."""
    counts, thresholds = gc.get_count(), gc.get_threshold()
    if counts[0] < YOUNG_COLLECTION:
        return
    generation = 0
    if counts[1] + 1 >= thresholds[1]:
        generation = 2 if counts[2] + 1 >= thresholds[2] else 1
    gc.collect(generation)


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
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._ledger = ledger
        self._journal = journal
        self._metrics = metrics
        self._job = job
        self._delete_keys = delete_keys
        self._delete_batch_size = delete_batch_size
        self._clock = clock
        self._mutation_wait = mutation_wait_seconds
        self._lock = asyncio.Lock()
        self._applied_sequence = 0  # the last journal record applied to the ledger
        self._settling = False  # a journal write's outcome is unknown and its tail is being read
        self._published = asyncio.Condition()
        self._verdicts = asyncio.Condition()  # notified when a mini-batch's verdict is decided
        self._deletions: asyncio.Queue[str] = asyncio.Queue()
        # Keys whose deletion from the store is under way, and an event set when that deletion has ended.
        self._deleting: frozenset[str] = frozenset()
        self._deletion_ended = asyncio.Event()
        self._deletion_ended.set()
        self._deletions_done = asyncio.Condition()  # notified whenever deleted units were journaled
        self._background: list[asyncio.Task] = []
        self._wake_handle: asyncio.TimerHandle | None = None
        self._wakes: set[asyncio.Task] = set()  # timed admissions under way (kept referenced until they end)
        self._last_admission_at: float | None = None
        self._failure: str = ""
        self._violations_exported = 0
        self._closed = False

    # -- lifecycle -------------------------------------------------------------------------------------

    async def recover(self) -> int:
        """Rebuild the ledger from the journal; returns the number of records replayed."""
        count = 0
        async for record in self._journal.replay():
            if self._apply_journaled(record) is not None:
                count += 1
        for key in self._ledger.pending_deletes:
            self._deletions.put_nowait(key)
        if count:
            logger.info(
                "recovered %d journal records: %d mini-batches admitted, version %d",
                count, self._ledger.next_sequence - 1, self._ledger.version,
            )
        async with self._lock:
            await self._admit_until_wait()
        self._refresh_gauges()
        return count

    def start_background(self) -> None:
        self._background.append(asyncio.create_task(self._delete_released(), name="delete-released"))
        self._background.append(asyncio.create_task(self._tick_gauges(), name="gauges"))

    async def close(self) -> None:
        self._closed = True
        if self._wake_handle is not None:
            self._wake_handle.cancel()
        for task in (*self._background, *self._wakes):
            task.cancel()
        await asyncio.gather(*self._background, *self._wakes, return_exceptions=True)
        async with self._published:
            self._published.notify_all()
        async with self._verdicts:
            self._verdicts.notify_all()

    # -- the commit path -------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _mutating(self) -> AsyncIterator[None]:
        """The lock, for a mutating call: UNAVAILABLE if it is not free within ``mutation_wait_seconds`` (the
        holder may be waiting for Redis to tell whether a journal write happened)."""
        try:
            if self._lock.locked():
                await asyncio.wait_for(self._lock.acquire(), self._mutation_wait)
            else:  # free: taken at once (wait_for would start a task per call)
                await self._lock.acquire()
        except TimeoutError:
            why = "waiting to learn whether a journal write happened" if self._settling else "busy"
            raise Unavailable(f"the admission service is {why}; retry") from None
        try:
            yield
        finally:
            self._lock.release()

    def _apply_journaled(self, record: journal_pb2.JournalRecord, prepared: Classified | None = None) -> Applied | None:
        """Apply a journaled record to the ledger, once: None if its sequence was applied already."""
        if not is_next(self._applied_sequence, record.sequence):
            return None
        applied = self._ledger.apply(record, prepared)
        self._applied_sequence = record.sequence
        return applied

    async def _append(self, record: journal_pb2.JournalRecord) -> None:
        """Journal ``record`` at the next sequence; must hold the lock. Returns once the record is in the journal
        (the caller applies it). Raises Unavailable once it is known not to be, after applying whatever the
        journal holds in its place: a change is never decided again over a write whose outcome is unknown."""
        record.sequence = self._applied_sequence + 1
        try:
            await self._journal.append(record)
            return
        except JournalOutcomeUnknown as exc:
            logger.warning("%s; changes wait until the journal's tail tells whether it happened", exc)
            cause: KnitTransError = exc
        except JournalFenced as exc:
            logger.warning("%s; applying the journal's tail", exc)
            cause = exc
        if await self._settle(record):
            logger.warning("journal record %d was written after all; applying it", record.sequence)
            return
        logger.warning("journal record %d was not written: the change did not happen", record.sequence)
        raise Unavailable(f"the change was not journaled ({cause.message}); retry") from cause

    async def _settle(self, record: journal_pb2.JournalRecord) -> bool:
        """Read the journal after the last applied record until Redis answers. True if ``record`` is next there;
        otherwise apply what is there (another writer's records, or none) and return False."""
        self._settling = True
        delay, longest = SETTLE_BACKOFF
        try:
            while True:
                try:
                    tail = [r async for r in self._journal.replay(after=self._applied_sequence)]
                    break
                except Unavailable as exc:
                    if self._closed:
                        raise
                    logger.info("journal tail not readable yet (%s); again in %.2fs", exc, delay)
                    await asyncio.sleep(delay)
                    delay = min(2 * delay, longest)
        finally:
            self._settling = False
        if tail and same_bytes(tail[0], record):
            return True
        for journaled in tail:
            applied = self._apply_journaled(journaled)
            if applied is not None:
                await self._after(applied, journaled.at)
        return False

    async def _commit(self, record: journal_pb2.JournalRecord) -> Applied:
        await self._append(record)
        applied = self._apply_journaled(record) or Applied()
        await self._after(applied, record.at)
        return applied

    async def _commit_admission(self, record: journal_pb2.JournalRecord, admit: Admit) -> Applied:
        """Commit an admission, planning its mini-batch while the journal writes the record: the plan reads only
        the metadata, and the assignments are dispatched only once the record is durable and applied."""
        writing = asyncio.ensure_future(self._append(record))
        await asyncio.sleep(0)  # let the write go out before planning takes the loop
        try:
            dispatch = self._ledger.plan_dispatch(admit.trajectory_ids)
        except Exception:  # planning ahead must not stop the commit: the streams plan again and report the error
            logger.debug("planning mini-batch ahead of its commit failed", exc_info=True)
            dispatch = None
        await writing
        applied = self._apply_journaled(record) or Applied()
        if applied.admitted is not None and dispatch is not None:
            applied.admitted.dispatch = dispatch
        await self._after(applied, record.at)
        return applied

    async def _commit_report(self, report: Classified) -> Applied:
        at = self._clock()
        if self._journal.keeps_records:
            record = report.record(at)
            await self._append(record)
            applied = self._apply_journaled(record, report) or Applied()
        else:  # nothing would keep the record: apply the report without building it
            applied = self._ledger.apply_report(at, report)
        await self._after(applied, at)
        return applied

    async def _after(self, applied: Applied, at: float) -> None:
        metrics = self._metrics
        if applied.admitted is not None:
            async with self._published:
                self._published.notify_all()
            # Let the woken assignment streams build and send before this call goes on (its metrics, its next
            # decision, its response): report-to-assignment latency is what the consumers wait on.
            await asyncio.sleep(0)
            self._on_admitted(applied.admitted, at)
        if applied.dropped:
            metrics.dropped.labels(applied.drop_reason.value).inc(len(applied.dropped))
        for key in applied.freed_keys:
            self._deletions.put_nowait(key)
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
                if str(exc) != self._failure:
                    logger.error("admission stopped: %s", exc)
                self._failure = str(exc)
                return
            self._failure = ""
            record = ledger.record_for(decision, now)
            if record is not None:
                try:
                    if isinstance(decision, Admit) and self._journal.keeps_records:
                        applied = await self._commit_admission(record, decision)
                    else:
                        applied = await self._commit(record)
                except Unavailable as exc:  # not journaled, so not decided: decide again shortly
                    logger.warning("%s; admission decides again in %.1fs", exc, RETRY_ADMISSION_AFTER)
                    self._schedule_wake(self._clock() + RETRY_ADMISSION_AFTER)
                    return
                if applied.changed_blocking:
                    logger.info("admission waiting: %s (%s)", decision.reason, getattr(decision, "detail", ""))
            if isinstance(decision, Wait):
                self._schedule_wake(decision.wake_at)
                self._refresh_gauges()
                return
            now = self._clock()  # the journal write took time
            moved = (now, ledger.version)

    def _schedule_wake(self, wake_at: float | None) -> None:
        if self._wake_handle is not None:
            self._wake_handle.cancel()
            self._wake_handle = None
        if wake_at is None:
            return
        loop = asyncio.get_running_loop()
        delay = max(0.0, wake_at - self._clock())
        self._wake_handle = loop.call_later(delay, self._start_wake)

    def _start_wake(self) -> None:
        if self._closed:
            return
        task = asyncio.ensure_future(self._wake())
        self._wakes.add(task)
        task.add_done_callback(self._wakes.discard)

    async def _wake(self) -> None:
        """A timed decision (a wait that ends, e.g. ``relax_after``); one that fails is tried again, not left
        for the next call to find."""
        try:
            async with self._lock:
                await self._admit_until_wait()
        except asyncio.CancelledError:
            raise
        except Exception:  # not the journal (_admit_until_wait retries that itself): a bug, so not too often
            logger.exception("timed admission failed; trying again in %.1fs", RETRY_AFTER_ERROR)
            if not self._closed:
                self._schedule_wake(self._clock() + RETRY_AFTER_ERROR)

    # -- RPCs ------------------------------------------------------------------------------------------

    async def ReportTrajectories(self, request: pb.ReportTrajectoriesRequest, context: aio.ServicerContext):
        async with self._mutating():
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
        async with self._mutating():
            record = journal_pb2.JournalRecord(at=self._clock(), scheduled=request)
            if not (request.request_id and request.request_id in self._ledger.scheduled_requests):
                await self._commit(record)
                await self._admit_until_wait()
        return pb.ReportScheduledResponse(total_scheduled=self._ledger.scheduled.get(request.rollout_step, 0))

    async def RegisterConsumer(self, request: pb.RegisterConsumerRequest, context: aio.ServicerContext):
        consumer = _consumer(request.consumer, "consumer")
        self._ledger.check_consumer(consumer)
        return pb.RegisterConsumerResponse(
            topology=topology_to_proto(self._ledger.settings.topology),
            acknowledged_sequence=self._ledger.acknowledged[consumer],
            job=self._job,
        )

    async def WatchAssignments(
        self, request: pb.WatchAssignmentsRequest, context: aio.ServicerContext
    ) -> AsyncIterator[pb.WatchAssignmentsResponse]:
        consumer = _consumer(request.consumer, "consumer")
        self._ledger.check_consumer(consumer)
        after = request.after_sequence
        if after >= self._ledger.next_sequence + 1_000_000:
            raise InvalidArgument("is far beyond the last assignment", field="after_sequence")
        while True:
            async with self._published:
                await self._published.wait_for(lambda last=after: self._ledger.next_sequence - 1 > last or self._closed)
                if self._closed:
                    return
                pending = self._ledger.pending_after(after)
            for minibatch in pending:
                yield self._assignment(minibatch, consumer)
                after = minibatch.sequence

    def _assignment(self, minibatch: AdmittedMiniBatch, consumer: ConsumerId) -> pb.WatchAssignmentsResponse:
        return assignment_response(minibatch, self._ledger.dispatch(minibatch), consumer)

    async def ReportProgress(self, request: pb.ReportProgressRequest, context: aio.ServicerContext):
        consumer = _consumer(request.consumer, "consumer")
        self._ledger.check_consumer(consumer)
        if request.stage not in _STAGES:
            raise InvalidArgument("must be VERIFIED, DELIVERED or OPTIMIZER_STEP", field="stage")
        if not 1 <= request.sequence < self._ledger.next_sequence:
            raise InvalidArgument(
                f"no assignment {request.sequence} (last is {self._ledger.next_sequence - 1})", field="sequence"
            )
        async with self._mutating():
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
        async with self._mutating():
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
        sequence = request.sequence
        verdict, failure = self._ledger.verdict(sequence)
        if verdict is Verdict.PENDING and timeout > 0:
            async with self._verdicts:
                try:
                    await asyncio.wait_for(self._verdicts.wait_for(
                        lambda: self._closed or self._ledger.verdict(sequence)[0] is not Verdict.PENDING), timeout)
                except TimeoutError:
                    pass
            verdict, failure = self._ledger.verdict(sequence)
        return verdict_response(verdict, failure, self._ledger.unverified(sequence))

    async def AdvanceVersion(self, request: pb.AdvanceVersionRequest, context: aio.ServicerContext):
        async with self._mutating():
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
                await self._admit_until_wait()
            return pb.AdvanceVersionResponse(version=ledger.version)

    async def ReserveUnits(self, request: pb.ReserveUnitsRequest, context: aio.ServicerContext):
        wanted = {key for reservation in request.reservations for key in reservation.multimodal_keys}
        while True:
            async with self._mutating():
                if self._deleting.isdisjoint(wanted):
                    check_reservations(request, self._ledger.index, limit=self._ledger.settings.max_report_batch)
                    new = sum(
                        not self._ledger.is_reported(TrajectoryId(r.trajectory_id))
                        and self._ledger.index.reservation(TrajectoryId(r.trajectory_id)) is None
                        for r in request.reservations
                    )
                    if new:
                        await self._commit(journal_pb2.JournalRecord(at=self._clock(), reserved=request))
                    return pb.ReserveUnitsResponse(reserved=new)
                ended = self._deletion_ended
            # A unit being deleted now may be gone or not when the deletion ends: wait, so that the caller's write
            # that follows this reservation finds it absent and stores it again.
            await ended.wait()

    async def CancelReservations(self, request: pb.CancelReservationsRequest, context: aio.ServicerContext):
        if len(request.trajectory_ids) > self._ledger.settings.max_report_batch:
            raise InvalidArgument("too many trajectory ids in one request", field="trajectory_ids")
        freed: tuple[str, ...] = ()
        async with self._mutating():
            held = [t for t in request.trajectory_ids if self._ledger.index.reservation(TrajectoryId(t)) is not None]
            if held:
                cancelled = pb.CancelReservationsRequest(request_id=request.request_id, trajectory_ids=held)
                record = journal_pb2.JournalRecord(at=self._clock(), reservations_cancelled=cancelled)
                freed = (await self._commit(record)).freed_keys
        # A failed submit leaves nothing behind: answer once the units nobody references any more are deleted.
        pending = self._ledger.pending_deletes
        async with self._deletions_done:
            await self._deletions_done.wait_for(lambda: all(key not in pending for key in freed))
        return pb.CancelReservationsResponse(cancelled=len(held))

    async def GetStatus(self, request: pb.GetStatusRequest, context: aio.ServicerContext):
        return status_response(self._ledger, failure=self._failure, now=self._clock())

    # -- background work -------------------------------------------------------------------------------

    async def _delete_released(self) -> None:
        """Delete released units from the store in batches, then journal that they are gone.

        A key referenced again after its release (a reservation, or a report, revived it) is no longer pending
        and is skipped. While a batch is being deleted, reservations of its keys wait (see ReserveUnits)."""
        while True:
            queued = [await self._deletions.get()]
            while len(queued) < self._delete_batch_size and not self._deletions.empty():
                queued.append(self._deletions.get_nowait())
            async with self._lock:
                pending = self._ledger.pending_deletes
                keys = [key for key in dict.fromkeys(queued) if key in pending]
                if not keys:
                    continue
                self._deleting = frozenset(keys)
                self._deletion_ended.clear()
            try:
                if self._delete_keys is not None:
                    try:
                        await asyncio.to_thread(self._delete_keys, keys)
                    except KnitTransError as exc:
                        logger.warning("deleting %d released units failed, retrying later: %s", len(keys), exc)
                        await asyncio.sleep(1.0)
                        for key in keys:
                            self._deletions.put_nowait(key)
                        continue
                try:
                    async with self._lock:
                        deleted = journal_pb2.UnitsDeleted(keys=keys)
                        await self._commit(journal_pb2.JournalRecord(at=self._clock(), deleted=deleted))
                except Unavailable as exc:  # still pending: deleted again (which finds them gone) and journaled
                    logger.warning("journaling %d deleted units failed, retrying later: %s", len(keys), exc)
                    await asyncio.sleep(1.0)
                    for key in keys:
                        self._deletions.put_nowait(key)
                    continue
                self._metrics.released_units.inc(len(keys))
                async with self._deletions_done:
                    self._deletions_done.notify_all()
            finally:
                self._deleting = frozenset()
                self._deletion_ended.set()

    async def _tick_gauges(self) -> None:
        while True:
            self._refresh_gauges()
            await asyncio.sleep(1.0)

    def _refresh_gauges(self) -> None:
        ledger = self._ledger
        metrics = self._metrics
        status = ledger.engine.status()
        for source in status.sources:
            metrics.pool.labels(source.source).set(source.ready)
            metrics.quota_target.labels(source.source).set(source.quota)
            metrics.quota_slack.labels(source.source).set(source.slack)
        reason, _, since = ledger.blocking()
        blocked = 0.0 if since is None or reason is BlockingReason.NONE else max(0.0, self._clock() - since)
        metrics.set_blocking(reason, blocked)
        metrics.train_batch_index.set(status.train_batch_index)
        metrics.minibatch_index.set(status.minibatches_admitted)
        metrics.policy_version.set(ledger.version)
        if ledger.quota_violations > self._violations_exported:
            metrics.quota_violations.inc(ledger.quota_violations - self._violations_exported)
            self._violations_exported = ledger.quota_violations

