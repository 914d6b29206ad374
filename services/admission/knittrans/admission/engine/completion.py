"""Partial-rollout completion quotas: at least ρ of the trajectories scheduled at rollout step r completed.

The quota of step r applies to every train batch trained at version r or later. A trajectory counts as
completed once it is reported, accepted or filtered. Scheduled counts come from the caller
(``add_scheduled``); a step never has fewer scheduled than completed trajectories.
"""

from __future__ import annotations

import math

from knittrans.admission.engine.quotas import progressive_target


class CompletionTracker:
    """Scheduled and completed counts per rollout step, with the set of steps below their final quota."""

    __slots__ = ("completed", "completed_at_start", "declared", "quota", "unmet")

    def __init__(self, quota: float) -> None:
        self.quota = quota
        self.declared: dict[int, int] = {}
        self.completed: dict[int, int] = {}
        self.completed_at_start: dict[int, int] = {}
        self.unmet: set[int] = set()

    def scheduled(self, step: int) -> int:
        return max(self.declared.get(step, 0), self.completed.get(step, 0))

    def final_target(self, step: int) -> int:
        return math.ceil(self.quota * self.scheduled(step) - 1e-9)

    def add_scheduled(self, step: int, count: int) -> None:
        declared = self.declared[step] = self.declared.get(step, 0) + count
        self._refresh(step, declared, self.completed.get(step, 0))

    def add_completed(self, step: int, count: int = 1) -> None:
        completed = self.completed[step] = self.completed.get(step, 0) + count
        self._refresh(step, self.declared.get(step, 0), completed)

    def start_train_batch(self) -> None:
        self.completed_at_start = dict(self.completed)

    def first_unmet(self, up_to_step: int, alpha: float) -> tuple[int, int, int] | None:
        """The lowest step ≤ ``up_to_step`` below its progressive target, as (step, completed, target)."""
        if not self.unmet:
            return None
        due = [step for step in self.unmet if step <= up_to_step]
        if len(due) > 1:
            due.sort()
        for step in due:
            completed = self.completed.get(step, 0)
            target = progressive_target(self.completed_at_start.get(step, 0), self.final_target(step), alpha)
            if completed < target:
                return step, completed, target
        return None

    def _refresh(self, step: int, declared: int, completed: int) -> None:
        scheduled = declared if declared > completed else completed
        if completed < math.ceil(self.quota * scheduled - 1e-9):
            self.unmet.add(step)
        elif self.unmet:
            self.unmet.discard(step)
