"""The planner's plan becomes an encoding schedule whose placeholder rows land on the right packed tokens."""

from __future__ import annotations

import pytest
import torch

from knittrans.admission.planning.planner import plan_minibatch
from knittrans.demo.model import Backbone, BackboneConfig, EncoderConfig, VisionEncoder
from knittrans.demo.multimodal_batch import (
    SyntheticMinibatch,
    duplicated_features,
    feature_positions,
    make_grpo_minibatch,
    micro_batch_loss,
    pack_micro_batch,
)
from knittrans.errors import InvalidArgument
from knittrans.plan import Plan, zigzag_chunks
from knittrans.train import EncodingUse, schedule_from_plan
from knittrans.train.reuse import GatheredEncodings, train_minibatch
from knittrans.types import (
    BackboneTopology,
    EncoderTopology,
    MultimodalRef,
    TokenSpan,
    Topology,
    TrajectoryMeta,
    VersionSegment,
)

ENCODER = EncoderConfig(image_size=16, patch_size=4, dim=32, depth=1, heads=4, merge=2, out_dim=32)
BACKBONE = BackboneConfig(vocab_size=64, dim=32, depth=1, heads=4)


def synthetic_batch() -> SyntheticMinibatch:
    return make_grpo_minibatch(
        num_samples=3,
        group_size=4,
        images_per_sample=2,
        rows_per_image=ENCODER.num_rows,
        image_shape=(3, ENCODER.image_size, ENCODER.image_size),
        vocab_size=BACKBONE.vocab_size,
        repeat_image_in_response=True,
        seed=3,
    )


def metadata(batch: SyntheticMinibatch) -> list[TrajectoryMeta]:
    metas = []
    for t in batch.trajectories:
        _, mask = t.labels_and_mask()
        metas.append(
            TrajectoryMeta(
                trajectory_id=t.trajectory_id,
                sample_id=t.sample_id,
                source="synthetic",
                rollout_step=0,
                num_tokens=t.num_tokens,
                num_loss_tokens=int(sum(mask)),
                segments=(VersionSegment(version=0, num_tokens=t.num_tokens),),
                multimodal=tuple(
                    MultimodalRef(
                        key=p.key,
                        encoder="vision",
                        cost=1.0,
                        placeholder=TokenSpan(start=p.start, end=p.start + batch.rows_per_image),
                    )
                    for p in t.images
                ),
            )
        )
    return metas


def plan_for(batch: SyntheticMinibatch, *, dp: int, cp: int, tp: int, encoder_dp: int) -> Plan:
    topology = Topology(
        backbone=BackboneTopology(dp=dp, cp=cp, tp=tp, max_tokens_per_microbatch=96),
        encoders=(EncoderTopology(name="vision", dp=encoder_dp, max_cost_per_microbatch=3),),
    )
    plan = plan_minibatch(metadata(batch), topology)
    plan.validate()
    return plan


def packed_indices(plan: Plan, trajectory: int, cp_rank: int) -> list[int | None]:
    """The packed layout written independently of the adapter: CP rank's two chunks at padded length."""
    cp = plan.topology.backbone.cp
    chunk = int(plan.backbone.padded_tokens[trajectory]) // (2 * cp)
    length = plan.trajectories[trajectory].num_tokens
    return [g if g < length else None for c in zigzag_chunks(cp, cp_rank) for g in range(c * chunk, (c + 1) * chunk)]


def expand(uses: tuple[EncodingUse, ...]) -> set[tuple[int, str, int]]:
    return {(u.position + k, u.key, u.first_row + k) for u in uses for k in range(u.num_rows)}


@pytest.mark.parametrize(("dp", "cp", "tp", "encoder_dp"), [(1, 1, 1, 1), (2, 1, 2, 3), (1, 2, 2, 4), (2, 2, 1, 2)])
def test_uses_match_the_packed_layout_on_every_rank(dp: int, cp: int, tp: int, encoder_dp: int) -> None:
    batch = synthetic_batch()
    plan = plan_for(batch, dp=dp, cp=cp, tp=tp, encoder_dp=encoder_dp)
    schedule = schedule_from_plan(plan, encoder="vision")
    assert schedule.world_size == dp * cp * tp and schedule.tp_size == tp
    assert {r.key for r in schedule.routes} == set(batch.images)
    owners = {r.owner for r in schedule.routes}
    assert owners <= set(range(min(encoder_dp, schedule.world_size)))
    for rank in schedule.ranks:
        assert len(rank.backbone_micro_batches) == plan.microbatches_per_rank
        for j, trajectories in enumerate(plan.microbatches(rank.dp_rank)):
            ids = [plan.trajectories[int(t)].trajectory_id for t in trajectories]
            layout = [packed_indices(plan, int(t), rank.cp_rank) for t in trajectories]
            want = pack_micro_batch(batch, ids, layout).uses
            assert expand(rank.backbone_micro_batches[j].uses) == expand(want)
    if cp > 1:  # some placeholder is cut by a chunk boundary
        assert any(u.first_row > 0 for r in schedule.ranks for m in r.backbone_micro_batches for u in m.uses)


def test_single_rank_plan_trains_like_the_duplicated_path() -> None:
    batch = synthetic_batch()
    plan = plan_for(batch, dp=1, cp=1, tp=1, encoder_dp=1)
    schedule = schedule_from_plan(plan, encoder="vision")
    micros = []
    for trajectories in plan.microbatches(0):
        ids = [plan.trajectories[int(t)].trajectory_id for t in trajectories]
        micros.append(pack_micro_batch(batch, ids, [packed_indices(plan, int(t), 0) for t in trajectories]))
    normalizer = plan.backbone.minibatch_loss_tokens

    torch.manual_seed(0)
    encoder, backbone = VisionEncoder(ENCODER), Backbone(BACKBONE)
    for micro in micros:
        features = duplicated_features(encoder, batch, micro.uses)
        micro_batch_loss(backbone, micro, features, feature_positions(micro.uses), normalizer).backward()
    want = [p.grad.clone() for m in (encoder, backbone) for p in m.parameters()]

    torch.manual_seed(0)
    encoder, backbone = VisionEncoder(ENCODER), Backbone(BACKBONE)

    def step(gathered: GatheredEncodings) -> torch.Tensor:
        micro = micros[gathered.micro_batch]
        return micro_batch_loss(backbone, micro, gathered.features, gathered.positions, normalizer)

    train_minibatch(
        encoder=encoder,
        encoder_inputs=lambda m: torch.stack([batch.images[k] for k in m.keys]),
        backbone_step=step,
        schedule=schedule,
    )
    got = [p.grad for m in (encoder, backbone) for p in m.parameters()]
    for g, w in zip(got, want, strict=True):
        assert float((g - w).abs().max()) <= 2e-5 * float(w.abs().max())


def test_rank_maps_must_be_permutations() -> None:
    plan = plan_for(synthetic_batch(), dp=2, cp=1, tp=1, encoder_dp=2)
    with pytest.raises(InvalidArgument, match="not a permutation") as info:
        schedule_from_plan(plan, encoder="vision", backbone_rank=lambda d, c, t: 0)
    assert info.value.field == "backbone_rank"
    with pytest.raises(InvalidArgument, match=r"outside 0\.\.1"):
        schedule_from_plan(plan, encoder="vision", encoder_rank=lambda d: d + 5)
    with pytest.raises(InvalidArgument, match="unknown encoder"):
        schedule_from_plan(plan, encoder="audio")
