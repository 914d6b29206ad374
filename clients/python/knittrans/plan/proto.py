"""Protobuf forms of plans and consumer assignments (proto/knittrans/v1/plan.proto).

Bulk index data travels as packed repeated integers; a consumer's assignment is nested and self-contained, so
a sidecar needs nothing but it. Conversions from messages name the field of any invalid value.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from functools import partial
from typing import cast

import numpy as np

from knittrans.errors import InvalidArgument, within
from knittrans.plan.assignment import (
    ChunkSlice,
    ConsumerAssignment,
    EncoderMicroBatchAssignment,
    Encoding,
    EncodingAssignment,
    EncodingUse,
    FieldRead,
    ItemAssignment,
    MicroBatchAssignment,
    RouteEntry,
)
from knittrans.plan.parts import (
    ROUTE_COLUMNS,
    BackbonePlan,
    BalanceScheme,
    EncoderPlan,
    EncoderQuality,
    EncodingTable,
    Plan,
    PlanQuality,
    RouteMap,
)
from knittrans.types import BACKBONE_ROLE, ByteRange, ConsumerId, TokenSpan, TrajectoryId, UnitKey, UnitKind
from knittrans.v1 import plan_pb2, trajectory_pb2
from knittrans.wire import (
    consumer_from_proto,
    consumer_to_proto,
    header_from_proto,
    header_to_proto,
    topology_from_proto,
    topology_to_proto,
    trajectory_from_proto,
    trajectory_to_proto,
    unit_ref_from_proto,
    unit_ref_to_proto,
)
from knittrans.wire.enums import UNIT_KIND_FROM_PROTO, UNIT_KIND_TO_PROTO

# EncodingRoutes' columns, in RouteEntry field order.
ROUTE_FIELDS = ("dp_ranks", "cp_ranks", "tp_ranks", "microbatches", "trajectory_indices", "trajectory_ids",
                "references", "position_starts", "position_ends", "row_starts")


def plan_to_proto(plan: Plan) -> plan_pb2.Plan:
    """The protobuf form of a plan."""
    b = plan.backbone
    q = plan.quality
    return plan_pb2.Plan(
        topology=topology_to_proto(plan.topology),
        label_fields=plan.label_fields,
        trajectories=[trajectory_to_proto(t) for t in plan.trajectories],
        backbone=plan_pb2.BackbonePlan(
            microbatches_per_rank=b.microbatches_per_rank,
            microbatch_offsets=b.microbatch_offsets.tolist(),
            microbatch_items=b.microbatch_items.tolist(),
            padded_tokens=b.padded_tokens.tolist(),
            cp_spans=b.cp_spans.reshape(-1).tolist(),
            microbatch_loss_tokens=b.microbatch_loss_tokens.tolist(),
            minibatch_loss_tokens=b.minibatch_loss_tokens,
        ),
        encodings=[
            plan_pb2.Encoding(
                key=enc.key,
                encoder=enc.encoder,
                cost=enc.cost,
                source_trajectory=int(plan.encodings.source_trajectory[e]),
                source_reference=int(plan.encodings.source_reference[e]),
            )
            for e, enc in ((e, plan.encoding(e)) for e in range(len(plan.encodings)))
        ],
        reference_encodings=plan.encodings.reference_encodings.tolist(),
        encoders=[
            plan_pb2.EncoderPlan(
                name=p.name,
                microbatches_per_rank=p.microbatches_per_rank,
                microbatch_offsets=p.microbatch_offsets.tolist(),
                microbatch_encodings=p.microbatch_encodings.tolist(),
            )
            for p in plan.encoders
        ],
        route=plan_pb2.RouteMap(**{name: getattr(plan.route, name).tolist() for name in ROUTE_COLUMNS}),
        quality=plan_pb2.PlanQuality(
            imbalance=q.imbalance,
            rank_workloads=q.rank_workloads,
            lockstep_imbalance=q.lockstep_imbalance,
            microbatches_per_rank=q.microbatches_per_rank,
            padding_tokens=q.padding_tokens,
            empty_microbatches=q.empty_microbatches,
            oversize_microbatches=q.oversize_microbatches,
            references=q.references,
            unique_encodings=q.unique_encodings,
            dedup_factor=q.dedup_factor,
            encoders=[plan_pb2.EncoderQuality(**asdict(e)) for e in q.encoders],
            scheme=_scheme_to_proto(q.scheme),
        ),
    )


# --------------------------------------------------------------------------------------------------------------


def plan_from_proto(message: plan_pb2.Plan) -> Plan:
    """Convert and :meth:`~knittrans.plan.Plan.validate` a plan message."""
    plan = _plan_from_proto(message)
    plan.validate()
    return plan


def _plan_from_proto(message: plan_pb2.Plan) -> Plan:
    topology = within("topology", lambda: topology_from_proto(message.topology))
    trajectories = tuple(
        within(f"trajectories[{i}]", partial(trajectory_from_proto, t)) for i, t in enumerate(message.trajectories)
    )
    b = message.backbone
    n = len(trajectories)
    try:
        spans = np.array(b.cp_spans, dtype=np.int64).reshape(n, topology.backbone.cp, 2, 2)
    except ValueError:
        raise InvalidArgument(f"expected {n * topology.backbone.cp * 4} values", field="backbone.cp_spans") from None
    backbone = BackbonePlan(
        microbatches_per_rank=b.microbatches_per_rank,
        microbatch_offsets=np.array(b.microbatch_offsets, dtype=np.int64),
        microbatch_items=np.array(b.microbatch_items, dtype=np.int64),
        padded_tokens=np.array(b.padded_tokens, dtype=np.int64),
        cp_spans=spans,
        microbatch_loss_tokens=np.array(b.microbatch_loss_tokens, dtype=np.int64),
        minibatch_loss_tokens=b.minibatch_loss_tokens,
    )
    for i, enc in enumerate(message.encodings):
        t, j = enc.source_trajectory, enc.source_reference
        if not (t < n and j < len(trajectories[t].multimodal)):
            raise InvalidArgument(f"names an unknown reference ({t}, {j})", field=f"encodings[{i}]")
        ref = trajectories[t].multimodal[j]
        if (enc.key, enc.encoder, enc.cost) != (ref.key, ref.encoder, ref.cost):
            raise InvalidArgument("key, encoder or cost differs from its source reference", field=f"encodings[{i}]")
    table = EncodingTable(
        source_trajectory=np.array([e.source_trajectory for e in message.encodings], dtype=np.int64),
        source_reference=np.array([e.source_reference for e in message.encodings], dtype=np.int64),
        reference_encodings=np.array(message.reference_encodings, dtype=np.int64),
    )
    encoders = tuple(
        EncoderPlan(
            name=p.name,
            microbatches_per_rank=p.microbatches_per_rank,
            microbatch_offsets=np.array(p.microbatch_offsets, dtype=np.int64),
            microbatch_encodings=np.array(p.microbatch_encodings, dtype=np.int64),
        )
        for p in message.encoders
    )
    route = RouteMap(**{name: np.array(getattr(message.route, name), dtype=np.int64) for name in ROUTE_COLUMNS})
    q = message.quality
    quality = PlanQuality(
        imbalance=q.imbalance,
        rank_workloads=tuple(q.rank_workloads),
        lockstep_imbalance=q.lockstep_imbalance,
        microbatches_per_rank=q.microbatches_per_rank,
        padding_tokens=q.padding_tokens,
        empty_microbatches=q.empty_microbatches,
        oversize_microbatches=q.oversize_microbatches,
        references=q.references,
        unique_encodings=q.unique_encodings,
        dedup_factor=q.dedup_factor,
        encoders=tuple(
            EncoderQuality(
                name=e.name,
                imbalance=e.imbalance,
                rank_costs=tuple(e.rank_costs),
                microbatches_per_rank=e.microbatches_per_rank,
                empty_microbatches=e.empty_microbatches,
                oversize_microbatches=e.oversize_microbatches,
                unique_encodings=e.unique_encodings,
            )
            for e in q.encoders
        ),
        scheme=_scheme_from_proto(q.scheme),
    )
    return Plan(
        topology=topology,
        label_fields=tuple(message.label_fields),
        trajectories=trajectories,
        backbone=backbone,
        encodings=table,
        encoders=encoders,
        route=route,
        quality=quality,
    )


def _scheme_to_proto(scheme: BalanceScheme) -> plan_pb2.BalanceScheme:
    # protoc's .pyi types enum fields as the enum class, while EnumTypeWrapper.Value returns a plain int.
    return cast("plan_pb2.BalanceScheme", plan_pb2.BalanceScheme.Value(f"BALANCE_SCHEME_{scheme.name}"))


def _scheme_from_proto(number: int) -> BalanceScheme:
    for scheme in BalanceScheme:
        if number == plan_pb2.BalanceScheme.Value(f"BALANCE_SCHEME_{scheme.name}"):
            return scheme
    raise InvalidArgument("unknown or unspecified balance scheme", field="quality.scheme")


def _span_to_proto(span: TokenSpan) -> trajectory_pb2.TokenSpan:
    return trajectory_pb2.TokenSpan(start=span.start, end=span.end)


def _span_from_proto(message: trajectory_pb2.TokenSpan, path: str) -> TokenSpan:
    return within(path, lambda: TokenSpan(start=message.start, end=message.end))


def _encoding_to_proto(assignment: EncodingAssignment) -> plan_pb2.EncodingAssignment:
    enc = assignment.encoding
    message = plan_pb2.EncodingAssignment(
        encoding_id=enc.encoding_id,
        key=enc.key,
        encoder=enc.encoder,
        cost=enc.cost,
        kind=_kind_to_proto(enc.kind),
        num_rows=enc.num_rows,
        routes=routes_to_proto(assignment.routes),
    )
    if enc.header is not None:
        message.header.CopyFrom(header_to_proto(enc.header))
    return message


def encoding_assignment_to_proto(assignment: EncodingAssignment) -> plan_pb2.EncodingAssignment:
    """One unique encoding with its routes (encoder consumers receive these per micro-batch)."""
    return _encoding_to_proto(assignment)


def encoding_assignment_from_proto(e: plan_pb2.EncodingAssignment, path: str = "encoding") -> EncodingAssignment:
    encoding = Encoding(
        encoding_id=e.encoding_id,
        key=UnitKey(e.key),
        encoder=e.encoder,
        cost=e.cost,
        num_rows=e.num_rows,
        kind=_kind_from_proto_number(e.kind, f"{path}.kind"),
        header=within(f"{path}.header", lambda: header_from_proto(e.header)) if e.HasField("header") else None,
    )
    routes = routes_from_proto(e.routes, f"{path}.routes")
    return EncodingAssignment(encoding=encoding, routes=routes)


def routes_to_proto(routes: Sequence[RouteEntry]) -> plan_pb2.EncodingRoutes:
    """An encoding's destinations as the message's parallel columns."""
    return plan_pb2.EncodingRoutes(
        dp_ranks=[r.consumer.dp_rank for r in routes],
        cp_ranks=[r.consumer.cp_rank for r in routes],
        tp_ranks=[r.tp_rank for r in routes],
        microbatches=[r.microbatch for r in routes],
        trajectory_indices=[r.trajectory_index for r in routes],
        trajectory_ids=[r.trajectory_id for r in routes],
        references=[r.reference for r in routes],
        position_starts=[r.positions.start for r in routes],
        position_ends=[r.positions.end for r in routes],
        row_starts=[r.row_start for r in routes],
    )


def routes_from_proto(columns: plan_pb2.EncodingRoutes, path: str = "routes") -> tuple[RouteEntry, ...]:
    """An encoding's destinations from the message's columns (every column must have one entry per destination;
    each destination is a backbone consumer)."""
    lengths = {name: len(getattr(columns, name)) for name in ROUTE_FIELDS}
    count = lengths["dp_ranks"]
    for name, length in lengths.items():
        if length != count:
            raise InvalidArgument(f"has {length} entries, dp_ranks has {count}", field=f"{path}.{name}")
    consumers: dict[tuple[int, int], ConsumerId] = {}
    entries = []
    rows = zip(*(getattr(columns, name) for name in ROUTE_FIELDS), strict=True)
    for k, (dp, cp, tp, mb, t, tid, r, start, end, row) in enumerate(rows):
        consumer = consumers.get((dp, cp))
        if consumer is None:
            consumer = consumers[(dp, cp)] = ConsumerId(role=BACKBONE_ROLE, dp_rank=dp, cp_rank=cp)
        if end < start:
            raise InvalidArgument(f"end {end} is before start {start}", field=f"{path}.position_ends[{k}]")
        entries.append(RouteEntry(consumer=consumer, tp_rank=tp, microbatch=mb, trajectory_index=t,
                                  trajectory_id=TrajectoryId(tid), reference=r,
                                  positions=TokenSpan(start=start, end=end), row_start=row))
    return tuple(entries)


def _kind_to_proto(kind: UnitKind) -> trajectory_pb2.UnitKind:
    return UNIT_KIND_TO_PROTO[kind]


def _kind_from_proto_number(number: int, path: str) -> UnitKind:
    if number in UNIT_KIND_FROM_PROTO:
        return UNIT_KIND_FROM_PROTO[number]
    raise InvalidArgument("unknown or unspecified unit kind", field=path)


def assignment_to_proto(assignment: ConsumerAssignment) -> plan_pb2.ConsumerAssignment:
    return plan_pb2.ConsumerAssignment(
        consumer=consumer_to_proto(assignment.consumer),
        minibatch_loss_tokens=assignment.minibatch_loss_tokens,
        cp=assignment.cp,
        microbatches=[
            plan_pb2.MicroBatchAssignment(
                index=mb.index,
                last=mb.last,
                num_loss_tokens=mb.num_loss_tokens,
                items=[
                    plan_pb2.ItemAssignment(
                        trajectory_index=item.trajectory_index,
                        trajectory=trajectory_to_proto(item.trajectory),
                        padded_tokens=item.padded_tokens,
                        chunks=[
                            plan_pb2.ChunkSlice(
                                chunk=c.chunk, padded=_span_to_proto(c.padded), tokens=_span_to_proto(c.tokens)
                            )
                            for c in item.chunks
                        ],
                        reads=[
                            plan_pb2.FieldRead(
                                unit=unit_ref_to_proto(r.unit),
                                spans=[_span_to_proto(s) for s in r.spans],
                                byte_ranges=[
                                    plan_pb2.ByteRange(offset=b.offset, length=b.length) for b in r.byte_ranges
                                ],
                                look_ahead=r.look_ahead,
                            )
                            for r in item.reads
                        ],
                        encodings=[
                            plan_pb2.EncodingUse(
                                encoding_id=u.encoding_id,
                                key=u.key,
                                positions=_span_to_proto(u.positions),
                                row_start=u.row_start,
                                reference=u.reference,
                            )
                            for u in item.encodings
                        ],
                    )
                    for item in mb.items
                ],
            )
            for mb in assignment.microbatches
        ],
        encoder_microbatches=[
            plan_pb2.EncoderMicroBatchAssignment(
                index=mb.index, last=mb.last, encodings=[_encoding_to_proto(e) for e in mb.encodings]
            )
            for mb in assignment.encoder_microbatches
        ],
    )


def assignment_from_proto(message: plan_pb2.ConsumerAssignment) -> ConsumerAssignment:
    consumer = within("consumer", lambda: consumer_from_proto(message.consumer))
    microbatches = []
    for i, mb in enumerate(message.microbatches):
        path = f"microbatches[{i}]"
        items = []
        for j, item in enumerate(mb.items):
            ipath = f"{path}.items[{j}]"
            chunks = tuple(
                ChunkSlice(
                    chunk=c.chunk,
                    padded=_span_from_proto(c.padded, f"{ipath}.chunks[{k}].padded"),
                    tokens=_span_from_proto(c.tokens, f"{ipath}.chunks[{k}].tokens"),
                )
                for k, c in enumerate(item.chunks)
            )
            reads = tuple(
                FieldRead(
                    unit=within(f"{ipath}.reads[{k}].unit", partial(unit_ref_from_proto, r.unit)),
                    spans=tuple(_span_from_proto(s, f"{ipath}.reads[{k}].spans") for s in r.spans),
                    byte_ranges=tuple(
                        within(
                            f"{ipath}.reads[{k}].byte_ranges", partial(ByteRange, offset=b.offset, length=b.length)
                        )
                        for b in r.byte_ranges
                    ),
                    look_ahead=r.look_ahead,
                )
                for k, r in enumerate(item.reads)
            )
            uses = tuple(
                EncodingUse(
                    encoding_id=u.encoding_id,
                    key=UnitKey(u.key),
                    positions=_span_from_proto(u.positions, f"{ipath}.encodings[{k}].positions"),
                    row_start=u.row_start,
                    reference=u.reference,
                )
                for k, u in enumerate(item.encodings)
            )
            items.append(
                ItemAssignment(
                    trajectory_index=item.trajectory_index,
                    trajectory=within(f"{ipath}.trajectory", partial(trajectory_from_proto, item.trajectory)),
                    padded_tokens=item.padded_tokens,
                    chunks=chunks,
                    reads=reads,
                    encodings=uses,
                )
            )
        microbatches.append(
            MicroBatchAssignment(index=mb.index, last=mb.last, num_loss_tokens=mb.num_loss_tokens, items=tuple(items))
        )
    encoder_microbatches = []
    for i, encoder_mb in enumerate(message.encoder_microbatches):
        encodings = tuple(
            encoding_assignment_from_proto(e, f"encoder_microbatches[{i}].encodings[{j}]")
            for j, e in enumerate(encoder_mb.encodings)
        )
        encoder_microbatches.append(
            EncoderMicroBatchAssignment(index=encoder_mb.index, last=encoder_mb.last, encodings=encodings)
        )
    return ConsumerAssignment(
        consumer=consumer,
        minibatch_loss_tokens=message.minibatch_loss_tokens,
        cp=message.cp,
        microbatches=tuple(microbatches),
        encoder_microbatches=tuple(encoder_microbatches),
    )
