"""A backbone sidecar cuts its CP rank's part from its DP rank's message; what it packs must be what the per-consumer
assignment of the same plan packed, byte for byte.

The reference is the per-consumer expansion every release used (``plan.for_consumer``, unchanged); the path under
test is the one the service and a sidecar really run: the service's :class:`MiniBatchDispatch` of the ingest
columns, the serialised ``WatchAssignmentsResponse``, the sidecar's :class:`AssignmentEvent` decoding one
micro-batch at a time. Plans are random: lengths, CP degree 1, 2 or 4, TP, images shared between trajectories whose
placeholders cross zigzag chunk (and so CP rank) boundaries, label fields and token-aligned fields read with one
token of look-ahead.
"""

from __future__ import annotations

from dataclasses import fields

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from knittrans.admission.planning import plan_minibatch
from knittrans.admission.service.assignment_messages import assignment_bytes
from knittrans.admission.service.assignments import MiniBatchDispatch, gather_rows
from knittrans.admission.service.ledger import AdmittedMiniBatch
from knittrans.admission.service.trajectory_columns import TrajectoryColumns
from knittrans.plan import MicroBatchAssignment
from knittrans.reorg.assignments import Admission, AssignmentEvent, _event_from_proto
from knittrans.reorg.packing import PackSettings, backbone_layout, pack_backbone
from knittrans.reorg.verification import stored_units
from knittrans.store.arrays import header_of, to_numpy
from knittrans.types import (
    BackboneTopology,
    ConsumerId,
    EncoderTopology,
    FieldAlignment,
    MultimodalRef,
    TokenSpan,
    Topology,
    TrajectoryMeta,
    UnitKind,
    UnitRef,
    VersionSegment,
)
from knittrans.v1 import admission_pb2
from knittrans.v1 import admission_service_pb2 as pb
from knittrans.wire.columns import batch_from_metas

PACK = PackSettings(pad_token_id=3, pack_multiple=4)
IMAGE_ROWS = (3, 9, 17)  # placeholder length of image k (the same wherever the image is used)


def fields_of(rng: np.random.Generator, length: int) -> dict[str, np.ndarray]:
    return {
        "input_ids": rng.integers(1, 50_000, size=length, dtype=np.int32),
        "routing": rng.integers(0, 256, size=(length, 3), dtype=np.uint8),
        "logprobs": rng.standard_normal(length).astype(np.float32),
        "loss_mask": (rng.random(length) < 0.7).astype(np.uint8),
        "meta": rng.standard_normal(2).astype(np.float32),  # a per-trajectory field: read whole
    }


def trajectory(index: int, fields: dict[str, np.ndarray], images: list[tuple[int, int]], group: int,
               alignment: FieldAlignment | None) -> TrajectoryMeta:
    length = len(fields["input_ids"])
    units = []
    for name, array in fields.items():
        _, dtype = to_numpy(array, field=name)
        sequence = name != "meta"
        units.append(UnitRef(key=f"t{index}/{name}", field_name=name,
                             kind=UnitKind.TOKEN_FIELD if sequence else UnitKind.FIELD,
                             header=header_of(array, dtype, sequence=sequence),
                             alignment=alignment if name == "logprobs" else None))
    multimodal = tuple(
        MultimodalRef(key=f"g{group}/img{k}", encoder="vision", cost=float(IMAGE_ROWS[k]),
                      placeholder=TokenSpan(start=start, end=start + IMAGE_ROWS[k]), kind=UnitKind.IMAGE)
        for k, start in images
    )
    return TrajectoryMeta(
        trajectory_id=f"t{index}", sample_id=f"s{group}", source="math", rollout_step=0, num_tokens=length,
        num_loss_tokens=int(fields["loss_mask"].sum()), segments=(VersionSegment(version=0, num_tokens=length),),
        units=tuple(units), multimodal=multimodal, scalars=(("reward", float(index)),),
    )


