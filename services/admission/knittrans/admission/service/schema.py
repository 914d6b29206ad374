"""The job's trajectory schema, fixed by the first accepted trajectory and enforced at ingest (DESIGN.md §9, §10).

The reorg packer puts the items of one micro-batch side by side, so everything it assumes about them must hold
for every pair of trajectories the service could ever admit together:

- the same stored fields (names and kinds), each per-token field with the same dtype, the same trailing shape
  (``shape[1:]``; the leading axis is the trajectory's length, or its response's) and the same coverage (the
  packer gives a response-only field a ``<name>.mask``), each non-sequence field with the same dtype
  (its shape may differ: the packer then gives every item a tensor of its own, ``<name>.<item>``);
- field names the packer can name a tensor after without colliding with one it generates
  (:mod:`knittrans.tensor_names`), and label fields (read with one token of look-ahead) that are 1-D integers;
- scalar names that can name a tensor. Scalar *sets* may differ: the packer fills a missing scalar with NaN (0,
  false) and marks it in ``scalar_present.<name>``; a name keeps one kind (float, int, bool) in a job, and so does
  a metadata name (str, bytes, JSON), within its size bound (:mod:`.value_schema`).

A job may declare its schema in its config (:class:`knittrans.trajectory_schema.TrajectorySchema`,
:func:`declared_schema`); without one, the first accepted trajectory fixes it.

What the packer assumes about one item alone (a header's byte length matching its shape and dtype, a per-token
field's leading axis matching the trajectory's length) is checked by :mod:`~knittrans.admission.service.ingest.rules`.
Trajectories a rollout filter rejected are released at once and never packed, so they are not held to the
schema. Pure: the schema is derived from reported metadata only, so replaying the journal rebuilds it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

import numpy as np

from knittrans.admission.service.trajectory_columns import TrajectoryColumns
from knittrans.admission.service.value_schema import MetadataRules, ScalarRules, check_values, derived_value_rules
from knittrans.errors import InvalidArgument
from knittrans.tensor_names import field_name_problem, scalar_name_problem
from knittrans.trajectory_schema import TrajectorySchema
from knittrans.types import DType, UnitKind
from knittrans.wire.enums import (
    COVERAGE_TO_PROTO,
    DTYPE_FROM_PROTO,
    DTYPE_TO_PROTO,
    TOKEN_FIELD_KIND,
    UNIT_KIND_FROM_PROTO,
    UNIT_KIND_TO_PROTO,
)

_TOKEN_FIELD = TOKEN_FIELD_KIND
_FIELD = UNIT_KIND_TO_PROTO[UnitKind.FIELD]
_INTEGER_DTYPES = frozenset(
    DTYPE_TO_PROTO[dtype]
    for dtype in (DType.UINT8, DType.INT8, DType.UINT16, DType.INT16, DType.INT32, DType.UINT32, DType.INT64)
)


@dataclass(frozen=True, kw_only=True)
class FieldSchema:
    """What every accepted trajectory's unit of one field must agree on."""

    kind: int  # trajectory_pb2.UnitKind
    dtype: int  # trajectory_pb2.DType
    trailing_shape: tuple[int, ...] | None  # per-token fields: shape[1:]; None: not fixed
    coverage: int = 0  # trajectory_pb2.TokenCoverage; 0: the whole sequence

    def describe(self) -> str:
        kind = UNIT_KIND_FROM_PROTO[self.kind].value
        dtype = DTYPE_FROM_PROTO[self.dtype].value
        shape = "" if self.trailing_shape is None else f", rows of shape {list(self.trailing_shape)}"
        return f"{kind} {dtype}{shape}{', response only' if self.coverage else ''}"


@dataclass(frozen=True, kw_only=True)
class JobSchema:
    """The job's stored fields, scalars and metadata; ``declared``: from the config, not the first trajectory."""

    fields: Mapping[str, FieldSchema]  # the stored fields reports carry
    scalars: ScalarRules = field(default_factory=dict)
    metadata: MetadataRules = field(default_factory=dict)
    declared: bool = False
    attached: Mapping[str, FieldSchema] = field(default_factory=dict)  # fields trainer roles attach (docs/roles.md)
    attached_by: Mapping[str, str] = field(default_factory=dict)  # attached field -> the role that attaches it

    @property
    def origin(self) -> str:
        return "declared in the job's schema" if self.declared else "fixed by the job's first trajectory"

    def describe(self) -> str:
        return ", ".join(f"{name}: {schema.describe()}" for name, schema in sorted(self.fields.items()))


