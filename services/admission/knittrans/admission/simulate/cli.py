"""``knittrans simulate``: colocated vs disaggregated staleness per admission policy, side by side."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable

from knittrans.admission.cli_outputs import add_output_arguments, prepare_plot, shows_progress, write_json
from knittrans.admission.replay.cli import add_policy_argument, parse_policies
from knittrans.admission.replay.progress import ProgressBar
from knittrans.admission.replay.trace import read_trace
from knittrans.admission.simulate.config import SimConfig
from knittrans.admission.simulate.modes import MODES, Mode
from knittrans.admission.simulate.report import comparison_table, reduction_lines, simulation_json
from knittrans.admission.simulate.results import PolicySimulation
from knittrans.admission.simulate.rollout import DurationModel, LognormalDurations, RolloutScript, TraceDurations
from knittrans.admission.simulate.simulator import simulate_policy
from knittrans.config import load_config
from knittrans.types import AdmissionUnit

logger = logging.getLogger(__name__)

_UNIT_NAMES = {AdmissionUnit.TRAJECTORY: "trajectories", AdmissionUnit.GROUP: "groups"}
_PROGRESS_MIN_TRAJECTORIES = 50_000  # "auto" shows bars only for runs at least this long (per mode)


def register(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    """Simulate colocated vs disaggregated RL per admission policy: architectural staleness (paper §2.2, §7)."""
    parser.description = (
        "Simulate an RL pipeline in colocated and disaggregated execution under one or more admission policies, "
        "driving the admission engine the service uses, and report staleness per train step, quota violations, "
        "staleness-bound drops and the architectural staleness (disaggregated minus colocated) per policy."
    )
    parser.add_argument("--config", required=True, help="simulation config (YAML); see examples/sim/")
    add_policy_argument(parser)
    parser.add_argument("--trace", metavar="TRACE.jsonl",
                        help="draw durations (end - start) and token counts per source from a replay trace")
    parser.add_argument("--train-batches", type=int, metavar="N", help="override train_batches")
    parser.add_argument("--seed", type=int, help="override seed")
    add_output_arguments(
        parser, plot="draw staleness per step and the admission timeline",
        progress="bars on stderr (auto: on a terminal, for long runs)",
    )
    return run


def run(args: argparse.Namespace) -> int:
    config = load_config(
        SimConfig, path=args.config, flags={"train_batches": args.train_batches, "seed": args.seed}
    )
    policies = parse_policies(args.policy, config.policy)
    durations: DurationModel = (
        TraceDurations(read_trace(args.trace), config) if args.trace else LognormalDurations(config)
    )
    script = RolloutScript(config, durations)
    per_mode = config.train_batches * config.train_batch_size * config.trajectories_per_unit
    show_progress = shows_progress(
        args.progress, interactive=sys.stderr.isatty(), work=per_mode, minimum=_PROGRESS_MIN_TRAJECTORIES
    )
    results: list[PolicySimulation] = []
    for policy in policies:
        bars = {
            mode: ProgressBar(sys.stderr, total=per_mode, label=_label(policy.value, mode), enabled=show_progress)
            for mode in MODES
        }
        results.append(simulate_policy(config, policy, script, progress=bars))
    print(
        f"simulated {config.train_batches} train batches of {config.train_batch_size} "
        f"{_UNIT_NAMES[config.admission_unit]} in {config.num_minibatches} mini-batches per mode; means over the steps "
        f"after a warm-up of {config.warmup}"
    )
    print(comparison_table(results))
    for line in reduction_lines(results):
        print(line)
    for result in results:
        for mode in result.modes:
            if mode.failed:
                print(f"{result.policy.value} ({mode.mode.value}) stopped: {mode.failed}")
    sys.stdout.flush()
    if args.json:
        write_json(args.json, simulation_json(config, results, config_path=args.config, trace_path=args.trace))
    if args.plot:
        from knittrans.admission.simulate.plot import plot_simulation

        prepare_plot(args.plot)
        plot_simulation(results, args.plot)
        print(f"wrote {args.plot}")
    return 0


def _label(policy: str, mode: Mode) -> str:
    return f"{policy} {'disagg' if mode is Mode.DISAGGREGATED else 'coloc'}"
