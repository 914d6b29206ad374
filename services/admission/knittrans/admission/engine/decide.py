"""``decide(state, now, version) -> Decision``: the pure admission decision (DESIGN.md §3).

It reads the state and never changes it; :meth:`AdmissionState.apply` carries the decision out. The checks,
in order: filtered reports are dropped; units over the staleness bound for the version that trains the
current train batch are dropped; admission waits while it is more than ``max_batches_ahead`` train batches
ahead of the policy version; then the size target, the per-source progressive targets and the completion
quotas must hold, and the guard-aware candidate must pass the feasibility guard. A quota that blocks for
longer than ``on_starvation`` allows is waived (``relax``) or raises :class:`StarvationError` (``fail``).
"""

from __future__ import annotations

from knittrans.admission.engine.config import StarvationAction
from knittrans.admission.engine.decisions import Admit, BlockingReason, Decision, Drop, DropReason, Wait
from knittrans.admission.engine.guard import deficits, plan_forced_picks
from knittrans.admission.engine.state import AdmissionState
from knittrans.errors import FailedPrecondition, StarvationError
from knittrans.types import AdmissionUnit


def decide(state: AdmissionState, now: float, version: int) -> Decision:
    """The next decision for ``state`` at time ``now`` under policy version ``version``. Pure."""
    if state._filtered:
        filtered = tuple(state._filtered)
        return Drop(
            trajectory_ids=filtered,
            reason=DropReason.FILTERED,
            detail=f"{len(filtered)} trajectories rejected by a rollout-side filter",
        )
    plan = state.plan
    train_version = state._version_base + state._batch
    if version > train_version:
        raise FailedPrecondition(
            f"policy version {version} is ahead of train batch {state._batch}, which trains at {train_version}"
        )
    pool = state._pool
    bound = plan.staleness_bound
    if bound is not None and pool.min_version < train_version - bound:
        stale = pool.stale_units(train_version - bound)
        return Drop(
            trajectory_ids=tuple(t for unit in stale for t in unit.trajectory_ids),
            reason=DropReason.STALE,
            detail=f"{len(stale)} units older than version {train_version - bound}, over the staleness bound "
            f"{bound} for train version {train_version}",
        )
    ahead = plan.max_batches_ahead
    if ahead is not None and version < train_version - ahead:
        return _wait(
            state,
            now,
            BlockingReason.TRAIN_BATCH_COMPLETE,
            f"train batch {state._batch - 1} is admitted; train batch {state._batch} waits for policy version "
            f"{train_version - ahead} (now {version})",
        )
    if pool.total < state._units_needed:
        return _wait(state, now, BlockingReason.TRAIN_BATCH_SIZE, state._size_detail)
    relaxed = state._relaxed
    if not relaxed:
        blocked = _first_unmet_target(state, train_version)
        if blocked is None:
            admit = _build_admit(state, now, train_version, relaxed=False)
            if admit is not None:
                return admit
            blocked = (BlockingReason.FEASIBILITY, _feasibility_detail(state))
        reason, detail = blocked
        starvation = plan.on_starvation
        if starvation.action is StarvationAction.WAIT:
            return _wait(state, now, reason, detail)
        since = state._blocked_since if state._blocking is reason and state._blocked_since is not None else now
        starving_since = state._starving_since if state._starving_since is not None else since
        deadline = starving_since + starvation.after_seconds
        if now < deadline:
            return _wait(state, now, reason, detail, wake_at=deadline)
        if starvation.action is StarvationAction.FAIL:
            raise StarvationError(
                f"{detail}; blocked by {reason.value} since t={starving_since:g} "
                f"({now - starving_since:g} s, on_starvation {starvation})"
            )
    admit = _build_admit(state, now, train_version, relaxed=True)
    assert admit is not None  # with the quotas waived, any m ready units form a candidate
    return admit


