"""Fields trainer roles attach to admitted trajectories (``AttachFields``; DESIGN.md §10 "Roles", docs/roles.md).

A producing role (a reference model, a critic) writes each value it computed for a trajectory of a mini-batch to
the unit store, as a unit of its own, and reports the unit here. :func:`check_attachments` holds every attachment
to the job's declared schema exactly like a reported unit (the field is declared ``attached_by`` the role; its
dtype, row shape and coverage are the declared ones; its length is the number of tokens the field covers) and to
the mini-batch (the trajectory is one of it, the mini-batch is not released). The accepted attachments are
journaled and applied: :class:`AttachedFields` keeps their ``UnitRef`` per trajectory, the unit index counts the
key as the trajectory's own (so the trajectory's release deletes it), and a consuming role's plan carries them
beside the reported units, so its sidecars read and pack them like any other token field.

Idempotent per (trajectory, field): the identical unit again changes nothing (a retry, or another TP rank's
copy); a different one is :class:`~knittrans.errors.Conflict` naming both.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from knittrans.admission.planning.encoder import ReferenceColumns
from knittrans.admission.service.assignments import MiniBatchDispatch, MiniBatchRows
from knittrans.admission.service.retention import AdmittedMiniBatch, Verdict
from knittrans.errors import Conflict, FailedPrecondition, InvalidArgument, within
from knittrans.types import BACKBONE_ROLE, MAX_ID_LENGTH, Coverage, Topology, TrajectoryId, UnitKey, UnitKind
from knittrans.v1 import admission_service_pb2 as pb
from knittrans.v1 import journal_pb2, trajectory_pb2
from knittrans.wire.enums import COVERAGE_TO_PROTO, DTYPE_TO_PROTO
from knittrans.wire.trajectory import unit_ref_from_proto

if TYPE_CHECKING:
    from knittrans.admission.service.journaled import JournaledCommits
    from knittrans.admission.service.ledger import AdmissionLedger, Applied

logger = logging.getLogger(__name__)


class AttachedFields:
    """Trajectory -> field -> the attached unit, for live trajectories (pure state; the ledger owns it)."""

    def __init__(self) -> None:
        self._units: dict[TrajectoryId, dict[str, trajectory_pb2.UnitRef]] = {}

    def get(self, trajectory_id: TrajectoryId, field_name: str) -> trajectory_pb2.UnitRef | None:
        return self._units.get(trajectory_id, {}).get(field_name)

    def of(self, trajectory_id: TrajectoryId) -> Mapping[str, trajectory_pb2.UnitRef]:
        return self._units.get(trajectory_id, {})

    def record(self, trajectory_id: TrajectoryId, unit: trajectory_pb2.UnitRef) -> bool:
        """Keep ``unit``; False if this very unit is kept already."""
        fields = self._units.setdefault(trajectory_id, {})
        if fields.get(unit.field_name) == unit:
            return False
        kept = trajectory_pb2.UnitRef()
        kept.CopyFrom(unit)
        fields[unit.field_name] = kept
        return True

    def forget(self, trajectory_ids: Iterable[TrajectoryId]) -> None:
        """Released trajectories: the index frees their attached keys with their own."""
        for trajectory_id in trajectory_ids:
            self._units.pop(trajectory_id, None)

    def complete(self, trajectory_ids: Sequence[TrajectoryId], fields: Iterable[str]) -> bool:
        """Whether every one of ``fields`` is attached to every one of ``trajectory_ids``."""
        wanted = tuple(fields)
        return all(name in self._units.get(t, {}) for t in trajectory_ids for name in wanted)

    def items(self) -> list[tuple[TrajectoryId, trajectory_pb2.UnitRef]]:
        return [(t, unit) for t, fields in self._units.items() for unit in fields.values()]

    def __len__(self) -> int:
        return sum(len(fields) for fields in self._units.values())


def check_attachments(request: pb.AttachFieldsRequest, ledger: AdmissionLedger) -> tuple[list[int], int]:
    """Validate ``request`` against the ledger; returns the indices of the attachments that are new (the first of
    identical duplicates) and how many are already recorded. Raises naming the field of the first bad one."""
    if len(request.request_id) > MAX_ID_LENGTH:
        raise InvalidArgument(f"longer than {MAX_ID_LENGTH} characters", field="request_id")
    topology = ledger.settings.topology
    role = within("role", lambda: topology.role(request.role)).name if request.role else None
    if role is None:
        raise InvalidArgument("name the attaching trainer role", field="role")
    if len(request.attachments) > ledger.settings.max_report_batch:
        raise InvalidArgument(f"more than {ledger.settings.max_report_batch} attachments in one request",
                              field="attachments")
    if not 1 <= request.sequence < ledger.next_sequence:
        raise InvalidArgument(f"no assignment {request.sequence} (last is {ledger.next_sequence - 1})",
                              field="sequence")
    minibatch = ledger.minibatches.get(request.sequence)
    if minibatch is None or minibatch.released:
        raise FailedPrecondition(f"mini-batch {request.sequence} is released: nothing can be attached to it",
                                 field="sequence")
    schema = ledger.schema
    members = frozenset(minibatch.trajectory_ids)
    attached = ledger.attachments
    new: list[int] = []
    unchanged = 0
    seen: dict[tuple[str, str], trajectory_pb2.UnitRef] = {}
    alignments: dict[str, int] = {}
    for i, attachment in enumerate(request.attachments):
        where = f"attachments[{i}]"
        trajectory_id = TrajectoryId(attachment.trajectory_id)
        if trajectory_id not in members:
            raise InvalidArgument(f"trajectory {trajectory_id!r} is not in mini-batch {request.sequence}",
                                  field=f"{where}.trajectory_id")
        unit = attachment.unit
        ref = within(f"{where}.unit", lambda u=unit: unit_ref_from_proto(u))  # type: ignore[misc]
        name = ref.field_name
        producer = None if schema is None else schema.attached_by.get(name)
        if producer is None or schema is None:
            raise InvalidArgument(f"field {name!r} is not declared in the schema as attached by a role",
                                  field=f"{where}.unit.field_name")
        if producer != role:
            raise InvalidArgument(f"field {name!r} is attached by role {producer!r}, not by {role!r}",
                                  field=f"{where}.unit.field_name")
        expected = schema.attached[name]
        if ref.kind is not UnitKind.TOKEN_FIELD:
            raise InvalidArgument(f"field {name!r} is a token field", field=f"{where}.unit.kind")
        if DTYPE_TO_PROTO[ref.header.dtype] != expected.dtype or COVERAGE_TO_PROTO[ref.coverage] != expected.coverage \
                or ref.header.shape[1:] != expected.trailing_shape:
            found = f"{ref.header.dtype.value} rows of shape {list(ref.header.shape[1:])} over the {ref.coverage.value}"
            raise InvalidArgument(f"field {name!r} is {found}, the job's is {expected.describe()} (declared in the "
                                  "job's schema)", field=f"{where}.unit.header")
        covered = ledger.covered_tokens(trajectory_id, ref.coverage is Coverage.RESPONSE)
        if ref.header.shape[0] != covered:
            raise InvalidArgument(f"field {name!r} has {ref.header.shape[0]} rows; trajectory {trajectory_id!r} has "
                                  f"{covered} tokens in its {ref.coverage.value}", field=f"{where}.unit.header.shape")
        if ref.header.chunk_tokens:
            raise InvalidArgument("attached units are stored whole", field=f"{where}.unit.header.chunk_tokens")
        known = attached.get(trajectory_id, name) or seen.get((trajectory_id, name))
        if known is not None:
            if known != unit:
                raise Conflict(f"field {name!r} of trajectory {trajectory_id!r} is attached already as unit "
                               f"{known.key!r} with other content", field=f"{where}.unit")
            unchanged += 1
            continue
        owner = ledger.index.owner(UnitKey(ref.key))
        if owner is not None or any(u.key == ref.key for u in seen.values()):
            raise InvalidArgument(f"key {ref.key!r} is referenced already (by {owner!r})", field=f"{where}.unit.key")
        alignment = alignments.setdefault(name, _alignment_in(ledger, minibatch, name, unit.alignment))
        if unit.alignment != alignment:
            raise InvalidArgument(f"field {name!r} has another alignment than its other attachments in this "
                                  "mini-batch", field=f"{where}.unit.alignment")
        seen[(trajectory_id, name)] = unit
        new.append(i)
    return new, unchanged


def _alignment_in(ledger: AdmissionLedger, minibatch: AdmittedMiniBatch, name: str, default: int) -> int:
    """The alignment a field's attachments in the mini-batch have (they are packed together), else ``default``."""
    for trajectory_id in minibatch.trajectory_ids:
        known = ledger.attachments.get(trajectory_id, name)
        if known is not None:
            return known.alignment
    return default


