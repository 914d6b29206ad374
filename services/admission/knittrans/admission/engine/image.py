"""An :class:`AdmissionState` as plain values, and back: what the admission service snapshots.

:func:`engine_image` reads every field a transition of the state reads; :func:`restore_engine` builds a state
equal to it, so that restoring an image taken after some calls and making further calls gives the state those
calls give from the start. What the state derives (the pool's per-source order and counts, trajectory -> group,
the next mini-batch's targets, the completion steps below their quota) is rebuilt rather than stored. The wait
in force is kept without its wake-up time, as a journal replay rebuilds it. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from knittrans.admission.engine.config import EngineConfig
from knittrans.admission.engine.decisions import BlockingReason, Wait
from knittrans.admission.engine.pool import PooledUnit
from knittrans.admission.engine.state import AdmissionState, _PendingGroup
from knittrans.errors import FailedPrecondition
from knittrans.types import SampleId, TrajectoryId


@dataclass(frozen=True, kw_only=True)
class PendingGroupImage:
    sample_id: str
    source: int
    size: int
    reported: int
    accepted: tuple[str, ...]
    oldest_version: int
    ready_at: float


@dataclass(frozen=True, kw_only=True)
class CompletionImage:
    declared: dict[int, int]
    completed: dict[int, int]
    completed_at_start: dict[int, int]


@dataclass(frozen=True, kw_only=True)
class EngineImage:
    """The state's fields. Pool unit ``i`` is element ``i`` of each ``unit_*`` column; ``unit_members`` is None
    when every unit is one trajectory (its id), else each unit's trajectories."""

    version_base: int
    train_batch_index: int
    minibatch_index: int
    admitted: tuple[int, ...]
    admitted_total: int
    relaxed: bool
    blocking: BlockingReason
    blocked_since: float | None
    starving_since: float | None
    last_wait: Wait | None
    filtered: tuple[str, ...]
    unit_versions: list[int]
    unit_ready_at: list[float]
    unit_ids: list[str]
    unit_sources: list[int]
    unit_seqs: list[int]
    unit_members: list[tuple[str, ...]] | None
    pending_groups: tuple[PendingGroupImage, ...]
    group_sizes: dict[SampleId, int]
    closed_samples: tuple[str, ...]
    next_seq: int
    carry: tuple[int, ...]
    carry_total: int
    carry_seq: int
    completion: CompletionImage | None


def engine_image(state: AdmissionState) -> EngineImage:
    inputs = state._inputs
    units = list(inputs.pool.units.values())
    keys = [unit.key for unit in units]
    grouped = state._grouped
    last = inputs.last_wait
    completion = inputs.completion
    return EngineImage(
        version_base=inputs.version_base,
        train_batch_index=inputs.train_batch_index,
        minibatch_index=inputs.minibatch_index,
        admitted=tuple(inputs.admitted),
        admitted_total=inputs.admitted_total,
        relaxed=inputs.relaxed,
        blocking=inputs.blocking,
        blocked_since=inputs.blocked_since,
        starving_since=inputs.starving_since,
        last_wait=None if last is None else Wait(reason=last.reason, detail=last.detail, since=last.since),
        filtered=tuple(inputs.filtered),
        unit_versions=[key[0] for key in keys],
        unit_ready_at=[key[1] for key in keys],
        unit_ids=[key[2] for key in keys],
        unit_sources=[unit.source for unit in units],
        unit_seqs=[unit.seq for unit in units],
        unit_members=[unit.trajectory_ids for unit in units] if grouped else None,
        pending_groups=tuple(
            PendingGroupImage(sample_id=sample_id, source=group.source, size=group.size, reported=group.reported,
                              accepted=tuple(group.accepted), oldest_version=group.oldest_version,
                              ready_at=group.ready_at)
            for sample_id, group in state._groups.items()
        ),
        group_sizes=dict(state._group_sizes),
        closed_samples=tuple(state._closed_samples),
        next_seq=state._seq,
        carry=tuple(state._carry),
        carry_total=state._carry_total,
        carry_seq=state._carry_seq,
        completion=None if completion is None else CompletionImage(
            declared=dict(completion.declared), completed=dict(completion.completed),
            completed_at_start=dict(completion.completed_at_start)),
    )


def restore_engine(config: EngineConfig, image: EngineImage) -> AdmissionState:
    """The state ``image`` was taken of, for ``config`` (the config it was taken with)."""
    state = AdmissionState(config, version=image.version_base)
    inputs = state._inputs
    num_sources = len(state.targets.sources)
    if len(image.admitted) != num_sources or len(image.carry) != num_sources:
        raise FailedPrecondition(f"the snapshot is of {len(image.admitted)} sources, the config has {num_sources}")
    if (image.completion is None) != (inputs.completion is None):
        raise FailedPrecondition("the snapshot and the config disagree on the completion quota")
    inputs.train_batch_index = image.train_batch_index
    inputs.minibatch_index = image.minibatch_index
    inputs.admitted = list(image.admitted)
    inputs.admitted_total = image.admitted_total
    inputs.relaxed = image.relaxed
    inputs.blocking = image.blocking
    inputs.blocked_since = image.blocked_since
    inputs.starving_since = image.starving_since
    inputs.last_wait = image.last_wait
    inputs.filtered = [TrajectoryId(t) for t in image.filtered]
    count = len(image.unit_ids)
    members = image.unit_members if image.unit_members is not None else list(zip(image.unit_ids))
    keys = list(zip(image.unit_versions, image.unit_ready_at, image.unit_ids, strict=True))
    units = list(map(tuple.__new__, [PooledUnit] * count,
                     zip(keys, image.unit_sources, members, image.unit_seqs, strict=True)))
    inputs.pool.insert_many(keys, list(image.unit_sources), units)
    unit_of = state._unit_of
    if state._grouped:
        for unit in units:
            unit_of.update(dict.fromkeys(unit.trajectory_ids, unit.key[2]))
    for group in image.pending_groups:
        pending = _PendingGroup(group.source, group.size)
        pending.reported = group.reported
        pending.accepted = [TrajectoryId(t) for t in group.accepted]
        pending.oldest_version = group.oldest_version
        pending.ready_at = group.ready_at
        state._groups[SampleId(group.sample_id)] = pending
        unit_of.update(dict.fromkeys(pending.accepted, group.sample_id))
    state._group_sizes.update((SampleId(s), size) for s, size in image.group_sizes.items())
    state._closed_samples.update(SampleId(s) for s in image.closed_samples)
    state._seq = image.next_seq
    state._carry = list(image.carry)
    state._carry_total = image.carry_total
    state._carry_seq = image.carry_seq
    tracker = inputs.completion
    if tracker is not None and image.completion is not None:
        tracker.declared.update(image.completion.declared)
        tracker.completed.update(image.completion.completed)
        tracker.completed_at_start.update(image.completion.completed_at_start)
        for step in set(tracker.declared) | set(tracker.completed):
            tracker._refresh(step, tracker.declared.get(step, 0), tracker.completed.get(step, 0))
    state._refresh_targets()
    return state
