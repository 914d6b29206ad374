"""Translation between protobuf messages and the typed domain objects of :mod:`knittrans.types`.

Every ``*_from_proto`` function validates by building the domain object; an
:class:`~knittrans.errors.InvalidArgument` raised inside is re-raised with the full field path of the
message (``trajectories[3].units[1].header.byte_length``), so callers can name the field.
"""

from __future__ import annotations

from functools import partial
from typing import TypeVar, cast

from knittrans.errors import InvalidArgument, within
from knittrans.types import (
    BackboneTopology,
    ConsumerId,
    CostModel,
    DType,
    EncoderTopology,
    FieldAlignment,
    MultimodalRef,
    SampleId,
    SourceName,
    TokenSpan,
    Topology,
    TrajectoryId,
    TrajectoryMeta,
    UnitHeader,
    UnitKey,
    UnitKind,
    UnitRef,
    VersionSegment,
)
from knittrans.v1 import topology_pb2, trajectory_pb2

T = TypeVar("T")

# The casts: protoc's .pyi types enum fields as the enum class, while EnumTypeWrapper.Value returns a plain int.
_DTYPE_TO_PROTO = cast(
    "dict[DType, trajectory_pb2.DType]",
    {dtype: trajectory_pb2.DType.Value(f"D_TYPE_{dtype.name}") for dtype in DType},
)
_DTYPE_FROM_PROTO: dict[int, DType] = {number: dtype for dtype, number in _DTYPE_TO_PROTO.items()}
_KIND_TO_PROTO = cast(
    "dict[UnitKind, trajectory_pb2.UnitKind]",
    {kind: trajectory_pb2.UnitKind.Value(f"UNIT_KIND_{kind.name}") for kind in UnitKind},
)
_KIND_FROM_PROTO: dict[int, UnitKind] = {number: kind for kind, number in _KIND_TO_PROTO.items()}
ALIGNMENT_TO_PROTO = cast(
    "dict[FieldAlignment | None, trajectory_pb2.FieldAlignment]",
    {
        None: trajectory_pb2.FIELD_ALIGNMENT_UNSPECIFIED,
        **{a: trajectory_pb2.FieldAlignment.Value(f"FIELD_ALIGNMENT_{a.name}") for a in FieldAlignment},
    },
)
ALIGNMENT_FROM_PROTO: dict[int, FieldAlignment | None] = {
    number: alignment for alignment, number in ALIGNMENT_TO_PROTO.items()
}


def header_to_proto(header: UnitHeader) -> trajectory_pb2.UnitHeader:
    message = trajectory_pb2.UnitHeader(
        dtype=_DTYPE_TO_PROTO[header.dtype],
        shape=header.shape,
        byte_length=header.byte_length,
        content_hash=header.content_hash,
        chunk_tokens=header.chunk_tokens,
    )
    if header.seq_axis is not None:
        message.seq_axis = header.seq_axis
    return message


def header_from_proto(message: trajectory_pb2.UnitHeader) -> UnitHeader:
    if message.dtype not in _DTYPE_FROM_PROTO:
        raise InvalidArgument("unknown or unspecified dtype", field="dtype")
    return UnitHeader(
        dtype=_DTYPE_FROM_PROTO[message.dtype],
        shape=tuple(message.shape),
        byte_length=message.byte_length,
        content_hash=message.content_hash,
        seq_axis=message.seq_axis if message.HasField("seq_axis") else None,
        chunk_tokens=message.chunk_tokens,
    )


def _kind_from_proto(number: int) -> UnitKind:
    if number not in _KIND_FROM_PROTO:
        raise InvalidArgument("unknown or unspecified unit kind", field="kind")
    return _KIND_FROM_PROTO[number]


def unit_ref_to_proto(ref: UnitRef) -> trajectory_pb2.UnitRef:
    return trajectory_pb2.UnitRef(
        key=ref.key, field_name=ref.field_name, kind=_KIND_TO_PROTO[ref.kind], header=header_to_proto(ref.header),
        alignment=ALIGNMENT_TO_PROTO[ref.alignment],
    )


