"""DP balancing: equal micro-batch counts under skew, budgets, the two schemes, the encoder plan."""

from __future__ import annotations

import numpy as np
import pytest
from planning_data import image, topology, trajectory

from knittrans.admission.planning import plan_minibatch
from knittrans.admission.planning.backbone import sequence_workloads
from knittrans.admission.planning.partition import karmarkar_karp
from knittrans.plan import BalanceScheme
from knittrans.types import ConsumerId, EncoderTopology


@pytest.mark.parametrize("dp", [2, 3, 8])
@pytest.mark.parametrize("multiple", [1, 2])
def test_equal_microbatch_counts_under_very_skewed_lengths(dp: int, multiple: int) -> None:
    # One sequence 400× the rest and over the budget, plus many tiny ones.
    lengths = [40_000] + [100] * 37 + [3_000, 2_500]
    plan = plan_minibatch(
        [trajectory(f"t{i}", n) for i, n in enumerate(lengths)],
        topology(dp=dp, cp=2, budget=4096, quadratic=1e-4, microbatch_multiple=multiple),
    )
    plan.validate()
    counts = [len(plan.microbatches(d)) for d in range(dp)]
    assert counts == [plan.microbatches_per_rank] * dp
    assert plan.microbatches_per_rank % multiple == 0
    assert plan.quality.oversize_microbatches == 1
    oversize = [mb for d in range(dp) for mb in plan.microbatches(d) if 0 in mb.tolist()]
    assert [len(mb) for mb in oversize] == [1]
    # Nothing was padded while a micro-batch could still be split.
    assert plan.quality.empty_microbatches == 0


def test_empty_microbatches_pad_only_when_there_are_fewer_sequences_than_slots() -> None:
    plan = plan_minibatch([trajectory("a", 50), trajectory("b", 60)], topology(dp=4, cp=1, budget=1000))
    plan.validate()
    assert plan.microbatches_per_rank == 1
    assert plan.quality.empty_microbatches == 2
    assert sorted(len(mb) for d in range(4) for mb in plan.microbatches(d)) == [0, 0, 1, 1]


def test_budget_holds_except_for_oversize_singletons() -> None:
    rng = np.random.default_rng(3)
    lengths = rng.integers(1, 9000, size=200).tolist()
    plan = plan_minibatch([trajectory(f"t{i}", n) for i, n in enumerate(lengths)], topology(dp=4, cp=2, budget=8192))
    padded = plan.backbone.padded_tokens
    for d in range(4):
        for mb in plan.microbatches(d):
            assert len(mb) == 1 or padded[mb].sum() <= 8192


def _verl_style_imbalance(padded: np.ndarray, workloads: np.ndarray, dp: int) -> float:
    """verl's default: equal-count Karmarkar–Karp on sequence length, scored on workload."""
    parts = karmarkar_karp(padded.tolist(), dp, equal_count=True)
    loads = [workloads[part].sum() for part in parts]
    return float(max(loads) / np.mean(loads))


@pytest.mark.parametrize(
    ("count", "dp", "cp", "seed"), [(512, 4, 1, 1), (512, 8, 2, 2), (256, 16, 1, 3), (1024, 32, 4, 4)]
)
def test_balance_beats_verl_style_length_balancing_on_attention_heavy_lengths(
    count: int, dp: int, cp: int, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(np.log(8192) - 0.5, 1.0, count), 256, 65536).astype(int)
    topo = topology(dp=dp, cp=cp, budget=65536, quadratic=1 / 24576)
    plan = plan_minibatch([trajectory(f"t{i}", int(n), fields=False) for i, n in enumerate(lengths)], topo)
    workloads = sequence_workloads(plan.backbone.padded_tokens, topo.backbone.cost)
    verl = _verl_style_imbalance(plan.backbone.padded_tokens, workloads, dp)
    bound = max(1.0, workloads.max() / (workloads.sum() / dp))
    assert plan.quality.imbalance <= verl
    assert plan.quality.imbalance <= max(1.05, bound * 1.01)


