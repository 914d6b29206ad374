"""What the admission client's calls take and return, and their one conversion from and to protobuf.

Shared by :class:`~knittrans.client.aio.AsyncAdmissionClient` and the sync
:class:`~knittrans.client.admission.AdmissionClient` that wraps it, and by the reorg sidecars.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum

from knittrans.errors import InvalidArgument, KnitTransError
from knittrans.plan import ConsumerAssignment
from knittrans.plan.proto import assignment_from_proto as consumer_assignment_from_proto
from knittrans.plan.rank_proto import consumer_assignment_from_rank_proto
from knittrans.reservations import UnitReservation
from knittrans.types import ConsumerId, Topology, TrajectoryId, TrajectoryMeta
from knittrans.v1 import admission_service_pb2 as pb
from knittrans.v1 import trajectory_pb2
from knittrans.wire import consumer_from_proto, consumer_to_proto, topology_from_proto, trajectory_to_proto
from knittrans.wire.columns import batch_from_messages, batch_from_metas

DEFAULT_DEADLINE = timedelta(seconds=10)


class ReportOutcome(StrEnum):
    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"
    CONFLICT = "conflict"


class ProgressStage(StrEnum):
    DELIVERED = "delivered"
    OPTIMIZER_STEP = "optimizer_step"
    VERIFIED = "verified"  # every unit of the consumer's part is in the store (sidecars, before the verdict)


_OUTCOMES = {
    pb.REPORT_OUTCOME_ACCEPTED: ReportOutcome.ACCEPTED,
    pb.REPORT_OUTCOME_DUPLICATE: ReportOutcome.DUPLICATE,
    pb.REPORT_OUTCOME_CONFLICT: ReportOutcome.CONFLICT,
}
_STAGES: dict[ProgressStage, pb.ProgressStage] = {
    ProgressStage.DELIVERED: pb.PROGRESS_STAGE_DELIVERED,
    ProgressStage.OPTIMIZER_STEP: pb.PROGRESS_STAGE_OPTIMIZER_STEP,
    ProgressStage.VERIFIED: pb.PROGRESS_STAGE_VERIFIED,
}


@dataclass(frozen=True, kw_only=True)
class ReportResult:
    trajectory_id: TrajectoryId
    outcome: ReportOutcome
    reason: str = ""


@dataclass(frozen=True, kw_only=True)
class Registration:
    topology: Topology
    acknowledged_sequence: int
    job: str
    num_minibatches: int = 1  # per train batch: sequence s is mini-batch (s-1) % n of train batch (s-1) // n


@dataclass(frozen=True, kw_only=True)
class Assignment:
    """One consumer's part of one admitted mini-batch."""

    sequence: int
    train_batch_index: int
    minibatch_index: int
    num_minibatches: int
    train_version: int
    trajectory_ids: tuple[TrajectoryId, ...]
    global_loss_tokens: int
    assignment: ConsumerAssignment

    @property
    def is_last_of_train_batch(self) -> bool:
        return self.minibatch_index == self.num_minibatches - 1


@dataclass(frozen=True, kw_only=True)
class SourceStatus:
    source: str
    pool: int
    admitted: int
    quota: int
    target: float
    slack: int


@dataclass(frozen=True, kw_only=True)
class ConsumerFailure:
    """A consumer could not read or pack one admitted mini-batch (it skipped it; see ``ReportConsumerFailure``)."""

    consumer: ConsumerId
    sequence: int
    train_batch_index: int
    minibatch_index: int
    microbatch_index: int
    trajectory_id: str
    unit_key: str
    reason: str


@dataclass(frozen=True, kw_only=True)
class AdmissionStatus:
    sources: tuple[SourceStatus, ...]
    train_batch_index: int
    minibatch_index: int
    num_minibatches: int
    policy_version: int
    blocking_reason: str
    blocking_detail: str
    blocked_seconds: float
    pool_size: int
    admitted_total: int
    dropped_stale: int
    released_minibatches: int
    failed_minibatches: int = 0
    recent_failures: tuple[ConsumerFailure, ...] = ()


def new_request_id() -> str:
    return uuid.uuid4().hex


class VerdictState(StrEnum):
    PENDING = "pending"  # some planned consumer has not verified the mini-batch yet
    OK = "ok"
    FAILED = "failed"


_VERDICTS = {
    pb.MINI_BATCH_VERDICT_PENDING: VerdictState.PENDING,
    pb.MINI_BATCH_VERDICT_OK: VerdictState.OK,
    pb.MINI_BATCH_VERDICT_FAILED: VerdictState.FAILED,
}


@dataclass(frozen=True, kw_only=True)
class MiniBatchVerdict:
    """One ``WaitMiniBatchVerdict`` answer: ``failure`` decided a FAILED verdict; ``waiting_for`` holds up a
    PENDING one."""

    state: VerdictState
    failure: ConsumerFailure | None = None
    waiting_for: tuple[ConsumerId, ...] = ()


def report_request(
    trajectories: Sequence[TrajectoryMeta | trajectory_pb2.TrajectoryMetadata], *, request_id: str, columnar: bool
) -> pb.ReportTrajectoriesRequest:
    """One columnar ``TrajectoryBatch`` (the service checks and stores those several times faster than a list
    of messages), unless ``columnar`` is false or a message has no columnar form (a unit without a header,
    which the service rejects either way)."""
    request = pb.ReportTrajectoriesRequest(request_id=request_id)
    metas = [t for t in trajectories if isinstance(t, TrajectoryMeta)]
    if columnar and len(metas) == len(trajectories):
        request.batch.CopyFrom(batch_from_metas(metas))
        return request
    messages = [t if isinstance(t, trajectory_pb2.TrajectoryMetadata) else trajectory_to_proto(t) for t in trajectories]
    try:
        batch = batch_from_messages(messages) if columnar else None
    except InvalidArgument:
        batch = None
    if batch is None:
        request.trajectories.extend(messages)
    else:
        request.batch.CopyFrom(batch)
    return request


