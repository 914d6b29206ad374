"""The pure packer against a naive reference built from the full trajectories, on real planner output."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from knittrans.admission.planning import plan_minibatch
from knittrans.errors import InvalidArgument
from knittrans.plan import MicroBatchAssignment
from knittrans.reorg.packing import (
    CU_SEQLENS,
    CU_SEQLENS_GLOBAL,
    LABELS,
    POSITION_IDS,
    SEQ_LENGTHS,
    Destination,
    PackSettings,
    backbone_layout,
    encoder_layout,
    pack_backbone,
    tensor_view,
)
from knittrans.store.arrays import header_of, to_numpy
from knittrans.train.plan_adapter import local_token_position
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

ROUTING_WIDTH = 3


def make_fields(rng: np.random.Generator, length: int, *, with_mask: bool) -> dict[str, np.ndarray]:
    fields = {
        "input_ids": rng.integers(1, 50_000, size=length, dtype=np.int32),
        "routing": rng.integers(0, 256, size=(length, ROUTING_WIDTH), dtype=np.uint8),
        "logprobs": rng.standard_normal(length).astype(np.float32),
        "old_logprobs": rng.standard_normal(length).astype(np.float32),  # token-aligned: shifted when packed
        "meta": rng.standard_normal(2).astype(np.float32),  # non-sequence
    }
    if with_mask:
        fields["loss_mask"] = (rng.random(length) < 0.7).astype(np.uint8)
    return fields


def make_trajectory(
    index: int, fields: dict[str, np.ndarray], *, images: tuple[MultimodalRef, ...] = ()
) -> TrajectoryMeta:
    length = len(fields["input_ids"])
    units = []
    for name, array in fields.items():
        _, dtype = to_numpy(array, field=name)
        sequence = name != "meta"
        units.append(UnitRef(key=f"ns/t/t{index}/{name}", field_name=name,
                             kind=UnitKind.TOKEN_FIELD if sequence else UnitKind.FIELD,
                             header=header_of(array, dtype, sequence=sequence),
                             alignment=FieldAlignment.TOKEN if name == "old_logprobs" else None))
    mask = fields.get("loss_mask")
    return TrajectoryMeta(
        trajectory_id=f"t{index}", sample_id=f"s{index // 2}", source="math", rollout_step=0,
        num_tokens=length, num_loss_tokens=int(mask.sum()) if mask is not None else length,
        segments=(VersionSegment(version=0, num_tokens=length),), units=tuple(units), multimodal=images,
        scalars=(("reward", float(index)), ("advantage", -0.5 * index)),
    )


def read_bytes(mb: MicroBatchAssignment, layout, arrays: dict[str, dict[str, np.ndarray]]) -> list[bytes]:
    """What a store would return for each placement, sliced from the full arrays."""
    by_key = {}
    for item in mb.items:
        for read in item.reads:
            by_key[read.unit.key] = (item.trajectory.trajectory_id, read)
    out = []
    for placement in layout.reads:
        trajectory_id, read = by_key[placement.key]
        raw = arrays[trajectory_id][read.unit.field_name].tobytes()
        ranges = placement.ranges if placement.ranges is not None else read.byte_ranges
        out.append(b"".join(raw[r.offset : r.end] for r in ranges))
    return out


def reference(mb: MicroBatchAssignment, arrays, cp: int, cp_rank: int, settings: PackSettings, total: int):
    """The expected packed tensors, token by token."""
    tokens, labels, positions, routing, logprobs, old_logprobs, mask = [], [], [], [], [], [], []
    for item in mb.items:
        full = arrays[item.trajectory.trajectory_id]
        length = item.trajectory.num_tokens
        chunk = item.padded_tokens // (2 * cp)
        for c in (cp_rank, 2 * cp - 1 - cp_rank):
            for position in range(c * chunk, (c + 1) * chunk):
                positions.append(position)
                real = position < length
                tokens.append(full["input_ids"][position] if real else settings.pad_token_id)
                labels.append(full["input_ids"][position + 1] if position + 1 < length else settings.label_ignore_index)
                routing.append(full["routing"][position] if real else np.zeros(ROUTING_WIDTH, np.uint8))
                logprobs.append(full["logprobs"][position] if real else 0.0)
                has_label = position + 1 < length
                old_logprobs.append(full["old_logprobs"][position + 1] if has_label else 0.0)
                # The mask is label-aligned: 0 where the label is ignored (the last real token, padding).
                if "loss_mask" in full:
                    mask.append(full["loss_mask"][position] if has_label else 0)
                else:
                    mask.append(1 if has_label else 0)
    tail = total - len(tokens)
    tokens += [settings.pad_token_id] * tail
    labels += [settings.label_ignore_index] * tail
    positions += list(range(tail))
    routing += [np.zeros(ROUTING_WIDTH, np.uint8)] * tail
    logprobs += [0.0] * tail
    old_logprobs += [0.0] * tail
    mask += [0] * tail
    return {
        "input_ids": np.array(tokens, np.int32),
        LABELS: np.array(labels, np.int64),
        POSITION_IDS: np.array(positions, np.int64),
        "routing": np.array(routing, np.uint8).reshape(-1, ROUTING_WIDTH),
        "logprobs": np.array(logprobs, np.float32),
        "old_logprobs": np.array(old_logprobs, np.float32),
        "loss_mask": np.array(mask, np.uint8),
    }


def check_consumer(plan, arrays, consumer: ConsumerId, settings: PackSettings, seen: dict) -> None:
    cp = plan.topology.backbone.cp
    assignment = plan.for_consumer(consumer)
    for mb in assignment.microbatches:
        layout, slot = pack_backbone(mb, read_bytes(mb, layout_of(mb, cp, settings), arrays), cp=cp, settings=settings)
        got = {spec.name: tensor_view(slot, spec) for spec in layout.tensors}
        if not mb.items:  # the planner equalises micro-batch counts with empty ones
            assert layout.num_tokens == 0 and not layout.reads and got[CU_SEQLENS].tolist() == [0]
            continue
        expected = reference(mb, arrays, cp, consumer.cp_rank, settings, layout.num_tokens)
        assert layout.num_tokens % settings.pack_multiple == 0
        for name, want in expected.items():
            np.testing.assert_array_equal(got[name], want, err_msg=name)
        # Bytes read are exactly the plan's needs.
        assert layout.needed_bytes == mb.needed_bytes
        # Boundaries and non-sequence fields.
        local = [item.padded_tokens // cp for item in mb.items]
        np.testing.assert_array_equal(got[CU_SEQLENS], np.concatenate([[0], np.cumsum(local)]))
        np.testing.assert_array_equal(got[CU_SEQLENS_GLOBAL],
                                      np.concatenate([[0], np.cumsum([i.padded_tokens for i in mb.items])]))
        np.testing.assert_array_equal(got[SEQ_LENGTHS], [i.trajectory.num_tokens for i in mb.items])
        np.testing.assert_array_equal(got["meta"], np.stack([arrays[i.trajectory.trajectory_id]["meta"]
                                                             for i in mb.items]))
        np.testing.assert_array_equal(got["scalar.reward"], [dict(i.trajectory.scalars)["reward"] for i in mb.items])
        for item in mb.items:
            for chunk in item.chunks:
                for t in range(chunk.tokens.start, chunk.tokens.end):
                    key = (item.trajectory.trajectory_id, t)
                    assert key not in seen, f"token {key} packed twice"
                    seen[key] = True


def layout_of(mb, cp, settings):
    return backbone_layout(mb, cp=cp, settings=settings)


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 90), min_size=1, max_size=9),
    dp=st.integers(1, 3),
    cp=st.integers(1, 3),
    budget=st.integers(40, 200),
    with_mask=st.booleans(),
    pack_multiple=st.sampled_from([1, 8, 64]),
    seed=st.integers(0, 2**16),
)
def test_packed_tensors_match_the_reference(lengths, dp, cp, budget, with_mask, pack_multiple, seed) -> None:
    if len(lengths) < dp:
        lengths = lengths * dp
    rng = np.random.default_rng(seed)
    arrays, trajectories = {}, []
    for index, length in enumerate(lengths):
        fields = make_fields(rng, length, with_mask=with_mask)
        arrays[f"t{index}"] = fields
        trajectories.append(make_trajectory(index, fields))
    topology = Topology(backbone=BackboneTopology(dp=dp, cp=cp, tp=2, max_tokens_per_microbatch=budget))
    plan = plan_minibatch(trajectories, topology)
    pack = PackSettings(pad_token_id=7, pack_multiple=pack_multiple)
    seen: dict = {}
    for consumer in plan.consumers():
        check_consumer(plan, arrays, consumer, pack, seen)
    assert len(seen) == sum(lengths), "every real token is packed exactly once over all (dp, cp) consumers"


def test_non_label_fields_are_read_straight_into_place_and_labels_through_scratch() -> None:
    rng = np.random.default_rng(1)
    arrays = {f"t{i}": make_fields(rng, n, with_mask=True) for i, n in enumerate((37, 64, 5))}
    trajectories = [make_trajectory(i, arrays[f"t{i}"]) for i in range(3)]
    plan = plan_minibatch(trajectories, Topology(backbone=BackboneTopology(dp=1, cp=2, max_tokens_per_microbatch=999)))
    mb = plan.for_consumer(ConsumerId(role="backbone", dp_rank=0, cp_rank=0)).microbatches[0]
    layout = backbone_layout(mb, cp=2, settings=PackSettings())
    by_field = {}
    for item in mb.items:
        for read in item.reads:
            by_field[read.unit.key] = read.unit.field_name
    destinations = {by_field[p.key]: p.destination for p in layout.reads}
    assert destinations["routing"] is Destination.SLOT
    assert destinations["loss_mask"] is Destination.SLOT
    assert destinations["meta"] is Destination.SLOT
    assert destinations["input_ids"] is Destination.SCRATCH  # carries one token of look-ahead
    assert destinations["old_logprobs"] is Destination.SCRATCH  # token-aligned: shifted, so it needs look-ahead
    for spec in layout.tensors:
        assert spec.offset % 64 == 0


def test_encoding_positions_agree_with_the_plan_adapter() -> None:
    rng = np.random.default_rng(2)
    arrays, trajectories = {}, []
    for index, length in enumerate((40, 33, 52, 20)):
        arrays[f"t{index}"] = make_fields(rng, length, with_mask=False)
        image = MultimodalRef(key=f"ns/s/s{index // 2}/mm/{index // 2:08x}", encoder="vision", cost=4.0,
                              placeholder=TokenSpan(start=3, end=17),
                              header=header_of(np.zeros((2, 2, 3), np.uint8), to_numpy(np.zeros(1, np.uint8),
                                                                                        field="x")[1], sequence=False))
        trajectories.append(make_trajectory(index, arrays[f"t{index}"], images=(image,)))
    topology = Topology(backbone=BackboneTopology(dp=2, cp=2, tp=2, max_tokens_per_microbatch=60),
                        encoders=(EncoderTopology(name="vision", dp=2, max_cost_per_microbatch=8),))
    plan = plan_minibatch(trajectories, topology)
    checked = 0
    for consumer in plan.consumers():
        if consumer.encoder_name is not None:
            assignment = plan.for_consumer(consumer)
            for emb in assignment.encoder_microbatches:
                layout = encoder_layout(emb)
                assert layout.needed_bytes == emb.needed_bytes
                if emb.encodings:
                    assert layout.tensor("inputs").shape == (len(emb.encodings), 2, 2, 3)
            continue
        for mb in plan.for_consumer(consumer).microbatches:
            layout = backbone_layout(mb, cp=2, settings=PackSettings())
            offsets = dict(zip((i.trajectory_index for i in mb.items), layout.item_offsets, strict=True))
            for use in layout.encodings:
                item = next(i for i in mb.items if i.trajectory.trajectory_id == use.trajectory_id)
                source = next(u for u in item.encodings if (u.reference, u.row_start) == (use.reference, use.row_start))
                expected = local_token_position(plan, item.trajectory_index, consumer.cp_rank,
                                                source.positions.start, offsets[item.trajectory_index])
                assert use.packed_start == expected
                assert use.num_rows == source.positions.length
                checked += 1
    assert checked > 0


def test_reserved_and_inconsistent_fields_are_rejected() -> None:
    rng = np.random.default_rng(3)
    good = make_fields(rng, 10, with_mask=False)
    bad = dict(good, labels=good["input_ids"].copy())
    plan = plan_minibatch([make_trajectory(0, bad)],
                          Topology(backbone=BackboneTopology(dp=1, max_tokens_per_microbatch=99)))
    mb = plan.for_consumer(ConsumerId(role="backbone", dp_rank=0)).microbatches[0]
    with pytest.raises(InvalidArgument, match="reserved"):
        backbone_layout(mb, cp=1, settings=PackSettings())

    other = {k: v for k, v in make_fields(rng, 12, with_mask=False).items() if k != "routing"}
    plan = plan_minibatch([make_trajectory(0, good), make_trajectory(1, other)],
                          Topology(backbone=BackboneTopology(dp=1, max_tokens_per_microbatch=99)))
    mb = plan.for_consumer(ConsumerId(role="backbone", dp_rank=0)).microbatches[0]
    with pytest.raises(InvalidArgument) as info:
        backbone_layout(mb, cp=1, settings=PackSettings())
    assert info.value.field.startswith("items[1]")


@pytest.mark.parametrize("value", [0, -1, True])
def test_pack_settings_validate(value) -> None:
    with pytest.raises(InvalidArgument) as info:
        PackSettings(pack_multiple=value)
    assert info.value.field == "pack_multiple"


def test_a_token_aligned_field_without_look_ahead_or_a_token_aligned_tokens_field_is_refused() -> None:
    rng = np.random.default_rng(4)
    fields = make_fields(rng, 20, with_mask=True)
    plan = plan_minibatch([make_trajectory(0, fields)], Topology(backbone=BackboneTopology(dp=1, cp=2,
                                                                                          max_tokens_per_microbatch=99)))
    mb = plan.for_consumer(ConsumerId(role="backbone", dp_rank=0, cp_rank=0)).microbatches[0]
    item = mb.items[0]
    index = next(k for k, r in enumerate(item.reads) if r.unit.field_name == "old_logprobs")
    reads = list(item.reads)
    reads[index] = replace(reads[index], look_ahead=False)
    with pytest.raises(InvalidArgument) as info:
        backbone_layout(replace(mb, items=(replace(item, reads=tuple(reads)),)), cp=2, settings=PackSettings())
    assert info.value.field == f"items[0].reads[{index}].look_ahead"
    tokens = next(k for k, r in enumerate(item.reads) if r.unit.field_name == "input_ids")
    reads = list(item.reads)
    reads[tokens] = replace(reads[tokens], unit=replace(reads[tokens].unit, alignment=FieldAlignment.TOKEN))
    with pytest.raises(InvalidArgument) as info:
        backbone_layout(replace(mb, items=(replace(item, reads=tuple(reads)),)), cp=2, settings=PackSettings())
    assert info.value.field == f"items[0].reads[{tokens}].unit.alignment"
