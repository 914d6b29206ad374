"""Simulation results as JSON and as a side-by-side table."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from knittrans.admission.engine import AdmissionPolicy
from knittrans.admission.simulate.config import SimConfig
from knittrans.admission.simulate.results import ModeResult, PolicySimulation

# Reductions in architectural staleness are reported against these policies when they were simulated.
BASELINES = (AdmissionPolicy.TRAIN_BATCH, AdmissionPolicy.LINEAR)


def _round(value: float | None, digits: int = 6) -> float | None:
    return None if value is None else round(value, digits)


def _rounded(values: Sequence[float]) -> list[float | None]:
    return [_round(v) for v in values]


def mode_json(result: ModeResult) -> dict[str, Any]:
    steps = result.steps
    return {
        "per_step_staleness": _rounded(result.per_step_staleness),
        "mean_staleness": _round(result.mean_staleness),
        "violations": result.violations,
        "dropped_stale": result.dropped_stale,
        "admission_times": [_rounded(times) for times in result.admission_times],
        "per_step_trajectory_staleness": _rounded([s.trajectory_staleness for s in steps]),
        "per_step_max_trajectory_staleness": [s.max_trajectory_staleness for s in steps],
        "mean_trajectory_staleness": _round(result.mean_trajectory_staleness),
        "trajectory_staleness_counts": {str(k): v for k, v in result.trajectory_staleness_counts.items()},
        "trained_at": _rounded([s.trained_at for s in steps]),
        "compositions": [dict(s.composition) for s in steps],
        "train_batches": len(steps),
        "mean_step_seconds": _round(result.mean_step_seconds, 3),
        "launched": result.launched,
        "completed": result.completed,
        "discarded": result.discarded,
        "left_in_pool": result.left_in_pool,
        "simulated_seconds": _round(result.simulated_seconds, 3),
        "failed": result.failed,
    }


def reduction(policy: PolicySimulation, baseline: PolicySimulation) -> float | None:
    """1 − (architectural staleness of ``policy``) / (that of ``baseline``); None without a positive baseline."""
    ours, theirs = policy.architectural_staleness, baseline.architectural_staleness
    if ours is None or theirs is None or theirs <= 0:
        return None
    return 1.0 - ours / theirs


def reductions(results: Sequence[PolicySimulation]) -> dict[str, dict[str, float | None]]:
    """For each simulated policy, its reduction against each simulated baseline other than itself."""
    by_policy = {r.policy: r for r in results}
    return {
        result.policy.value: {
            baseline.value: _round(reduction(result, by_policy[baseline]), 4)
            for baseline in BASELINES
            if baseline in by_policy and baseline is not result.policy
        }
        for result in results
    }


def simulation_json(
    config: SimConfig, results: Sequence[PolicySimulation], *, config_path: str, trace_path: str | None
) -> dict[str, Any]:
    """The whole output: what was simulated, then per policy its architectural staleness and both modes."""
    return {
        "config": config_path,
        "trace": trace_path,
        "train_batch_size": config.train_batch_size,
        "num_minibatches": config.num_minibatches,
        "admission_unit": config.admission_unit.value,
        "group_size": config.group_size,
        "staleness_bound": config.staleness_bound,
        "partial_rollout": config.partial_rollout,
        "train_batches": config.train_batches,
        "warmup_steps": config.warmup,
        "seed": config.seed,
        "policies": {
            result.policy.value: {
                "architectural_staleness": _round(result.architectural_staleness),
                "per_step_architectural_staleness": _rounded(result.per_step_architectural_staleness),
                **{mode.mode.value: mode_json(mode) for mode in result.modes},
            }
            for result in results
        },
        "architectural_staleness_reduction": reductions(results),
    }


def _cell(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def comparison_table(results: Sequence[PolicySimulation]) -> str:
    """Policies side by side; pairs are disaggregated/colocated."""
    rows = [(
        "policy", "train batches", "violations", "dropped stale", "staleness disagg", "staleness coloc",
        "architectural", "s per step",
    )]
    for result in results:
        dis, col = result.disaggregated, result.colocated
        failed = " (stalled)" if dis.failed or col.failed else ""
        rows.append((
            result.policy.value,
            f"{len(dis.steps)}/{len(col.steps)}{failed}",
            f"{dis.violations}/{col.violations}",
            f"{dis.dropped_stale}/{col.dropped_stale}",
            _cell(dis.mean_staleness, ".3f"),
            _cell(col.mean_staleness, ".3f"),
            _cell(result.architectural_staleness, ".3f"),
            f"{_cell(dis.mean_step_seconds, '.0f')}/{_cell(col.mean_step_seconds, '.0f')}",
        ))
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    rule = tuple("-" * width for width in widths)
    return "\n".join(
        "  ".join(cell.ljust(width) if column == 0 else cell.rjust(width)
                  for column, (cell, width) in enumerate(zip(row, widths, strict=True)))
        for row in [rows[0], rule, *rows[1:]]
    )


def reduction_lines(results: Sequence[PolicySimulation]) -> list[str]:
    """One sentence per quota-preserving policy and simulated baseline (train-batch is only ever the baseline).

    Policies that violated a quota in either mode are left out: their staleness is bought with the quotas.
    """
    by_policy = {r.policy: r for r in results}
    lines = []
    for result in results:
        if result.disaggregated.violations or result.colocated.violations:
            continue
        for baseline in BASELINES:
            if baseline not in by_policy or baseline is result.policy or result.policy is BASELINES[0]:
                continue
            value = reduction(result, by_policy[baseline])
            ours, theirs = result.architectural_staleness, by_policy[baseline].architectural_staleness
            if value is not None and ours is not None and theirs is not None:
                lines.append(
                    f"{result.policy.value} vs {baseline.value}: architectural staleness {theirs:.3f} -> {ours:.3f} "
                    f"({value:.1%} lower)"
                )
    return lines