def report_results(request: pb.ReportTrajectoriesRequest, response: pb.ReportTrajectoriesResponse
                   ) -> list[ReportResult]:
    """One result per reported trajectory, in the request's order."""
    if not request.HasField("batch"):
        return [
            ReportResult(trajectory_id=TrajectoryId(r.trajectory_id), outcome=_OUTCOMES[r.outcome], reason=r.reason)
            for r in response.results
        ]
    reasons = {r.trajectory_id: r.reason for r in response.conflicts}
    return [
        ReportResult(trajectory_id=TrajectoryId(trajectory_id), outcome=_OUTCOMES[outcome],
                     reason=reasons.get(trajectory_id, "") if outcome == pb.REPORT_OUTCOME_CONFLICT else "")
        for trajectory_id, outcome in zip(request.batch.trajectory_ids, response.outcomes, strict=True)
    ]


def reservations_to_proto(reservations: Sequence[UnitReservation]) -> list[pb.UnitReservation]:
    return [pb.UnitReservation(trajectory_id=r.trajectory_id, sample_id=r.sample_id,
                               multimodal_keys=list(r.multimodal_keys), unit_keys=list(r.unit_keys))
            for r in reservations]


def progress_stage_to_proto(stage: ProgressStage) -> pb.ProgressStage:
    return _STAGES[stage]


def registration_from_proto(response: pb.RegisterConsumerResponse) -> Registration:
    return Registration(topology=topology_from_proto(response.topology),
                        acknowledged_sequence=response.acknowledged_sequence, job=response.job,
                        num_minibatches=response.num_minibatches or 1)


def assignment_from_proto(response: pb.WatchAssignmentsResponse, consumer: ConsumerId) -> Assignment:
    """``consumer``'s assignment; a backbone consumer's is cut from its DP rank's part (the same message on
    every CP rank's stream). ``trajectory_ids`` is what the stream was asked to carry (include_trajectory_ids)."""
    admission = response.admission
    if response.WhichOneof("part") == "rank_assignment":
        part = consumer_assignment_from_rank_proto(response.rank_assignment, consumer)
    else:
        part = consumer_assignment_from_proto(response.assignment)
    return Assignment(
        sequence=response.sequence,
        train_batch_index=admission.train_batch_index,
        minibatch_index=admission.minibatch_index,
        num_minibatches=admission.num_minibatches,
        train_version=admission.train_version,
        trajectory_ids=tuple(TrajectoryId(t) for t in admission.trajectory_ids),
        global_loss_tokens=response.global_loss_tokens,
        assignment=part,
    )


def status_from_proto(response: pb.GetStatusResponse) -> AdmissionStatus:
    from knittrans.v1 import admission_pb2

    return AdmissionStatus(
        sources=tuple(
            SourceStatus(source=s.source, pool=s.pool, admitted=s.admitted, quota=s.quota, target=s.target,
                         slack=s.slack)
            for s in response.sources
        ),
        train_batch_index=response.train_batch_index,
        minibatch_index=response.minibatch_index,
        num_minibatches=response.num_minibatches,
        policy_version=response.policy_version,
        blocking_reason=admission_pb2.BlockingReason.Name(response.blocking_reason)
        .removeprefix("BLOCKING_REASON_")
        .lower(),
        blocking_detail=response.blocking_detail,
        blocked_seconds=response.blocked_seconds,
        pool_size=response.pool_size,
        admitted_total=response.admitted_total,
        dropped_stale=response.dropped_stale,
        released_minibatches=response.released_minibatches,
        failed_minibatches=response.failed_minibatches,
        recent_failures=tuple(consumer_failure_from_proto(f) for f in response.recent_failures),
    )


def consumer_failure_from_proto(failure: pb.ConsumerFailure) -> ConsumerFailure:
    return ConsumerFailure(
        consumer=consumer_from_proto(failure.consumer), sequence=failure.sequence,
        train_batch_index=failure.train_batch_index, minibatch_index=failure.minibatch_index,
        microbatch_index=failure.microbatch_index, trajectory_id=failure.trajectory_id, unit_key=failure.unit_key,
        reason=failure.reason,
    )


def consumer_failure_to_proto(failure: ConsumerFailure) -> pb.ConsumerFailure:
    return pb.ConsumerFailure(
        consumer=consumer_to_proto(failure.consumer), sequence=failure.sequence,
        train_batch_index=failure.train_batch_index, minibatch_index=failure.minibatch_index,
        microbatch_index=failure.microbatch_index, trajectory_id=failure.trajectory_id, unit_key=failure.unit_key,
        reason=failure.reason,
    )


def verdict_from_proto(response: pb.WaitMiniBatchVerdictResponse, sequence: int) -> MiniBatchVerdict:
    state = _VERDICTS.get(response.verdict)
    if state is None:
        raise KnitTransError(f"unknown verdict {response.verdict} on mini-batch {sequence}", field="verdict")
    return MiniBatchVerdict(
        state=state,
        failure=consumer_failure_from_proto(response.failure) if state is VerdictState.FAILED else None,
        waiting_for=tuple(consumer_from_proto(c) for c in response.waiting_for),
    )

