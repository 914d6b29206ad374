"""Where a sidecar's assignments come from (DESIGN.md §2 step 4).

An :class:`AssignmentSource` registers the consumer, then yields its assignments in sequence order and takes
acknowledgements (``acknowledge(s)``: everything up to ``s`` is delivered, so a restarted sidecar resumes
after it), verifications (``report_verified``: every unit of this consumer's part is in the store) and failures
(``report_failure``: a mini-batch the sidecar could not read or pack), and gives the verdict on a mini-batch
(``wait_verdict``: whether every consumer may deliver it, or the failure that stops them all). Two
implementations:

- :class:`AdmissionAssignmentSource`: the admission service over gRPC (``RegisterConsumer``, then
  ``WatchAssignments`` from the acknowledged sequence, reconnecting with back-off and resuming with no gap and
  no repeat; ``ReportProgress(DELIVERED)`` for acknowledgements, ``ReportProgress(VERIFIED)`` for
  verifications, ``ReportConsumerFailure`` for failures, ``WaitMiniBatchVerdict`` for verdicts);
- :class:`PlannedAssignmentSource`: plans computed in-process (embedded single-process use, benchmarks); it
  ends after its last plan and keeps the failures it was told about. It judges each mini-batch by its own
  consumer's reports only: in-process sources of several consumers share no verdict.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from functools import cached_property
from typing import Protocol

from grpc import aio

from knittrans.client.aio import AsyncAdmissionClient
from knittrans.client.connection import ConnectionSettings, error_from_rpc
from knittrans.client.model import ConsumerFailure, ProgressStage, Registration, VerdictState
from knittrans.errors import InvalidArgument, KnitTransError, NotFound
from knittrans.plan import ConsumerAssignment, EncoderMicroBatchAssignment, MicroBatchAssignment, Plan
from knittrans.plan.proto import (
    assignment_from_proto,
    assignment_to_proto,
    encoding_assignment_to_proto,
    plan_from_proto,
)
from knittrans.plan.rank_proto import check_rank_message, consumer_assignment_from_rank_proto, cp_microbatch_from_proto
from knittrans.reorg.node_feed import NodeAssignmentFeed
from knittrans.reorg.reconnect import reconnecting
from knittrans.retry import RetryPolicy
from knittrans.trainer.descriptor import MiniBatchFailure
from knittrans.types import ConsumerId, Topology
from knittrans.v1 import admission_pb2, admission_service_pb2, plan_pb2
from knittrans.wire import within

logger = logging.getLogger(__name__)



@dataclass(frozen=True, kw_only=True)
class Admission:
    """Which mini-batch an assignment belongs to."""

    train_batch_index: int = 0
    minibatch_index: int = 0
    num_minibatches: int = 1
    train_version: int = 0
    trajectory_ids: tuple[str, ...] = ()
    admitted_at: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "trajectory_ids", tuple(self.trajectory_ids))
        if self.num_minibatches < 1 or not 0 <= self.minibatch_index < self.num_minibatches:
            raise InvalidArgument(
                f"needs 0 <= minibatch_index < num_minibatches, got {self.minibatch_index}/{self.num_minibatches}",
                field="minibatch_index",
            )

    def to_proto(self) -> admission_pb2.MiniBatchAdmission:
        return admission_pb2.MiniBatchAdmission(
            train_batch_index=self.train_batch_index, minibatch_index=self.minibatch_index,
            num_minibatches=self.num_minibatches, train_version=self.train_version,
            trajectory_ids=self.trajectory_ids, admitted_at=self.admitted_at,
        )

    @staticmethod
    def from_proto(message: admission_pb2.MiniBatchAdmission) -> Admission:
        return Admission(
            train_batch_index=message.train_batch_index, minibatch_index=message.minibatch_index,
            num_minibatches=message.num_minibatches or 1, train_version=message.train_version,
            trajectory_ids=tuple(message.trajectory_ids), admitted_at=message.admitted_at,
        )


@dataclass(frozen=True, kw_only=True, eq=False)
class AssignmentEvent:
    """One admitted mini-batch as this consumer sees it.

    The consumer's part arrives decoded (``decoded``), as its protobuf (``message``), or, for a backbone consumer
    of the admission service, as its DP rank's part (``rank``, the same for every CP rank). A message is decoded
    one micro-batch at a time (:meth:`unit`; from ``rank``, straight into this CP rank's cut), so the first
    micro-batch can be read and packed before the rest of a large assignment is decoded.
    """

    sequence: int
    admission: Admission
    global_loss_tokens: int
    consumer: ConsumerId
    plan: Plan | None = None  # the whole plan, when the source has it (encoding schedules need it)
    received_at: float = 0.0  # wall clock: when the assignment reached this sidecar (before decoding it)
    decoded: ConsumerAssignment | None = None
    message: plan_pb2.ConsumerAssignment | None = None
    rank: plan_pb2.RankAssignment | None = None

    def __post_init__(self) -> None:
        if self.sequence < 1:
            raise InvalidArgument("must be at least 1", field="sequence")
        if sum(form is not None for form in (self.decoded, self.message, self.rank)) != 1:
            raise InvalidArgument("needs the assignment in exactly one form: decoded, message or rank",
                                  field="assignment")
        if self.rank is not None:
            check_rank_message(self.rank, self.consumer)

    @property
    def encoder(self) -> bool:
        return self.consumer.encoder_name is not None

    @property
    def num_units(self) -> int:
        """Micro-batches (encoder micro-batches for an encoder consumer) in consumption order."""
        if self.decoded is not None:
            return len(self.decoded.encoder_microbatches if self.encoder else self.decoded.microbatches)
        if self.rank is not None:
            return len(self.rank.microbatches)
        assert self.message is not None
        return len(self.message.encoder_microbatches if self.encoder else self.message.microbatches)

    def unit(self, index: int) -> MicroBatchAssignment | EncoderMicroBatchAssignment:
        if self.decoded is not None:
            return (self.decoded.encoder_microbatches if self.encoder else self.decoded.microbatches)[index]
        if self.rank is not None:
            return cp_microbatch_from_proto(self.rank, index, self.consumer.cp_rank)
        assert self.message is not None
        single = plan_pb2.ConsumerAssignment(consumer=self.message.consumer, cp=self.message.cp,
                                             minibatch_loss_tokens=self.message.minibatch_loss_tokens)
        if self.encoder:
            # Without routes: the sidecar needs the inputs' keys and headers; the routes travel on as messages.
            unit = single.encoder_microbatches.add()
            unit.CopyFrom(self.message.encoder_microbatches[index])
            for encoding in unit.encodings:
                encoding.ClearField("routes")
            return within(f"encoder_microbatches[{index}]",
                          lambda: assignment_from_proto(single).encoder_microbatches[0])
        single.microbatches.append(self.message.microbatches[index])
        return within(f"microbatches[{index}]", lambda: assignment_from_proto(single).microbatches[0])

    def encoder_input_messages(self, index: int) -> tuple[plan_pb2.EncodingAssignment, ...]:
        """Encoder micro-batch ``index``'s inputs with their routes, as messages (what descriptors carry)."""
        if self.message is not None:
            return tuple(self.message.encoder_microbatches[index].encodings)
        assert self.decoded is not None
        return tuple(encoding_assignment_to_proto(e) for e in self.decoded.encoder_microbatches[index].encodings)

    @cached_property
    def assignment(self) -> ConsumerAssignment:
        """The whole part, decoded (once)."""
        if self.decoded is not None:
            return self.decoded
        if self.rank is not None:
            return consumer_assignment_from_rank_proto(self.rank, self.consumer)
        assert self.message is not None
        return assignment_from_proto(self.message)

    def assignment_proto(self) -> plan_pb2.ConsumerAssignment:
        if self.message is not None:
            return self.message
        return assignment_to_proto(self.assignment)


@dataclass(frozen=True, kw_only=True)
class FailureReport:
    """Micro-batch ``microbatch_index`` of assignment ``sequence`` could not be read or packed."""

    sequence: int
    admission: Admission
    microbatch_index: int
    failure: MiniBatchFailure


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """Whether the consumers may deliver a mini-batch: ``failure`` (the first failure any consumer reported
    before every consumer had verified it) is None when they may."""

    failure: MiniBatchFailure | None = None

    @property
    def ok(self) -> bool:
        return self.failure is None


class AssignmentSource(Protocol):
    """Assignments of one consumer, in sequence order (see the module docstring)."""

    async def register(self) -> Registration: ...

    def __aiter__(self) -> AsyncIterator[AssignmentEvent]: ...

    async def acknowledge(self, sequence: int) -> None: ...

    async def report_failure(self, report: FailureReport) -> None: ...

    async def report_verified(self, sequence: int) -> None: ...

    async def wait_verdict(self, sequence: int) -> Verdict: ...

    async def admitted_trajectory_ids(self, sequence: int) -> tuple[str, ...]:
        """Every trajectory id of mini-batch ``sequence`` (assignments leave them out: each names only its own)."""
        ...

    def restart_after(self, sequence: int) -> None:
        """The next iteration yields the assignments after ``sequence`` (a restored job's), even delivered ones."""
        ...

    async def close(self) -> None: ...


# --------------------------------------------------------------------------------------------------------------


class PlannedAssignmentSource:
    """Assignments cut from plans computed in this process; ends after the last plan.

    ``plans`` are (admission, plan) pairs in sequence order (sequence numbers start at ``first_sequence``);
    iteration starts after the last acknowledged sequence given at construction.
    """

    def __init__(
        self,
        consumer: ConsumerId,
        plans: Sequence[tuple[Admission, Plan]],
        *,
        first_sequence: int = 1,
        acknowledged_sequence: int = 0,
        job: str = "default",
        topology: Topology | None = None,
    ) -> None:
        if not plans and topology is None:
            raise InvalidArgument("needs at least one plan, or the topology", field="plans")
        self._consumer = consumer
        self._plans = list(plans)
        self._first = first_sequence
        self._topology = topology or self._plans[0][1].topology
        consumer.check_within(self._topology)
        self._job = job
        self.acknowledged = acknowledged_sequence
        self.failures: list[FailureReport] = []
        self.verified: list[int] = []
        self._after = acknowledged_sequence

    async def register(self) -> Registration:
        return Registration(topology=self._topology, acknowledged_sequence=self.acknowledged, job=self._job)

    async def _events(self) -> AsyncIterator[AssignmentEvent]:
        for offset, (admission, plan) in enumerate(self._plans):
            sequence = self._first + offset
            if sequence <= self._after:
                continue
            received_at = time.time()
            part = plan.for_consumer(self._consumer)
            yield AssignmentEvent(sequence=sequence, admission=admission, consumer=self._consumer,
                                  global_loss_tokens=part.minibatch_loss_tokens, decoded=part, plan=plan,
                                  received_at=received_at)
            await asyncio.sleep(0)

    def __aiter__(self) -> AsyncIterator[AssignmentEvent]:
        return self._events()

    async def acknowledge(self, sequence: int) -> None:
        self.acknowledged = max(self.acknowledged, sequence)

    async def report_failure(self, report: FailureReport) -> None:
        self.failures.append(report)

    async def report_verified(self, sequence: int) -> None:
        self.verified.append(sequence)

    async def wait_verdict(self, sequence: int) -> Verdict:
        failure = next((r.failure for r in self.failures if r.sequence == sequence), None)
        return Verdict(failure=failure)

    async def admitted_trajectory_ids(self, sequence: int) -> tuple[str, ...]:
        admission, plan = self._plans[sequence - self._first]
        return admission.trajectory_ids or tuple(t.trajectory_id for t in plan.trajectories)

    def restart_after(self, sequence: int) -> None:
        self._after = sequence

    async def close(self) -> None:
        return None


# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class WatchSettings:
    deadline: timedelta = timedelta(seconds=10)  # unary calls
    initial_backoff: timedelta = timedelta(milliseconds=50)
    max_backoff: timedelta = timedelta(seconds=2)
    give_up_after: timedelta | None = None  # None: reconnect forever (the service may be restarting)
    verdict_poll: timedelta = timedelta(seconds=5)  # how long one WaitMiniBatchVerdict call waits server-side

    @property
    def retry(self) -> RetryPolicy:
        return RetryPolicy(initial=self.initial_backoff.total_seconds(), cap=self.max_backoff.total_seconds(),
                           deadline=None if self.give_up_after is None else self.give_up_after.total_seconds(),
                           jitter=0.5)


class AdmissionAssignmentSource:
    """The admission service's assignment stream for one consumer (see the module docstring)."""

    def __init__(self, connection: ConnectionSettings, consumer: ConsumerId,
                 settings: WatchSettings | None = None, *, feed: NodeAssignmentFeed | None = None) -> None:
        """With a ``feed``, the consumer's assignments come from the node stream of the process's consumers
        (:mod:`knittrans.reorg.node_feed`), and its calls go over the feed's client."""
        self._consumer = consumer
        self._settings = settings or WatchSettings()
        self._feed = feed
        # The SDK's admission client and its retry rules; only the back-off's bounds are the sidecar's.
        self._client = feed.client if feed is not None else AsyncAdmissionClient(
            connection, deadline=self._settings.deadline, retry=self._settings.retry)
        self._received = 0  # the last sequence yielded: resume point after a reconnect
        self._registered = False

    @property
    def consumer(self) -> ConsumerId:
        return self._consumer

    async def register(self) -> Registration:
        registration = await self._client.register_consumer(self._consumer,
                                                            request_id=f"register/{self._consumer}")
        self._consumer.check_within(registration.topology)
        self._received = registration.acknowledged_sequence
        self._registered = True
        if self._feed is not None:
            self._feed.registered(self._consumer, self._received)
        logger.info("registered %s with the admission service; resuming after sequence %d",
                    self._consumer, self._received)
        return registration

    def __aiter__(self) -> AsyncIterator[AssignmentEvent]:
        return self._events()

    def _accepted(self, response: admission_service_pb2.WatchAssignmentsResponse,
                  received_at: float) -> AssignmentEvent | None:
        """The next assignment, or None for a repeat (after a reconnect race: already yielded)."""
        if response.sequence <= self._received:
            return None
        if response.sequence != self._received + 1:
            raise KnitTransError(f"assignment stream skipped from {self._received} to {response.sequence}",
                                 field="sequence")
        event = _event_from_proto(response, received_at, self._consumer)
        self._received = event.sequence
        return event

    async def _events(self) -> AsyncIterator[AssignmentEvent]:
        if not self._registered:
            await self.register()
        if self._feed is not None:  # the feed reconnects, for all of the process's consumers
            async for response, received_at in self._feed.messages(self._consumer, self._received):
                event = self._accepted(response, received_at)
                if event is not None:
                    yield event
            return
        responses = reconnecting(
            lambda: self._client.watch_assignment_messages(self._consumer, after_sequence=self._received),
            self._settings.retry, "assignment stream", lambda: self._received)
        async for response in responses:
            event = self._accepted(response, time.time())
            if event is not None:
                yield event

    def restart_after(self, sequence: int) -> None:
        self._received = sequence

    async def admitted_trajectory_ids(self, sequence: int) -> tuple[str, ...]:
        """Asked of the admission service: the first message of a stream from ``sequence``, with the ids."""
        stream = self._client.watch_assignment_messages(self._consumer, after_sequence=sequence - 1,
                                                        include_trajectory_ids=True)
        try:
            async for response in stream:
                if response.sequence == sequence:
                    return tuple(response.admission.trajectory_ids)
                break
        except aio.AioRpcError as error:
            raise error_from_rpc(error) from None
        finally:
            await stream.aclose()
        raise NotFound(f"the admission service has no mini-batch {sequence}", field="sequence")

    async def acknowledge(self, sequence: int) -> None:
        await self._client.report_progress(self._consumer, sequence, ProgressStage.DELIVERED,
                                           request_id=f"delivered/{self._consumer}/{sequence}")

    async def report_failure(self, report: FailureReport) -> None:
        failure = ConsumerFailure(
            consumer=self._consumer,
            sequence=report.sequence,
            train_batch_index=report.admission.train_batch_index,
            minibatch_index=report.admission.minibatch_index,
            microbatch_index=report.microbatch_index,
            trajectory_id=report.failure.trajectory_id,
            unit_key=report.failure.unit_key,
            reason=report.failure.reason,
        )
        await self._client.report_consumer_failure(failure, request_id=f"failed/{self._consumer}/{report.sequence}")

    async def report_verified(self, sequence: int) -> None:
        await self._client.report_progress(self._consumer, sequence, ProgressStage.VERIFIED,
                                           request_id=f"verified/{self._consumer}/{sequence}")

    async def wait_verdict(self, sequence: int) -> Verdict:
        """Long-polls until the service has the verdict; waits for as long as some consumer has not verified."""
        poll = self._settings.verdict_poll
        polls = 0
        while True:
            polls += 1
            verdict = await self._client.wait_minibatch_verdict(sequence, wait=poll, role=self._consumer.role)
            if verdict.state is VerdictState.OK:
                return Verdict()
            if verdict.state is VerdictState.FAILED:
                assert verdict.failure is not None
                return Verdict(failure=_failure_for_consumers(verdict.failure))
            if polls % 6 == 0:  # about every 30 s with the default poll
                waiting = ", ".join(f"{c.role} dp {c.dp_rank} cp {c.cp_rank}" for c in verdict.waiting_for)
                logger.warning("%s: mini-batch %d still waits for its verdict after %.0fs: not verified yet by %s "
                               "(is every planned consumer's sidecar running?)", self._consumer, sequence,
                               polls * poll.total_seconds(), waiting or "?")

    async def close(self) -> None:
        if self._feed is None:  # a feed's client is closed with the feed, by whoever made it
            await self._client.close()


def _failure_for_consumers(failure: ConsumerFailure) -> MiniBatchFailure:
    """The failure a consumer reported, for every consumer's trainer ranks: the reason says whose it was."""
    consumer = failure.consumer
    origin = f"{consumer.role} dp {consumer.dp_rank} cp {consumer.cp_rank}"
    reason = f"consumer {origin}, micro-batch {failure.microbatch_index}: {failure.reason or 'failed'}"
    return MiniBatchFailure(trajectory_id=failure.trajectory_id, unit_key=failure.unit_key,
                            reason=reason if len(reason) <= 1024 else reason[:1021] + "...")


def _event_from_proto(
    response: admission_service_pb2.WatchAssignmentsResponse, received_at: float, consumer: ConsumerId
) -> AssignmentEvent:
    rank = response.rank_assignment if response.WhichOneof("part") == "rank_assignment" else None
    if rank is None and (response.assignment.consumer.role, response.assignment.consumer.dp_rank,
                         response.assignment.consumer.cp_rank) != (consumer.role, consumer.dp_rank, consumer.cp_rank):
        raise InvalidArgument(f"is not {consumer}'s", field="assignment.consumer")
    plan = None
    # A service that sends the whole plan (for encoding schedules) sets an optional `plan` field.
    if "plan" in response.DESCRIPTOR.fields_by_name and response.HasField("plan"):
        plan = plan_from_proto(response.plan)
    return AssignmentEvent(
        sequence=response.sequence,
        admission=Admission.from_proto(response.admission),
        global_loss_tokens=response.global_loss_tokens,
        consumer=consumer,
        message=None if rank is not None else response.assignment,
        rank=rank,
        plan=plan,
        received_at=received_at,
    )


__all__ = [
    "Admission",
    "AdmissionAssignmentSource",
    "AssignmentEvent",
    "AssignmentSource",
    "FailureReport",
    "PlannedAssignmentSource",
    "Registration",
    "Verdict",
    "WatchSettings",
]
