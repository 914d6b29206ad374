"""``knittrans plan``: plan one mini-batch from files, to inspect a plan or tune budgets.

    knittrans plan --batch BATCH.jsonl --topology TOPO.yaml [--json OUT.json]

BATCH.jsonl holds one trajectory per line (docs/plan-format.md); TOPO.yaml is a topology loaded through the
config loader, so unknown keys are errors. The summary goes to stdout (stderr when the plan JSON does).
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from knittrans.admission.planning.planner import plan_minibatch
from knittrans.config import load_config
from knittrans.errors import InvalidArgument
from knittrans.plan import DEFAULT_LABEL_FIELDS, Plan
from knittrans.plan.json import plan_to_json, trajectory_from_json_dict
from knittrans.types import Topology, TrajectoryMeta

logger = logging.getLogger(__name__)


def register(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    """Plan one mini-batch: DP micro-batches, zigzag CP ranges, encoder plan and route map."""
    parser.add_argument("--batch", required=True, type=Path, help="BATCH.jsonl: one trajectory per line")
    parser.add_argument("--topology", required=True, type=Path, help="TOPO.yaml: backbone and encoder layout")
    parser.add_argument(
        "--json", type=Path, default=None, metavar="OUT.json", help="write the plan as JSON ('-': stdout)"
    )
    parser.add_argument(
        "--label-field",
        action="append",
        dest="label_fields",
        default=None,
        metavar="FIELD",
        help=f"a per-token field that labels come from (repeatable; default: {', '.join(DEFAULT_LABEL_FIELDS)})",
    )
    parser.add_argument(
        "--balance-target",
        type=float,
        default=1.01,
        help="imbalance above which dealing sequences before packing is tried too (default 1.01)",
    )
    return run


def run(args: argparse.Namespace) -> int:
    # The topology file is an input document, not this process's config: no KNITTRANS_* overrides.
    topology = load_config(Topology, path=args.topology, env={})
    trajectories, lines = read_batch_lines(args.batch)
    logger.info("planning %d trajectories", len(trajectories))
    try:
        plan = plan_minibatch(
            trajectories,
            topology,
            label_fields=tuple(args.label_fields or DEFAULT_LABEL_FIELDS),
            balance_target=args.balance_target,
        )
    except InvalidArgument as exc:
        raise at_lines(exc, lines) from exc
    plan.validate()
    to_stdout = args.json is not None and str(args.json) == "-"
    write_summary(plan, sys.stderr if to_stdout else sys.stdout)
    if to_stdout:
        sys.stdout.write(plan_to_json(plan) + "\n")
    elif args.json is not None:
        args.json.write_text(plan_to_json(plan) + "\n")
        logger.info("wrote the plan to %s", args.json)
    return 0


def read_batch(path: Path) -> list[TrajectoryMeta]:
    """Parse BATCH.jsonl; errors name the line and the field (``batch.jsonl:3.num_tokens``)."""
    return read_batch_lines(path)[0]


def read_batch_lines(path: Path) -> tuple[list[TrajectoryMeta], list[str]]:
    """Parse BATCH.jsonl into its trajectories and, for each, where it is (``batch.jsonl:3``)."""
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise InvalidArgument(f"cannot read: {exc.strerror}", field=str(path)) from exc
    trajectories = []
    locations = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path.name}:{number}"
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InvalidArgument(f"not valid JSON: {exc.msg}", field=where) from None
        trajectories.append(trajectory_from_json_dict(data, where))
        locations.append(where)
    if not trajectories:
        raise InvalidArgument("holds no trajectory", field=str(path))
    return trajectories, locations


_TRAJECTORY_POSITION = re.compile(r"\btrajectories\[(\d+)\]")


def at_lines(error: InvalidArgument, locations: list[str]) -> InvalidArgument:
    """The planner's error with each ``trajectories[i]`` (0-based, blank lines skipped) replaced by its line."""

    def line(match: re.Match[str]) -> str:
        return locations[int(match.group(1))]

    field = _TRAJECTORY_POSITION.sub(line, error.field) if error.field else None
    return type(error)(_TRAJECTORY_POSITION.sub(line, error.message), field=field)


def write_summary(plan: Plan, out: TextIO) -> None:
    """A human-readable digest: quality figures and each DP rank's micro-batches (padded tokens/sequences)."""
    b = plan.topology.backbone
    q = plan.quality
    tokens = int(plan.num_tokens.sum())
    out.write(
        f"{plan.num_trajectories} trajectories, {tokens} tokens; dp={b.dp} cp={b.cp} tp={b.tp}, "
        f"budget {b.max_tokens_per_microbatch} padded tokens per micro-batch, pad multiple {b.effective_pad_multiple}\n"
    )
    out.write(
        f"{q.scheme.value}: {q.microbatches_per_rank} micro-batches per rank, imbalance {q.imbalance:.4f} "
        f"(lockstep {q.lockstep_imbalance:.4f}), padding {q.padding_tokens} tokens, "
        f"{q.empty_microbatches} empty and {q.oversize_microbatches} oversize micro-batches, "
        f"{plan.backbone.minibatch_loss_tokens} loss tokens\n"
    )
    padded = plan.backbone.padded_tokens
    for d in range(b.dp):
        cells = [f"{int(padded[mb].sum())}/{len(mb)}" for mb in plan.microbatches(d)]
        out.write(f"  dp {d}: workload {q.rank_workloads[d]:.4g}  tokens/sequences: {' '.join(cells)}\n")
    if q.references:
        out.write(
            f"{q.unique_encodings} unique encodings for {q.references} references (dedup {q.dedup_factor:.2f}x)\n"
        )
    for e in q.encoders:
        out.write(
            f"  encoder {e.name}: {e.unique_encodings} encodings, {e.microbatches_per_rank} micro-batches per rank, "
            f"imbalance {e.imbalance:.4f}, {e.empty_microbatches} empty and {e.oversize_microbatches} oversize; "
            f"route rows {len(plan.route)}\n"
        )
