"""`AsyncAdmissionClient`: the admission service's calls on grpc.aio, typed and deadline-bound.

The one admission client: the reorg sidecars use it directly, and the sync
:class:`~knittrans.client.admission.AdmissionClient` runs its coroutines on a blocking transport (see
:mod:`knittrans.client.transport`). Status codes come back as the same
:class:`~knittrans.errors.KnitTransError` classes the service raised. Every unary call here is idempotent
(reports are keyed by trajectory id, the others by request id or monotonic by nature), so each is retried
under the client's :class:`~knittrans.retry.RetryPolicy` while it fails with one of ``retry_codes``.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Sequence
from datetime import timedelta
from typing import Any

import grpc
from google.protobuf.message import Message

from knittrans.attach import AttachResult, FieldAttachment
from knittrans.client.connection import RETRYABLE_CODES, UNARY_RETRY, ConnectionSettings, error_from_rpc
from knittrans.client.model import (
    DEFAULT_DEADLINE,
    AdmissionStatus,
    Assignment,
    ConsumerFailure,
    MiniBatchVerdict,
    ProgressStage,
    Registration,
    ReportResult,
    assignment_from_proto,
    consumer_failure_to_proto,
    new_request_id,
    progress_stage_to_proto,
    registration_from_proto,
    report_request,
    report_results,
    reservations_to_proto,
    status_from_proto,
    verdict_from_proto,
)
from knittrans.client.transport import AioTransport, Transport
from knittrans.reservations import ReserveResult, UnitReservation
from knittrans.retry import RetryPolicy
from knittrans.steps import StepId
from knittrans.types import ConsumerId, TrajectoryId, TrajectoryMeta
from knittrans.v1 import admission_service_pb2 as pb
from knittrans.v1 import trajectory_pb2
from knittrans.wire import consumer_to_proto
from knittrans.wire.trajectory import unit_ref_to_proto

DEFAULT_RETRY_CODES = RETRYABLE_CODES  # the SDK's one set (knittrans.client.connection)


class AsyncAdmissionClient:
    """Open it inside the event loop that will use it (a grpc.aio channel belongs to one loop). ``transport``
    replaces the grpc.aio channel (the sync client passes a blocking one)."""

    def __init__(
        self,
        connection: ConnectionSettings | str,
        *,
        deadline: timedelta = DEFAULT_DEADLINE,
        retry: RetryPolicy = UNARY_RETRY,
        retry_codes: frozenset[grpc.StatusCode] = DEFAULT_RETRY_CODES,
        transport: Callable[[ConnectionSettings, RetryPolicy, frozenset[grpc.StatusCode]], Transport] = AioTransport,
    ) -> None:
        self.connection = ConnectionSettings(target=connection) if isinstance(connection, str) else connection
        self._deadline = deadline
        self.retry_policy = retry
        self.retry_codes = retry_codes
        self._transport = transport(self.connection, retry, retry_codes)

    async def close(self) -> None:
        await self._transport.close()

    async def __aenter__(self) -> AsyncAdmissionClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _idempotent(
        self, method: str, request: Message, deadline: timedelta | None, *, extra_seconds: float = 0.0
    ) -> Any:
        timeout = (deadline or self._deadline).total_seconds() + extra_seconds
        try:
            return await self._transport.unary(method, request, timeout=timeout)
        except grpc.RpcError as error:
            raise error_from_rpc(error) from None

    async def report(
        self,
        trajectories: Sequence[TrajectoryMeta | trajectory_pb2.TrajectoryMetadata],
        *,
        request_id: str | None = None,
        deadline: timedelta | None = None,
        columnar: bool = True,
    ) -> list[ReportResult]:
        """Report trajectories; one result per trajectory, in order (see
        :func:`~knittrans.client.model.report_request` for the form they travel in)."""
        request = report_request(trajectories, request_id=request_id or new_request_id(), columnar=columnar)
        return report_results(request, await self._idempotent("ReportTrajectories", request, deadline))

    async def reserve_units(
        self, reservations: Sequence[UnitReservation], *, request_id: str | None = None,
        deadline: timedelta | None = None,
    ) -> ReserveResult:
        """Reserve the units these trajectories will reference, before writing them (see ``ReserveUnits`` in the
        proto): how many reservations were new, and which trajectories were already reported."""
        request = pb.ReserveUnitsRequest(request_id=request_id or new_request_id(),
                                         reservations=reservations_to_proto(reservations))
        response: pb.ReserveUnitsResponse = await self._idempotent("ReserveUnits", request, deadline)
        return ReserveResult(reserved=response.reserved,
                             already_reported=frozenset(TrajectoryId(t) for t in response.already_reported))

    async def cancel_reservations(
        self, trajectory_ids: Sequence[TrajectoryId], *, request_id: str | None = None,
        deadline: timedelta | None = None,
    ) -> int:
        """Drop the reservations of trajectories that will never be reported; returns how many were held."""
        request = pb.CancelReservationsRequest(request_id=request_id or new_request_id(),
                                               trajectory_ids=list(trajectory_ids))
        response: pb.CancelReservationsResponse = await self._idempotent("CancelReservations", request, deadline)
        return response.cancelled

    async def report_scheduled(
        self, rollout_step: int, count: int, *, request_id: str | None = None, deadline: timedelta | None = None
    ) -> int:
        request = pb.ReportScheduledRequest(
            request_id=request_id or new_request_id(), rollout_step=rollout_step, count=count
        )
        response: pb.ReportScheduledResponse = await self._idempotent("ReportScheduled", request, deadline)
        return response.total_scheduled

    async def register_consumer(
        self, consumer: ConsumerId, *, request_id: str | None = None, deadline: timedelta | None = None
    ) -> Registration:
        request = pb.RegisterConsumerRequest(request_id=request_id or new_request_id(),
                                             consumer=consumer_to_proto(consumer))
        return registration_from_proto(await self._idempotent("RegisterConsumer", request, deadline))

    def watch_assignment_messages(
        self, consumer: ConsumerId, *, after_sequence: int = 0, include_trajectory_ids: bool = False
    ) -> AsyncGenerator[pb.WatchAssignmentsResponse, None]:
        """The raw stream (for readers that decode an assignment lazily); one connection, no retry, no
        deadline (keep-alive pings detect a dead peer). It raises ``grpc.RpcError``: a reader that
        reconnects decides which codes it retries, and maps the others with
        :func:`~knittrans.client.connection.error_from_rpc`. Without ``include_trajectory_ids`` the admission
        names no trajectories (the part names its own)."""
        request = pb.WatchAssignmentsRequest(consumer=consumer_to_proto(consumer), after_sequence=after_sequence,
                                             include_trajectory_ids=include_trajectory_ids)
        return self._transport.stream("WatchAssignments", request)

    def watch_node_assignment_messages(
        self, consumers: Sequence[ConsumerId], *, after_sequence: int = 0
    ) -> AsyncGenerator[pb.WatchNodeAssignmentsResponse, None]:
        """One raw stream for several consumers (``WatchNodeAssignments``: a process hosting a node's sidecars),
        as :meth:`watch_assignment_messages`: one connection, no retry, no deadline, ``grpc.RpcError``."""
        request = pb.WatchNodeAssignmentsRequest(consumers=[consumer_to_proto(c) for c in consumers],
                                                 after_sequence=after_sequence)
        return self._transport.stream("WatchNodeAssignments", request)

    async def watch_assignments(
        self, consumer: ConsumerId, *, after_sequence: int = 0
    ) -> AsyncGenerator[Assignment, None]:
        """Assignments in order, decoded, each with every admitted trajectory id; the stream has no deadline
        (keep-alive pings detect a dead peer)."""
        messages = self.watch_assignment_messages(consumer, after_sequence=after_sequence, include_trajectory_ids=True)
        try:
            async for response in messages:
                yield assignment_from_proto(response, consumer)
        except grpc.RpcError as error:
            raise error_from_rpc(error) from None
        finally:
            await messages.aclose()

    async def report_progress(
        self, consumer: ConsumerId, sequence: int, stage: ProgressStage, *, request_id: str | None = None,
        deadline: timedelta | None = None,
    ) -> bool:
        request = pb.ReportProgressRequest(
            request_id=request_id or new_request_id(), consumer=consumer_to_proto(consumer), sequence=sequence,
            stage=progress_stage_to_proto(stage),
        )
        response: pb.ReportProgressResponse = await self._idempotent("ReportProgress", request, deadline)
        return response.released

    async def advance_version(
        self, train_batch_index: int, new_version: int, *, deadline: timedelta | None = None
    ) -> int:
        request = pb.AdvanceVersionRequest(
            request_id=new_request_id(), train_batch_index=train_batch_index, new_version=new_version
        )
        response: pb.AdvanceVersionResponse = await self._idempotent("AdvanceVersion", request, deadline)
        return response.version

    async def report_checkpoint(self, step: StepId, *, deadline: timedelta | None = None) -> StepId:
        """A checkpoint holds every step up to and including ``step``; returns the latest checkpoint the service
        knows (its ``train_version`` is 0: the service keeps the step's position only)."""
        request = pb.ReportCheckpointRequest(request_id=new_request_id(), train_batch_index=step.train_batch_index,
                                             minibatch_index=step.minibatch_index)
        response: pb.ReportCheckpointResponse = await self._idempotent("ReportCheckpoint", request, deadline)
        return StepId(train_batch_index=response.checkpoint_train_batch_index,
                      minibatch_index=response.checkpoint_minibatch_index)

    async def status(self, *, deadline: timedelta | None = None) -> AdmissionStatus:
        """The job's state; like every read, retried while the service is unavailable (not started yet, restarting)."""
        return status_from_proto(await self._idempotent("GetStatus", pb.GetStatusRequest(), deadline))

    async def report_consumer_failure(
        self, failure: ConsumerFailure, *, request_id: str | None = None, deadline: timedelta | None = None
    ) -> bool:
        """A consumer could not read or pack a mini-batch; returns False when it had already reported one."""
        request = pb.ReportConsumerFailureRequest(request_id=request_id or new_request_id(),
                                                  failure=consumer_failure_to_proto(failure))
        response: pb.ReportConsumerFailureResponse = await self._idempotent("ReportConsumerFailure", request, deadline)
        return response.recorded

    async def attach_fields(
        self, role: str, sequence: int, attachments: Sequence[FieldAttachment], *, request_id: str | None = None,
        deadline: timedelta | None = None,
    ) -> AttachResult:
        """Report units a trainer role wrote for mini-batch ``sequence`` (:mod:`knittrans.attach`)."""
        request = pb.AttachFieldsRequest(
            request_id=request_id or new_request_id(), role=role, sequence=sequence,
            attachments=[pb.FieldAttachment(trajectory_id=a.trajectory_id, unit=unit_ref_to_proto(a.unit))
                         for a in attachments])
        response: pb.AttachFieldsResponse = await self._idempotent("AttachFields", request, deadline)
        return AttachResult(attached=response.attached, unchanged=response.unchanged, complete=response.complete)

    async def wait_minibatch_verdict(
        self, sequence: int, *, wait: timedelta, deadline: timedelta | None = None, role: str = ""
    ) -> MiniBatchVerdict:
        """One long poll: the verdict on mini-batch ``sequence`` for consumers of ``role`` (a ConsumerId.role; a
        trainer role has its own, docs/roles.md), or PENDING if the service has none after ``wait`` (the call's
        deadline is ``deadline`` on top of that)."""
        request = pb.WaitMiniBatchVerdictRequest(sequence=sequence, timeout_seconds=wait.total_seconds(), role=role)
        response = await self._idempotent("WaitMiniBatchVerdict", request, deadline,
                                          extra_seconds=wait.total_seconds())
        return verdict_from_proto(response, sequence)