@st.composite
def minibatches(draw):
    cp = draw(st.sampled_from([1, 2, 4]))
    topology = Topology(
        backbone=BackboneTopology(dp=draw(st.integers(1, 3)), cp=cp, tp=draw(st.sampled_from([1, 2])),
                                  max_tokens_per_microbatch=draw(st.sampled_from([64, 160, 512]))),
        encoders=(EncoderTopology(name="vision", dp=draw(st.integers(1, 2)), max_cost_per_microbatch=20),),
    )
    labels = draw(st.sampled_from([("input_ids",), ("input_ids", "loss_mask")]))
    # Token-aligned logprobs are packed shifted, so read with look-ahead; one alignment per mini-batch, since the
    # packer wants a field's use to agree within a micro-batch.
    alignment = draw(st.sampled_from([None, FieldAlignment.TOKEN, FieldAlignment.LABEL]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    metas, arrays = [], {}
    for index, length in enumerate(draw(st.lists(st.integers(2, 300), min_size=1, max_size=12))):
        images, position = [], 0
        for k in draw(st.lists(st.integers(0, len(IMAGE_ROWS) - 1), max_size=3, unique=True)):
            start = position + draw(st.integers(0, 40))
            if start + IMAGE_ROWS[k] > length:
                break
            images.append((k, start))
            position = start + IMAGE_ROWS[k]
        fields = fields_of(rng, length)
        meta = trajectory(index, fields, images, group=index // 2, alignment=alignment)
        metas.append(meta)
        arrays[meta.trajectory_id] = fields
    return topology, labels, metas, arrays


def packed(mb: MicroBatchAssignment, cp: int, arrays) -> tuple:
    by_key = {read.unit.key: (item.trajectory.trajectory_id, read) for item in mb.items for read in item.reads}
    layout = backbone_layout(mb, cp=cp, settings=PACK)
    data = []
    for placement in layout.reads:
        trajectory_id, read = by_key[placement.key]
        raw = arrays[trajectory_id][read.unit.field_name].tobytes()
        data.append(b"".join(raw[r.offset:r.end] for r in (placement.ranges or read.byte_ranges)))
    layout, slot = pack_backbone(mb, data, cp=cp, settings=PACK)
    return {f.name: getattr(layout, f.name) for f in fields(layout)}, slot.tobytes()  # PackLayout has no __eq__


def sidecar_event(dispatch: MiniBatchDispatch, consumer: ConsumerId) -> AssignmentEvent:
    """The event a backbone sidecar makes of its stream's message (the bytes every CP rank of the DP rank gets)."""
    admission = admission_pb2.MiniBatchAdmission(train_batch_index=0, minibatch_index=0, num_minibatches=1)
    minibatch = AdmittedMiniBatch(sequence=1, admission=admission, trajectory_ids=(), owed_steps=set())
    data = assignment_bytes(minibatch, dispatch, admission, ConsumerId(role="backbone", dp_rank=consumer.dp_rank))
    return _event_from_proto(pb.WatchAssignmentsResponse.FromString(data), 0.0, consumer)


@given(minibatches())
@settings(max_examples=80, deadline=None)
def test_each_cp_rank_packs_from_its_dp_rank_s_message_what_its_own_assignment_packed(case) -> None:
    topology, labels, metas, arrays = case
    plan = plan_minibatch(metas, topology, label_fields=labels)
    dispatch = MiniBatchDispatch(gather_rows([(TrajectoryColumns.from_proto(batch_from_metas(metas)), i)
                                              for i in range(len(metas))]), topology, labels)
    cp = topology.backbone.cp
    crossing = 0
    for dp_rank in range(topology.backbone.dp):
        for cp_rank in range(cp):
            consumer = ConsumerId(role="backbone", dp_rank=dp_rank, cp_rank=cp_rank)
            expected = plan.for_consumer(consumer)
            event = sidecar_event(dispatch, consumer)
            reference = AssignmentEvent(sequence=1, admission=Admission(), global_loss_tokens=0, consumer=consumer,
                                        decoded=expected)
            assert event.num_units == len(expected.microbatches)
            assert stored_units(event) == stored_units(reference)
            assert event.assignment == expected
            for position, want in enumerate(expected.microbatches):
                got = event.unit(position)
                assert got == want, (consumer, position)
                (got_layout, got_bytes), (want_layout, want_bytes) = packed(got, cp, arrays), packed(want, cp, arrays)
                assert got_bytes == want_bytes, (consumer, position)
                assert got_layout == want_layout, (consumer, position)
                crossing += sum(len(item.encodings) for item in got.items)
    assert crossing == sum(1 for r in range(len(plan.route.encodings)) if plan.route.tp_ranks[r] == 0)


def test_an_image_across_cp_ranks_is_split_between_them() -> None:
    """A fixed case the random ones may miss: one image whose placeholder spans all four CP ranks' chunks."""
    rng = np.random.default_rng(7)
    fields = fields_of(rng, 64)
    meta = trajectory(0, fields, [(2, 20)], group=0, alignment=FieldAlignment.TOKEN)  # positions [20, 37)
    topology = Topology(backbone=BackboneTopology(dp=1, cp=4, max_tokens_per_microbatch=128),
                        encoders=(EncoderTopology(name="vision", dp=1, max_cost_per_microbatch=40),))
    plan = plan_minibatch([meta], topology, label_fields=("input_ids",))
    dispatch = MiniBatchDispatch(gather_rows([(TrajectoryColumns.from_proto(batch_from_metas([meta])), 0)]),
                                 topology, ("input_ids",))
    pieces = []
    for cp_rank in range(4):
        consumer = ConsumerId(role="backbone", dp_rank=0, cp_rank=cp_rank)
        got = sidecar_event(dispatch, consumer).unit(0)
        assert got == plan.for_consumer(consumer).microbatches[0]
        pieces.extend((u.positions.start, u.positions.end, u.row_start) for u in got.items[0].encodings)
    assert len(pieces) > 1  # the image really is cut by the chunk boundaries
    assert sorted(pieces) == [(s, e, s - 20) for s, e, _ in sorted(pieces)]
    assert sum(e - s for s, e, _ in pieces) == 17
