"""``knittrans replay``: trace-driven admission replay, several policies side by side."""

from __future__ import annotations

import argparse
import gc
import logging
import sys
from collections.abc import Callable

from knittrans.admission.cli_outputs import add_output_arguments, prepare_plot, shows_progress, write_json
from knittrans.admission.engine import AdmissionPolicy
from knittrans.admission.replay.config import ReplayConfig
from knittrans.admission.replay.driver import EntryCache, PolicyResult, replay_policy
from knittrans.admission.replay.progress import ProgressBar
from knittrans.admission.replay.report import comparison_table, replay_json
from knittrans.admission.replay.trace import read_trace
from knittrans.config import load_config
from knittrans.errors import ConfigError, InvalidArgument

logger = logging.getLogger(__name__)

ALL_POLICIES = "all"
# Baselines first, KnitTrans last: the order of the table and the plot.
POLICY_ORDER = (
    AdmissionPolicy.TRAIN_BATCH,
    AdmissionPolicy.LINEAR,
    AdmissionPolicy.STREAM,
    AdmissionPolicy.NO_GUARD,
    AdmissionPolicy.KNITTRANS,
)
_PROGRESS_MIN_TRAJECTORIES = 20_000  # "auto" shows a bar only for replays at least this long


def parse_policies(values: list[str] | None, default: AdmissionPolicy) -> list[AdmissionPolicy]:
    """``--policy`` values (repeatable, ``all``, or comma-separated) in order, without repeats."""
    if not values:
        return [default]
    chosen: list[AdmissionPolicy] = []
    for value in values:
        for name in (part.strip() for part in value.split(",")):
            if not name:
                continue
            if name == ALL_POLICIES:
                candidates = list(POLICY_ORDER)
            else:
                try:
                    candidates = [AdmissionPolicy.parse(name)]
                except InvalidArgument as exc:
                    raise ConfigError(f"{exc.message} or {ALL_POLICIES}", field="policy") from None
            chosen.extend(p for p in candidates if p not in chosen)
    return chosen


def register(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    """Replay a trajectory trace through the admission engine and compare policies (paper §7.3)."""
    parser.description = (
        "Replay a trace of finished trajectories through the admission engine under one or more policies and "
        "compare quota violations, first-admission delay and staleness side by side."
    )
    parser.add_argument("--trace", required=True, help="JSON Lines trace, one trajectory per line")
    parser.add_argument("--config", required=True, help="replay config (YAML)")
    add_policy_argument(parser)
    add_output_arguments(
        parser, plot="draw composition and admission timelines",
        progress="bar on stderr (auto: on a terminal, for long replays)",
    )
    return run


def add_policy_argument(parser: argparse.ArgumentParser) -> None:
    """``--policy`` (repeatable), read by :func:`parse_policies`."""
    parser.add_argument(
        "--policy", action="append", metavar="POLICY",
        help=f"{', '.join(p.value for p in POLICY_ORDER)} or {ALL_POLICIES}; repeat to compare "
        "(default: the config's policy)",
    )


def run(args: argparse.Namespace) -> int:
    config = load_config(ReplayConfig, path=args.config)
    policies = parse_policies(args.policy, config.policy)
    trace = read_trace(args.trace)
    trace.check_sources(config.source_names)
    # The parsed trace lives, unchanged, until the command ends: keep the cyclic collector from scanning
    # it again and again, which would make long replays slower per trajectory.
    gc.collect()
    gc.freeze()
    show_progress = shows_progress(
        args.progress, interactive=sys.stderr.isatty(), work=trace.num_finished, minimum=_PROGRESS_MIN_TRAJECTORIES
    )
    results: list[PolicyResult] = []
    entries = EntryCache(trace)
    for policy in policies:
        bar = ProgressBar(sys.stderr, total=trace.num_finished, label=policy.value, enabled=show_progress)
        results.append(replay_policy(trace, config, policy, progress=bar, entries=entries))
    print(
        f"replayed {trace.num_finished} finished trajectories ({len(trace.records)} scheduled) from {args.trace}: "
        f"train batch {config.train_batch_size} in {config.num_minibatches} mini-batches"
    )
    print(comparison_table(results), flush=True)
    for result in results:
        if result.failed:
            print(f"{result.policy.value} stopped: {result.failed}")
    if args.json:
        write_json(args.json, replay_json(trace, config, results, args.trace))
    if args.plot:
        from knittrans.admission.replay.plot import plot_replay

        prepare_plot(args.plot)
        plot_replay(trace, results, args.plot)
        print(f"wrote {args.plot}")
    return 0

