"""Domain objects straight from the columnar form (``TrajectoryBatch``), without a message per trajectory.

A DP rank's assignment carries its trajectories as one batch (``RankAssignment.trajectories``): the admission
service cuts it from the columns it keeps anyway, where building one ``TrajectoryMetadata`` per trajectory was the
largest cost of dispatching a large mini-batch. :func:`metas_from_batch` gives back exactly what
:func:`knittrans.wire.trajectory_from_proto` gives for each trajectory's message, and validates alike: a column
of the wrong length names ``<path>.<column>``, an invalid trajectory ``<path>[i].<field>``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import accumulate
from typing import Any, TypeVar

from knittrans.errors import InvalidArgument, within
from knittrans.types import MultimodalRef, TokenSpan, TrajectoryMeta, UnitHeader, UnitKey, UnitRef, VersionSegment
from knittrans.v1 import trajectory_pb2
from knittrans.values import NO_VALUES
from knittrans.wire.enums import ALIGNMENT_FROM_PROTO, COVERAGE_FROM_PROTO, DTYPE_FROM_PROTO, UNIT_KIND_FROM_PROTO
from knittrans.wire.trajectory import TRAJECTORY_COLUMNS
from knittrans.wire.values import values_from_proto

T = TypeVar("T")


def _offsets(counts: Sequence[int]) -> list[int]:
    return [0, *accumulate(counts)]


def _check_length(path: str, name: str, values: Sequence[Any], expected: int, *, sparse: bool = False) -> None:
    if sparse and not len(values):
        return
    if len(values) != expected:
        raise InvalidArgument(f"has {len(values)} values, expected {expected}", field=f"{path}.{name}")


def _lookup(table: Mapping[int, T], number: int, what: str) -> T:
    if number not in table:
        raise InvalidArgument(f"unknown or unspecified {what} {number}")
    return table[number]


def _headers(message: trajectory_pb2.UnitHeaderColumns, count: int, path: str, first: int,
             stop: int) -> list[UnitHeader]:
    """Headers ``first:stop`` of the ``count`` in ``message`` (every column's length is checked whole). Only the
    asked ones are built: a sidecar decodes its rank's batch one micro-batch at a time, and building every header
    of the batch for each made decoding grow with the whole batch (17 times the headers at 17 micro-batches)."""
    for name in ("dtypes", "ranks", "has_seq_axis", "seq_axes", "byte_lengths", "content_hashes", "chunk_tokens"):
        _check_length(path, name, getattr(message, name), count)
    shape_offsets = _offsets(message.ranks)
    _check_length(path, "shape", message.shape, shape_offsets[-1])
    shape, dtypes, has_axis, axes = message.shape, message.dtypes, message.has_seq_axis, message.seq_axes
    byte_lengths, hashes, chunks = message.byte_lengths, message.content_hashes, message.chunk_tokens
    return [within(f"{path}[{k}]", lambda k=k: UnitHeader(  # type: ignore[misc]
        dtype=_lookup(DTYPE_FROM_PROTO, dtypes[k], "dtype"),
        shape=tuple(shape[shape_offsets[k]:shape_offsets[k + 1]]),
        byte_length=byte_lengths[k], content_hash=hashes[k], seq_axis=axes[k] if has_axis[k] else None,
        chunk_tokens=chunks[k])) for k in range(first, stop)]


def metas_from_batch(batch: trajectory_pb2.TrajectoryBatch, path: str = "trajectories", start: int = 0,
                     stop: int | None = None) -> tuple[TrajectoryMeta, ...]:
    """Trajectories ``start:stop`` of ``batch`` (all by default), in order, each as ``trajectory_from_proto`` makes
    it of the trajectory's message. Every column is checked whole."""
    n = len(batch.trajectory_ids)
    stop = n if stop is None else stop
    plain = []
    for spec in TRAJECTORY_COLUMNS:
        column = getattr(batch, spec.column)
        _check_length(path, spec.column, column, n, sparse=spec.sparse)
        plain.append(list(column) if len(column) else [0] * n)
    for name in ("segment_counts", "unit_counts", "multimodal_counts", "scalar_counts"):
        _check_length(path, name, getattr(batch, name), n)
    _check_length(path, "values", batch.values, n, sparse=True)
    segments, units, refs, scalars = (_offsets(getattr(batch, name)) for name in (
        "segment_counts", "unit_counts", "multimodal_counts", "scalar_counts"))
    for name in ("segment_versions", "segment_tokens"):
        _check_length(path, name, getattr(batch, name), segments[-1])
    for name in ("unit_keys", "unit_fields", "unit_kinds"):
        _check_length(path, name, getattr(batch, name), units[-1])
    for name in ("unit_alignments", "unit_coverages"):
        _check_length(path, name, getattr(batch, name), units[-1], sparse=True)
    for name in ("multimodal_keys", "multimodal_encoders", "multimodal_costs", "placeholder_starts",
                 "placeholder_ends", "multimodal_kinds", "multimodal_has_header"):
        _check_length(path, name, getattr(batch, name), refs[-1])
    for name in ("scalar_names", "scalar_values"):
        _check_length(path, name, getattr(batch, name), scalars[-1])
    first_unit = units[start]
    unit_headers = _headers(batch.unit_headers, units[-1], f"{path}.unit_headers", first_unit, units[stop])
    has_header = list(batch.multimodal_has_header)
    header_rows = _offsets(has_header)  # reference k's header, if any, is header_rows[k]
    first_header = header_rows[refs[start]]
    ref_headers = _headers(batch.multimodal_headers, header_rows[-1], f"{path}.multimodal_headers", first_header,
                           header_rows[refs[stop]])
    field_names, encoders = list(batch.field_names), list(batch.encoders)
    versions, lengths = list(batch.segment_versions), list(batch.segment_tokens)
    unit_keys, unit_fields, unit_kinds = list(batch.unit_keys), list(batch.unit_fields), list(batch.unit_kinds)
    alignments: list[int] = list(batch.unit_alignments) or [0] * units[-1]
    coverages: list[int] = list(batch.unit_coverages) or [0] * units[-1]
    ref_keys, ref_encoders, costs = list(batch.multimodal_keys), list(batch.multimodal_encoders), list(
        batch.multimodal_costs)
    starts, ends, ref_kinds = list(batch.placeholder_starts), list(batch.placeholder_ends), list(batch.multimodal_kinds)
    scalar_names, scalar_values = list(batch.scalar_names), list(batch.scalar_values)
    values = batch.values

    def name_of(table: list[str], index: int, what: str) -> str:
        if not 0 <= index < len(table):
            raise InvalidArgument(f"index {index} is outside the batch's {len(table)} {what}")
        return table[index]

    def trajectory(i: int) -> TrajectoryMeta:
        fields: dict[str, Any] = {spec.field: column[i] for spec, column in zip(TRAJECTORY_COLUMNS, plain, strict=True)}
        own_values = values[i] if len(values) else None
        converted = NO_VALUES
        if own_values is not None and (own_values.int_scalars or own_values.bool_scalars or own_values.metadata):
            carried = own_values
            converted = within("values", lambda: values_from_proto(carried))
        return TrajectoryMeta(
            **fields,
            segments=tuple(VersionSegment(version=versions[k], num_tokens=lengths[k])
                           for k in range(segments[i], segments[i + 1])),
            units=tuple(
                within(f"units[{k - units[i]}]", lambda k=k: UnitRef(  # type: ignore[misc]
                    key=UnitKey(unit_keys[k]), field_name=name_of(field_names, unit_fields[k], "field names"),
                    kind=_lookup(UNIT_KIND_FROM_PROTO, unit_kinds[k], "unit kind"), header=unit_headers[k - first_unit],
                    alignment=_lookup(ALIGNMENT_FROM_PROTO, alignments[k], "field alignment"),
                    coverage=_lookup(COVERAGE_FROM_PROTO, coverages[k], "token coverage")))
                for k in range(units[i], units[i + 1])
            ),
            multimodal=tuple(
                within(f"multimodal[{k - refs[i]}]", lambda k=k: MultimodalRef(  # type: ignore[misc]
                    key=UnitKey(ref_keys[k]), encoder=name_of(encoders, ref_encoders[k], "encoders"), cost=costs[k],
                    placeholder=TokenSpan(start=starts[k], end=ends[k]),
                    kind=_lookup(UNIT_KIND_FROM_PROTO, ref_kinds[k], "unit kind"),
                    header=ref_headers[header_rows[k] - first_header] if has_header[k] else None))
                for k in range(refs[i], refs[i + 1])
            ),
            scalars=tuple(sorted(zip(scalar_names[scalars[i]:scalars[i + 1]],
                                     scalar_values[scalars[i]:scalars[i + 1]], strict=True))),
            values=converted,
        )

    return tuple(within(f"{path}[{i}]", lambda i=i: trajectory(i)) for i in range(start, stop))  # type: ignore[misc]
