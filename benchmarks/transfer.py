"""One RL step, side by side in one run, on the same workload and topology (DP=4 x TP=2 x CP=2 by default):

- TransferQueue 0.1.11 (sample-level storage, its in-memory SimpleStorage), in its own venv: (a) as its users use
  it, (b) as the paper configured it, (b-tp-shared) the strongest sample-level read configuration, and
  (streaming) its own best practice, a ``StreamingDataLoader`` per rank with prefetch;
- KnitTrans iter (consumption-driven delivery with prefetch) and eager (the whole mini-batch is materialised
  before compute), with the real admission service and reorg sidecars, on every ``--store`` (the file store on
  /dev/shm and a Mooncake store), each cluster kept up for the whole run.

One clock for both systems (``transfer_accounting.one_clock_exposed``): a step's exposed transfer starts when
its last trajectory has been written and reported (put into TransferQueue; stored and reported to the admission
service), or when the training loop asks for it if that is later, and ends when every trainer rank holds its
first micro-batch (iter) or its whole mini-batch (eager); every later second the loop spends outside compute
counts too, its own take/release work included. Timestamps are ``time.time()`` in every process. KnitTrans's
clock starts as the report of the step's last trajectory goes out, its other trajectories reported before, as
rollouts finish one by one (TransferQueue's starts once its last put has returned). Each KnitTrans arm also runs
one extra cold step whose whole step is reported in one call inside the clock, which is how this benchmark
started KnitTrans's clock before; its figure stays beside the new one as
``exposed_one_clock_cold_whole_step_report_s``, with its own ratio. For KnitTrans's cold steps the JSON also
gives the CPU each group of its processes used from the clock's start until every DP group held the step
(``cold_step_cpu``, :mod:`process_cpu`), and that CPU's share of every usable CPU over the window; for both
systems' cold steps, the whole machine's busy share until the last DP group held the data
(``cold_step_machine_busy_fraction``, from ``/proc/stat``).

Each arm runs warm-up steps, then ``--steps`` measured ones: the first is cold (reported while the trainer
waits), the later ones are the steady state (the streaming loader gets the next mini-batch's data as soon as the
current one's; KnitTrans gets it once every DP group holds the current one's micro-batch 0, so a cold step
never shares the machine with the next mini-batch's dispatch; both are one mini-batch ahead, which the engine's
``max_batches_ahead`` of 1 allows). The arms are interleaved:
each of ``--repeats`` runs goes through all of them, in reverse order every other run. Per run the ratio of the
strongest TransferQueue arm's cold exposed transfer to KnitTrans iter's is taken on each store; the summary gives
medians over the runs. KnitTrans's earlier figure (from the moment the last consumer had its assignment, loop
overhead apart) stays beside it as ``exposed_from_last_assignment_s``. JSON on stdout; progress on stderr.

    python benchmarks/transfer.py --smoke                      # small and fast
    python benchmarks/transfer.py --repeats 3                  # the issue's full-size step, three runs
    python benchmarks/transfer.py --repeats 3 --output bench-out/transfer.json   # and bench-out/transfer.png
    python benchmarks/transfer.py --skip-transferqueue         # KnitTrans arms only

The multi-role arm (``--roles-arm``, on by default with ``--smoke``; :mod:`transfer_roles`): a ``reference`` role
attaches ``ref_logprobs`` that the actor consumes, once with one pass over each mini-batch and once with
``--roles-passes`` more; per role, the bytes moved against the bytes it uniquely needs, and the actor's exposed
transfer counted from the last report (the reference pass and the attach included). Its figures are under
``roles`` in the JSON, interleaved with the other arms in every run.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from transfer_accounting import describe
from transfer_knittrans import STEP_TIMEOUT_S, KnitTransClusters
from transfer_plot import plot_transfer
from transfer_roles import ReferenceTopology, RolesClusters, summarise_roles
from transfer_tq import DEFAULT_VENV, TransferQueueSession
from transfer_workload import add_workload_arguments, build_workload, config_from_arguments

from knittrans.trainer import DeliveryMode

logger = logging.getLogger("transfer")

TQ_ARM_NAMES = {"a": "transferqueue-a-as-users", "b": "transferqueue-b-paper",
                "b-tp-shared": "transferqueue-b-tp-shared", "streaming": "transferqueue-streaming-prefetch"}
STEADY_TARGET_S = 0.005
RATIO_TARGET = 100.0


def figures(arm: dict[str, Any]) -> dict[str, Any]:
    """The figures of one arm in one run that the summary compares."""
    kept = {
        "exposed_one_clock_cold_s": arm["exposed_one_clock_cold_s"],
        "exposed_one_clock_steady_s_per_step": arm["exposed_one_clock_steady_s_per_step"],
        "bytes_moved_from_storage": arm["bytes_moved_from_storage"],
        "bytes_uniquely_needed": arm["bytes_uniquely_needed"],
        "amplification": round(arm["amplification"], 4),
        "amplification_with_redistribution": round(arm["amplification_with_redistribution"], 4),
        "step_s": arm["step_s"],
        "medium": arm["medium"],
    }
    for key in ("exposed_one_clock_cold_whole_step_report_s", "exposed_from_last_assignment_s_per_step",
                "exposed_from_plan_known_s_per_step", "steady_loop_take_cpu_s_per_step"):
        if key in arm:
            kept[key] = arm[key]
    if "cold_step_cpu" in arm:  # KnitTrans: the CPU its processes used in the cold step, and its share of the CPUs
        kept["cold_step_cpu_s"] = arm["cold_step_cpu"]["total_cpu_s"]
        kept["cold_step_busy_fraction_of_cpus"] = arm["cold_step_cpu"]["busy_fraction_of_cpus"]
    if arm.get("cold_step_machine_busy_fraction") is not None:  # both systems: every process of the machine
        kept["cold_step_machine_busy_fraction"] = arm["cold_step_machine_busy_fraction"]
    return kept


def ratios(run: dict[str, dict[str, Any]], stores: Sequence[str]) -> dict[str, Any]:
    """Within one run, per store: the strongest TransferQueue arm's exposed transfer over KnitTrans's, for the cold
    first step (the streaming loader has none) and for the steady state (where the arm reports one). The cold
    step's ratio is also given against KnitTrans's extra cold step, whose whole step is reported inside its clock
    (``cold_whole_step_report_...``: this benchmark's cold figure before the clock started at the last
    trajectory's report)."""
    out: dict[str, Any] = {}
    phases = {"cold": ("exposed_one_clock_cold_s", "exposed_one_clock_cold_s"),
              "cold_whole_step_report": ("exposed_one_clock_cold_s", "exposed_one_clock_cold_whole_step_report_s"),
              "steady": ("exposed_one_clock_steady_s_per_step", "exposed_one_clock_steady_s_per_step")}
    for phase, (key, our_key) in phases.items():
        tq = {name: arm[key] for name, arm in run.items() if name.startswith("transferqueue-") and arm[key] is not None}
        if not tq:
            continue
        strongest = min(tq, key=lambda name: tq[name])
        if phase != "cold_whole_step_report":
            out[f"strongest_transferqueue_arm_{phase}"] = strongest
        for store in stores:
            for mode in ("iter", "eager"):
                ours = run.get(f"knittrans-{mode}-{store}", {}).get(our_key)
                if ours is not None:
                    out[f"{phase}_strongest_tq_over_knittrans_{mode}_{store}"] = tq[strongest] / max(ours, 1e-9)
    return out


def summarise(runs: Sequence[dict[str, Any]], stores: Sequence[str]) -> dict[str, Any]:
    def median(values: Sequence[float | None]) -> float | None:
        present = [v for v in values if v is not None]
        return statistics.median(present) if present else None

    names = list(runs[0]["arms"])
    per_arm = {}
    for name in names:
        rows = [run["arms"][name] for run in runs]
        per_arm[name] = {"medium": rows[0]["medium"], "amplification": rows[0]["amplification"],
                         **{key: median([row[key] for row in rows]) for key in rows[0]
                            if key not in ("medium", "amplification")}}
    ratio_keys = [key for key in runs[0]["ratios"] if not key.startswith("strongest_transferqueue_arm")]
    summary: dict[str, Any] = {
        "clock": "one clock: from the step's last trajectory written and reported (or the loop asking, if later) "
                 "to every rank holding its first micro-batch (iter) or whole mini-batch (eager), plus every "
                 "later second outside compute",
        "runs": len(runs),
        "per_arm_medians": per_arm,
        "strongest_transferqueue_arm_per_run": [{k: v for k, v in run["ratios"].items()
                                                  if k.startswith("strongest_transferqueue_arm")} for run in runs],
        "ratios_per_run": {key: [run["ratios"][key] for run in runs] for key in ratio_keys},
        "ratio_medians": {key: median([run["ratios"][key] for run in runs]) for key in ratio_keys},
    }
    targets: dict[str, Any] = {}
    for store in stores:
        ratio = summary["ratio_medians"].get(f"cold_strongest_tq_over_knittrans_iter_{store}")
        if ratio is not None:
            targets[f"exposed_one_clock_strongest_tq_over_knittrans_iter_{store}"] = {
                "measured": round(ratio, 2), "target": f">= {RATIO_TARGET:.0f}x", "met": ratio >= RATIO_TARGET}
        steady = per_arm.get(f"knittrans-iter-{store}", {}).get("exposed_one_clock_steady_s_per_step")
        if steady is not None:
            targets[f"knittrans_iter_{store}_steady_state_exposed_per_step_s"] = {
                "measured": round(steady, 4), "cold_first_step_s": round(
                    per_arm[f"knittrans-iter-{store}"]["exposed_one_clock_cold_s"], 4),
                "target": f"<= {STEADY_TARGET_S}", "met": steady <= STEADY_TARGET_S}
    amplifications = [run["arms"][name]["amplification"] for run in runs for name in names
                      if name.startswith("knittrans-")]
    if amplifications:
        targets["knittrans_amplification_from_bytes_moved"] = {
            "measured": sorted(set(amplifications)), "target": "1.0000",
            "met": all(a == 1.0 for a in amplifications)}
    summary["targets"] = targets
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    # A SIGTERM (a time-out, a kill) ends the run through the clean-up below: the services and sidecars run in
    # sessions of their own and would outlive an abrupt exit, with the file store's units in /dev/shm.
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_workload_arguments(parser)
    parser.add_argument("--repeats", type=int, default=1, help="interleaved runs of every arm (default 1)")
    parser.add_argument("--warmup-steps", type=int, default=1, help="per arm and run (default 1)")
    parser.add_argument("--steps", type=int, default=None,
                        help="measured steps per arm and run, the first cold; default 3 (2 with --smoke)")
    parser.add_argument("--tq-arms", default="a,b,b-tp-shared,streaming",
                        help="TransferQueue arms (default a,b,b-tp-shared,streaming)")
    parser.add_argument("--skip-transferqueue", action="store_true")
    parser.add_argument("--store", default="file,mooncake",
                        help="KnitTrans unit stores, comma-separated: file, mooncake (default both)")
    parser.add_argument("--slots", type=int, default=2, help="ring slots per sidecar (default 2)")
    parser.add_argument("--node-sidecars", action=argparse.BooleanOptionalAction, default=False,
                        help="one sidecar process hosting every consumer over one assignment stream, as a node's "
                             "(default: one process per consumer)")
    parser.add_argument("--prefetch", type=int, default=1, help="micro-batches each trainer stages ahead (default 1)")
    parser.add_argument("--encoder-microbatch-images", type=int, default=16,
                        help="encoder micro-batch budget, in images (default 16)")
    parser.add_argument("--venv", type=Path, default=DEFAULT_VENV, help="the TransferQueue venv")
    parser.add_argument("--roles-arm", action=argparse.BooleanOptionalAction, default=None,
                        help="run the multi-role arm (reference + actor); default: with --smoke only")
    parser.add_argument("--roles-reference-dp", type=int, default=None,
                        help="the reference role's DP (default: half the actor's, at least 1)")
    parser.add_argument("--roles-reference-tokens", type=int, default=None,
                        help="the reference's micro-batch budget in tokens (default: twice the actor's)")
    parser.add_argument("--roles-passes", type=int, default=2,
                        help="passes of the multi-role arm's second variant (default 2; 1: no second variant)")
    parser.add_argument("--step-timeout-s", type=float, default=STEP_TIMEOUT_S,
                        help="a KnitTrans step not ended after this long is stalled: every process's stacks are "
                             "dumped (the services' to the cluster's logs, kept) and the run fails "
                             "(default %(default)g)")
    parser.add_argument("--keep-logs", action="store_true",
                        help="keep the KnitTrans clusters' run directories (logs, configs) in the temporary "
                             "directory; by default they are kept only when the run did not finish")
    parser.add_argument("--output", type=Path, help="also write the JSON here")
    parser.add_argument("--plot", type=Path,
                        help="write the figure (PNG) here; with --output, beside it by default (transfer.png)")
    arguments = parser.parse_args(argv)
    config = config_from_arguments(arguments)
    steps = (2 if arguments.smoke else 3) if arguments.steps is None else arguments.steps
    stores = [s.strip() for s in arguments.store.split(",") if s.strip()]
    tq_arms = [] if arguments.skip_transferqueue else [a.strip() for a in arguments.tq_arms.split(",") if a.strip()]
    unknown = [s for s in stores if s not in ("file", "mooncake")] + [a for a in tq_arms if a not in TQ_ARM_NAMES]
    if unknown or arguments.repeats < 1 or steps < 1 or arguments.warmup_steps < 0:
        parser.error(f"unknown stores or arms {unknown}, or --repeats/--steps < 1 or --warmup-steps < 0")
    roles_arm = arguments.smoke if arguments.roles_arm is None else arguments.roles_arm
    reference = ReferenceTopology(
        dp=arguments.roles_reference_dp or max(1, config.dp // 2),
        max_tokens_per_microbatch=arguments.roles_reference_tokens or 2 * config.max_tokens_per_micro_batch)
    if roles_arm and (reference.dp < 1 or arguments.roles_passes < 1
                      or reference.max_tokens_per_microbatch < config.max_tokens):
        parser.error("--roles-reference-dp and --roles-passes must be >= 1, and --roles-reference-tokens at least "
                     "the longest trajectory (the reference holds whole sequences)")

    if not arguments.step_timeout_s > 0:
        parser.error("--step-timeout-s must be positive")
    document: dict[str, Any] = {"benchmark": "transfer: one RL step, TransferQueue vs KnitTrans, on one clock",
                                "workload": describe(build_workload(config)), "repeats": arguments.repeats,
                                "warmup_steps": arguments.warmup_steps, "measured_steps": steps}
    session = TransferQueueSession(config, venv_dir=arguments.venv) if tq_arms else None
    clusters = None
    roles_clusters = None
    roles_records: list[dict[str, Any]] = []
    records: list[dict[str, Any]] = []
    runs: list[dict[str, Any]] = []
    finished = False
    try:
        clusters = KnitTransClusters(config, stores=stores, slots=arguments.slots, prefetch=arguments.prefetch,
                                     encoder_microbatch_images=arguments.encoder_microbatch_images,
                                     node_sidecars=arguments.node_sidecars)
        order: list[tuple[str, Any]] = [("tq", arm) for arm in tq_arms] + [
            ("knittrans", (store, mode)) for store in stores for mode in (DeliveryMode.ITER, DeliveryMode.EAGER)]
        if roles_arm:
            roles_clusters = RolesClusters(config, reference, stores=stores, slots=arguments.slots,
                                           prefetch=arguments.prefetch)
            order += [("roles", (store, tuple(dict.fromkeys((1, arguments.roles_passes))))) for store in stores]
        for repeat in range(arguments.repeats):
            run: dict[str, dict[str, Any]] = {}
            for system, arm in order if repeat % 2 == 0 else order[::-1]:
                logger.info("run %d: %s %s", repeat, system, arm)
                if system == "tq":
                    assert session is not None
                    record = session.run(arm, warmup_steps=arguments.warmup_steps, steps=steps)
                elif system == "roles":
                    assert roles_clusters is not None
                    variants = arm[1] if repeat % 2 == 0 else arm[1][::-1]
                    roles_records += [{**record, "repeat": repeat} for record in roles_clusters.run(
                        arm[0], variants, warmup_steps=arguments.warmup_steps, steps=steps)]
                    continue
                else:
                    record = clusters.run(arm[0], arm[1], warmup_steps=arguments.warmup_steps, steps=steps,
                                          step_timeout_s=arguments.step_timeout_s)
                records.append({**record, "repeat": repeat})
                run[record["arm"]] = figures(record)
            runs.append({"repeat": repeat, "arms": run, "ratios": ratios(run, stores)})
            logger.info("run %d ratios: %s", repeat, runs[-1]["ratios"])
        finished = True
    finally:
        keep_logs = arguments.keep_logs or not finished
        if clusters is not None:
            document["knittrans"] = clusters.close(keep_logs=keep_logs)
        if roles_clusters is not None:
            document["roles"] = {"cluster": roles_clusters.close(keep_logs=keep_logs)}
        if session is not None:
            document["transferqueue"] = session.description
            session.close()
    document["summary"] = summarise(runs, stores)
    document["runs"] = runs
    document["arms"] = records
    if roles_records:
        document["roles"].update({"summary": summarise_roles(roles_records), "arms": roles_records})
    text = json.dumps(document, indent=2)
    if arguments.output:
        arguments.output.parent.mkdir(parents=True, exist_ok=True)
        arguments.output.write_text(text + "\n")
    plot = arguments.plot or (arguments.output.with_suffix(".png") if arguments.output else None)
    if plot is not None:
        plot.parent.mkdir(parents=True, exist_ok=True)
        plot_transfer(document["summary"], runs, plot, ratio_target=RATIO_TARGET, steady_target_s=STEADY_TARGET_S)
        logger.info("figure written to %s", plot)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
