"""Pipeline simulator benchmark: simulated trajectories per second, and staleness accounting per segment vs per token.

Prints one JSON document.

- ``simulate``: 100 train batches of 1,024 trajectories under the ``knittrans`` policy in both modes
  (disaggregated and colocated) on the skewed four-source workload of examples/sim/skewed-4src.yaml, scaled to
  a train batch of 1,024 (target: under 10 s for both modes together), with the rollout draws included.
- ``staleness_accounting``: the cost per trajectory of the simulator's per-version-segment accounting, side by
  side with the named baseline ``per-token``: the same token-weighted version sum computed token by token,
  which is what accounting per token would cost (measured on a sample, it is too slow for the whole run).

    python benchmarks/simulate.py [--quick]

Timings are wall-clock on a shared machine: other load shows up in them.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import time
from bisect import bisect_right
from collections.abc import Sequence

from knittrans.admission.engine import AdmissionPolicy
from knittrans.admission.simulate import (
    LognormalDurations,
    Mode,
    RolloutScript,
    SimConfig,
    SourceRollout,
    simulate_policy,
)
from knittrans.admission.simulate.segments import version_token_sum

BASELINE = "per-token"
TARGET_SECONDS = 10.0
TRAIN_BATCH_SIZE = 1024
TRAIN_BATCHES = 100


def workload(train_batches: int) -> SimConfig:
    """examples/sim/skewed-4src.yaml with a train batch of 1,024 (and the slots scaled with it)."""
    return SimConfig(
        train_batch_size=TRAIN_BATCH_SIZE,
        num_minibatches=4,
        sources={"A": 0.24, "B": 0.24, "C": 0.24, "D": 0.24},
        source_schedule=(0.0, 0.0, 0.5, 1.0),
        group_size=4,
        rollout_slots=1280,
        next_step_after=0.95,
        rollout={
            "A": SourceRollout(mean_seconds=80, std_seconds=40),
            "B": SourceRollout(mean_seconds=250, std_seconds=80),
            "C": SourceRollout(mean_seconds=400, std_seconds=60),
            "D": SourceRollout(mean_seconds=600, std_seconds=60),
        },
        tokens_per_second=20,
        train_seconds_per_minibatch=120,
        sync_seconds=10,
        train_batches=train_batches,
        seed=7,
    )


def simulate_throughput(train_batches: int) -> dict[str, object]:
    config = workload(train_batches)
    started = time.perf_counter()
    script = RolloutScript(config, LognormalDurations(config))
    result = simulate_policy(config, AdmissionPolicy.KNITTRANS, script)
    seconds = time.perf_counter() - started
    completed = sum(mode.completed for mode in result.modes)
    admitted = sum(step.trajectories for mode in result.modes for step in mode.steps)
    failed = [mode.failed for mode in result.modes if mode.failed]
    if failed:
        raise RuntimeError(f"the benchmark workload stalled: {failed}")
    return {
        "policy": AdmissionPolicy.KNITTRANS.value,
        "modes": [Mode.DISAGGREGATED.value, Mode.COLOCATED.value],
        "train_batches_per_mode": train_batches,
        "trajectories_per_train_batch": TRAIN_BATCH_SIZE,
        "simulated_trajectories": completed,
        "admitted_trajectories": admitted,
        "seconds": round(seconds, 3),
        "trajectories_per_second": round(completed / seconds),
        "architectural_staleness": round(result.architectural_staleness or 0.0, 4),
    }


def per_token_version_sum(version_times: Sequence[float], start: float, end: float, tokens: int) -> tuple[int, float]:
    """The baseline: each token's version looked up at its own generation time (tokens spread evenly)."""
    step = (end - start) / tokens
    total = 0
    for k in range(tokens):
        total += bisect_right(version_times, start + (k + 0.5) * step) - 1
    return bisect_right(version_times, start) - 1, float(total)


def accounting_sample(count: int) -> tuple[list[float], list[tuple[float, float, int]]]:
    """Trajectories of the workload's rollout on a timeline with a version change every ~650 s."""
    config = workload(TRAIN_BATCHES)
    script = RolloutScript(config, LognormalDurations(config))
    script.ensure(count // config.group_size + 1)
    rng = random.Random(3)
    horizon = 650.0 * 40
    trajectories = []
    for index in range(count):
        start = rng.uniform(0.0, horizon)
        trajectories.append((start, start + script.durations[index], script.tokens[index]))
    version_times = [650.0 * v for v in range(60)]
    return version_times, trajectories


def accounting_cost(count: int, baseline_count: int) -> dict[str, object]:
    version_times, trajectories = accounting_sample(count)
    started = time.perf_counter()
    for start, end, tokens in trajectories:
        version_token_sum(version_times, start, end, tokens)
    segment_us = (time.perf_counter() - started) / len(trajectories) * 1e6
    sample = trajectories[:baseline_count]
    started = time.perf_counter()
    for start, end, tokens in sample:
        per_token_version_sum(version_times, start, end, tokens)
    token_us = (time.perf_counter() - started) / len(sample) * 1e6
    mean_tokens = sum(t for _, _, t in trajectories) / len(trajectories)
    return {
        "mean_tokens_per_trajectory": round(mean_tokens),
        "per-segment": {"us_per_trajectory": round(segment_us, 3), "trajectories": len(trajectories)},
        BASELINE: {"us_per_trajectory": round(token_us, 1), "trajectories": len(sample)},
        "speedup": round(token_us / segment_us, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="10 train batches and a smaller accounting sample")
    args = parser.parse_args()
    train_batches = 10 if args.quick else TRAIN_BATCHES
    print("simulate...", file=sys.stderr, flush=True)
    gc.collect()
    simulate = simulate_throughput(train_batches)
    print("staleness accounting...", file=sys.stderr, flush=True)
    accounting = accounting_cost(2_000 if args.quick else 20_000, 50 if args.quick else 400)
    per_token_projection = (
        accounting[BASELINE]["us_per_trajectory"] * simulate["simulated_trajectories"] / 1e6  # type: ignore[index]
    )
    seconds = simulate["seconds"]
    document = {
        "benchmark": "simulate",
        "baseline": BASELINE,
        "simulate": simulate,
        "staleness_accounting": {
            **accounting,
            "projected_extra_seconds_with_per_token_accounting": round(per_token_projection, 1),
        },
        "targets": {
            "seconds_for_100_train_batches_of_1024_both_modes": {
                "target": TARGET_SECONDS,
                "measured": seconds,
                "met": seconds < TARGET_SECONDS if train_batches == TRAIN_BATCHES else None,
            }
        },
    }
    print(json.dumps(document, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