def _alignment_from_proto(number: int) -> FieldAlignment | None:
    if number not in ALIGNMENT_FROM_PROTO:
        raise InvalidArgument(f"unknown field alignment {number}", field="alignment")
    return ALIGNMENT_FROM_PROTO[number]


def unit_ref_from_proto(message: trajectory_pb2.UnitRef) -> UnitRef:
    if not message.HasField("header"):
        raise InvalidArgument("is required", field="header")
    return UnitRef(
        key=UnitKey(message.key),
        field_name=message.field_name,
        kind=_kind_from_proto(message.kind),
        header=within("header", lambda: header_from_proto(message.header)),
        alignment=_alignment_from_proto(message.alignment),
    )


def multimodal_to_proto(ref: MultimodalRef) -> trajectory_pb2.MultimodalRef:
    message = trajectory_pb2.MultimodalRef(
        key=ref.key,
        encoder=ref.encoder,
        cost=ref.cost,
        placeholder=trajectory_pb2.TokenSpan(start=ref.placeholder.start, end=ref.placeholder.end),
        kind=_KIND_TO_PROTO[ref.kind],
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


def trajectory_to_proto(meta: TrajectoryMeta) -> trajectory_pb2.TrajectoryMetadata:
    return trajectory_pb2.TrajectoryMetadata(
        trajectory_id=meta.trajectory_id,
        sample_id=meta.sample_id,
        source=meta.source,
        rollout_step=meta.rollout_step,
        num_tokens=meta.num_tokens,
        num_loss_tokens=meta.num_loss_tokens,
        segments=[trajectory_pb2.VersionSegment(version=s.version, num_tokens=s.num_tokens) for s in meta.segments],
        units=[unit_ref_to_proto(u) for u in meta.units],
        multimodal=[multimodal_to_proto(m) for m in meta.multimodal],
        accepted=meta.accepted,
        scalars=dict(meta.scalars),
        finished_at=meta.finished_at,
    )


def trajectory_from_proto(message: trajectory_pb2.TrajectoryMetadata) -> TrajectoryMeta:
    segments = tuple(
        within(f"segments[{i}]", partial(VersionSegment, version=s.version, num_tokens=s.num_tokens))
        for i, s in enumerate(message.segments)
    )
    units = tuple(within(f"units[{i}]", partial(unit_ref_from_proto, u)) for i, u in enumerate(message.units))
    multimodal = tuple(
        within(f"multimodal[{i}]", partial(multimodal_from_proto, m)) for i, m in enumerate(message.multimodal)
    )
    return TrajectoryMeta(
        trajectory_id=TrajectoryId(message.trajectory_id),
        sample_id=SampleId(message.sample_id),
        source=SourceName(message.source),
        rollout_step=message.rollout_step,
        num_tokens=message.num_tokens,
        num_loss_tokens=message.num_loss_tokens,
        segments=segments,
        units=units,
        multimodal=multimodal,
        accepted=message.accepted,
        scalars=tuple(sorted(message.scalars.items())),
        finished_at=message.finished_at,
    )


def topology_to_proto(topology: Topology) -> topology_pb2.Topology:
    backbone = topology.backbone
    return topology_pb2.Topology(
        backbone=topology_pb2.BackboneTopology(
            dp=backbone.dp,
            cp=backbone.cp,
            tp=backbone.tp,
            max_tokens_per_microbatch=backbone.max_tokens_per_microbatch,
            cost=topology_pb2.CostModel(linear=backbone.cost.linear, quadratic=backbone.cost.quadratic),
            microbatch_multiple=backbone.microbatch_multiple,
            sequence_parallel=backbone.sequence_parallel,
            pad_multiple=backbone.pad_multiple,
        ),
        encoders=[
            topology_pb2.EncoderTopology(
                name=e.name, dp=e.dp, tp=e.tp, max_cost_per_microbatch=e.max_cost_per_microbatch
            )
            for e in topology.encoders
        ],
    )


def topology_from_proto(message: topology_pb2.Topology) -> Topology:
    """Zero-valued optional knobs (cp, tp, microbatch_multiple, an empty cost model) mean "the default"."""
    b = message.backbone
    cost = CostModel() if not b.HasField("cost") or (b.cost.linear == 0 and b.cost.quadratic == 0) else None
    backbone = within(
        "backbone",
        lambda: BackboneTopology(
            dp=b.dp,
            cp=b.cp or 1,
            tp=b.tp or 1,
            max_tokens_per_microbatch=b.max_tokens_per_microbatch,
            cost=cost or within("cost", lambda: CostModel(linear=b.cost.linear, quadratic=b.cost.quadratic)),
            microbatch_multiple=b.microbatch_multiple or 1,
            sequence_parallel=b.sequence_parallel,
            pad_multiple=b.pad_multiple,
        ),
    )
    encoders = tuple(
        within(
            f"encoders[{i}]",
            partial(
                EncoderTopology, name=e.name, dp=e.dp, tp=e.tp or 1, max_cost_per_microbatch=e.max_cost_per_microbatch
            ),
        )
        for i, e in enumerate(message.encoders)
    )
    return Topology(backbone=backbone, encoders=encoders)


def consumer_to_proto(consumer: ConsumerId) -> topology_pb2.ConsumerId:
    return topology_pb2.ConsumerId(role=consumer.role, dp_rank=consumer.dp_rank, cp_rank=consumer.cp_rank)


def consumer_from_proto(message: topology_pb2.ConsumerId) -> ConsumerId:
    return ConsumerId(role=message.role, dp_rank=message.dp_rank, cp_rank=message.cp_rank)


def _trusted(cls: type[T], **fields: object) -> T:
    """Build a frozen dataclass without running its validation: only for values already validated."""
    instance = object.__new__(cls)
    instance.__dict__.update(fields)
    return instance


def _trusted_header(message: trajectory_pb2.UnitHeader) -> UnitHeader:
    return _trusted(
        UnitHeader,
        dtype=_DTYPE_FROM_PROTO[message.dtype],
        shape=tuple(message.shape),
        byte_length=message.byte_length,
        content_hash=message.content_hash,
        seq_axis=message.seq_axis if message.HasField("seq_axis") else None,
        chunk_tokens=message.chunk_tokens,
    )


def trusted_trajectory_from_proto(message: trajectory_pb2.TrajectoryMetadata) -> TrajectoryMeta:
    """:func:`trajectory_from_proto` without re-validation, for reports the service's ingest check accepted.

    It builds equal objects several times faster, which keeps planning off the report-to-assignment path.
    """
    units = tuple(
        _trusted(UnitRef, key=u.key, field_name=u.field_name, kind=_KIND_FROM_PROTO[u.kind],
                 header=_trusted_header(u.header), alignment=ALIGNMENT_FROM_PROTO[u.alignment])
        for u in message.units
    )
    multimodal = tuple(
        _trusted(
            MultimodalRef, key=m.key, encoder=m.encoder, cost=m.cost,
            placeholder=_trusted(TokenSpan, start=m.placeholder.start, end=m.placeholder.end),
            kind=_KIND_FROM_PROTO[m.kind], header=_trusted_header(m.header) if m.HasField("header") else None,
        )
        for m in message.multimodal
    )
    return _trusted(
        TrajectoryMeta,
        trajectory_id=message.trajectory_id,
        sample_id=message.sample_id,
        source=message.source,
        rollout_step=message.rollout_step,
        num_tokens=message.num_tokens,
        num_loss_tokens=message.num_loss_tokens,
        segments=tuple(_trusted(VersionSegment, version=s.version, num_tokens=s.num_tokens) for s in message.segments),
        units=units,
        multimodal=multimodal,
        accepted=message.accepted,
        scalars=tuple(sorted((str(k), float(v)) for k, v in message.scalars.items())),
        finished_at=message.finished_at,
    )
