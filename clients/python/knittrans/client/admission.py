"""`AdmissionClient`: typed, deadline-bound calls to the admission service.

Status codes come back as the same :class:`~knittrans.errors.KnitTransError` classes the service raised.
Idempotent calls (reports are keyed by trajectory id, the others by request id or monotonic by nature) are
retried with back-off while the service is unavailable.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum

import grpc

from knittrans.client.connection import ConnectionSettings, call_with_retry, error_from_rpc, open_channel
from knittrans.errors import InvalidArgument
from knittrans.plan import ConsumerAssignment
from knittrans.plan.proto import assignment_from_proto as consumer_assignment_from_proto
from knittrans.trajectory_batch import batch_from_messages, batch_from_metas
from knittrans.types import ConsumerId, Topology, TrajectoryId, TrajectoryMeta, UnitReservation
from knittrans.v1 import admission_service_pb2 as pb
from knittrans.v1 import admission_service_pb2_grpc, trajectory_pb2
from knittrans.wire import consumer_to_proto, topology_from_proto, trajectory_to_proto

DEFAULT_DEADLINE = timedelta(seconds=10)


class ReportOutcome(StrEnum):
    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"
    CONFLICT = "conflict"


class ProgressStage(StrEnum):
    DELIVERED = "delivered"
    OPTIMIZER_STEP = "optimizer_step"


_OUTCOMES = {
    pb.REPORT_OUTCOME_ACCEPTED: ReportOutcome.ACCEPTED,
    pb.REPORT_OUTCOME_DUPLICATE: ReportOutcome.DUPLICATE,
    pb.REPORT_OUTCOME_CONFLICT: ReportOutcome.CONFLICT,
}
_STAGES = {
    ProgressStage.DELIVERED: pb.PROGRESS_STAGE_DELIVERED,
    ProgressStage.OPTIMIZER_STEP: pb.PROGRESS_STAGE_OPTIMIZER_STEP,
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


class AdmissionClient:
    def __init__(self, connection: ConnectionSettings | str, *, deadline: timedelta = DEFAULT_DEADLINE) -> None:
        self.connection = ConnectionSettings(target=connection) if isinstance(connection, str) else connection
        self._deadline = deadline
        self._channel = open_channel(self.connection)
        self._stub = admission_service_pb2_grpc.AdmissionServiceStub(self._channel)
        self._metadata = self.connection.call_metadata()

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> AdmissionClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _idempotent(self, rpc, request, deadline: timedelta | None):
        return call_with_retry(rpc, request, deadline=deadline or self._deadline, metadata=self._metadata)

    def report(
        self,
        trajectories: Sequence[TrajectoryMeta | trajectory_pb2.TrajectoryMetadata],
        *,
        request_id: str | None = None,
        deadline: timedelta | None = None,
        columnar: bool = True,
    ) -> list[ReportResult]:
        """Report trajectories; one result per trajectory, in order. They travel as one columnar
        ``TrajectoryBatch`` (the service checks and stores those several times faster than a list of messages),
        unless ``columnar`` is false or a message has no columnar form (a unit without a header, which the
        service rejects either way)."""
        request = pb.ReportTrajectoriesRequest(request_id=request_id or new_request_id())
        if columnar and all(isinstance(t, TrajectoryMeta) for t in trajectories):
            request.batch.CopyFrom(batch_from_metas(trajectories))
        else:
            messages = [
                t if isinstance(t, trajectory_pb2.TrajectoryMetadata) else trajectory_to_proto(t) for t in trajectories
            ]
            try:
                batch = batch_from_messages(messages) if columnar else None
            except InvalidArgument:
                batch = None
            if batch is None:
                request.trajectories.extend(messages)
            else:
                request.batch.CopyFrom(batch)
        response = self._idempotent(self._stub.ReportTrajectories, request, deadline)
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

    def reserve_units(
        self, reservations: Sequence[UnitReservation], *, request_id: str | None = None,
        deadline: timedelta | None = None,
    ) -> int:
        """Reserve the multimodal units these trajectories will reference, before writing them (see
        ``ReserveUnits`` in the proto); returns how many reservations were new."""
        request = pb.ReserveUnitsRequest(request_id=request_id or new_request_id(), reservations=[
            pb.UnitReservation(trajectory_id=r.trajectory_id, sample_id=r.sample_id,
                               multimodal_keys=list(r.multimodal_keys))
            for r in reservations
        ])
        return self._idempotent(self._stub.ReserveUnits, request, deadline).reserved

    def cancel_reservations(
        self, trajectory_ids: Sequence[TrajectoryId], *, request_id: str | None = None,
        deadline: timedelta | None = None,
    ) -> int:
        """Drop the reservations of trajectories that will never be reported; returns how many were held."""
        request = pb.CancelReservationsRequest(request_id=request_id or new_request_id(),
                                               trajectory_ids=list(trajectory_ids))
        return self._idempotent(self._stub.CancelReservations, request, deadline).cancelled

    def report_scheduled(
        self, rollout_step: int, count: int, *, request_id: str | None = None, deadline: timedelta | None = None
    ) -> int:
        request = pb.ReportScheduledRequest(
            request_id=request_id or new_request_id(), rollout_step=rollout_step, count=count
        )
        return self._idempotent(self._stub.ReportScheduled, request, deadline).total_scheduled

    def register_consumer(self, consumer: ConsumerId, *, deadline: timedelta | None = None) -> Registration:
        request = pb.RegisterConsumerRequest(request_id=new_request_id(), consumer=consumer_to_proto(consumer))
        response = self._idempotent(self._stub.RegisterConsumer, request, deadline)
        return Registration(
            topology=topology_from_proto(response.topology),
            acknowledged_sequence=response.acknowledged_sequence,
            job=response.job,
        )

    def watch_assignments(self, consumer: ConsumerId, *, after_sequence: int = 0) -> Iterator[Assignment]:
        """Yield assignments in order; the stream has no deadline (keep-alive pings detect a dead peer)."""
        request = pb.WatchAssignmentsRequest(consumer=consumer_to_proto(consumer), after_sequence=after_sequence)
        stream = self._stub.WatchAssignments(request, metadata=self._metadata)
        try:
            for response in stream:
                yield assignment_from_proto(response)
        except grpc.RpcError as error:
            raise error_from_rpc(error) from None
        finally:
            stream.cancel()

    def report_progress(
        self, consumer: ConsumerId, sequence: int, stage: ProgressStage, *, deadline: timedelta | None = None
    ) -> bool:
        request = pb.ReportProgressRequest(
            request_id=new_request_id(), consumer=consumer_to_proto(consumer), sequence=sequence, stage=_STAGES[stage]
        )
        return self._idempotent(self._stub.ReportProgress, request, deadline).released

    def advance_version(self, train_batch_index: int, new_version: int, *, deadline: timedelta | None = None) -> int:
        request = pb.AdvanceVersionRequest(
            request_id=new_request_id(), train_batch_index=train_batch_index, new_version=new_version
        )
        return self._idempotent(self._stub.AdvanceVersion, request, deadline).version

    def status(self, *, deadline: timedelta | None = None) -> AdmissionStatus:
        """The job's state; like every read, retried while the service is unavailable (not started yet, restarting)."""
        return status_from_proto(self._idempotent(self._stub.GetStatus, pb.GetStatusRequest(), deadline))


def assignment_from_proto(response: pb.WatchAssignmentsResponse) -> Assignment:
    admission = response.admission
    return Assignment(
        sequence=response.sequence,
        train_batch_index=admission.train_batch_index,
        minibatch_index=admission.minibatch_index,
        num_minibatches=admission.num_minibatches,
        train_version=admission.train_version,
        trajectory_ids=tuple(TrajectoryId(t) for t in admission.trajectory_ids),
        global_loss_tokens=response.global_loss_tokens,
        assignment=consumer_assignment_from_proto(response.assignment),
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
        recent_failures=tuple(
            ConsumerFailure(
                consumer=ConsumerId(role=f.consumer.role, dp_rank=f.consumer.dp_rank, cp_rank=f.consumer.cp_rank),
                sequence=f.sequence, train_batch_index=f.train_batch_index, minibatch_index=f.minibatch_index,
                microbatch_index=f.microbatch_index, trajectory_id=f.trajectory_id, unit_key=f.unit_key,
                reason=f.reason,
            )
            for f in response.recent_failures
        ),
    )
