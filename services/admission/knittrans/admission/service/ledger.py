"""The admission service's whole state, changed only by applying journal records.

:class:`AdmissionLedger` holds the engine state, the reported metadata, the unit index with its reference
counts, the admitted mini-batches with the consumers that still owe their optimizer step, and every
consumer's acknowledged stream position. It does no I/O and reads no clock: the servicer builds a
:class:`~knittrans.v1.journal_pb2.JournalRecord` for each change, journals it, then applies it here. Recovery
applies the journaled records in order and arrives at the same state.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from knittrans.admission.engine import AdmissionState, EngineConfig, PoolEntry, decide
from knittrans.admission.engine.decisions import Admit, BlockingReason, Decision, Drop, DropReason, Wait
from knittrans.admission.engine.state import EngineStatus
from knittrans.admission.planning import plan_minibatch
from knittrans.admission.service.ingest import Ingested, IngestLimits, check_batch, check_trajectory, fingerprint
from knittrans.errors import FailedPrecondition, InvalidArgument
from knittrans.plan import Plan
from knittrans.store.index import IndexEntry, UnitIndex
from knittrans.types import (
    BACKBONE_ROLE,
    ENCODER_ROLE_PREFIX,
    AdmissionUnit,
    ConsumerId,
    SampleId,
    SourceName,
    Topology,
    TrajectoryId,
    UnitKey,
)
from knittrans.v1 import admission_pb2, admission_service_pb2, journal_pb2, trajectory_pb2
from knittrans.wire import trusted_trajectory_from_proto

logger = logging.getLogger(__name__)

_BLOCKING_TO_PROTO = {r: admission_pb2.BlockingReason.Value(f"BLOCKING_REASON_{r.name}") for r in BlockingReason}
_BLOCKING_FROM_PROTO = {number: reason for reason, number in _BLOCKING_TO_PROTO.items()}
_DROP_TO_PROTO = {r: admission_pb2.DropReason.Value(f"DROP_REASON_{r.name}") for r in DropReason}
_DROP_FROM_PROTO = {number: reason for reason, number in _DROP_TO_PROTO.items()}
OUTCOME = admission_service_pb2.ReportOutcome
_ANY_VERSION = 2**63


def blocking_to_proto(reason: BlockingReason) -> int:
    return _BLOCKING_TO_PROTO[reason]


def all_consumers(topology: Topology) -> tuple[ConsumerId, ...]:
    """Every planned consumer: one per backbone (dp, cp) and one per encoder dp rank."""
    backbone = topology.backbone
    consumers = [
        ConsumerId(role=BACKBONE_ROLE, dp_rank=dp, cp_rank=cp) for dp in range(backbone.dp) for cp in range(backbone.cp)
    ]
    for encoder in topology.encoders:
        consumers.extend(
            ConsumerId(role=f"{ENCODER_ROLE_PREFIX}{encoder.name}", dp_rank=dp) for dp in range(encoder.dp)
        )
    return tuple(consumers)


@dataclass(frozen=True, kw_only=True)
class LedgerSettings:
    engine: EngineConfig
    topology: Topology
    label_fields: tuple[str, ...] = ("input_ids",)
    initial_version: int = 0
    max_report_batch: int = 10_000


@dataclass
class MiniBatch:
    """An admitted mini-batch, kept until every planned consumer reported its optimizer step."""

    sequence: int
    admission: admission_pb2.MiniBatchAdmission
    trajectory_ids: tuple[TrajectoryId, ...]
    owed_steps: set[ConsumerId]
    plan: Plan | None = None  # derived from the metadata on demand; never journaled

    @property
    def released(self) -> bool:
        return not self.owed_steps


@dataclass
class Reported:
    fingerprint: bytes
    message: trajectory_pb2.TrajectoryMetadata | None  # None once released: only the fingerprint stays


@dataclass
class Classified:
    """How a report would be applied: its per-trajectory results and the new trajectories to journal."""

    results: list[admission_service_pb2.TrajectoryReportResult]
    accepted: list[trajectory_pb2.TrajectoryMetadata]


@dataclass
class Applied:
    """What applying one record changed, for the shell to act on (publish, delete, update metrics)."""

    admitted: MiniBatch | None = None
    dropped: tuple[TrajectoryId, ...] = ()
    drop_reason: DropReason | None = None
    released: MiniBatch | None = None
    freed_keys: tuple[UnitKey, ...] = ()
    changed_blocking: bool = False
    version_changed: bool = False


class AdmissionLedger:
    def __init__(self, settings: LedgerSettings) -> None:
        self.settings = settings
        self.consumers = all_consumers(settings.topology)
        self._consumer_set = frozenset(self.consumers)
        self.engine = AdmissionState(settings.engine, version=settings.initial_version)
        self.version = settings.initial_version
        self.limits = IngestLimits(
            sources=frozenset(settings.engine.sources), encoders=frozenset(e.name for e in settings.topology.encoders)
        )
        self.reported: dict[TrajectoryId, Reported] = {}
        # Validation results of the report being applied, so the hot path reads each message only once.
        self._prepared: dict[TrajectoryId, tuple[Ingested, bytes]] = {}
        self.index = UnitIndex()
        self.minibatches: dict[int, MiniBatch] = {}
        self.next_sequence = 1
        self.acknowledged: dict[ConsumerId, int] = dict.fromkeys(self.consumers, 0)
        self.scheduled_requests: set[str] = set()
        self.scheduled: dict[int, int] = {}  # rollout step -> trajectories declared scheduled
        self.pending_deletes: dict[UnitKey, None] = {}
        self.last_wait: Wait | None = None
        self.admitted_total = 0
        self.dropped_stale = 0
        self.released_minibatches = 0
        self.quota_violations = 0

    # -- checking inputs (no mutation) -----------------------------------------------------------------

    def classify(self, request: admission_service_pb2.ReportTrajectoriesRequest) -> Classified:
        """Validate a report whole and sort its trajectories into accepted, duplicate and conflict."""
        trajectories = request.trajectories
        ingested = check_batch(trajectories, self.limits, self.version, max_batch=self.settings.max_report_batch)
        results = []
        accepted = []
        claimed: dict[UnitKey, str] = {}
        for i, (message, item) in enumerate(zip(trajectories, ingested, strict=True)):
            trajectory_id = TrajectoryId(item.trajectory_id)
            known = self.reported.get(trajectory_id)
            digest = fingerprint(message)
            if known is None:
                self._check_keys(item, i, claimed)
                accepted.append(message)
                self._prepared[trajectory_id] = (item, digest)
                outcome, reason = OUTCOME.REPORT_OUTCOME_ACCEPTED, ""
            elif known.fingerprint == digest:
                outcome, reason = OUTCOME.REPORT_OUTCOME_DUPLICATE, ""
            else:
                outcome = OUTCOME.REPORT_OUTCOME_CONFLICT
                reason = "a different trajectory with this id was already acknowledged"
            results.append(
                admission_service_pb2.TrajectoryReportResult(
                    trajectory_id=trajectory_id, outcome=outcome, reason=reason
                )
            )
        return Classified(results=results, accepted=accepted)

    def _check_keys(self, item: Ingested, i: int, claimed: dict[UnitKey, str]) -> None:
        """A unit key belongs to one trajectory, a multimodal key to one sample (within and across reports)."""
        owner_of = self.index.owner
        for j, key in enumerate(item.unit_keys):
            if owner_of(key) is not None or key in claimed:
                raise InvalidArgument(
                    "is already referenced by another trajectory", field=f"trajectories[{i}].units[{j}].key"
                )
            claimed[key] = item.trajectory_id
        for j, key in enumerate(item.multimodal_keys):
            owner = owner_of(key) or claimed.get(key)
            if owner is not None and owner != item.sample_id:
                raise InvalidArgument(
                    f"belongs to {owner!r}, not to sample {item.sample_id!r}",
                    field=f"trajectories[{i}].multimodal[{j}].key",
                )
            claimed[key] = item.sample_id

    def check_consumer(self, consumer: ConsumerId, field_prefix: str = "consumer") -> None:
        if consumer not in self._consumer_set:
            try:
                consumer.check_within(self.settings.topology)
            except InvalidArgument as exc:
                raise InvalidArgument(exc.message, field=f"{field_prefix}.{exc.field}") from exc
            raise InvalidArgument(f"{consumer} is not a planned consumer", field=f"{field_prefix}.role")

    # -- deciding --------------------------------------------------------------------------------------

    def decide(self, now: float) -> Decision:
        return decide(self.engine, now, self.version)

    def record_for(self, decision: Decision, now: float) -> journal_pb2.JournalRecord | None:
        """The journal record that carries out ``decision``; None for a wait that changes nothing."""
        if isinstance(decision, Admit):
            return journal_pb2.JournalRecord(
                at=now,
                admission=admission_pb2.MiniBatchAdmission(
                    train_batch_index=decision.train_batch_index,
                    minibatch_index=decision.minibatch_index,
                    num_minibatches=decision.num_minibatches,
                    train_version=decision.train_version,
                    trajectory_ids=decision.trajectory_ids,
                    admitted_at=decision.admitted_at,
                ),
            )
        if isinstance(decision, Drop):
            return journal_pb2.JournalRecord(
                at=now,
                drop=admission_pb2.TrajectoryDrop(
                    trajectory_ids=decision.trajectory_ids, reason=_DROP_TO_PROTO[decision.reason],
                    detail=decision.detail,
                ),
            )
        previous = self.last_wait
        if previous is not None and previous.reason is decision.reason and previous.since == decision.since:
            return None
        return journal_pb2.JournalRecord(
            at=decision.since,
            wait=admission_pb2.AdmissionWait(reason=_BLOCKING_TO_PROTO[decision.reason], detail=decision.detail),
        )

    # -- applying records (the only mutation) ----------------------------------------------------------

    def apply(self, record: journal_pb2.JournalRecord) -> Applied:
        kind = record.WhichOneof("change")
        handler = getattr(self, f"_apply_{kind}", None)
        if handler is None:
            raise FailedPrecondition(f"unknown journal record {kind!r}")
        return handler(record)

    def _apply_report(self, record: journal_pb2.JournalRecord) -> Applied:
        prepared = self._prepared
        for message in record.report.trajectories:
            trajectory_id = TrajectoryId(message.trajectory_id)
            if trajectory_id in self.reported:
                continue  # replaying a report that was journaled twice is harmless
            cached = prepared.pop(trajectory_id, None)
            if cached is None:  # recovery: the record was validated when it was journaled
                item, digest = check_trajectory(message, "trajectory", self.limits, _ANY_VERSION), fingerprint(message)
            else:
                item, digest = cached
            self.reported[trajectory_id] = Reported(fingerprint=digest, message=message)
            self.index.add(
                IndexEntry(
                    trajectory_id=trajectory_id,
                    sample_id=SampleId(item.sample_id),
                    unit_keys=item.unit_keys,
                    multimodal_keys=item.multimodal_keys,
                )
            )
            self.engine.add(
                PoolEntry(
                    trajectory_id=trajectory_id,
                    sample_id=SampleId(item.sample_id),
                    source=SourceName(item.source),
                    ready_at=record.at,
                    oldest_version=item.oldest_version,
                    rollout_step=item.rollout_step,
                    num_tokens=item.num_tokens,
                    accepted=item.accepted,
                )
            )
        prepared.clear()
        return Applied()

    def _apply_scheduled(self, record: journal_pb2.JournalRecord) -> Applied:
        scheduled = record.scheduled
        if scheduled.request_id and scheduled.request_id in self.scheduled_requests:
            return Applied()
        if scheduled.request_id:
            self.scheduled_requests.add(scheduled.request_id)
        self.engine.add_scheduled(scheduled.rollout_step, scheduled.count)
        self.scheduled[scheduled.rollout_step] = self.scheduled.get(scheduled.rollout_step, 0) + scheduled.count
        return Applied()

    def _apply_wait(self, record: journal_pb2.JournalRecord) -> Applied:
        wait = Wait(reason=_BLOCKING_FROM_PROTO[record.wait.reason], detail=record.wait.detail, since=record.at)
        self.engine.apply(wait)
        changed = self.last_wait is None or self.last_wait.reason is not wait.reason
        self.last_wait = wait
        return Applied(changed_blocking=changed)

    def _apply_admission(self, record: journal_pb2.JournalRecord) -> Applied:
        admission = record.admission
        ids = tuple(TrajectoryId(t) for t in admission.trajectory_ids)
        completes = admission.minibatch_index == admission.num_minibatches - 1
        before = self.engine.status() if completes else None
        self.engine.apply(
            Admit(
                trajectory_ids=ids,
                train_batch_index=admission.train_batch_index,
                minibatch_index=admission.minibatch_index,
                num_minibatches=admission.num_minibatches,
                train_version=admission.train_version,
                admitted_at=admission.admitted_at,
            )
        )
        if before is not None and self._batch_below_quota(before, ids):
            self.quota_violations += 1
        minibatch = MiniBatch(
            sequence=self.next_sequence, admission=admission, trajectory_ids=ids, owed_steps=set(self.consumers)
        )
        self.minibatches[minibatch.sequence] = minibatch
        self.next_sequence += 1
        self.admitted_total += len(ids)
        self.last_wait = None
        return Applied(admitted=minibatch)

    def _batch_below_quota(self, before: EngineStatus, ids: Sequence[TrajectoryId]) -> bool:
        """Whether the train batch that ``ids`` completes ends below a source quota (counted in units)."""
        grouped = self.settings.engine.admission_unit is AdmissionUnit.GROUP
        units: dict[str, set[str]] = {}
        for trajectory_id in ids:
            message = self.reported[trajectory_id].message
            if message is not None:
                units.setdefault(message.source, set()).add(message.sample_id if grouped else trajectory_id)
        return any(s.admitted + len(units.get(s.source, ())) < s.quota for s in before.sources)

    def _apply_drop(self, record: journal_pb2.JournalRecord) -> Applied:
        drop = record.drop
        reason = _DROP_FROM_PROTO[drop.reason]
        ids = tuple(TrajectoryId(t) for t in drop.trajectory_ids)
        self.engine.apply(Drop(trajectory_ids=ids, reason=reason, detail=drop.detail))
        if reason is DropReason.STALE:
            self.dropped_stale += len(ids)
        freed = self._release_trajectories(ids)
        self.last_wait = None
        return Applied(dropped=ids, drop_reason=reason, freed_keys=freed)

    def _apply_version(self, record: journal_pb2.JournalRecord) -> Applied:
        new_version = record.version.new_version
        if new_version <= self.version:
            return Applied()
        self.version = new_version
        return Applied(version_changed=True)

    def _apply_progress(self, record: journal_pb2.JournalRecord) -> Applied:
        progress = record.progress
        consumer = ConsumerId(
            role=progress.consumer.role, dp_rank=progress.consumer.dp_rank, cp_rank=progress.consumer.cp_rank
        )
        if progress.sequence > self.acknowledged[consumer]:
            # An optimizer step implies delivery, whichever report arrives first.
            self.acknowledged[consumer] = progress.sequence
        if progress.stage == admission_service_pb2.PROGRESS_STAGE_DELIVERED:
            self._forget_finished()
            return Applied()
        minibatch = self.minibatches.get(progress.sequence)
        if minibatch is None or consumer not in minibatch.owed_steps:
            return Applied()
        minibatch.owed_steps.discard(consumer)
        if not minibatch.released:
            return Applied()
        self.released_minibatches += 1
        freed = self._release_trajectories(minibatch.trajectory_ids)
        minibatch.plan = None
        self._forget_finished()
        return Applied(released=minibatch, freed_keys=freed)

    def _apply_deleted(self, record: journal_pb2.JournalRecord) -> Applied:
        for key in record.deleted.keys:
            self.pending_deletes.pop(UnitKey(key), None)
        return Applied()

    def _release_trajectories(self, ids: Iterable[TrajectoryId]) -> tuple[UnitKey, ...]:
        ids = tuple(ids)
        for trajectory_id in ids:
            reported = self.reported.get(trajectory_id)
            if reported is not None:
                reported.message = None
        freed = self.index.release(ids)
        for key in freed:
            self.pending_deletes[key] = None
        return freed

    def _forget_finished(self) -> None:
        """Drop mini-batches that are released and acknowledged by every consumer: nobody can ask again."""
        oldest_ack = min(self.acknowledged.values(), default=0)
        for sequence in [s for s, m in self.minibatches.items() if m.released and s <= oldest_ack]:
            del self.minibatches[sequence]

    # -- derived views ---------------------------------------------------------------------------------

    def plan(self, minibatch: MiniBatch) -> Plan:
        """The mini-batch's plan: a pure function of its metadata and the topology, so never journaled."""
        if minibatch.plan is None:
            metas = []
            for trajectory_id in minibatch.trajectory_ids:
                message = self.reported[trajectory_id].message
                if message is None:
                    raise FailedPrecondition(f"mini-batch {minibatch.sequence} is already released")
                metas.append(trusted_trajectory_from_proto(message))  # validated at ingest
            minibatch.plan = plan_minibatch(metas, self.settings.topology, label_fields=self.settings.label_fields)
        return minibatch.plan

    def pending_after(self, after: int) -> list[MiniBatch]:
        """The mini-batches with sequence above ``after``, in order (every consumer gets every one)."""
        return [m for s, m in sorted(self.minibatches.items()) if s > after]

    def blocking(self) -> tuple[BlockingReason, str, float | None]:
        wait = self.last_wait
        if wait is None:
            return BlockingReason.NONE, "", None
        return wait.reason, wait.detail, wait.since
