"""`AdmissionClient`: typed, deadline-bound calls to the admission service, for code without an event loop.

It runs the one admission client, :class:`~knittrans.client.aio.AsyncAdmissionClient`, on a blocking
transport: the same calls, requests, retries and errors (status codes come back as the same
:class:`~knittrans.errors.KnitTransError` classes the service raised), completed in the caller's thread with
no event loop (see :mod:`knittrans.client.transport`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import timedelta
from pathlib import Path

import grpc

from knittrans.attach import AttachResult, FieldAttachment
from knittrans.blocking import run_to_completion
from knittrans.client.aio import DEFAULT_RETRY_CODES, AsyncAdmissionClient
from knittrans.client.connection import UNARY_RETRY, ConnectionSettings
from knittrans.client.model import (
    DEFAULT_DEADLINE,
    AdmissionStatus,
    Assignment,
    ConsumerFailure,
    MiniBatchVerdict,
    ProgressStage,
    Registration,
    ReportOutcome,
    ReportResult,
    SourceStatus,
    VerdictState,
    assignment_from_proto,
    new_request_id,
    status_from_proto,
)
from knittrans.client.transport import BlockingTransport
from knittrans.reservations import ReserveResult, UnitReservation
from knittrans.retry import RetryPolicy
from knittrans.steps import StepId
from knittrans.types import ConsumerId, TrajectoryId, TrajectoryMeta
from knittrans.v1 import trajectory_pb2

__all__ = [
    "DEFAULT_DEADLINE",
    "AdmissionClient",
    "AdmissionStatus",
    "Assignment",
    "ConsumerFailure",
    "MiniBatchVerdict",
    "ProgressStage",
    "Registration",
    "ReportOutcome",
    "ReportResult",
    "SourceStatus",
    "VerdictState",
    "assignment_from_proto",
    "new_request_id",
    "status_from_proto",
]


class AdmissionClient:
    """The sync face of :class:`~knittrans.client.aio.AsyncAdmissionClient`: same arguments, same retry rules
    (``retry_policy`` and ``retry_codes`` are the async client's objects)."""

    def __init__(
        self,
        connection: ConnectionSettings | str,
        *,
        deadline: timedelta = DEFAULT_DEADLINE,
        retry: RetryPolicy = UNARY_RETRY,
        retry_codes: frozenset[grpc.StatusCode] = DEFAULT_RETRY_CODES,
    ) -> None:
        self._client = AsyncAdmissionClient(connection, deadline=deadline, retry=retry, retry_codes=retry_codes,
                                            transport=BlockingTransport)
        self.connection = self._client.connection
        self.retry_policy = self._client.retry_policy
        self.retry_codes = self._client.retry_codes

    @classmethod
    def from_env(cls, *, connection_file: str | Path | None = None, wait_seconds: float = 60.0) -> AdmissionClient:
        """A client of the admission service of the stack ``knittrans up`` runs (:mod:`knittrans.connect`)."""
        from knittrans.connect import load_connection

        return cls(load_connection(connection_file, wait_seconds=wait_seconds).admission)

    def close(self) -> None:
        run_to_completion(self._client.close())

    def __enter__(self) -> AdmissionClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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
        return run_to_completion(self._client.report(trajectories, request_id=request_id, deadline=deadline,
                                                  columnar=columnar))

    def reserve_units(
        self, reservations: Sequence[UnitReservation], *, request_id: str | None = None,
        deadline: timedelta | None = None,
    ) -> ReserveResult:
        """Reserve the units these trajectories will reference, before writing them (see ``ReserveUnits`` in the
        proto): how many reservations were new, and which trajectories were already reported."""
        return run_to_completion(self._client.reserve_units(reservations, request_id=request_id, deadline=deadline))

    def cancel_reservations(
        self, trajectory_ids: Sequence[TrajectoryId], *, request_id: str | None = None,
        deadline: timedelta | None = None,
    ) -> int:
        """Drop the reservations of trajectories that will never be reported; returns how many were held."""
        return run_to_completion(self._client.cancel_reservations(trajectory_ids, request_id=request_id,
                                                               deadline=deadline))

    def report_scheduled(
        self, rollout_step: int, count: int, *, request_id: str | None = None, deadline: timedelta | None = None
    ) -> int:
        return run_to_completion(self._client.report_scheduled(rollout_step, count, request_id=request_id,
                                                            deadline=deadline))

    def register_consumer(self, consumer: ConsumerId, *, deadline: timedelta | None = None) -> Registration:
        return run_to_completion(self._client.register_consumer(consumer, deadline=deadline))

    def watch_assignments(self, consumer: ConsumerId, *, after_sequence: int = 0) -> Iterator[Assignment]:
        """Yield assignments in order; the stream has no deadline (keep-alive pings detect a dead peer)."""
        stream = self._client.watch_assignments(consumer, after_sequence=after_sequence)

        try:
            while True:
                try:
                    assignment = run_to_completion(anext(stream))
                except StopAsyncIteration:
                    return
                yield assignment
        finally:
            run_to_completion(stream.aclose())

    def report_progress(
        self, consumer: ConsumerId, sequence: int, stage: ProgressStage, *, deadline: timedelta | None = None
    ) -> bool:
        return run_to_completion(self._client.report_progress(consumer, sequence, stage, deadline=deadline))

    def advance_version(self, train_batch_index: int, new_version: int, *, deadline: timedelta | None = None) -> int:
        return run_to_completion(self._client.advance_version(train_batch_index, new_version, deadline=deadline))

    def report_checkpoint(self, step: StepId, *, deadline: timedelta | None = None) -> StepId:
        """A checkpoint holds every step up to and including ``step`` (see ``ReportCheckpoint``)."""
        return run_to_completion(self._client.report_checkpoint(step, deadline=deadline))

    def status(self, *, deadline: timedelta | None = None) -> AdmissionStatus:
        """The job's state; like every read, retried while the service is unavailable (not started yet, restarting)."""
        return run_to_completion(self._client.status(deadline=deadline))

    def report_consumer_failure(
        self, failure: ConsumerFailure, *, request_id: str | None = None, deadline: timedelta | None = None
    ) -> bool:
        """A consumer could not read or pack a mini-batch; returns False when it had already reported one."""
        return run_to_completion(self._client.report_consumer_failure(failure, request_id=request_id,
                                                                   deadline=deadline))

    def attach_fields(
        self, role: str, sequence: int, attachments: Sequence[FieldAttachment], *, request_id: str | None = None,
        deadline: timedelta | None = None,
    ) -> AttachResult:
        """Report units a trainer role wrote for mini-batch ``sequence`` (:mod:`knittrans.attach`)."""
        return run_to_completion(self._client.attach_fields(role, sequence, attachments, request_id=request_id,
                                                            deadline=deadline))

    def wait_minibatch_verdict(
        self, sequence: int, *, wait: timedelta, deadline: timedelta | None = None, role: str = ""
    ) -> MiniBatchVerdict:
        """One long poll for the verdict on mini-batch ``sequence`` for consumers of ``role`` (PENDING if none came
        within ``wait``)."""
        return run_to_completion(self._client.wait_minibatch_verdict(sequence, wait=wait, deadline=deadline,
                                                                     role=role))
