"""What a sidecar checks before delivering a mini-batch: every unit its part reads, with the size its header says,
the same whether the assignment came decoded or as its protobuf; and the first unit that is missing or of another
size is blamed, with its trajectory."""

from __future__ import annotations

import random

import pytest

from knittrans.admission.planning import plan_minibatch
from knittrans.plan.proto import assignment_to_proto
from knittrans.reorg.assignments import Admission, AssignmentEvent
from knittrans.reorg.verification import first_mismatch, stored_units
from knittrans.types import (
    BackboneTopology,
    ConsumerId,
    DType,
    EncoderTopology,
    MultimodalRef,
    TokenSpan,
    Topology,
    TrajectoryMeta,
    UnitHeader,
    VersionSegment,
)
from tests.builders import digest, token_unit

TOPOLOGY_ARGS = {"backbone": BackboneTopology(dp=2, cp=2, max_tokens_per_microbatch=256),
                 "encoders": (EncoderTopology(name="vision", dp=1, max_cost_per_microbatch=20),)}


def meta(index: int) -> TrajectoryMeta:
    tokens = 40 + 37 * index
    trajectory_id, sample_id = f"t{index}", f"s{index // 2}"  # two trajectories share each sample's image
    image = MultimodalRef(key=f"{sample_id}/img", encoder="vision", cost=8.0, placeholder=TokenSpan(start=2, end=6),
                          header=UnitHeader(dtype=DType.UINT8, shape=(4, 4, 3), byte_length=48,
                                            content_hash=digest(sample_id)))
    return TrajectoryMeta(
        trajectory_id=trajectory_id, sample_id=sample_id, source="A", rollout_step=0, num_tokens=tokens,
        num_loss_tokens=tokens // 2, segments=(VersionSegment(version=0, num_tokens=tokens),),
        units=(token_unit(trajectory_id, "input_ids", tokens),
               token_unit(trajectory_id, "routing", tokens, DType.UINT8, width=4)),
        multimodal=(image,),
    )


@pytest.fixture(scope="module")
def plan():
    return plan_minibatch([meta(i) for i in range(8)], Topology(**TOPOLOGY_ARGS))


def events(plan, consumer: ConsumerId) -> list[AssignmentEvent]:
    part = plan.for_consumer(consumer)
    common = {"sequence": 1, "admission": Admission(), "global_loss_tokens": part.minibatch_loss_tokens,
              "consumer": consumer}
    return [AssignmentEvent(decoded=part, **common), AssignmentEvent(message=assignment_to_proto(part), **common)]


def test_every_unit_of_every_part_is_checked_once_with_its_header_size_in_either_form(plan) -> None:
    metas = {m.trajectory_id: m for m in (meta(i) for i in range(8))}
    expected_backbone = {u.key: (u.header.byte_length, m.trajectory_id) for m in metas.values() for u in m.units}
    expected_images = {r.key: r.header.byte_length for m in metas.values() for r in m.multimodal}
    backbone: dict[str, tuple[int, str]] = {}
    for d in range(2):
        for c in range(2):
            decoded, message = events(plan, ConsumerId(role="backbone", dp_rank=d, cp_rank=c))
            units = stored_units(decoded)
            assert units == stored_units(message)
            assert len({u.key for u in units}) == len(units)
            backbone.update({u.key: (u.byte_length, u.trajectory_id) for u in units})
    assert backbone == expected_backbone  # every CP rank reads (a range of) each of its trajectories' units
    decoded, message = events(plan, ConsumerId(role="encoder:vision", dp_rank=0))
    units = stored_units(decoded)
    assert units == stored_units(message)
    assert {u.key: u.byte_length for u in units} == expected_images
    for unit in units:  # an image is blamed on a trajectory that uses it
        assert unit.key in {r.key for r in metas[unit.trajectory_id].multimodal}


@pytest.mark.parametrize("seed", range(5))
def test_the_first_missing_or_resized_unit_is_blamed(plan, seed: int) -> None:
    rng = random.Random(seed)
    consumer = ConsumerId(role="backbone", dp_rank=rng.randrange(2), cp_rank=rng.randrange(2))
    units = stored_units(events(plan, consumer)[1])
    sizes: list[int | None] = [u.byte_length for u in units]
    assert first_mismatch(units, sizes) is None
    damaged = sorted(rng.sample(range(len(units)), 2))
    sizes[damaged[0]] = None if seed % 2 else sizes[damaged[0]] + 1
    sizes[damaged[1]] = None
    found = first_mismatch(units, sizes)
    victim = units[damaged[0]]
    assert found is not None and found.microbatch_index == victim.microbatch_index
    assert (found.failure.trajectory_id, found.failure.unit_key) == (victim.trajectory_id, victim.key)
    assert ("missing" if seed % 2 else "bytes") in found.failure.reason