def _wait(
    state: AdmissionState, now: float, reason: BlockingReason, detail: str, wake_at: float | None = None
) -> Wait:
    last = state._last_wait
    if last is not None and last.detail is detail and last.reason is reason and last.wake_at == wake_at:
        return last  # the wait in force, unchanged: same reason since the same time, same detail
    since = state._blocked_since if state._blocking is reason and state._blocked_since is not None else now
    return Wait(reason=reason, detail=detail, since=since, wake_at=wake_at)


def _first_unmet_target(state: AdmissionState, train_version: int) -> tuple[BlockingReason, str] | None:
    """The first per-source or completion target P_{i,t} that does not hold, with a detail message."""
    plan = state.plan
    minibatch = state._minibatch
    targets = state._source_targets
    if targets:
        for index, (ready, admitted) in enumerate(zip(state._pool.sizes, state._admitted, strict=True)):
            if ready + admitted < targets[index]:
                return BlockingReason.SOURCE_QUOTA, state._source_details[index]
    completion = state._completion
    if completion is not None and plan.completion_alpha is not None:
        unmet = completion.first_unmet(train_version, plan.completion_alpha[minibatch])
        if unmet is not None:
            step, completed, target = unmet
            return (
                BlockingReason.COMPLETION_QUOTA,
                f"rollout step {step}: {completed} of {completion.scheduled(step)} scheduled trajectories "
                f"completed, below its target {target} for mini-batch {minibatch + 1}/{plan.num_minibatches}",
            )
    return None


def _forced_picks(state: AdmissionState, counts: list[int]) -> tuple[list[int], int]:
    plan = state.plan
    minibatch = state._minibatch
    if not plan.guard and plan.mirror is None:
        return [0] * len(counts), 0
    admitted = state._admitted
    minimums = None
    if plan.mirror is not None:
        minimums = [r - b if r > b else 0 for r, b in zip(plan.mirror[minibatch], admitted, strict=True)]
    return plan_forced_picks(
        available=counts,
        deficit=deficits(plan.quotas, admitted),
        remaining_capacity=plan.train_batch_size - state._admitted_total,
        size=plan.sizes[minibatch],
        minimums=minimums,
        guard=plan.guard,
    )


def _feasibility_detail(state: AdmissionState) -> str:
    plan = state.plan
    counts = state._pool.counts()
    short = [
        f"{name} needs {deficit} more, {count} ready"
        for name, deficit, count in zip(plan.sources, deficits(plan.quotas, state._admitted), counts, strict=True)
        if deficit > count
    ]
    remaining = plan.train_batch_size - state._admitted_total - plan.sizes[state._minibatch]
    return (
        f"no candidate for mini-batch {state._minibatch + 1}/{plan.num_minibatches} leaves room for the "
        f"remaining quotas in the {remaining} slots after it"
        + (f" ({'; '.join(short)})" if short else "")
    )


def _build_admit(state: AdmissionState, now: float, train_version: int, *, relaxed: bool) -> Admit | None:
    """The guard-aware candidate (DESIGN.md §3.4), or None when it cannot pass the guard (unless relaxed)."""
    pool = state._pool
    counts = pool.counts()
    picks, shortfall = _forced_picks(state, counts)
    if shortfall > 0 and not relaxed:
        return None
    plan = state.plan
    minibatch = state._minibatch
    size = plan.sizes[minibatch]
    keys = []
    for queue, count in zip(pool.queues, picks, strict=True):
        if count:
            keys.extend(queue.keys[queue.head : queue.head + count])
    fill = size - len(keys)
    if fill:
        keys.extend(pool.merge_take(picks, fill))
    keys.sort()
    if plan.admission_unit is AdmissionUnit.GROUP:
        units = pool.units
        trajectory_ids = tuple(t for key in keys for t in units[key[2]].trajectory_ids)
    else:
        trajectory_ids = tuple(key[2] for key in keys)
    return Admit(
        trajectory_ids=trajectory_ids,
        train_batch_index=state._batch,
        minibatch_index=minibatch,
        num_minibatches=plan.num_minibatches,
        train_version=train_version,
        admitted_at=now,
        relaxed=relaxed or state._relaxed,
    )
