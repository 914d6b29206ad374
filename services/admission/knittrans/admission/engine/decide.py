"""``decide(state, now, version) -> Decision``: the pure admission decision (DESIGN.md §3).

It reads the state's read-only :attr:`~AdmissionState.decision_view` and never changes it;
:meth:`AdmissionState.apply` carries the decision out. The checks, in order: filtered reports are dropped;
units over the staleness bound for the version that trains the current train batch are dropped; admission
waits while it is more than ``max_batches_ahead`` train batches ahead of the policy version; then the size
target, the per-source progressive targets and the completion quotas must hold, and the guard-aware
candidate must pass the feasibility guard. A quota that blocks for longer than ``on_starvation`` allows is
waived (``relax``) or raises :class:`StarvationError` (``fail``).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import cast

from knittrans.admission.engine.config import StarvationAction
from knittrans.admission.engine.decisions import Admit, BlockingReason, Decision, Drop, DropReason, Wait
from knittrans.admission.engine.guard import deficits, plan_forced_picks
from knittrans.admission.engine.state import AdmissionState
from knittrans.admission.engine.view import DecisionView
from knittrans.errors import FailedPrecondition, StarvationError
from knittrans.types import AdmissionUnit, TrajectoryId


def decide(state: AdmissionState, now: float, version: int) -> Decision:
    """The next decision for ``state`` at time ``now`` under policy version ``version``. Pure."""
    view = state.decision_view
    if view.filtered:
        filtered = tuple(view.filtered)
        return Drop(
            trajectory_ids=filtered,
            reason=DropReason.FILTERED,
            detail=f"{len(filtered)} trajectories rejected by a rollout-side filter",
        )
    targets = view.targets
    batch = view.train_batch_index
    train_version = view.version_base + batch
    if version > train_version:
        raise FailedPrecondition(
            f"policy version {version} is ahead of train batch {batch}, which trains at {train_version}"
        )
    pool = view.pool
    bound = targets.staleness_bound
    if bound is not None and pool.min_version < train_version - bound:
        stale = pool.stale_units(train_version - bound)
        return Drop(
            trajectory_ids=tuple(t for unit in stale for t in unit.trajectory_ids),
            reason=DropReason.STALE,
            detail=f"{len(stale)} units older than version {train_version - bound}, over the staleness bound "
            f"{bound} for train version {train_version}",
        )
    ahead = targets.max_batches_ahead
    if ahead is not None and version < train_version - ahead:
        return _wait(
            view,
            now,
            BlockingReason.TRAIN_BATCH_COMPLETE,
            f"train batch {batch - 1} is admitted; train batch {batch} waits for policy version "
            f"{train_version - ahead} (now {version})",
        )
    if pool.total < view.units_needed:
        return _wait(view, now, BlockingReason.TRAIN_BATCH_SIZE, view.size_detail)
    relaxed = view.relaxed
    if not relaxed:
        blocked = _first_unmet_target(view, train_version)
        if blocked is None:
            admit = _build_admit(view, now, train_version, relaxed=False)
            if admit is not None:
                return admit
            blocked = (BlockingReason.FEASIBILITY, _feasibility_detail(view))
        reason, detail = blocked
        starvation = targets.on_starvation
        if starvation.action is StarvationAction.WAIT:
            return _wait(view, now, reason, detail)
        since = view.blocked_since if view.blocking is reason and view.blocked_since is not None else now
        starving_since = view.starving_since if view.starving_since is not None else since
        deadline = starving_since + starvation.after_seconds
        if now < deadline:
            return _wait(view, now, reason, detail, wake_at=deadline)
        if starvation.action is StarvationAction.FAIL:
            raise StarvationError(
                f"{detail}; blocked by {reason.value} since t={starving_since:g} "
                f"({now - starving_since:g} s, on_starvation {starvation})"
            )
    admit = _build_admit(view, now, train_version, relaxed=True)
    assert admit is not None  # with the quotas waived, any m ready units form a candidate
    return admit


def decisions_until_wait(
    state: AdmissionState, now: float, version: int
) -> Generator[Decision, tuple[float, int] | None, None]:
    """The decisions for ``state`` until the engine waits: each decision in turn, the last one a :class:`Wait`.

    The caller carries out each decision (``state.apply``, or a journal that applies it) before it asks for
    the next one, so an async caller can await between steps; the state changes only through the caller.
    ``next()`` decides the next one at the same ``now`` and ``version``; ``send((now, version))`` decides it at a
    later time or policy version (a service reads its clock at every step; a colocated simulation trains,
    and so moves both, after admitting the last mini-batch of a train batch). The errors of :func:`decide`
    (``on_starvation: fail``, a version ahead of the train batch) end it.
    """
    while True:
        decision = decide(state, now, version)
        moved = yield decision
        if type(decision) is Wait:
            return
        if moved is not None:
            now, version = moved


def _wait(
    view: DecisionView, now: float, reason: BlockingReason, detail: str, wake_at: float | None = None
) -> Wait:
    last = view.last_wait
    if last is not None and last.detail is detail and last.reason is reason and last.wake_at == wake_at:
        return last  # the wait in force, unchanged: same reason since the same time, same detail
    since = view.blocked_since if view.blocking is reason and view.blocked_since is not None else now
    return Wait(reason=reason, detail=detail, since=since, wake_at=wake_at)


def _first_unmet_target(view: DecisionView, train_version: int) -> tuple[BlockingReason, str] | None:
    """The first per-source or completion target P_{i,t} that does not hold, with a detail message."""
    targets = view.targets
    minibatch = view.minibatch_index
    source = first_unmet_source(view)
    if source is not None:
        return BlockingReason.SOURCE_QUOTA, view.source_details[source]
    completion = view.completion
    if completion is not None and targets.completion_alpha is not None:
        unmet = completion.first_unmet(train_version, targets.completion_alpha[minibatch])
        if unmet is not None:
            step, completed, target = unmet
            return (
                BlockingReason.COMPLETION_QUOTA,
                f"rollout step {step}: {completed} of {completion.scheduled(step)} scheduled trajectories "
                f"completed, below its target {target} for mini-batch {minibatch + 1}/{targets.num_minibatches}",
            )
    return None


def first_unmet_source(view: DecisionView) -> int | None:
    """The first source whose ready plus admitted units are below its progressive target, or None."""
    source_targets = view.source_targets
    if source_targets:
        for index, (ready, admitted) in enumerate(zip(view.pool.sizes, view.admitted, strict=True)):
            if ready + admitted < source_targets[index]:
                return index
    return None


def _forced_picks(view: DecisionView, counts: list[int]) -> tuple[list[int], int]:
    targets = view.targets
    minibatch = view.minibatch_index
    if not targets.guard and targets.mirror is None:
        return [0] * len(counts), 0
    admitted = view.admitted
    minimums = None
    if targets.mirror is not None:
        minimums = [r - b if r > b else 0 for r, b in zip(targets.mirror[minibatch], admitted, strict=True)]
    return plan_forced_picks(
        available=counts,
        deficit=deficits(targets.quotas, admitted),
        remaining_capacity=targets.train_batch_size - view.admitted_total,
        size=targets.sizes[minibatch],
        minimums=minimums,
        guard=targets.guard,
    )


def _feasibility_detail(view: DecisionView) -> str:
    targets = view.targets
    counts = view.pool.counts()
    short = [
        f"{name} needs {deficit} more, {count} ready"
        for name, deficit, count in zip(targets.sources, deficits(targets.quotas, view.admitted), counts, strict=True)
        if deficit > count
    ]
    remaining = targets.train_batch_size - view.admitted_total - targets.sizes[view.minibatch_index]
    return (
        f"no candidate for mini-batch {view.minibatch_index + 1}/{targets.num_minibatches} leaves room for the "
        f"remaining quotas in the {remaining} slots after it"
        + (f" ({'; '.join(short)})" if short else "")
    )


def _build_admit(view: DecisionView, now: float, train_version: int, *, relaxed: bool) -> Admit | None:
    """The guard-aware candidate (DESIGN.md §3.4), or None when it cannot pass the guard (unless relaxed)."""
    pool = view.pool
    counts = pool.counts()
    picks, shortfall = _forced_picks(view, counts)
    if shortfall > 0 and not relaxed:
        return None
    targets = view.targets
    minibatch = view.minibatch_index
    size = targets.sizes[minibatch]
    keys = []
    for queue, count in zip(pool.queues, picks, strict=True):
        if count:
            keys.extend(queue.keys[queue.head : queue.head + count])
    fill = size - len(keys)
    if fill:
        keys.extend(pool.merge_take(picks, fill))
    keys.sort()
    if targets.admission_unit is AdmissionUnit.GROUP:
        units = pool.units
        trajectory_ids = tuple(t for key in keys for t in units[key[2]].trajectory_ids)
    else:
        # A trajectory unit's id is its trajectory's id; cast rather than wrap each id on the hot path.
        trajectory_ids = cast("tuple[TrajectoryId, ...]", tuple(key[2] for key in keys))
    return Admit(
        trajectory_ids=trajectory_ids,
        train_batch_index=view.train_batch_index,
        minibatch_index=minibatch,
        num_minibatches=targets.num_minibatches,
        train_version=train_version,
        admitted_at=now,
        relaxed=relaxed or view.relaxed,
    )
