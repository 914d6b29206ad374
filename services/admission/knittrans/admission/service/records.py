"""Journal records and the engine's decisions, each translated into the other.

The servicer journals :func:`record_for` a decision before the ledger applies it; the ledger reads the decision
back with :func:`admit_of`, :func:`drop_of` and :func:`wait_of`. Recovery applies the same records, so both
directions must agree exactly, which is why they sit side by side here and hold no state.
"""

from __future__ import annotations

from knittrans.admission.engine.decisions import Admit, BlockingReason, Decision, Drop, DropReason, Wait
from knittrans.types import ConsumerId, TrajectoryId
from knittrans.v1 import admission_pb2, admission_service_pb2, journal_pb2

_BLOCKING_TO_PROTO = {r: admission_pb2.BlockingReason.Value(f"BLOCKING_REASON_{r.name}") for r in BlockingReason}
_BLOCKING_FROM_PROTO = {number: reason for reason, number in _BLOCKING_TO_PROTO.items()}
_DROP_TO_PROTO = {r: admission_pb2.DropReason.Value(f"DROP_REASON_{r.name}") for r in DropReason}
_DROP_FROM_PROTO = {number: reason for reason, number in _DROP_TO_PROTO.items()}


def blocking_to_proto(reason: BlockingReason) -> int:
    return _BLOCKING_TO_PROTO[reason]


def blocking_from_proto(number: int) -> BlockingReason:
    return _BLOCKING_FROM_PROTO[number]


def failure_consumer(failure: admission_service_pb2.ConsumerFailure) -> ConsumerId:
    return ConsumerId(role=failure.consumer.role, dp_rank=failure.consumer.dp_rank, cp_rank=failure.consumer.cp_rank)


def record_for(decision: Decision, now: float, last_wait: Wait | None) -> journal_pb2.JournalRecord | None:
    """The journal record that carries out ``decision``; None for a wait that changes nothing (the same reason
    since the same time as ``last_wait``, the wait last applied)."""
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
    if last_wait is not None and last_wait.reason is decision.reason and last_wait.since == decision.since:
        return None
    return journal_pb2.JournalRecord(
        at=decision.since,
        wait=admission_pb2.AdmissionWait(reason=_BLOCKING_TO_PROTO[decision.reason], detail=decision.detail),
    )


def admit_of(record: journal_pb2.JournalRecord) -> Admit:
    admission = record.admission
    return Admit(
        trajectory_ids=tuple(TrajectoryId(t) for t in admission.trajectory_ids),
        train_batch_index=admission.train_batch_index,
        minibatch_index=admission.minibatch_index,
        num_minibatches=admission.num_minibatches,
        train_version=admission.train_version,
        admitted_at=admission.admitted_at,
    )


def drop_of(record: journal_pb2.JournalRecord) -> Drop:
    drop = record.drop
    return Drop(
        trajectory_ids=tuple(TrajectoryId(t) for t in drop.trajectory_ids), reason=_DROP_FROM_PROTO[drop.reason],
        detail=drop.detail,
    )


def wait_of(record: journal_pb2.JournalRecord) -> Wait:
    """The wait a record carries; it began when the record was written (:func:`record_for` stamps ``since``)."""
    return Wait(reason=_BLOCKING_FROM_PROTO[record.wait.reason], detail=record.wait.detail, since=record.at)
