"""One RL step, side by side in one run, on the same workload and topology (DP=4 x TP=2 x CP=2 by default):

- TransferQueue 0.1.11 (sample-level storage), in its own venv: (a) as its users use it, (b) as the paper
  configured it, and (b-tp-shared), the strongest sample-level configuration (it matches the paper's 2.4x);
- KnitTrans eager (the whole mini-batch is materialised before compute) and KnitTrans iter
  (consumption-driven delivery with prefetch), with the real admission service and reorg sidecars.

Per arm: bytes moved out of storage, bytes uniquely needed, amplification, exposed transfer seconds per step and
step time (definitions in ``transfer_workload.py``). The summary compares the exposed transfer of the strongest
TransferQueue arm with KnitTrans iter, and checks the targets. JSON on stdout; progress on stderr.

    python benchmarks/transfer.py --smoke                 # small and fast
    python benchmarks/transfer.py                         # the issue's full-size step
    python benchmarks/transfer.py --skip-transferqueue    # KnitTrans arms only
    python benchmarks/transfer.py --store mooncake        # KnitTrans on Mooncake instead of the file store
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from transfer_accounting import describe
from transfer_knittrans import run_knittrans_arms
from transfer_tq import DEFAULT_VENV, run_transferqueue_arms
from transfer_workload import add_workload_arguments, build_workload, config_from_arguments

from knittrans.trainer import DeliveryMode

logger = logging.getLogger("transfer")

STRONGEST_TQ_CANDIDATES = ("transferqueue-b-tp-shared", "transferqueue-b-paper", "transferqueue-a-as-users")


def summarise(arms: Sequence[dict[str, Any]]) -> dict[str, Any]:
    by_name = {arm["arm"]: arm for arm in arms}
    summary: dict[str, Any] = {
        "per_arm": {
            name: {
                "bytes_moved_from_storage": arm["bytes_moved_from_storage"],
                "bytes_uniquely_needed": arm["bytes_uniquely_needed"],
                "amplification": round(arm["amplification"], 4),
                "amplification_with_redistribution": round(arm["amplification_with_redistribution"], 4),
                "exposed_transfer_s_per_step": arm["exposed_transfer_s_per_step"],
                "step_s": arm["step_s"],
            }
            for name, arm in by_name.items()
        }
    }
    tq = [by_name[name] for name in STRONGEST_TQ_CANDIDATES if name in by_name]
    iterating = by_name.get("knittrans-iter")
    if tq and iterating:
        strongest = min(tq, key=lambda arm: arm["exposed_transfer_s_per_step"])
        exposed = iterating["exposed_transfer_s_per_step"]
        ratio = strongest["exposed_transfer_s_per_step"] / max(exposed, 1e-9)
        with_loop = iterating["exposed_including_loop_overhead_s_per_step"]
        firsts = iterating["first_microbatch_ready_s_per_step"]
        first = float(sum(firsts) / len(firsts))
        summary.update({
            "strongest_transferqueue_arm": strongest["arm"],
            "exposed_transfer_ratio_strongest_tq_over_knittrans_iter": ratio,
            "exposed_transfer_ratio_including_loop_overhead": strongest["exposed_transfer_s_per_step"] / with_loop,
            "knittrans_iter_first_microbatch_ready_s": first,
            "knittrans_iter_exposed_over_first_microbatch": exposed / max(first, 1e-9),
            "targets": {
                "knittrans_amplification_is_1.00x": all(
                    round(by_name[name]["amplification"], 2) == 1.0
                    for name in ("knittrans-iter", "knittrans-eager") if name in by_name),
                "exposed_ratio_at_least_100x": ratio >= 100,
                "iter_exposed_at_most_first_microbatch_plus_5pct": exposed <= first * 1.05,
            },
        })
        for name in ("transferqueue-b-paper", "transferqueue-a-as-users"):
            if name in by_name:
                summary[f"exposed_transfer_ratio_{name}_over_knittrans_iter"] = (
                    by_name[name]["exposed_transfer_s_per_step"] / max(iterating["exposed_transfer_s_per_step"], 1e-9))
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_workload_arguments(parser)
    parser.add_argument("--warmup-steps", type=int, default=None, help="default 1 (0 with --smoke)")
    parser.add_argument("--steps", type=int, default=None, help="measured steps per arm; default 2 (1 with --smoke)")
    parser.add_argument("--layouts", default="a,b,b-tp-shared", help="TransferQueue layouts (default a,b,b-tp-shared)")
    parser.add_argument("--skip-transferqueue", action="store_true")
    parser.add_argument("--store", choices=["file", "mooncake"], default="file",
                        help="KnitTrans unit store (default: the embedded file store on /dev/shm)")
    parser.add_argument("--slots", type=int, default=2, help="ring slots per sidecar (default 2)")
    parser.add_argument("--prefetch", type=int, default=1, help="micro-batches each trainer stages ahead (default 1)")
    parser.add_argument("--encoder-microbatch-images", type=int, default=16,
                        help="encoder micro-batch budget, in images (default 16)")
    parser.add_argument("--venv", type=Path, default=DEFAULT_VENV, help="the TransferQueue venv")
    parser.add_argument("--output", type=Path, help="also write the JSON here")
    arguments = parser.parse_args(argv)
    config = config_from_arguments(arguments)
    warmup = (0 if arguments.smoke else 1) if arguments.warmup_steps is None else arguments.warmup_steps
    steps = (1 if arguments.smoke else 2) if arguments.steps is None else arguments.steps

    arms: list[dict[str, Any]] = []
    document: dict[str, Any] = {"benchmark": "transfer: one RL step, TransferQueue vs KnitTrans",
                                "workload": describe(build_workload(config)),
                                "warmup_steps": warmup, "measured_steps": steps}
    if not arguments.skip_transferqueue:
        logger.info("running the TransferQueue arms (%s)", arguments.layouts)
        tq = run_transferqueue_arms(config, layouts=[x.strip() for x in arguments.layouts.split(",") if x.strip()],
                                    warmup_steps=warmup, steps=steps, venv_dir=arguments.venv)
        arms.extend(tq.pop("arms"))
        tq.pop("workload", None)
        document["transferqueue"] = tq
    logger.info("running the KnitTrans arms (iter, eager) on the %s store", arguments.store)
    knittrans = run_knittrans_arms(config, modes=(DeliveryMode.ITER, DeliveryMode.EAGER), warmup_steps=warmup,
                                   steps=steps, store=arguments.store, slots=arguments.slots,
                                   prefetch=arguments.prefetch,
                                   encoder_microbatch_images=arguments.encoder_microbatch_images)
    arms.extend(knittrans.pop("arms"))
    document["knittrans"] = knittrans
    document["arms"] = arms
    document["summary"] = summarise(arms)
    text = json.dumps(document, indent=2)
    if arguments.output:
        arguments.output.parent.mkdir(parents=True, exist_ok=True)
        arguments.output.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
