"""An encoding's routes travel as columns (``EncodingRoutes``), which the service writes with numpy
(:class:`RouteWire`) and consumers decode with :func:`routes_from_proto`. The oracle is the per-row form: the
message protobuf builds from each ``RouteEntry``'s values one by one, and the planner's own ``plan.routes(e)``."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from knittrans.admission.planning import plan_minibatch
from knittrans.admission.service.assignments import MiniBatchDispatch, gather_rows
from knittrans.admission.service.route_wire import RouteWire, varint, varints
from knittrans.admission.service.trajectory_columns import TrajectoryColumns
from knittrans.errors import InvalidArgument
from knittrans.plan.assignment import RouteEntry
from knittrans.plan.proto import routes_from_proto, routes_to_proto
from knittrans.types import (
    BACKBONE_ROLE,
    BackboneTopology,
    ConsumerId,
    EncoderTopology,
    MultimodalRef,
    TokenSpan,
    Topology,
    TrajectoryId,
    TrajectoryMeta,
    UnitKind,
)
from knittrans.v1 import plan_pb2
from knittrans.wire.columns import batch_from_metas
from tests.unit.admission_service.test_assignment_fields import meta

U32 = (1 << 32) - 1
U64 = (1 << 64) - 1
# Values on every varint length boundary, and the fields' extremes.
EDGES = sorted({0, 1, *((1 << (7 * k)) + d for k in range(1, 10) for d in (-1, 0)), U32, U64} - {-1})


def u32() -> st.SearchStrategy[int]:
    return st.one_of(st.sampled_from([v for v in EDGES if v <= U32]), st.integers(0, U32))


def u64() -> st.SearchStrategy[int]:
    return st.one_of(st.sampled_from(EDGES), st.integers(0, U64))


@st.composite
def route_entry(draw) -> RouteEntry:
    start = draw(u64())
    return RouteEntry(
        consumer=ConsumerId(role=BACKBONE_ROLE, dp_rank=draw(u32()), cp_rank=draw(u32())),
        tp_rank=draw(u32()), microbatch=draw(u32()), trajectory_index=draw(u32()),
        trajectory_id=TrajectoryId(draw(st.text(min_size=1, max_size=40))), reference=draw(u32()),
        positions=TokenSpan(start=start, end=draw(st.integers(start, U64))), row_start=draw(u64()),
    )


def wire_of(groups: list[list[RouteEntry]]) -> RouteWire:
    rows = [r for group in groups for r in group]
    bounds = np.cumsum([0, *(len(group) for group in groups)]).tolist()
    columns = {
        "dp_ranks": [r.consumer.dp_rank for r in rows], "cp_ranks": [r.consumer.cp_rank for r in rows],
        "tp_ranks": [r.tp_rank for r in rows], "microbatches": [r.microbatch for r in rows],
        "trajectory_indices": [r.trajectory_index for r in rows], "references": [r.reference for r in rows],
        "position_starts": [r.positions.start for r in rows], "position_ends": [r.positions.end for r in rows],
        "row_starts": [r.row_start for r in rows],
    }
    return RouteWire({name: np.array(values, dtype=np.uint64) for name, values in columns.items()},
                     [r.trajectory_id for r in rows], bounds)


@given(groups=st.lists(st.lists(route_entry(), max_size=6), max_size=8))
@settings(max_examples=200, deadline=None)
def test_each_encoding_s_wire_routes_are_what_protobuf_serialises_row_by_row(groups) -> None:
    wire = wire_of(groups)
    for e, group in enumerate(groups):
        expected = routes_to_proto(group)
        assert wire.encoding_bytes(e) == expected.SerializeToString(deterministic=True)
        decoded = routes_from_proto(plan_pb2.EncodingRoutes.FromString(wire.encoding_bytes(e)))
        assert decoded == tuple(group)


@given(values=st.lists(u64(), max_size=50))
def test_varints_are_protobuf_s(values) -> None:
    data, offsets = varints(np.array(values, dtype=np.uint64))
    field = plan_pb2.EncodingRoutes(row_starts=values).SerializeToString()
    assert field == (b"\x52" + varint(len(data)) + data if values else b"")  # field 10, length-delimited
    assert offsets.tolist() == np.cumsum([0, *(len(varint(v)) for v in values)]).tolist()


def test_a_value_outside_its_field_is_refused_by_name() -> None:
    columns = {name: np.zeros(1, dtype=np.uint64) for name in (
        "dp_ranks", "cp_ranks", "tp_ranks", "microbatches", "trajectory_indices", "references", "position_starts",
        "position_ends", "row_starts")}
    columns["tp_ranks"] = np.array([U32 + 1], dtype=np.uint64)
    with pytest.raises(InvalidArgument) as raised:
        RouteWire(columns, ["t"], [0, 1])
    assert raised.value.field == "routes.tp_ranks"


def test_columns_of_different_lengths_are_refused_by_name() -> None:
    message = routes_to_proto([RouteEntry(consumer=ConsumerId(role=BACKBONE_ROLE, dp_rank=0), tp_rank=0,
                                          microbatch=0, trajectory_index=0, trajectory_id=TrajectoryId("t"),
                                          reference=0, positions=TokenSpan(start=1, end=3), row_start=0)])
    message.references.append(1)
    with pytest.raises(InvalidArgument) as raised:
        routes_from_proto(message, "encodings[0].routes")
    assert raised.value.field == "encodings[0].routes.references"
    message.references.pop()
    message.position_ends[0] = 0
    with pytest.raises(InvalidArgument) as raised:
        routes_from_proto(message)
    assert raised.value.field == "routes.position_ends[0]"


def long_image_meta(index: int, tokens: int, group: int) -> TrajectoryMeta:
    """A trajectory whose one image (20 placeholders, the same for the whole sample) is most of it, so CP chunks
    split it."""
    base = meta(index, tokens, images=0, group=group)
    image = MultimodalRef(key=f"{base.sample_id}/big", encoder="vision", cost=32.0, kind=UnitKind.IMAGE,
                          placeholder=TokenSpan(start=1 + index % 3, end=21 + index % 3))
    return replace(base, multimodal=(image,))


def check_routes(lengths: list[int], group: int, cp: int, tp: int) -> int:
    """Each encoder message's routes, decoded, are the plan's; returns how many encodings reach several CP ranks."""
    metas = [long_image_meta(i, length, group) for i, length in enumerate(lengths)]
    topology = Topology(backbone=BackboneTopology(dp=2, cp=cp, tp=tp, max_tokens_per_microbatch=320),
                        encoders=(EncoderTopology(name="vision", dp=2, max_cost_per_microbatch=64),))
    plan = plan_minibatch(metas, topology, label_fields=("input_ids",))
    dispatch = MiniBatchDispatch(gather_rows([(TrajectoryColumns.from_proto(batch_from_metas(metas)), i)
                                              for i in range(len(metas))]), topology, ("input_ids",))
    split = 0
    for d in range(2):
        message = dispatch.assignment(ConsumerId(role="encoder:vision", dp_rank=d))
        message = plan_pb2.ConsumerAssignment.FromString(message.SerializeToString())
        for micro in message.encoder_microbatches:
            for encoding in micro.encodings:
                routes = routes_from_proto(encoding.routes)
                assert routes == plan.routes(encoding.encoding_id)
                split += len({r.consumer.cp_rank for r in routes}) > 1
    return split


@given(lengths=st.lists(st.integers(min_value=24, max_value=300), min_size=1, max_size=12),
       group=st.integers(min_value=1, max_value=3), cp=st.sampled_from([2, 4]), tp=st.sampled_from([1, 2]))
@settings(max_examples=40, deadline=None)
def test_encoder_messages_route_as_the_plan_does_when_images_span_cp_chunks(lengths, group, cp, tp) -> None:
    check_routes(lengths, group, cp, tp)


def test_images_that_span_cp_chunks_reach_every_cp_rank_they_span() -> None:
    assert check_routes([40, 120, 200, 90, 300, 64], group=2, cp=4, tp=2) > 0
