"""The job's rules for a trajectory's scalars and metadata, checked at ingest (DESIGN.md §10).

The packer gives every scalar name one tensor dtype (float64, int64 or bool) and the trainer gets metadata by
name, so a name keeps one kind in a job. A declared schema (:class:`knittrans.trajectory_schema.TrajectorySchema`)
lists every scalar and metadata name, its kind, whether it is required and, for metadata, its size bound; an
undeclared name is refused. Without one, the job's first accepted trajectory fixes the names and kinds it has,
all optional, and a later trajectory may still bring a float scalar of a new name (the rule before typed values
existed). Values are checked one trajectory at a time, but only trajectories that have typed values, or all of
them when a column rule could fail: the common report (float scalars of known names) costs a set lookup per name.
Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from knittrans.admission.service.trajectory_columns import TrajectoryColumns
from knittrans.errors import InvalidArgument
from knittrans.trajectory_schema import MetadataSchema, ScalarSchema
from knittrans.values import MAX_METADATA_BYTES, MetadataKind, ScalarKind
from knittrans.wire.values import METADATA_KIND_OF_MEMBER

ScalarRules = Mapping[str, ScalarSchema]
MetadataRules = Mapping[str, MetadataSchema]


def describe_scalars(rules: ScalarRules) -> str:
    return ", ".join(f"{name}: {rule.kind}" for name, rule in sorted(rules.items())) or "none"


def describe_metadata(rules: MetadataRules) -> str:
    return ", ".join(f"{name}: {rule.kind}" for name, rule in sorted(rules.items())) or "none"


def derived_value_rules(columns: TrajectoryColumns, row: int) -> tuple[dict[str, ScalarSchema],
                                                                       dict[str, MetadataSchema]]:
    """The scalar and metadata rules trajectory ``row`` fixes: its names and kinds, all optional."""
    offsets = columns.scalar_offsets
    scalars = {name: ScalarSchema(kind=ScalarKind.FLOAT, required=False)
               for name in columns.scalar_names[int(offsets[row]) : int(offsets[row + 1])]}
    metadata: dict[str, MetadataSchema] = {}
    values = columns.values_of(row)
    if values is not None:
        for name in values.int_scalars:
            scalars[name] = ScalarSchema(kind=ScalarKind.INT, required=False)
        for name in values.bool_scalars:
            scalars[name] = ScalarSchema(kind=ScalarKind.BOOL, required=False)
        for name, value in values.metadata.items():
            metadata[name] = MetadataSchema(kind=METADATA_KIND_OF_MEMBER[value.WhichOneof("value")],
                                            max_bytes=MAX_METADATA_BYTES, required=False)
    return scalars, metadata


def check_values(columns: TrajectoryColumns, accepted: np.ndarray, scalars: ScalarRules, metadata: MetadataRules,
                 *, declared: bool) -> None:
    """Check the scalars and metadata of the ``accepted`` trajectories against the rules; raise
    :class:`InvalidArgument` naming the first offending trajectory's field."""
    origin = "declared in the job's schema" if declared else "fixed by the job's first trajectory"
    names = columns.scalar_names

    def float_name_ok(name: str) -> bool:
        rule = scalars.get(name)
        return not declared if rule is None else rule.kind is ScalarKind.FLOAT

    known_floats = all(map(float_name_ok, set(names)))
    required_floats = [name for name, rule in scalars.items() if rule.required and rule.kind is ScalarKind.FLOAT]
    floats_present = True
    if required_floats and len(accepted):
        offsets = columns.scalar_offsets
        hits = np.isin(np.array(names, dtype=object), required_floats).astype(np.int64) if names else np.zeros(0)
        counts = np.zeros(len(columns), dtype=np.int64)
        rows = np.flatnonzero(np.diff(offsets))
        if len(rows):
            counts[rows] = np.add.reduceat(hits, offsets[rows])
        floats_present = bool((counts[accepted] == len(required_floats)).all())
    others_required = any(rule.required for rule in metadata.values()) or any(
        rule.required and rule.kind is not ScalarKind.FLOAT for rule in scalars.values())
    if known_floats and floats_present and not others_required:
        candidates = [i for i in accepted.tolist() if columns.values_of(i) is not None]
    else:
        candidates = accepted.tolist()
    for i in candidates:
        _check_row(columns, i, scalars, metadata, declared=declared, origin=origin)


def _check_row(columns: TrajectoryColumns, i: int, scalars: ScalarRules, metadata: MetadataRules, *,
               declared: bool, origin: str) -> None:
    where = f"trajectories[{i}]"
    offsets = columns.scalar_offsets
    present: dict[str, tuple[ScalarKind, str]] = {
        name: (ScalarKind.FLOAT, f"{where}.scalars.{name}")
        for name in columns.scalar_names[int(offsets[i]) : int(offsets[i + 1])]}
    values = columns.values_of(i)
    if values is not None:
        for name in sorted(values.int_scalars):
            present[name] = (ScalarKind.INT, f"{where}.values.int_scalars.{name}")
        for name in sorted(values.bool_scalars):
            present[name] = (ScalarKind.BOOL, f"{where}.values.bool_scalars.{name}")
    for name, (kind, field) in present.items():
        rule = scalars.get(name)
        if rule is None:
            if kind is ScalarKind.FLOAT and not declared:
                continue
            raise InvalidArgument(f"scalar {name!r} is not among the job's scalars ({describe_scalars(scalars)}; "
                                  f"{origin})", field=field)
        if rule.kind is not kind:
            raise InvalidArgument(f"scalar {name!r} is {kind}, the job's is {rule.kind} ({origin})", field=field)
    for name, rule in sorted(scalars.items()):
        if rule.required and name not in present:
            column = "scalars" if rule.kind is ScalarKind.FLOAT else f"values.{rule.kind}_scalars"
            raise InvalidArgument(f"lacks the required {rule.kind} scalar {name!r} ({origin})",
                                  field=f"{where}.{column}")
    reported = values.metadata if values is not None else {}
    for name in sorted(reported):
        field = f"{where}.values.metadata.{name}"
        meta_rule = metadata.get(name)
        if meta_rule is None:
            raise InvalidArgument(f"metadata {name!r} is not among the job's metadata "
                                  f"({describe_metadata(metadata)}; {origin})", field=field)
        value = reported[name]
        member = value.WhichOneof("value")
        kind = METADATA_KIND_OF_MEMBER[member] if member is not None else None
        if kind is not meta_rule.kind:
            raise InvalidArgument(f"metadata {name!r} is {kind or 'unset'}, the job's is {meta_rule.kind} ({origin})",
                                  field=field)
        raw = getattr(value, member)
        size = len(raw) if kind is MetadataKind.BYTES else len(raw.encode("utf-8"))
        if size > meta_rule.max_bytes:
            raise InvalidArgument(f"has {size} bytes, more than the job's bound of {meta_rule.max_bytes} ({origin}); "
                                  "store large values as a unit", field=field)
    for name, meta_rule in sorted(metadata.items()):
        if meta_rule.required and name not in reported:
            raise InvalidArgument(f"lacks the required {meta_rule.kind} metadata {name!r} ({origin})",
                                  field=f"{where}.values.metadata")
