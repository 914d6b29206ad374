"""Planner benchmark: KnitTrans pack-then-deal against the verl default and round-robin dealing, side by side.

For each mini-batch (lognormal lengths, mean 8k tokens, capped at 64k) and topology (dp × cp) it plans the
same trajectories three ways and prints one JSON document:

- ``knittrans``: ``plan_minibatch`` — first-fit-decreasing micro-batches under the token budget, split to a
  multiple of dp, dealt by equal-count Karmarkar–Karp on workloads (a·L + b·L²). Timed twice: text only, and
  with an encoder plan and route map (2 images per sample, group size 8);
- ``verl``: equal-count Karmarkar–Karp on sequence length over DP ranks (verl's ``_balance_batch``), then per
  rank ``ceil(tokens / budget)`` micro-batches, the maximum over ranks, by Karmarkar–Karp on length (verl's
  ``rearrange_micro_batches``);
- ``round_robin``: trajectory i to rank i mod dp, then the same per-rank micro-batching as ``verl``.

Every scheme is scored on the same figures: ``imbalance`` (max/mean workload per DP rank, what the optimizer
step waits for), ``lockstep_imbalance`` (sum over micro-batch steps of the slowest rank, over the mean: what
ranks that synchronise every micro-batch wait for), ``padding_tokens``, ``empty_microbatches``,
``budget_violations`` (micro-batches of several sequences over the budget) and ``plan_ms`` (best of
``--repeat``). ``imbalance_lower_bound`` is max(1, heaviest sequence / mean rank workload): no scheme that
keeps sequences whole can do better.

    python benchmarks/planner.py                 # the full matrix: 512 and 8192 trajectories, dp 4/32, cp 1/4
    python benchmarks/planner.py --quick         # 512 trajectories only
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from knittrans.admission.planning import plan_minibatch
from knittrans.admission.planning.backbone import sequence_workloads
from knittrans.admission.planning.partition import karmarkar_karp
from knittrans.plan import padded_lengths
from knittrans.types import (
    BackboneTopology,
    CostModel,
    EncoderTopology,
    MultimodalRef,
    TokenSpan,
    Topology,
    TrajectoryMeta,
    VersionSegment,
)

MEAN_TOKENS = 8192
MAX_TOKENS = 65536
MIN_TOKENS = 1024  # a prompt, with room for its images
SIGMA = 1.0
GROUP_SIZE = 8
IMAGES_PER_SAMPLE = 2
IMAGE_ROWS = 64  # encoder output rows per image: 64 to 256
# A 7B-like model (hidden 4096): causal attention adds about L/(6·hidden) of the linear work per token.
COST = CostModel(linear=1.0, quadratic=1.0 / (6 * 4096))
CONTENT_HASH = hashlib.blake2b(b"knittrans-planner-benchmark", digest_size=16).hexdigest()


def sample_lengths(count: int, rng: np.random.Generator) -> np.ndarray:
    """Lognormal lengths with mean MEAN_TOKENS before clipping to [MIN_TOKENS, MAX_TOKENS]."""
    mu = math.log(MEAN_TOKENS) - SIGMA**2 / 2
    return np.clip(rng.lognormal(mu, SIGMA, count), MIN_TOKENS, MAX_TOKENS).astype(np.int64)


def make_trajectories(lengths: np.ndarray, *, multimodal: bool) -> list[TrajectoryMeta]:
    trajectories = []
    for i, length in enumerate(lengths.tolist()):
        sample = i // GROUP_SIZE
        images = ()
        if multimodal:
            # The images sit in the prompt, which every trajectory of the sample shares.
            rows = [IMAGE_ROWS * (1 + (sample + k) % 4) for k in range(IMAGES_PER_SAMPLE)]
            images = tuple(
                MultimodalRef(
                    key=f"s{sample}/img{k}",
                    encoder="vision",
                    cost=float(rows[k] ** 2 / 16),
                    placeholder=TokenSpan(start=16 + k * 4 * IMAGE_ROWS, end=16 + k * 4 * IMAGE_ROWS + rows[k]),
                )
                for k in range(IMAGES_PER_SAMPLE)
            )
        trajectories.append(
            TrajectoryMeta(
                trajectory_id=f"t{i}",
                sample_id=f"s{sample}",
                source="bench",
                rollout_step=0,
                num_tokens=length,
                num_loss_tokens=length // 2,
                segments=(VersionSegment(version=0, num_tokens=length),),
                multimodal=images,
            )
        )
    return trajectories


def make_topology(dp: int, cp: int, budget: int, *, multimodal: bool) -> Topology:
    encoders = (EncoderTopology(name="vision", dp=8, tp=1, max_cost_per_microbatch=16384.0),) if multimodal else ()
    return Topology(
        backbone=BackboneTopology(dp=dp, cp=cp, tp=2, max_tokens_per_microbatch=budget, cost=COST),
        encoders=encoders,
    )


def score(
    ranks: Sequence[Sequence[Sequence[int]]], padded: np.ndarray, workloads: np.ndarray, budget: int
) -> dict[str, Any]:
    """Figures of a layout given as, per DP rank, micro-batches of sequence indices."""
    per_rank = max(len(r) for r in ranks)
    step = np.zeros((len(ranks), per_rank))
    violations = 0
    empty = 0
    for d, microbatches in enumerate(ranks):
        for j, members in enumerate(microbatches):
            step[d, j] = workloads[list(members)].sum() if members else 0.0
            empty += not members
            violations += len(members) > 1 and int(padded[list(members)].sum()) > budget
    rank_work = step.sum(axis=1)
    mean = rank_work.mean()
    return {
        "imbalance": round(float(rank_work.max() / mean), 4),
        "lockstep_imbalance": round(float(step.max(axis=0).sum() / mean), 4),
        "microbatches_per_rank": per_rank,
        "empty_microbatches": empty,
        "budget_violations": violations,
    }


def per_rank_microbatches(rank_members: list[list[int]], padded: np.ndarray, budget: int) -> list[list[list[int]]]:
    """verl's dynamic micro-batching: the most micro-batches any rank needs, filled by KK on length."""
    count = max(max(1, math.ceil(int(padded[m].sum()) / budget)) for m in rank_members)
    layout = []
    for members in rank_members:
        parts = karmarkar_karp(padded[members].tolist(), min(count, len(members)))
        microbatches = [[members[i] for i in part] for part in parts]
        microbatches.extend([] for _ in range(count - len(microbatches)))
        layout.append(microbatches)
    return layout


