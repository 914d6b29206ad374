"""A DP rank's trajectories travel as one columnar batch (``RankAssignment.trajectories``), cut from the
mini-batch's reports joined into one set of columns. Whatever the reports (messages or batches, field names and
encoders numbered differently, columns one report leaves empty and another fills), every CP rank must decode
exactly what the per-item message form (a ``TrajectoryMetadata`` per item, the naive reference) gives, and the
batch must decode to the very trajectories that were reported."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from knittrans.admission.service.assignments import MiniBatchDispatch, gather_rows
from knittrans.admission.service.block_merge import rows_in_order
from knittrans.admission.service.compact_columns import compact_columns
from knittrans.admission.service.trajectory_columns import TrajectoryColumns
from knittrans.plan.rank_proto import consumer_assignment_from_rank_proto, rank_assignment_from_proto
from knittrans.reorg.assignments import Admission, AssignmentEvent
from knittrans.reorg.verification import stored_units
from knittrans.types import (
    BACKBONE_ROLE,
    BackboneTopology,
    ConsumerId,
    Coverage,
    DType,
    EncoderTopology,
    FieldAlignment,
    MultimodalRef,
    TokenSpan,
    Topology,
    TrajectoryMeta,
    UnitHeader,
    UnitKind,
    UnitRef,
    VersionSegment,
)
from knittrans.v1 import plan_pb2
from knittrans.values import MetadataKind, MetadataValue, TrajectoryValues
from knittrans.wire import trajectory_to_proto
from knittrans.wire.batch_metas import metas_from_batch
from knittrans.wire.columns import batch_from_metas
from tests.builders import digest, token_unit

TOPOLOGIES = (
    Topology(backbone=BackboneTopology(dp=2, cp=2, max_tokens_per_microbatch=256),
             encoders=(EncoderTopology(name="vision", dp=2, max_cost_per_microbatch=40),
                       EncoderTopology(name="audio", dp=1, max_cost_per_microbatch=64))),
    Topology(backbone=BackboneTopology(dp=3, cp=1, tp=2, max_tokens_per_microbatch=300),
             encoders=(EncoderTopology(name="vision", dp=1, max_cost_per_microbatch=1000),
                       EncoderTopology(name="audio", dp=2, max_cost_per_microbatch=17))),
    Topology(backbone=BackboneTopology(dp=1, cp=4, max_tokens_per_microbatch=512),
             encoders=(EncoderTopology(name="vision", dp=1, max_cost_per_microbatch=50),
                       EncoderTopology(name="audio", dp=1, max_cost_per_microbatch=50))),
)


@st.composite
def trajectories(draw, index: int) -> TrajectoryMeta:
    tokens = draw(st.integers(min_value=8, max_value=300))
    trajectory_id, sample_id = f"t{index}", f"s{index // draw(st.integers(1, 3))}"
    response_start = draw(st.sampled_from([0, 0, tokens // 3]))
    units = [token_unit(trajectory_id, "input_ids", tokens, DType.INT32)]
    # Optional fields in a drawn order: reports then number their field names differently.
    for name in draw(st.permutations(["logprobs", "routing", "stats", "response_mask"]))[:draw(st.integers(0, 4))]:
        if name == "logprobs":
            units.append(replace(token_unit(trajectory_id, name, tokens, DType.FLOAT32),
                                 alignment=draw(st.sampled_from([None, FieldAlignment.TOKEN, FieldAlignment.LABEL]))))
        elif name == "routing":
            units.append(token_unit(trajectory_id, name, tokens, DType.UINT8, width=draw(st.sampled_from([2, 8]))))
        elif name == "stats":
            units.append(UnitRef(key=f"{trajectory_id}/stats", field_name="stats", kind=UnitKind.FIELD,
                                 header=UnitHeader(dtype=DType.FLOAT64, shape=(3,), byte_length=24,
                                                   content_hash=digest(trajectory_id))))
        else:
            rows = tokens - response_start
            units.append(UnitRef(key=f"{trajectory_id}/{name}", field_name=name, kind=UnitKind.TOKEN_FIELD,
                                 coverage=Coverage.RESPONSE,
                                 header=UnitHeader(dtype=DType.UINT8, shape=(rows,), byte_length=rows,
                                                   content_hash=digest(f"{trajectory_id}/{name}"), seq_axis=0)))
    images = draw(st.integers(0, min(3, (tokens - 1) // 5)))
    # A sample's inputs are the same units in each of its trajectories: their fields follow from the key.
    multimodal = tuple(
        MultimodalRef(key=f"{sample_id}/img{k}", encoder=("vision", "audio")[(len(sample_id) + k) % 2],
                      cost=float(1 + (len(sample_id) + k) % 7), placeholder=TokenSpan(start=1 + 5 * k, end=5 + 5 * k),
                      kind=(UnitKind.IMAGE, UnitKind.VIDEO)[k % 2],
                      header=UnitHeader(dtype=DType.UINT8, shape=(2, 2), byte_length=4,
                                        content_hash=digest(f"{sample_id}{k}")) if k % 2 else None)
        for k in range(images)
    )
    values = draw(st.sampled_from([
        TrajectoryValues(),
        TrajectoryValues(int_scalars=(("turns", index),), bool_scalars=(("solved", index % 2 == 0),)),
        TrajectoryValues(metadata=(("note", MetadataValue(kind=MetadataKind.STR, value=f"n{index}")),)),
    ]))
    # By name: the order trajectory_from_proto gives them in.
    names = sorted(draw(st.sets(st.sampled_from(["r", "kl"]))))
    scalars = tuple((name, float(index + k)) for k, name in enumerate(names))
    return TrajectoryMeta(
        trajectory_id=trajectory_id, sample_id=sample_id, source="AB"[index % 2], rollout_step=index,
        num_tokens=tokens, num_loss_tokens=tokens // 2, segments=(VersionSegment(version=0, num_tokens=tokens // 2),),
        units=tuple(units), multimodal=multimodal, scalars=scalars, finished_at=float(index), values=values,
        response_start=response_start, accepted=draw(st.booleans()),
    )


@st.composite
def reports(draw) -> list[list[TrajectoryMeta]]:
    """A few reports of trajectories, together a mini-batch."""
    count = draw(st.integers(1, 14))
    metas = [draw(trajectories(i)) for i in range(count)]
    cuts = sorted(draw(st.sets(st.integers(1, count - 1), max_size=3))) if count > 1 else []
    return [metas[a:b] for a, b in zip([0, *cuts], [*cuts, count], strict=True)]


def columns_of(report: list[TrajectoryMeta], as_messages: bool) -> TrajectoryColumns:
    if as_messages:
        return TrajectoryColumns.from_messages([trajectory_to_proto(m) for m in report])
    return TrajectoryColumns.from_proto(batch_from_metas(report))


@given(parts=reports(), forms=st.lists(st.booleans(), min_size=4, max_size=4), data=st.data())
@settings(max_examples=60, deadline=None)
def test_reports_joined_in_any_order_decode_to_the_reported_trajectories(parts, forms, data) -> None:
    blocks = [columns_of(part, as_messages) for part, as_messages in zip(parts, forms, strict=False)]
    blocks = [compact_columns(b) if data.draw(st.booleans()) else b for b in blocks]  # as the ledger keeps them
    located = [(block, row) for block, part in zip(blocks, parts, strict=False) for row in range(len(part))]
    reported = [m for part in parts for m in part]
    # Every row, or a few: the blocks are then taken row set by row set, not joined whole.
    order = data.draw(st.permutations(range(len(located))))[: data.draw(st.integers(0, len(located)))]
    joined = rows_in_order([located[t] for t in order])
    expected = tuple(reported[t] for t in order)
    assert metas_from_batch(joined.take_range(0, len(order))) == expected
    assert metas_from_batch(joined.take(range(len(order)))) == expected
    start = data.draw(st.integers(0, len(order)))
    stop = data.draw(st.integers(start, len(order)))
    assert metas_from_batch(joined.take_range(start, stop)) == expected[start:stop]
    assert joined.take_range(start, stop) == joined.take(range(start, stop))
    # A sidecar decodes a slice of its rank's whole batch: only that slice's headers are built, at its offsets.
    assert metas_from_batch(joined.take_range(0, len(order)), start=start, stop=stop) == expected[start:stop]


@given(parts=reports(), forms=st.lists(st.booleans(), min_size=4, max_size=4),
       topology=st.sampled_from(range(len(TOPOLOGIES))), shuffle=st.randoms(use_true_random=False))
@settings(max_examples=60, deadline=None)
def test_each_cp_rank_decodes_from_the_rank_batch_what_the_per_item_messages_give(parts, forms, topology,
                                                                                   shuffle) -> None:
    blocks = [columns_of(part, as_messages) for part, as_messages in zip(parts, forms, strict=False)]
    located = [(block, row) for block, part in zip(blocks, parts, strict=False) for row in range(len(part))]
    shuffle.shuffle(located)  # admission order interleaves the reports
    topo = TOPOLOGIES[topology]
    rows = gather_rows(located)
    columnar = MiniBatchDispatch(rows, topo, ("input_ids",))
    per_item = MiniBatchDispatch(gather_rows(located), topo, ("input_ids",), message=rows.message)  # the old form
    for dp_rank in range(topo.backbone.dp):
        new = plan_pb2.RankAssignment.FromString(plan_pb2.RankAssignment(**columnar.rank_fields(dp_rank))
                                                 .SerializeToString())
        old = plan_pb2.RankAssignment(**per_item.rank_fields(dp_rank))
        assert new.HasField("trajectories") and not old.HasField("trajectories")
        assert not any(item.HasField("trajectory") for mb in new.microbatches for item in mb.items)
        assert rank_assignment_from_proto(new) == rank_assignment_from_proto(old)
        for cp_rank in range(topo.backbone.cp):
            consumer = ConsumerId(role=BACKBONE_ROLE, dp_rank=dp_rank, cp_rank=cp_rank)
            assert consumer_assignment_from_rank_proto(new, consumer) == consumer_assignment_from_rank_proto(
                old, consumer)
            events = [AssignmentEvent(sequence=1, admission=Admission(train_batch_index=0, minibatch_index=0,
                                                                      train_version=0, num_minibatches=1),
                                      global_loss_tokens=1, consumer=consumer, rank=rank) for rank in (new, old)]
            assert stored_units(events[0]) == stored_units(events[1])
            assert [events[0].unit(i) for i in range(events[0].num_units)] == [
                events[1].unit(i) for i in range(events[1].num_units)]


@given(parts=reports(), data=st.data())
@settings(max_examples=30, deadline=None)
def test_the_kept_compact_columns_cut_the_same_batch_as_the_reported_ones(parts, data) -> None:
    """The ledger keeps each report's columns compacted (packed digests, constant columns as views)."""
    for part in parts:
        columns = TrajectoryColumns.from_proto(batch_from_metas(part))
        rows = data.draw(st.lists(st.integers(0, len(part) - 1), max_size=8))
        assert compact_columns(columns).take(rows) == columns.take(rows)
        assert metas_from_batch(compact_columns(columns).take(rows)) == tuple(part[r] for r in rows)


