"""What a simulation reports: per train step, per mode, and the architectural staleness per policy."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from knittrans.admission.engine import AdmissionPolicy
from knittrans.admission.simulate.modes import Mode
from knittrans.types import SourceName


@dataclass(frozen=True, kw_only=True)
class StepResult:
    """One train batch (train step). Times are wall-clock seconds; ``composition`` counts admission units."""

    index: int
    train_version: int
    admit_times: tuple[float, ...]
    composition: Mapping[SourceName, int]
    quotas: Mapping[SourceName, int]
    trajectories: int
    tokens: int
    token_staleness: float  # token-mean staleness
    trajectory_staleness: float  # mean over trajectories of the staleness of their oldest token
    max_trajectory_staleness: int
    trained_at: float  # when its training and sync ended
    relaxed: bool

    @property
    def quota_met(self) -> bool:
        return all(self.composition[source] >= quota for source, quota in self.quotas.items())


def _mean(values: list[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None


@dataclass(frozen=True, kw_only=True)
class ModeResult:
    """One policy in one mode. Means are over the steps after the first ``warmup`` ones."""

    mode: Mode
    policy: AdmissionPolicy
    warmup: int
    steps: tuple[StepResult, ...]
    dropped_stale: int
    discarded: int  # unfinished trajectories thrown away at the end of colocated rollout phases
    launched: int
    completed: int
    left_in_pool: int
    trajectory_staleness_counts: Mapping[int, int]  # oldest-token staleness -> admitted trajectories
    simulated_seconds: float
    failed: str | None

    @property
    def per_step_staleness(self) -> list[float]:
        return [step.token_staleness for step in self.steps]

    @property
    def measured_steps(self) -> tuple[StepResult, ...]:
        return self.steps[self.warmup :]

    @property
    def mean_staleness(self) -> float | None:
        """Token-mean staleness per step, averaged over the steps after warm-up."""
        return _mean([step.token_staleness for step in self.measured_steps])

    @property
    def mean_trajectory_staleness(self) -> float | None:
        return _mean([step.trajectory_staleness for step in self.measured_steps])

    @property
    def violations(self) -> int:
        return sum(1 for step in self.steps if not step.quota_met)

    @property
    def admission_times(self) -> list[list[float]]:
        return [list(step.admit_times) for step in self.steps]

    @property
    def mean_step_seconds(self) -> float | None:
        """Wall time per train step after warm-up (from the end of one step's training to the next's)."""
        steps = self.steps
        if len(steps) <= max(1, self.warmup):
            return None
        first = max(1, self.warmup)
        return (steps[-1].trained_at - steps[first - 1].trained_at) / (len(steps) - first)


@dataclass(frozen=True, kw_only=True)
class PolicySimulation:
    """Both modes of one policy, on the same rollout script."""

    policy: AdmissionPolicy
    disaggregated: ModeResult
    colocated: ModeResult

    @property
    def modes(self) -> tuple[ModeResult, ModeResult]:
        return self.disaggregated, self.colocated

    @property
    def per_step_architectural_staleness(self) -> list[float]:
        """Disaggregated minus colocated token-mean staleness, step by step (steps both modes reached)."""
        return [
            d.token_staleness - c.token_staleness
            for d, c in zip(self.disaggregated.steps, self.colocated.steps, strict=False)
        ]

    @property
    def architectural_staleness(self) -> float | None:
        """The mean of the per-step differences over the steps after warm-up (the paper's §7.2 measure)."""
        return _mean(self.per_step_architectural_staleness[self.disaggregated.warmup :])
