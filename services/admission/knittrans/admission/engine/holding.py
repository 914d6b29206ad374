"""Which new reports leave the wait in force the decision, so that a caller adding reports one by one need not
decide again after each (the trace replay; DESIGN.md §3).

A wait depends on a new trajectory only through the checks ``decide`` makes before the one that blocked: a
filtered report is dropped first, a stale one is dropped next, and after that each check only grows easier
with more ready units. So after a report that is accepted and not stale the same checks pass, and the one that
blocked still fails while what it counts stays below its target: the pool's ready units for a size wait, the
blocking source's ready plus admitted units for a source wait, the blocking rollout step's completions for a
completion wait. More scheduled trajectories only raise completion targets, so they never end a wait (a hold
that then names a lower target than the step's own only ends sooner: the caller decides again).

The decision is then a wait for the same reason, since the same time, with the same wake-up and the same
detail, except that a completion wait's detail counts the step's completions when it was decided.

Group admission units are left out (a report may close a group and release several units at once); so are
feasibility waits (any new unit may make a candidate pass the guard).
"""

from __future__ import annotations

from dataclasses import dataclass

from knittrans.admission.engine.decide import first_unmet_source
from knittrans.admission.engine.decisions import BlockingReason, Wait
from knittrans.admission.engine.entries import PoolEntry
from knittrans.admission.engine.view import DecisionView
from knittrans.errors import InvalidArgument
from knittrans.types import AdmissionUnit

_HELD_REASONS = frozenset({
    BlockingReason.TRAIN_BATCH_COMPLETE,
    BlockingReason.TRAIN_BATCH_SIZE,
    BlockingReason.SOURCE_QUOTA,
    BlockingReason.COMPLETION_QUOTA,
})


@dataclass(frozen=True, kw_only=True, slots=True)
class WaitHold:
    """What a wait in force depends on of the reports that follow it (see the module docstring).

    ``min_version``: the oldest version a report may carry without being dropped as stale (None: no bound);
    ``blocking_source``: the index of the source below its target (source waits); ``blocking_step`` and
    ``step_target``: the rollout step below its completion target, and that target (completion waits)."""

    reason: BlockingReason
    min_version: int | None = None
    blocking_source: int | None = None
    blocking_step: int | None = None
    step_target: int = 0

    def __post_init__(self) -> None:
        if self.reason not in _HELD_REASONS:
            raise InvalidArgument(f"a {self.reason.value} wait is not held across reports", field="reason")
        if (self.reason is BlockingReason.SOURCE_QUOTA) != (self.blocking_source is not None):
            raise InvalidArgument("a source wait, and only it, names its blocking source", field="blocking_source")
        if (self.reason is BlockingReason.COMPLETION_QUOTA) != (self.blocking_step is not None):
            raise InvalidArgument("a completion wait, and only it, names its blocking step", field="blocking_step")

    def survives_report(self, view: DecisionView, entry: PoolEntry) -> bool:
        """Whether the wait stays the decision once ``entry`` was added (``view`` is the state after it)."""
        if not entry.accepted:
            return False
        if self.min_version is not None and entry.oldest_version < self.min_version:
            return False
        reason = self.reason
        if reason is BlockingReason.TRAIN_BATCH_SIZE:
            return view.pool.total < view.units_needed
        if reason is BlockingReason.SOURCE_QUOTA:
            index = self.blocking_source
            assert index is not None
            return view.pool.sizes[index] + view.admitted[index] < view.source_targets[index]
        if reason is BlockingReason.COMPLETION_QUOTA:
            completion = view.completion
            assert completion is not None and self.blocking_step is not None
            return completion.completed.get(self.blocking_step, 0) < self.step_target
        return True


def wait_hold(view: DecisionView, wait: Wait) -> WaitHold | None:
    """What keeps ``wait`` the decision of ``view``, the state it was just decided (and applied) on; None when
    any new report may change it. Pure."""
    targets = view.targets
    reason = wait.reason
    if reason not in _HELD_REASONS or targets.admission_unit is not AdmissionUnit.TRAJECTORY or view.filtered:
        return None
    train_version = view.version_base + view.train_batch_index
    bound = targets.staleness_bound
    min_version = None if bound is None else train_version - bound
    if reason is BlockingReason.SOURCE_QUOTA:
        source = first_unmet_source(view)
        return None if source is None else WaitHold(reason=reason, min_version=min_version, blocking_source=source)
    if reason is BlockingReason.COMPLETION_QUOTA:
        completion, alphas = view.completion, targets.completion_alpha
        if completion is None or alphas is None:
            return None
        unmet = completion.first_unmet(train_version, alphas[view.minibatch_index])
        if unmet is None:
            return None
        step, _, target = unmet
        return WaitHold(reason=reason, min_version=min_version, blocking_step=step, step_target=target)
    return WaitHold(reason=reason, min_version=min_version)