def apply_attached(ledger: AdmissionLedger, request: pb.AttachFieldsRequest) -> bool:
    """Record a journaled (validated) request's attachments; whether anything changed."""
    changed = False
    for attachment in request.attachments:
        trajectory_id = TrajectoryId(attachment.trajectory_id)
        if trajectory_id not in ledger.index:  # released since (replay of a record behind a snapshot)
            continue
        if ledger.attachments.record(trajectory_id, attachment.unit):
            ledger.index.attach_unit(trajectory_id, UnitKey(attachment.unit.key))
            changed = True
    return changed


def complete(ledger: AdmissionLedger, minibatch: AdmittedMiniBatch) -> bool:
    """Whether every attached field of the job is attached to every trajectory of the mini-batch."""
    schema = ledger.schema
    return schema is None or ledger.attachments.complete(minibatch.trajectory_ids, schema.attached_by)


def ready_for(ledger: AdmissionLedger, minibatch: AdmittedMiniBatch, role: str) -> bool:
    """Whether consumers of ``role`` (a ConsumerId.role) may be dispatched the mini-batch: every field the role
    consumes is attached to every trajectory of it, or a producing role failed it (then the consumers are
    dispatched so that they learn the failure from their verdict, :func:`role_verdict`)."""
    consumed = ledger.settings.topology.consumed_by(role)
    if not consumed or minibatch.released or ledger.attachments.complete(minibatch.trajectory_ids, consumed):
        return True
    return role_verdict(ledger, minibatch.sequence, role)[0] is Verdict.FAILED


