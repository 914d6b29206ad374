"""Generate the bundled skewed four-source replay trace, deterministically.

A disaggregated rollout in the shape of the paper's Figure 3(a): four data sources mixed equally, with
clearly different rollout durations (D is about five times slower than A). Rollout step r launches its
prompts staggered over the first ``stagger`` of [r·period, (r+1)·period); each prompt yields ``group_size``
trajectories. Training at 180 s per mini-batch (examples/replay/skewed-4src.yaml) about balances rollout. A few
trajectories are filtered (``accepted: false``) and a few never finish (``end: null``). No line carries a
``version``: the replay derives it on its own timeline.

    python examples/traces/make_trace.py > examples/traces/skewed-4src.jsonl
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys

# source: (mean duration s, std s)
SOURCES = {"A": (120.0, 40.0), "B": (250.0, 80.0), "C": (400.0, 120.0), "D": (600.0, 180.0)}


def lognormal_parameters(mean: float, std: float) -> tuple[float, float]:
    sigma2 = math.log(1.0 + (std / mean) ** 2)
    return math.log(mean) - sigma2 / 2.0, math.sqrt(sigma2)


def generate(
    *, steps: int, prompts_per_source: int, group_size: int, period: float, stagger: float, filtered: float,
    unfinished: float, seed: int,
) -> list[dict[str, object]]:
    rng = random.Random(seed)
    lines: list[dict[str, object]] = []
    sources = list(SOURCES)
    for step in range(steps):
        prompts = [source for source in sources for _ in range(prompts_per_source)]
        rng.shuffle(prompts)
        for slot, source in enumerate(prompts):
            sample_id = f"s{step}-{slot}"
            start = round(step * period + stagger * period * (slot + rng.random()) / len(prompts), 1)
            mu, sigma = lognormal_parameters(*SOURCES[source])
            for member in range(group_size):
                duration = rng.lognormvariate(mu, sigma)
                end: float | None = round(start + duration, 1)
                if rng.random() < unfinished:
                    end = None
                line: dict[str, object] = {
                    "id": f"{sample_id}-{member}",
                    "sample_id": sample_id,
                    "source": source,
                    "start": start,
                    "end": end,
                    "num_tokens": int(duration * 20 + rng.random() * 500),
                    "rollout_step": step,
                }
                if rng.random() < filtered:
                    line["accepted"] = False
                lines.append(line)
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--prompts-per-source", type=int, default=17)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--period", type=float, default=1000.0, help="seconds between rollout step launches")
    parser.add_argument("--stagger", type=float, default=0.2, help="fraction of the period a step's launches span")
    parser.add_argument("--filtered", type=float, default=0.03)
    parser.add_argument("--unfinished", type=float, default=0.005)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    lines = generate(
        steps=args.steps, prompts_per_source=args.prompts_per_source, group_size=args.group_size,
        period=args.period, stagger=args.stagger, filtered=args.filtered, unfinished=args.unfinished, seed=args.seed,
    )
    for line in lines:
        sys.stdout.write(json.dumps(line, separators=(",", ":")) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