def _unit_schema(columns: TrajectoryColumns, unit: int) -> FieldSchema:
    headers = columns.unit_headers
    kind = int(columns.unit_kinds[unit])
    trailing = None
    if kind == _TOKEN_FIELD:
        start, end = int(headers.shape_offsets[unit]), int(headers.shape_offsets[unit + 1])
        trailing = tuple(int(d) for d in headers.shape[start + 1 : end])
    return FieldSchema(kind=kind, dtype=int(headers.dtypes[unit]), trailing_shape=trailing,
                       coverage=int(columns.unit_coverages[unit]))


def _unit_field(columns: TrajectoryColumns, row: int, unit: int) -> str:
    return f"trajectories[{row}].units[{unit - int(columns.unit_offsets[row])}]"


def schema_of(columns: TrajectoryColumns, row: int, label_fields: Collection[str]) -> JobSchema:
    """The schema that trajectory ``row`` (valid by ingest's rules) fixes; raises :class:`InvalidArgument` if the
    packer could not pack it even alone."""
    fields: dict[str, FieldSchema] = {}
    for unit in range(int(columns.unit_offsets[row]), int(columns.unit_offsets[row + 1])):
        name = columns.field_names[int(columns.unit_fields[unit])]
        where = _unit_field(columns, row, unit)
        problem = field_name_problem(name)
        if problem is not None:
            raise InvalidArgument(problem, field=f"{where}.field_name")
        schema = _unit_schema(columns, unit)
        if name in label_fields and schema.kind == _TOKEN_FIELD and (
            schema.trailing_shape or schema.dtype not in _INTEGER_DTYPES or schema.coverage
        ):
            raise InvalidArgument(
                f"labels are made from field {name!r}, so it must be a 1-D integer field over the whole sequence, not "
                f"{schema.describe()}",
                field=f"{where}.header",
            )
        fields[name] = schema
    scalars, metadata = derived_value_rules(columns, row)
    return JobSchema(fields=fields, scalars=scalars, metadata=metadata)


def declared_schema(declared: TrajectorySchema) -> JobSchema:
    """The job schema a config declares (its label fields were checked with it)."""
    token_fields = {name: FieldSchema(kind=_TOKEN_FIELD, dtype=DTYPE_TO_PROTO[spec.dtype],
                                      trailing_shape=spec.row_shape, coverage=COVERAGE_TO_PROTO[spec.coverage])
                    for name, spec in declared.token_fields.items()}
    attached_by = {name: spec.attached_by for name, spec in declared.attached_fields.items()}
    fields = {name: spec for name, spec in token_fields.items() if name not in attached_by}
    fields.update({name: FieldSchema(kind=_FIELD, dtype=DTYPE_TO_PROTO[spec.dtype], trailing_shape=None)
                   for name, spec in declared.fields.items()})
    return JobSchema(fields=fields, scalars=dict(declared.scalars), metadata=dict(declared.metadata), declared=True,
                     attached={name: token_fields[name] for name in attached_by}, attached_by=attached_by)


def _signature_table(columns: TrajectoryColumns, units: np.ndarray) -> np.ndarray:
    """One row per unit: canonical field code, kind, dtype, coverage, trailing rank and trailing dimensions
    (per-token fields only), so equal rows mean equal :class:`FieldSchema` and name."""
    names = columns.field_names
    first: dict[str, int] = {}
    canonical = np.array([first.setdefault(name, i) for i, name in enumerate(names)], dtype=np.int64)
    headers = columns.unit_headers
    kinds = columns.unit_kinds[units]
    token = kinds == _TOKEN_FIELD
    ranks = np.where(token, np.maximum(headers.ranks[units] - 1, 0), 0)
    width = int(ranks.max(initial=0))
    table = np.zeros((len(units), 5 + width), dtype=np.uint64)
    table[:, 0] = canonical[columns.unit_fields[units]] if len(names) else 0
    table[:, 1] = kinds
    table[:, 2] = headers.dtypes[units]
    table[:, 3] = columns.unit_coverages[units]
    table[:, 4] = ranks
    starts = headers.shape_offsets[units]
    for axis in range(width):
        present = ranks > axis
        table[present, 5 + axis] = headers.shape[starts[present] + 1 + axis]
    return table


