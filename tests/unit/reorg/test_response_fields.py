"""Response-only fields (DESIGN.md §10) against a naive reference, on real planner output.

A response-only field stores only tokens ``[response_start, num_tokens)``. The reference pads it to the whole
sequence with the fill value (0) and packs it the old way, as a whole-sequence field; its mask is a whole-sequence
presence field (0 over the prompt, 1 over the response) packed the same way, with the same alignment. The
response-only path must give the same tensors, and read only the response part of the reference's reads.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from knittrans.admission.planning import plan_minibatch
from knittrans.errors import InvalidArgument
from knittrans.plan import MicroBatchAssignment
from knittrans.reorg.packing import PackSettings, backbone_layout, pack_backbone, tensor_view
from knittrans.store.arrays import header_of, to_numpy
from knittrans.types import (
    BackboneTopology,
    ConsumerId,
    Coverage,
    FieldAlignment,
    Topology,
    TrajectoryMeta,
    UnitKind,
    UnitRef,
    VersionSegment,
)

PACK = PackSettings(pad_token_id=3, pack_multiple=8)
RESPONSE_FIELDS = ("old_logprobs", "advantages")
PRESENT = "__present"  # the reference's presence field of a response-only field


def presence_name(name: str) -> str:
    return f"{name}{PRESENT}"


def meta_of(index: int, arrays: dict[str, np.ndarray], *, num_tokens: int, response_start: int,
            alignments: dict[str, FieldAlignment | None], response_only: bool) -> TrajectoryMeta:
    units = []
    for name, array in arrays.items():
        _, dtype = to_numpy(array, field=name)
        base = name.removesuffix(PRESENT)
        units.append(UnitRef(
            key=f"ns/t/t{index}/{name}", field_name=name, kind=UnitKind.TOKEN_FIELD,
            header=header_of(array, dtype, sequence=True), alignment=alignments.get(base),
            coverage=Coverage.RESPONSE if response_only and name in RESPONSE_FIELDS else Coverage.SEQUENCE))
    return TrajectoryMeta(
        trajectory_id=f"t{index}", sample_id=f"s{index}", source="math", rollout_step=0, num_tokens=num_tokens,
        num_loss_tokens=num_tokens - 1, segments=(VersionSegment(version=0, num_tokens=num_tokens),),
        units=tuple(units), response_start=response_start if response_only else 0)


def read_bytes(mb: MicroBatchAssignment, arrays: dict[str, dict[str, np.ndarray]]) -> list[bytes]:
    """What a store would return for each placement, sliced from the stored arrays."""
    by_key = {read.unit.key: (item.trajectory.trajectory_id, read.unit.field_name)
              for item in mb.items for read in item.reads}
    out = []
    for placement in backbone_layout(mb, cp=cp_of(mb), settings=PACK).reads:
        trajectory_id, name = by_key[placement.key]
        raw = arrays[trajectory_id][name].tobytes()
        assert placement.ranges is not None
        out.append(b"".join(raw[r.offset : r.end] for r in placement.ranges))
    return out


def cp_of(mb: MicroBatchAssignment) -> int:
    item = mb.items[0]
    return item.padded_tokens // (2 * item.chunks[0].padded.length)


def response_bytes(mb: MicroBatchAssignment, name: str) -> int:
    return sum(read.needed_bytes for item in mb.items for read in item.reads if read.unit.field_name == name)


def response_part_of_reference_reads(mb: MicroBatchAssignment, name: str, row_bytes: int) -> int:
    """The bytes of the reference's reads of a padded field that fall in the response."""
    total = 0
    for item in mb.items:
        start = response_starts[item.trajectory.trajectory_id]
        for read in item.reads:
            if read.unit.field_name == name:
                total += sum(max(span.end - max(span.start, start), 0) for span in read.spans) * row_bytes
    return total


response_starts: dict[str, int] = {}
alignment_choices = st.sampled_from([FieldAlignment.TOKEN, FieldAlignment.LABEL, None])


