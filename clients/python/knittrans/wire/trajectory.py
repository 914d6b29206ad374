"""Translation between trajectory messages and the typed domain objects of :mod:`knittrans.types`.

Every ``*_from_proto`` function validates by building the domain object; an
:class:`~knittrans.errors.InvalidArgument` raised inside is re-raised with the full field path of the
message (``trajectories[3].units[1].header.byte_length``), so callers can name the field.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Literal, TypeVar

from knittrans.errors import InvalidArgument, within
from knittrans.types import (
    Coverage,
    FieldAlignment,
    MultimodalRef,
    TokenSpan,
    TrajectoryMeta,
    UnitHeader,
    UnitKey,
    UnitKind,
    UnitRef,
    VersionSegment,
)
from knittrans.v1 import trajectory_pb2
from knittrans.wire.enums import (
    ALIGNMENT_FROM_PROTO,
    ALIGNMENT_TO_PROTO,
    COVERAGE_FROM_PROTO,
    COVERAGE_TO_PROTO,
    DTYPE_FROM_PROTO,
    DTYPE_TO_PROTO,
    UNIT_KIND_FROM_PROTO,
    UNIT_KIND_TO_PROTO,
)
from knittrans.wire.values import trajectory_values, trusted_values, values_to_proto

T = TypeVar("T")
M = TypeVar("M")


@dataclass(frozen=True)
class TrajectoryColumn:
    """A per-trajectory field with one plain value: its name on ``TrajectoryMetadata`` and
    :class:`~knittrans.types.TrajectoryMeta` (the same), its ``TrajectoryBatch`` column, and its element type
    (``str`` columns stay Python strings; the others become numpy arrays of that dtype)."""

    field: str
    column: str
    dtype: Literal["str", "uint64", "bool", "float64"]
    sparse: bool = False  # the TrajectoryBatch column is left empty when every value is 0 (and read so)


# The plain per-trajectory fields, listed once: the codecs below, the columnar form (knittrans.wire.columns) and
# the admission service's reader of it follow this table, so a new field of this sort is one entry here (plus the
# .proto and knittrans.types).
TRAJECTORY_COLUMNS: tuple[TrajectoryColumn, ...] = (
    TrajectoryColumn("trajectory_id", "trajectory_ids", "str"),
    TrajectoryColumn("sample_id", "sample_ids", "str"),
    TrajectoryColumn("source", "sources", "str"),
    TrajectoryColumn("rollout_step", "rollout_steps", "uint64"),
    TrajectoryColumn("num_tokens", "num_tokens", "uint64"),
    TrajectoryColumn("num_loss_tokens", "num_loss_tokens", "uint64"),
    TrajectoryColumn("accepted", "accepted", "bool"),
    TrajectoryColumn("finished_at", "finished_at", "float64"),
    TrajectoryColumn("response_start", "response_starts", "uint64", sparse=True),
)
TRAJECTORY_FIELDS: tuple[str, ...] = tuple(spec.field for spec in TRAJECTORY_COLUMNS)
read_plain_fields = attrgetter(*TRAJECTORY_FIELDS)


def plain_fields(trajectory: Any) -> dict[str, Any]:
    """The :data:`TRAJECTORY_COLUMNS` fields of a message or a domain object (they read alike), by field name."""
    return dict(zip(TRAJECTORY_FIELDS, read_plain_fields(trajectory), strict=True))


def _each(name: str, messages: Sequence[M], convert: Callable[[M], T]) -> tuple[T, ...]:
    """``convert`` of every element, naming ``name[i]`` in an error (formatted only then: this is hot)."""
    converted: list[T] = []
    try:
        for message in messages:
            converted.append(convert(message))
    except InvalidArgument as exc:
        path = f"{name}[{len(converted)}]"  # the element that failed
        raise InvalidArgument(exc.message, field=f"{path}.{exc.field}" if exc.field else path) from exc
    return tuple(converted)


def header_to_proto(header: UnitHeader) -> trajectory_pb2.UnitHeader:
    message = trajectory_pb2.UnitHeader(
        dtype=DTYPE_TO_PROTO[header.dtype],
        shape=header.shape,
        byte_length=header.byte_length,
        content_hash=header.content_hash,
        chunk_tokens=header.chunk_tokens,
    )
    if header.seq_axis is not None:
        message.seq_axis = header.seq_axis
    return message


def _header_fields(message: trajectory_pb2.UnitHeader) -> dict[str, Any]:
    """A header message's fields as :class:`UnitHeader` takes them (its dtype must be a known one)."""
    return {
        "dtype": DTYPE_FROM_PROTO[message.dtype],
        "shape": tuple(message.shape),
        "byte_length": message.byte_length,
        "content_hash": message.content_hash,
        "seq_axis": message.seq_axis if message.HasField("seq_axis") else None,
        "chunk_tokens": message.chunk_tokens,
    }


def header_from_proto(message: trajectory_pb2.UnitHeader) -> UnitHeader:
    if message.dtype not in DTYPE_FROM_PROTO:
        raise InvalidArgument("unknown or unspecified dtype", field="dtype")
    return UnitHeader(**_header_fields(message))


def _kind_from_proto(number: int) -> UnitKind:
    if number not in UNIT_KIND_FROM_PROTO:
        raise InvalidArgument("unknown or unspecified unit kind", field="kind")
    return UNIT_KIND_FROM_PROTO[number]


