"""Attaching fields a trainer role produced (DESIGN.md §10 "Roles", docs/roles.md).

A producing role (a reference model computing ``ref_logprobs``, a critic computing ``values``) writes each value
it computed for a trajectory of a mini-batch to the unit store, one unit per trajectory and field under
``<namespace>/t/<trajectory id>/<field>``, then reports the units with ``AttachFields``. The admission service
validates them against the job's schema (the field is declared ``attached_by`` the role, with its dtype, row
shape and coverage), journals them, and dispatches the mini-batch to the roles that consume the fields once every
trajectory has them. The mini-batch's release deletes the units.

Idempotent: attaching the same values again (a retry, or another TP rank of the same consumer) changes nothing;
other values for a (trajectory, field) already attached raise :class:`~knittrans.errors.Conflict`.
:class:`FieldAttacher` is the SDK's one way to do it; ``TrainerClient.attach`` uses it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from knittrans.errors import InvalidArgument
from knittrans.store.arrays import to_numpy
from knittrans.store.keys import check_simple_name, trajectory_unit_key
from knittrans.store.protocol import UnitStore, UnitWrite
from knittrans.types import Coverage, FieldAlignment, TrajectoryId, UnitKind, UnitRef, check_id

# field -> trajectory id -> its value (a numpy array or torch tensor whose leading axis covers its tokens)
AttachedValues = Mapping[str, Mapping[str, Any]]


@dataclass(frozen=True, kw_only=True)
class AttachResult:
    """What one ``AttachFields`` call changed."""

    attached: int  # attachments newly recorded
    unchanged: int  # already recorded identically
    complete: bool  # every attached field of the job is now attached to every trajectory of the mini-batch


@dataclass(frozen=True, kw_only=True)
class FieldAttachment:
    """One unit a role attaches to one trajectory."""

    trajectory_id: TrajectoryId
    unit: UnitRef


class AttachReporter(Protocol):
    """Reports attachments (the admission client does)."""

    def attach_fields(self, role: str, sequence: int, attachments: list[FieldAttachment], *,
                      request_id: str | None = None) -> AttachResult: ...


def attachment_writes(
    values: AttachedValues, *, namespace: str, coverage: Mapping[str, Coverage | str] | None = None,
    alignment: Mapping[str, FieldAlignment | str] | None = None,
) -> tuple[list[UnitWrite], list[FieldAttachment]]:
    """The store writes and attachments of ``values``. ``coverage`` and ``alignment`` are per field, as the
    job's schema declares it (default: the whole sequence, no alignment); validated before anything is written."""
    check_simple_name(namespace, "namespace")
    coverage = coverage or {}
    alignment = alignment or {}
    writes: list[UnitWrite] = []
    attachments: list[FieldAttachment] = []
    if not isinstance(values, Mapping):
        raise InvalidArgument("must map field names to {trajectory id: value}", field="values")
    for name, per_trajectory in values.items():
        check_simple_name(name, f"values.{name}")
        if not isinstance(per_trajectory, Mapping):
            raise InvalidArgument("must map trajectory ids to values", field=f"values.{name}")
        try:
            covers = Coverage(coverage.get(name, Coverage.SEQUENCE))
        except ValueError:
            raise InvalidArgument(f"must be one of {', '.join(Coverage)}", field=f"coverage.{name}") from None
        aligned = alignment.get(name)
        aligned = None if aligned is None else FieldAlignment.parse(str(aligned), f"alignment.{name}")
        for trajectory_id, value in per_trajectory.items():
            where = f"values.{name}.{trajectory_id}"
            check_id(trajectory_id, where)
            array, dtype = to_numpy(value, field=where)
            if array.ndim < 1 or array.shape[0] < 1:
                raise InvalidArgument("must have a leading axis over the tokens the field covers", field=where)
            write = UnitWrite.of_array(trajectory_unit_key(namespace, TrajectoryId(trajectory_id), name), array,
                                       dtype, sequence=True)
            writes.append(write)
            attachments.append(FieldAttachment(
                trajectory_id=TrajectoryId(trajectory_id),
                unit=UnitRef(key=write.key, field_name=name, kind=UnitKind.TOKEN_FIELD, header=write.header,
                             alignment=aligned, coverage=covers)))
    return writes, attachments


class FieldAttacher:
    """Writes a trainer role's values to the unit store and attaches them (see the module docstring).

    ``namespace`` prefixes the unit keys, like :class:`~knittrans.rollout.RolloutClient`'s (it must not collide
    with a field the rollout stores: attached fields are never reported, so it does not)."""

    def __init__(self, *, role: str, store: UnitStore, reporter: AttachReporter, namespace: str = "default") -> None:
        if not role or role.startswith("role:"):
            raise InvalidArgument(f"must be the trainer role's name (as in the topology), got {role!r}", field="role")
        check_simple_name(namespace, "namespace")
        self.role = role
        self._store = store
        self._reporter = reporter
        self._namespace = namespace

    def attach(
        self, sequence: int, values: AttachedValues, *, coverage: Mapping[str, Coverage | str] | None = None,
        alignment: Mapping[str, FieldAlignment | str] | None = None,
    ) -> AttachResult:
        """Attach ``values`` (field -> trajectory id -> value) to mini-batch ``sequence``'s trajectories: store
        them, then report them. Raises what the service raised (naming the field) after the write; a retry with
        the same values is harmless."""
        writes, attachments = attachment_writes(values, namespace=self._namespace, coverage=coverage,
                                                alignment=alignment)
        if not attachments:
            return AttachResult(attached=0, unchanged=0, complete=False)
        self._store.put_many(writes)
        # A deterministic request id: another TP rank (or a retry) sending the same attachments is the same request.
        first = attachments[0]
        request_id = f"attach/{self.role}/{sequence}/{first.trajectory_id}/{first.unit.field_name}/{len(attachments)}"
        return self._reporter.attach_fields(self.role, sequence, attachments, request_id=request_id[:256])

    def close(self) -> None:
        """Close the store and the reporter when they can be closed (the trainer opened them for this)."""
        for resource in (self._store, self._reporter):
            close = getattr(resource, "close", None)
            if close is not None:
                close()
