"""Replay results as JSON and as a side-by-side comparison table."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from knittrans.admission.replay.config import ReplayConfig
from knittrans.admission.replay.driver import PolicyResult, TrainBatchResult
from knittrans.admission.replay.trace import Trace


def _round(value: float | None, digits: int = 6) -> float | None:
    return None if value is None else round(value, digits)


def train_batch_json(batch: TrainBatchResult) -> dict[str, Any]:
    return {
        "index": batch.index,
        "train_version": batch.train_version,
        "start": _round(batch.start),
        "composition": dict(batch.composition),
        "quota_met": batch.quota_met,
        "admit_times": [_round(t) for t in batch.admit_times],
        "first_admit_fraction": _round(batch.first_admit_fraction),
        "trajectories": batch.trajectories,
        "mean_staleness": _round(batch.mean_staleness),
        "finished_training_at": _round(batch.finished_training_at),
        "relaxed": batch.relaxed,
    }


def policy_json(result: PolicyResult) -> dict[str, Any]:
    return {
        "quotas": dict(result.quotas),
        "train_batches": [train_batch_json(b) for b in result.train_batches],
        "violations": result.violations,
        "mean_first_admit_fraction": _round(result.mean_first_admit_fraction),
        "dropped_stale": result.dropped_stale,
        "dropped_filtered": result.dropped_filtered,
        "mean_staleness": _round(result.mean_staleness),
        "admitted_trajectories": result.admitted_trajectories,
        "relaxed_train_batches": result.relaxed_train_batches,
        "unfinished_train_batch_admit_times": [_round(t) for t in result.pending_admit_times],
        "left_in_pool": result.left_in_pool,
        "blocked_at_end": result.blocked_at_end.value,
        "failed": result.failed,
    }


def replay_json(trace: Trace, config: ReplayConfig, results: Sequence[PolicyResult], trace_path: str) -> dict[str, Any]:
    """The whole output: what was replayed, then one entry per policy under ``policies``."""
    return {
        "trace": trace_path,
        "trajectories": len(trace.records),
        "finished_trajectories": trace.num_finished,
        "train_batch_size": config.train_batch_size,
        "num_minibatches": config.num_minibatches,
        "admission_unit": config.admission_unit.value,
        "staleness_bound": config.staleness_bound,
        "completion_quota": config.completion_quota,
        "train_seconds_per_minibatch": config.train_seconds_per_minibatch,
        "policies": {result.policy.value: policy_json(result) for result in results},
    }


def _format(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def comparison_table(results: Sequence[PolicyResult]) -> str:
    """Policies side by side, one row each."""
    header = ("policy", "train batches", "violations", "first-admit frac", "mean staleness", "dropped stale",
              "relaxed")
    rows = [header]
    for result in results:
        batches = str(len(result.train_batches))
        if result.failed:
            batches += " (failed)"
        rows.append((
            result.policy.value,
            batches,
            str(result.violations),
            _format(result.mean_first_admit_fraction, ".3f"),
            _format(result.mean_staleness, ".3f"),
            str(result.dropped_stale),
            str(result.relaxed_train_batches),
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = []
    for n, row in enumerate(rows):
        cells = [row[0].ljust(widths[0])] + [cell.rjust(width) for cell, width in zip(row[1:], widths[1:], strict=True)]
        lines.append("  ".join(cells))
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)
