"""The encoding schedule built from every rank's local part (its consumers' assignments) equals the one the
full plan gives, and parts that do not fit together are refused."""

from __future__ import annotations

import pytest

from knittrans.admission.planning import plan_minibatch
from knittrans.demo.schedule_exchange import RankEncodingPart, rank_part, schedule_from_parts
from knittrans.demo.workload import WorkloadSpec, generate_samples
from knittrans.errors import InvalidArgument
from knittrans.packed.layout import item_offsets, packed_encoding_uses
from knittrans.plan import Plan
from knittrans.store.arrays import header_of
from knittrans.train import schedule_from_plan
from knittrans.types import (
    BACKBONE_ROLE,
    BackboneTopology,
    ConsumerId,
    DType,
    EncoderTopology,
    MultimodalRef,
    Topology,
    TrajectoryMeta,
    UnitKey,
    VersionSegment,
)

SPEC = WorkloadSpec(seed=2)


def metadata() -> list[TrajectoryMeta]:
    """Metadata of generated samples (no store needed: the plan is a function of the metadata)."""
    metas = []
    for sample in generate_samples(SPEC, 6):
        header = header_of(sample.image, DType.UINT8, sequence=False)
        for t in sample.trajectories:
            metas.append(
                TrajectoryMeta(
                    trajectory_id=t.trajectory_id,
                    sample_id=sample.sample_id,
                    source=sample.source,
                    rollout_step=0,
                    num_tokens=t.num_tokens,
                    num_loss_tokens=t.num_loss_tokens,
                    segments=(VersionSegment(version=0, num_tokens=t.generated_tokens),),
                    multimodal=(
                        MultimodalRef(
                            key=f"demo/s/{sample.sample_id}/mm/{header.content_hash}",
                            encoder="vision",
                            cost=16.0,
                            placeholder=sample.placeholder,
                            header=header,
                        ),
                    ),
                )
            )
    return metas


def parts_of(plan: Plan) -> list[RankEncodingPart]:
    b = plan.topology.backbone
    encoder_dp = plan.topology.encoder("vision").dp
    parts = []
    for rank in range(b.dp * b.cp):
        dp_rank, cp_rank = divmod(rank, b.cp)
        backbone = plan.for_consumer(ConsumerId(role=BACKBONE_ROLE, dp_rank=dp_rank, cp_rank=cp_rank))
        encoder = (
            plan.for_consumer(ConsumerId(role="encoder:vision", dp_rank=rank)).encoder_microbatches
            if rank < encoder_dp
            else ()
        )
        parts.append(
            rank_part(
                dp_rank=dp_rank,
                cp_rank=cp_rank,
                backbone_uses=[packed_encoding_uses(mb, item_offsets(mb, b.cp)) for mb in backbone.microbatches],
                encoder_micro_batches=encoder,
            )
        )
    return parts


@pytest.mark.parametrize(("dp", "cp", "encoder_dp"), [(1, 1, 1), (1, 2, 2), (2, 2, 2), (2, 2, 4), (2, 1, 1)])
def test_parts_give_the_plans_schedule(dp: int, cp: int, encoder_dp: int) -> None:
    topology = Topology(
        backbone=BackboneTopology(dp=dp, cp=cp, max_tokens_per_microbatch=160),
        encoders=(EncoderTopology(name="vision", dp=encoder_dp, max_cost_per_microbatch=32),),
    )
    plan = plan_minibatch(metadata(), topology)
    want = schedule_from_plan(plan, encoder="vision")
    parts = parts_of(plan)
    got = schedule_from_parts([RankEncodingPart.from_json(p.to_json()) for p in parts])  # the wire form
    # One route builder: the demo's gathered parts and the planner adapter give the very same schedule.
    assert got == want
    assert got.fingerprint() == want.fingerprint() == schedule_from_parts(parts).fingerprint()


def test_parts_that_do_not_fit_are_refused() -> None:
    use = ((UnitKey("demo/s/x/mm/00000000"), 4),)
    owner = RankEncodingPart(dp_rank=0, cp_rank=0, encoder_micro_batches=(use,))
    with pytest.raises(InvalidArgument, match="computed by ranks 0 and 1"):
        schedule_from_parts([owner, RankEncodingPart(dp_rank=1, cp_rank=0, encoder_micro_batches=(use,))])
    plan = plan_minibatch(
        metadata(),
        Topology(
            backbone=BackboneTopology(dp=1, cp=1, max_tokens_per_microbatch=160),
            encoders=(EncoderTopology(name="vision", dp=1, max_cost_per_microbatch=32),),
        ),
    )
    (consumer,) = parts_of(plan)
    with pytest.raises(InvalidArgument, match="no rank computes them"):
        schedule_from_parts(
            [RankEncodingPart(dp_rank=0, cp_rank=0, backbone_micro_batches=consumer.backbone_micro_batches)]
        )