@settings(max_examples=60, deadline=None)
@given(
    shapes=st.lists(st.tuples(st.integers(1, 80), st.floats(0, 1)), min_size=1, max_size=7),
    dp=st.integers(1, 2),
    cp=st.sampled_from([1, 2, 4]),
    budget=st.integers(48, 256),
    logprob_alignment=alignment_choices,
    advantage_alignment=alignment_choices,
    seed=st.integers(0, 2**16),
)
def test_response_only_fields_pack_like_the_padded_field_and_read_only_the_response(
    shapes, dp, cp, budget, logprob_alignment, advantage_alignment, seed
) -> None:
    shapes = shapes * dp if len(shapes) < dp else shapes
    rng = np.random.default_rng(seed)
    alignments = {"old_logprobs": logprob_alignment, "advantages": advantage_alignment}
    stored, padded, response_metas, reference_metas = {}, {}, [], []
    for index, (length, where) in enumerate(shapes):
        start = round(where * length)  # anywhere in [0, length]: an empty response too
        response_starts[f"t{index}"] = start
        tokens = rng.integers(1, 50_000, size=length, dtype=np.int32)
        response = {"old_logprobs": rng.standard_normal(length - start).astype(np.float32),
                    "advantages": rng.standard_normal((length - start, 2)).astype(np.float32)}
        stored[f"t{index}"] = {"input_ids": tokens, **response}
        full = {"input_ids": tokens}
        for name, values in response.items():
            full[name] = np.concatenate([np.zeros((start, *values.shape[1:]), values.dtype), values])
            full[presence_name(name)] = (np.arange(length) >= start).astype(np.uint8)
        padded[f"t{index}"] = full
        response_metas.append(meta_of(index, stored[f"t{index}"], num_tokens=length, response_start=start,
                                      alignments=alignments, response_only=True))
        reference_metas.append(meta_of(index, full, num_tokens=length, response_start=start,
                                       alignments=alignments, response_only=False))
    topology = Topology(backbone=BackboneTopology(dp=dp, cp=cp, max_tokens_per_microbatch=budget))
    plan, reference_plan = plan_minibatch(response_metas, topology), plan_minibatch(reference_metas, topology)
    for consumer in plan.consumers():
        got_mbs = plan.for_consumer(consumer).microbatches
        want_mbs = reference_plan.for_consumer(consumer).microbatches
        for mb, reference_mb in zip(got_mbs, want_mbs, strict=True):
            assert [i.trajectory.trajectory_id for i in mb.items] == [
                i.trajectory.trajectory_id for i in reference_mb.items]
            if not mb.items:
                continue
            layout, slot = pack_backbone(mb, read_bytes(mb, stored), cp=cp, settings=PACK)
            reference_layout, reference_slot = pack_backbone(reference_mb, read_bytes(reference_mb, padded), cp=cp,
                                                             settings=PACK)
            got = {spec.name: tensor_view(slot, spec) for spec in layout.tensors}
            want = {spec.name: tensor_view(reference_slot, spec) for spec in reference_layout.tensors}
            for name in RESPONSE_FIELDS:
                np.testing.assert_array_equal(got[name], want[name], err_msg=name)
                np.testing.assert_array_equal(got[f"{name}.mask"], want[presence_name(name)], err_msg=f"{name}.mask")
                row_bytes = 4 * got[name][0].size
                assert response_bytes(mb, name) == response_part_of_reference_reads(reference_mb, name, row_bytes)
            for name in ("input_ids", "labels", "position_ids", "cu_seqlens", "loss_mask"):
                np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    # Over all ranks, a field read without look-ahead is read exactly once: its stored bytes, not one more.
    for name, alignment in alignments.items():
        if alignment is not FieldAlignment.TOKEN:
            read = sum(response_bytes(mb, name) for consumer in plan.consumers()
                       for mb in plan.for_consumer(consumer).microbatches)
            assert read == sum(arrays[name].nbytes for arrays in stored.values())


def test_the_planners_reads_of_a_response_field_start_at_its_own_row_zero() -> None:
    """cp = 2, 16 tokens, response from token 6: rank 0 holds chunks [0, 4) and [12, 16), rank 1 [4, 8) and [8, 12).
    A token-aligned response field is read from token 6 on only, with one token of look-ahead after each chunk."""
    logprobs = np.arange(10, dtype=np.float32)
    meta = meta_of(0, {"input_ids": np.arange(16, dtype=np.int32), "old_logprobs": logprobs}, num_tokens=16,
                   response_start=6, alignments={"old_logprobs": FieldAlignment.TOKEN}, response_only=True)
    plan = plan_minibatch([meta], Topology(backbone=BackboneTopology(dp=1, cp=2, max_tokens_per_microbatch=64)))
    reads = {}
    for cp_rank in (0, 1):
        (item,) = plan.for_consumer(ConsumerId(role="backbone", dp_rank=0, cp_rank=cp_rank)).microbatches[0].items
        (read,) = (r for r in item.reads if r.unit.field_name == "old_logprobs")
        reads[cp_rank] = ([(s.start, s.end) for s in read.spans], [(b.offset, b.length) for b in read.byte_ranges])
    assert reads[0] == ([(12, 16)], [(6 * 4, 4 * 4)])  # tokens 12..15 are rows 6..9; no look-ahead past the end
    assert reads[1] == ([(6, 13)], [(0, 7 * 4)])  # chunk [4, 8) from the response start, then [8, 12) + token 12


def test_a_label_field_or_the_tokens_field_cannot_cover_only_the_response() -> None:
    tokens = np.arange(6, dtype=np.int32)
    unit = UnitRef(key="ns/t/t0/input_ids", field_name="input_ids", kind=UnitKind.TOKEN_FIELD,
                   header=header_of(tokens, to_numpy(tokens, field="t")[1], sequence=True), coverage=Coverage.RESPONSE)
    meta = TrajectoryMeta(trajectory_id="t0", sample_id="s0", source="math", rollout_step=0, num_tokens=8,
                          num_loss_tokens=7, segments=(VersionSegment(version=0, num_tokens=8),), units=(unit,),
                          response_start=2)
    plan = plan_minibatch([meta], Topology(backbone=BackboneTopology(dp=1, cp=1, max_tokens_per_microbatch=64)))
    mb = plan.for_consumer(ConsumerId(role="backbone", dp_rank=0)).microbatches[0]
    with pytest.raises(InvalidArgument) as info:
        backbone_layout(mb, cp=1, settings=PACK)
    assert info.value.field == "items[0].reads[0].unit.coverage"


def test_a_unit_whose_rows_do_not_match_its_coverage_is_refused_naming_the_field() -> None:
    arrays = {"input_ids": np.arange(8, dtype=np.int32), "old_logprobs": np.zeros(8, np.float32)}
    with pytest.raises(InvalidArgument) as info:
        meta_of(0, arrays, num_tokens=8, response_start=3, alignments={}, response_only=True)
    assert info.value.field == "units[1].header.shape"
    assert "'old_logprobs'" in info.value.message and "needs 5" in info.value.message
    with pytest.raises(InvalidArgument) as info:
        meta_of(0, arrays, num_tokens=8, response_start=9, alignments={}, response_only=True)
    assert info.value.field == "response_start"