def role_verdict(ledger: AdmissionLedger, sequence: int, role: str
                 ) -> tuple[Verdict, pb.ConsumerFailure | None]:
    """The verdict for consumers of ``role``: FAILED as soon as a role it depends on (through the fields it
    consumes, transitively) failed the mini-batch, whose fields will then never be attached; else its own."""
    topology = ledger.settings.topology
    for name in topology.consumed_by(role):
        producer = topology.producer_of(name)
        if producer is not None:
            verdict, failure = role_verdict(ledger, sequence, producer.consumer_role)
            if verdict is Verdict.FAILED:
                return verdict, failure
    return ledger.verdict(sequence, role)


async def attach_fields(
    request: pb.AttachFieldsRequest,
    *,
    ledger: AdmissionLedger,
    commits: JournaledCommits,
    commit: Callable[[journal_pb2.JournalRecord], Awaitable[Applied]],
    clock: Callable[[], float],
) -> pb.AttachFieldsResponse:
    async with commits.mutating():
        new, unchanged = check_attachments(request, ledger)
        if new:
            record = journal_pb2.JournalRecord(at=clock())
            record.attached.request_id = request.request_id
            record.attached.role = request.role
            record.attached.sequence = request.sequence
            record.attached.attachments.extend(request.attachments[i] for i in new)
            await commit(record)
        minibatch = ledger.minibatches[request.sequence]
        done = complete(ledger, minibatch)
    if new:
        logger.debug("role %s attached %d units to mini-batch %d (complete: %s)", request.role, len(new),
                     request.sequence, done)
    return pb.AttachFieldsResponse(attached=len(new), unchanged=unchanged, complete=done)


def role_dispatch(rows: MiniBatchRows, topology: Topology, label_fields: Sequence[str], role: str,
                  attached: AttachedFields) -> MiniBatchDispatch:
    """The plan of a mini-batch for the consumers of ``role`` (a ConsumerId.role; "" is the backbone's), on the
    role's own topology. The attached fields the role consumes join its trajectories' messages when they are
    built, which the gating (a role is dispatched a mini-batch only once they are attached) puts after they were
    attached."""
    role = role or BACKBONE_ROLE
    consumed = topology.consumed_by(role)
    text_only = role != BACKBONE_ROLE and len(rows.references.keys) > 0
    if text_only:  # images and their encodings are the backbone's (its encoders); a trainer role reads no media
        rows = without_references(rows)

    def message(t: int) -> trajectory_pb2.TrajectoryMetadata:
        units = attached.of(TrajectoryId(rows.trajectory_ids[t]))
        return with_attached(rows.message(t), (units[name] for name in consumed if name in units),
                             drop_multimodal=text_only)

    return MiniBatchDispatch(rows, topology.view_of(role), label_fields, role=role,
                             message=message if consumed or text_only else None)


def without_references(rows: MiniBatchRows) -> MiniBatchRows:
    """The rows as a text-only consumer plans them: the same trajectories, none of their multimodal references."""
    return dataclasses.replace(
        rows,
        references=ReferenceColumns(
            trajectories=np.zeros(0, dtype=np.int64), keys=(), encoders=(), costs=np.zeros(0, dtype=np.float64),
            starts=np.zeros(0, dtype=np.int64), ends=np.zeros(0, dtype=np.int64), kinds=(), content_hashes=()),
        reference_kinds=[],
        reference_offsets=[0] * (len(rows.trajectory_ids) + 1),
        _messages={},
    )


def with_attached(message: trajectory_pb2.TrajectoryMetadata, units: Iterable[trajectory_pb2.UnitRef], *,
                  drop_multimodal: bool = False) -> trajectory_pb2.TrajectoryMetadata:
    """A trajectory's message with attached units beside its reported ones, and without its multimodal references
    for a text-only consumer (a copy; ``message`` is shared)."""
    extra = list(units)
    if not extra and not (drop_multimodal and len(message.multimodal)):
        return message
    copy = trajectory_pb2.TrajectoryMetadata()
    copy.CopyFrom(message)
    copy.units.extend(extra)
    if drop_multimodal:
        copy.ClearField("multimodal")
    return copy