def verl_layout(padded: np.ndarray, dp: int, budget: int) -> list[list[list[int]]]:
    ranks = karmarkar_karp(padded.tolist(), dp, equal_count=True)
    return per_rank_microbatches(ranks, padded, budget)


def round_robin_layout(padded: np.ndarray, dp: int, budget: int) -> list[list[list[int]]]:
    ranks = [list(range(d, len(padded), dp)) for d in range(dp)]
    return per_rank_microbatches(ranks, padded, budget)


def best_time(function: Callable[[], Any], repeat: int) -> tuple[float, float, Any]:
    """Best wall and best CPU milliseconds over ``repeat`` runs. The CPU figure is what planning costs when
    other processes share the cores; the wall figure is what a caller waits for on this machine now."""
    best_wall, best_cpu, result = math.inf, math.inf, None
    for _ in range(repeat):
        wall, cpu = time.perf_counter(), time.process_time()
        result = function()
        best_cpu = min(best_cpu, time.process_time() - cpu)
        best_wall = min(best_wall, time.perf_counter() - wall)
    return best_wall * 1e3, best_cpu * 1e3, result


def run_case(count: int, dp: int, cp: int, budget: int, repeat: int, rng: np.random.Generator) -> dict[str, Any]:
    lengths = sample_lengths(count, rng)
    text = make_trajectories(lengths, multimodal=False)
    images = make_trajectories(lengths, multimodal=True)
    text_topology = make_topology(dp, cp, budget, multimodal=False)
    image_topology = make_topology(dp, cp, budget, multimodal=True)
    padded = padded_lengths(lengths, text_topology.backbone.effective_pad_multiple)
    workloads = sequence_workloads(padded, COST)
    mean_rank = workloads.sum() / dp

    text_ms, text_cpu_ms, plan = best_time(lambda: plan_minibatch(text, text_topology), repeat)
    image_ms, image_cpu_ms, image_plan = best_time(lambda: plan_minibatch(images, image_topology), repeat)
    ours_layout = [[list(mb) for mb in plan.microbatches(d)] for d in range(dp)]
    ours = score(ours_layout, padded, workloads, budget)
    ours.update(
        padding_tokens=plan.quality.padding_tokens,
        oversize_microbatches=plan.quality.oversize_microbatches,
        scheme=plan.quality.scheme.value,
        plan_ms=round(text_ms, 2),
        plan_cpu_ms=round(text_cpu_ms, 2),
        plan_with_encoder_ms=round(image_ms, 2),
        plan_with_encoder_cpu_ms=round(image_cpu_ms, 2),
        references=image_plan.quality.references,
        unique_encodings=image_plan.quality.unique_encodings,
        encoder_imbalance=round(image_plan.quality.encoders[0].imbalance, 4),
        encoder_microbatches_per_rank=image_plan.quality.encoders[0].microbatches_per_rank,
    )
    assert abs(ours["imbalance"] - round(plan.quality.imbalance, 4)) < 1e-3

    results = {"knittrans": ours}
    for name, layout_function in (("verl", verl_layout), ("round_robin", round_robin_layout)):
        ms, cpu_ms, layout = best_time(lambda f=layout_function: f(padded, dp, budget), repeat)
        figures = score(layout, padded, workloads, budget)
        figures.update(padding_tokens=int((padded - lengths).sum()), plan_ms=round(ms, 2), plan_cpu_ms=round(cpu_ms, 2))
        results[name] = figures
    return {
        "trajectories": count,
        "dp": dp,
        "cp": cp,
        "tp": 2,
        "max_tokens_per_microbatch": budget,
        "tokens": int(lengths.sum()),
        "max_length": int(lengths.max()),
        "imbalance_lower_bound": round(float(max(1.0, workloads.max() / mean_rank)), 4),
        **results,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="512 trajectories only")
    parser.add_argument("--repeat", type=int, default=3, help="timing repeats (the best is reported)")
    parser.add_argument(
        "--budget", type=int, default=MAX_TOKENS, help="max_tokens_per_microbatch (padded, per CP group)"
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    counts = (512,) if args.quick else (512, 8192)
    cases = []
    for count in counts:
        for dp in (4, 32):
            for cp in (1, 4):
                print(f"planning {count} trajectories at dp={dp} cp={cp}", file=sys.stderr, flush=True)
                cases.append(run_case(count, dp, cp, args.budget, args.repeat, rng))
    summary = {
        "never_worse_than_verl": all(c["knittrans"]["imbalance"] <= c["verl"]["imbalance"] for c in cases),
        # <= 1.05 where the bound allows it, else within 1% of the bound.
        "meets_imbalance_target": all(
            c["knittrans"]["imbalance"] <= max(1.05, c["imbalance_lower_bound"] * 1.01) for c in cases
        ),
        "plan_with_encoder_ms_8192_dp32_cp4": next(
            (
                {"wall": c["knittrans"]["plan_with_encoder_ms"], "cpu": c["knittrans"]["plan_with_encoder_cpu_ms"]}
                for c in cases
                if (c["trajectories"], c["dp"], c["cp"]) == (8192, 32, 4)
            ),
            None,
        ),
        "load_average_1min": round(os.getloadavg()[0], 2),
    }
    print(
        json.dumps(
            {
                "benchmark": "planner",
                "lengths": {"distribution": "lognormal", "mean": MEAN_TOKENS, "sigma": SIGMA, "max": MAX_TOKENS},
                "cost_model": {"linear": COST.linear, "quadratic": COST.quadratic},
                "cases": cases,
                "summary": summary,
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