@given(parts=reports(), forms=st.lists(st.booleans(), min_size=4, max_size=4), compact=st.booleans(),
       shuffle=st.randoms(use_true_random=False))
@settings(max_examples=60, deadline=None)
def test_the_rows_planning_reads_follow_the_admission_order_of_interleaved_reports(parts, forms, compact,
                                                                                     shuffle) -> None:
    """What planning reads of each trajectory, taken one trajectory at a time from its reported metadata."""
    blocks = [columns_of(part, as_messages) for part, as_messages in zip(parts, forms, strict=False)]
    blocks = [compact_columns(b) for b in blocks] if compact else blocks
    located = [(block, row, meta) for block, part in zip(blocks, parts, strict=False)
               for row, meta in enumerate(part)]
    shuffle.shuffle(located)
    rows = gather_rows([(block, row) for block, row, _ in located])
    metas = [meta for _, _, meta in located]
    assert list(rows.trajectory_ids) == [m.trajectory_id for m in metas]
    assert rows.num_tokens.tolist() == [m.num_tokens for m in metas]
    assert rows.loss_tokens.tolist() == [m.num_loss_tokens for m in metas]
    refs = [(t, ref) for t, m in enumerate(metas) for ref in m.multimodal]
    columns = rows.references
    assert columns.trajectories.tolist() == [t for t, _ in refs]
    assert list(columns.keys) == [ref.key for _, ref in refs]
    assert list(columns.encoders) == [ref.encoder for _, ref in refs]
    assert columns.costs.tolist() == [ref.cost for _, ref in refs]
    assert columns.starts.tolist() == [ref.placeholder.start for _, ref in refs]
    assert columns.ends.tolist() == [ref.placeholder.end for _, ref in refs]
    assert list(columns.kinds) == [ref.kind for _, ref in refs]
    assert list(columns.content_hashes) == [ref.header.content_hash if ref.header else None for _, ref in refs]
    assert list(rows.reference_offsets) == [0, *np.cumsum([len(m.multimodal) for m in metas]).tolist()]