def check_schema(
    columns: TrajectoryColumns, schema: JobSchema | None, label_fields: Collection[str]
) -> JobSchema | None:
    """Check a report (valid by ingest's rules) against the job's schema; without one yet, the report's first
    accepted trajectory fixes it. Returns the schema the report was checked against (None: nothing to check)."""
    for name in set(columns.scalar_names):
        problem = scalar_name_problem(name)
        if problem is not None:
            offsets = columns.scalar_offsets.tolist()
            index = columns.scalar_names.index(name)
            row = int(np.searchsorted(offsets, index, side="right")) - 1
            raise InvalidArgument(problem, field=f"trajectories[{row}].scalars")
    accepted = np.flatnonzero(columns.accepted)
    if not len(accepted):
        return schema
    if schema is None:
        schema = schema_of(columns, int(accepted[0]), label_fields)
    offsets = columns.unit_offsets
    counts = np.diff(offsets)[accepted]
    wrong_count = accepted[counts != len(schema.fields)]
    units = np.flatnonzero(np.repeat(columns.accepted, np.diff(offsets)))
    table = _signature_table(columns, units)
    width = len(schema.fields)
    signatures = None
    if not len(wrong_count) and width and len(units):
        # Reports usually carry the same fields in the same order for every trajectory: then one trajectory's
        # units are every signature there is (checked as they are: sorting out repeats costs more than they do).
        per_trajectory = table.reshape(len(accepted), -1)
        if (per_trajectory == per_trajectory[0]).all():
            signatures = zip(table[:width].tolist(), range(width), strict=True)
    if signatures is None:
        unique, first = np.unique(table, axis=0, return_index=True)
        signatures = zip(unique.tolist(), first.tolist(), strict=True)
    bad_units = []
    for signature, position in signatures:
        unit = int(units[position])
        expected = schema.fields.get(columns.field_names[signature[0]])
        if expected is None or expected != _unit_schema(columns, unit):
            bad_units.append(unit)
    # Name the first trajectory that breaks a rule, and its first offending unit.
    rows = columns.unit_rows
    first_bad_row = min([int(rows[u]) for u in bad_units] + wrong_count[:1].tolist(), default=None)
    if first_bad_row is None:
        check_values(columns, accepted, schema.scalars, schema.metadata, declared=schema.declared)
        return schema
    for unit in range(int(offsets[first_bad_row]), int(offsets[first_bad_row + 1])):
        name = columns.field_names[int(columns.unit_fields[unit])]
        expected = schema.fields.get(name)
        where = _unit_field(columns, first_bad_row, unit)
        if expected is None and name in schema.attached_by:
            raise InvalidArgument(f"field {name!r} is attached by role {schema.attached_by[name]!r} (AttachFields); "
                                  "reports must not carry it", field=f"{where}.field_name")
        if expected is None:
            raise InvalidArgument(
                f"field {name!r} is not among the job's fields ({schema.describe()}); {schema.origin}",
                field=f"{where}.field_name")
        found = _unit_schema(columns, unit)
        if found != expected:
            sub = "kind" if found.kind != expected.kind else "header.dtype" if found.dtype != expected.dtype \
                else "coverage" if found.coverage != expected.coverage else "header.shape"
            raise InvalidArgument(
                f"field {name!r} is {found.describe()}, the job's is {expected.describe()} ({schema.origin})",
                field=f"{where}.{sub}")
    present = {columns.field_names[int(columns.unit_fields[u])]
               for u in range(int(offsets[first_bad_row]), int(offsets[first_bad_row + 1]))}
    raise InvalidArgument(
        f"lacks fields {sorted(set(schema.fields) - present)}: every accepted trajectory of the job stores "
        f"{sorted(schema.fields)} ({schema.origin})", field=f"trajectories[{first_bad_row}].units")