def test_dealing_first_is_kept_when_few_microbatches_per_rank_leave_pack_then_deal_coarse() -> None:
    lengths = [9000, 8800, 8700, 1000, 900, 800, 700, 600, 500, 400, 300, 200]
    trajectories = [trajectory(f"t{i}", n, fields=False) for i, n in enumerate(lengths)]
    topo = topology(dp=3, cp=1, budget=10000, quadratic=1e-4)
    strict = plan_minibatch(trajectories, topo, balance_target=1.0)
    lenient = plan_minibatch(trajectories, topo, balance_target=100.0)
    assert lenient.quality.scheme is BalanceScheme.PACK_THEN_DEAL
    assert strict.quality.scheme is BalanceScheme.DEAL_THEN_PACK
    assert strict.quality.imbalance < lenient.quality.imbalance
    strict.validate()
    lenient.validate()


def test_ranks_consume_their_heaviest_microbatch_first() -> None:
    rng = np.random.default_rng(5)
    lengths = rng.integers(100, 5000, size=120).tolist()
    plan = plan_minibatch([trajectory(f"t{i}", n) for i, n in enumerate(lengths)], topology(dp=3, cp=2, budget=6000))
    workloads = sequence_workloads(plan.backbone.padded_tokens, plan.topology.backbone.cost)
    for d in range(3):
        per_microbatch = [workloads[mb].sum() for mb in plan.microbatches(d)]
        assert per_microbatch == sorted(per_microbatch, reverse=True)


def test_planning_is_deterministic() -> None:
    rng = np.random.default_rng(9)
    trajectories = [trajectory(f"t{i}", int(n)) for i, n in enumerate(rng.integers(1, 7000, size=64))]
    topo = topology(dp=4, cp=2, tp=2, budget=9000, quadratic=1e-4)
    assert plan_minibatch(trajectories, topo) == plan_minibatch(list(trajectories), topo)


def test_encoder_plan_dedups_group_repeats_and_balances_cost() -> None:
    encoders = (EncoderTopology(name="vision", dp=3, max_cost_per_microbatch=5000.0),)
    trajectories = []
    for s in range(6):
        images = tuple(image(f"s{s}/img{k}", 10 + 50 * k, 20 + 5 * s + k) for k in range(2))
        trajectories += [trajectory(f"s{s}t{g}", 400 + 37 * g, sample=f"s{s}", multimodal=images) for g in range(8)]
    plan = plan_minibatch(trajectories, topology(dp=2, cp=2, tp=2, budget=2048, encoders=encoders))
    plan.validate()
    assert plan.quality.references == 96
    assert plan.quality.unique_encodings == 12
    assert plan.quality.dedup_factor == 8.0
    quality = plan.quality.encoders[0]
    assert quality.imbalance < 1.2
    counts = [len(plan.encoder_microbatches("vision", d)) for d in range(3)]
    assert counts == [quality.microbatches_per_rank] * 3
    owned = sorted(int(e) for d in range(3) for mb in plan.encoder_microbatches("vision", d) for e in mb)
    assert owned == list(range(12))
    costs = [plan.encoding(e).cost for e in range(12)]
    for d in range(3):
        for mb in plan.encoder_microbatches("vision", d):
            assert len(mb) == 1 or sum(costs[int(e)] for e in mb) <= 5000.0
    # An encoder consumer gets its micro-batches with every route of each encoding (TP replicas included).
    assignment = plan.for_consumer(ConsumerId(role="encoder:vision", dp_rank=0))
    for mb in assignment.encoder_microbatches:
        for enc in mb.encodings:
            references = {r.reference for r in enc.routes}
            assert len(references) == 8
            assert {r.tp_rank for r in enc.routes} == {0, 1}
            assert enc.encoding.needed_bytes == enc.encoding.header.byte_length


def test_an_encoder_without_inputs_gets_zero_microbatches() -> None:
    encoders = (
        EncoderTopology(name="vision", dp=2, max_cost_per_microbatch=100.0),
        EncoderTopology(name="audio", dp=2, max_cost_per_microbatch=100.0),
    )
    plan = plan_minibatch(
        [trajectory("t", 100, multimodal=(image("s/i", 0, 5),))], topology(dp=1, cp=1, budget=512, encoders=encoders)
    )
    plan.validate()
    assert plan.encoder_plan("audio").microbatches_per_rank == 0
    assert plan.for_consumer(ConsumerId(role="encoder:audio", dp_rank=1)).encoder_microbatches == ()
    vision = [len(plan.encoder_microbatches("vision", d)) for d in range(2)]
    assert vision == [1, 1]
    assert plan.quality.encoders[0].empty_microbatches == 1