def unit_ref_to_proto(ref: UnitRef) -> trajectory_pb2.UnitRef:
    return trajectory_pb2.UnitRef(
        key=ref.key, field_name=ref.field_name, kind=UNIT_KIND_TO_PROTO[ref.kind], header=header_to_proto(ref.header),
        alignment=ALIGNMENT_TO_PROTO[ref.alignment], coverage=COVERAGE_TO_PROTO[ref.coverage],
    )


def _alignment_from_proto(number: int) -> FieldAlignment | None:
    if number not in ALIGNMENT_FROM_PROTO:
        raise InvalidArgument(f"unknown field alignment {number}", field="alignment")
    return ALIGNMENT_FROM_PROTO[number]


def _coverage_from_proto(number: int) -> Coverage:
    if number not in COVERAGE_FROM_PROTO:
        raise InvalidArgument(f"unknown token coverage {number}", field="coverage")
    return COVERAGE_FROM_PROTO[number]


def unit_ref_from_proto(message: trajectory_pb2.UnitRef) -> UnitRef:
    if not message.HasField("header"):
        raise InvalidArgument("is required", field="header")
    return UnitRef(
        key=UnitKey(message.key),
        field_name=message.field_name,
        kind=_kind_from_proto(message.kind),
        header=within("header", lambda: header_from_proto(message.header)),
        alignment=_alignment_from_proto(message.alignment),
        coverage=_coverage_from_proto(message.coverage),
    )


def multimodal_to_proto(ref: MultimodalRef) -> trajectory_pb2.MultimodalRef:
    message = trajectory_pb2.MultimodalRef(
        key=ref.key,
        encoder=ref.encoder,
        cost=ref.cost,
        placeholder=trajectory_pb2.TokenSpan(start=ref.placeholder.start, end=ref.placeholder.end),
        kind=UNIT_KIND_TO_PROTO[ref.kind],
    )
    if ref.header is not None:
        message.header.CopyFrom(header_to_proto(ref.header))
    return message


def multimodal_from_proto(message: trajectory_pb2.MultimodalRef) -> MultimodalRef:
    return MultimodalRef(
        key=UnitKey(message.key),
        encoder=message.encoder,
        cost=message.cost,
        placeholder=within(
            "placeholder", lambda: TokenSpan(start=message.placeholder.start, end=message.placeholder.end)
        ),
        kind=_kind_from_proto(message.kind),
        header=within("header", lambda: header_from_proto(message.header)) if message.HasField("header") else None,
    )


def _segment_from_proto(message: trajectory_pb2.VersionSegment) -> VersionSegment:
    return VersionSegment(version=message.version, num_tokens=message.num_tokens)


def trajectory_to_proto(meta: TrajectoryMeta) -> trajectory_pb2.TrajectoryMetadata:
    message = trajectory_pb2.TrajectoryMetadata(
        **plain_fields(meta),
        segments=[trajectory_pb2.VersionSegment(version=s.version, num_tokens=s.num_tokens) for s in meta.segments],
        units=[unit_ref_to_proto(u) for u in meta.units],
        multimodal=[multimodal_to_proto(m) for m in meta.multimodal],
        scalars=dict(meta.scalars),
    )
    if meta.values:  # left unset when empty, so that both forms of a report serialise alike
        message.values.CopyFrom(values_to_proto(meta.values))
    return message


def trajectory_from_proto(message: trajectory_pb2.TrajectoryMetadata) -> TrajectoryMeta:
    return TrajectoryMeta(
        **plain_fields(message),
        segments=_each("segments", message.segments, _segment_from_proto),
        units=_each("units", message.units, unit_ref_from_proto),
        multimodal=_each("multimodal", message.multimodal, multimodal_from_proto),
        scalars=tuple(sorted(message.scalars.items())),
        values=trajectory_values(message),
    )


def _trusted(cls: type[T], **fields: object) -> T:
    """Build a frozen dataclass without running its validation: only for values already validated."""
    instance = object.__new__(cls)
    instance.__dict__.update(fields)
    return instance


def _trusted_header(message: trajectory_pb2.UnitHeader) -> UnitHeader:
    return _trusted(UnitHeader, **_header_fields(message))


def trusted_trajectory_from_proto(message: trajectory_pb2.TrajectoryMetadata) -> TrajectoryMeta:
    """:func:`trajectory_from_proto` without re-validation, for reports the service's ingest check accepted.

    It builds equal objects several times faster, which keeps planning off the report-to-assignment path.
    """
    units = tuple(
        _trusted(UnitRef, key=u.key, field_name=u.field_name, kind=UNIT_KIND_FROM_PROTO[u.kind],
                 header=_trusted_header(u.header), alignment=ALIGNMENT_FROM_PROTO[u.alignment],
                 coverage=COVERAGE_FROM_PROTO[u.coverage])
        for u in message.units
    )
    multimodal = tuple(
        _trusted(
            MultimodalRef, key=m.key, encoder=m.encoder, cost=m.cost,
            placeholder=_trusted(TokenSpan, start=m.placeholder.start, end=m.placeholder.end),
            kind=UNIT_KIND_FROM_PROTO[m.kind], header=_trusted_header(m.header) if m.HasField("header") else None,
        )
        for m in message.multimodal
    )
    return _trusted(
        TrajectoryMeta,
        **plain_fields(message),
        segments=tuple(_trusted(VersionSegment, version=s.version, num_tokens=s.num_tokens) for s in message.segments),
        units=units,
        multimodal=multimodal,
        scalars=tuple(sorted((str(k), float(v)) for k, v in message.scalars.items())),
        values=trusted_values(message),
    )
