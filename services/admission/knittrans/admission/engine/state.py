"""The engine's state: the ready pool and the train batch being admitted, changed only by explicit transitions.

The state is a deterministic function of the sequence of calls made on it (``add``, ``add_scheduled``,
``expect_group``, ``apply``), so a caller that journals those calls rebuilds it exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from knittrans.admission.engine.config import EngineConfig
from knittrans.admission.engine.decisions import QUOTA_REASONS, Admit, BlockingReason, Decision, Drop, Wait
from knittrans.admission.engine.entries import PoolEntries, PoolEntry
from knittrans.admission.engine.pool import NO_VERSION, PooledUnit
from knittrans.admission.engine.quotas import AdmissionTargets, progressive_target
from knittrans.admission.engine.view import DecisionFields, DecisionView
from knittrans.errors import Conflict, FailedPrecondition, InvalidArgument
from knittrans.types import AdmissionUnit, SampleId, SourceName, TrajectoryId


@dataclass(frozen=True, kw_only=True)
class SourceStatus:
    source: SourceName
    quota: int  # τ_i
    admitted: int  # b_i in the current train batch
    ready: int  # units of this source in the pool
    target: int = 0  # ⌈τ_{i,t}⌉, its progressive target for the next mini-batch (0 without source predicates)

    @property
    def slack(self) -> int:
        """s_i − τ_i: rollout-side count minus the final quota (negative while short)."""
        return self.ready + self.admitted - self.quota


@dataclass(frozen=True, kw_only=True)
class EngineStatus:
    """A snapshot for ``GetStatus`` and metrics."""

    train_batch_index: int
    minibatches_admitted: int
    num_minibatches: int
    train_version: int
    pool_size: int
    sources: tuple[SourceStatus, ...]
    blocking: BlockingReason
    blocked_since: float | None
    relaxed: bool


class _PendingGroup:
    """A sample whose reports are not all in yet (admission unit ``group``)."""

    __slots__ = ("accepted", "oldest_version", "ready_at", "reported", "size", "source")

    def __init__(self, source: int, size: int) -> None:
        self.source = source
        self.size = size
        self.reported = 0
        self.accepted: list[TrajectoryId] = []
        self.oldest_version = NO_VERSION
        self.ready_at = 0.0  # when its last trajectory was reported


class AdmissionState:
    """The ready pool and the train batch being admitted.

    Read it through its properties and :meth:`status`; change it only through :meth:`add`,
    :meth:`add_scheduled`, :meth:`expect_group` and :meth:`apply`. :func:`decide` reads
    :attr:`decision_view`, the read-only view of the fields a decision needs.
    """

    def __init__(self, config: EngineConfig, *, version: int = 0) -> None:
        if not isinstance(version, int) or isinstance(version, bool) or version < 0:
            raise InvalidArgument(f"must be a non-negative integer, got {version!r}", field="version")
        self.config = config
        self.targets = AdmissionTargets.build(config)
        # What a decision reads (pool, counts of the train batch, targets, the wait in force): decide gets it
        # read-only through decision_view; only this class's transitions change it.
        self._inputs = DecisionFields(self.targets, version_base=version)
        self._source_index = {name: i for i, name in enumerate(self.targets.sources)}
        num_sources = len(self.targets.sources)
        self._grouped = self.targets.admission_unit is AdmissionUnit.GROUP
        # Trajectory -> its group, for the members of pending and pooled groups. Without groups a unit's id
        # is its trajectory's id, so no map is needed.
        self._unit_of: dict[TrajectoryId, str] = {}
        self._groups: dict[SampleId, _PendingGroup] = {}
        self._group_sizes: dict[SampleId, int] = {}
        self._closed_samples: set[SampleId] = set()
        self._seq = 0
        self._generation = 0  # transitions so far: see generation
        self._carry = [0] * num_sources  # s_{i,0}
        self._carry_total = 0  # s_{0,0}
        self._carry_seq = 0  # units with a lower seq were in the pool when the train batch started
        self._refresh_targets()

    # -- read-only views -------------------------------------------------------------------------------

    @property
    def decision_view(self) -> DecisionView:
        """The fields :func:`decide` reads, read-only; they change with every transition of this state."""
        return self._inputs

    @property
    def generation(self) -> int:
        """Bumped by every call that changes this state. :func:`decide` reads nothing else of it, so while the
        generation and the policy version stay the same, the decision applied last stays the decision: after a
        :class:`Wait`, until its ``wake_at`` (a wait depends on the time only through that deadline)."""
        return self._generation

    @property
    def train_batch_index(self) -> int:
        return self._inputs.train_batch_index

    @property
    def minibatches_admitted(self) -> int:
        """Mini-batches of the current train batch admitted so far (the 0-based index of the next one)."""
        return self._inputs.minibatch_index

    @property
    def train_version(self) -> int:
        """The policy version that trains the current train batch: v₀ + its index."""
        return self._inputs.version_base + self._inputs.train_batch_index

    @property
    def pool_size(self) -> int:
        return self._inputs.pool.total

    @property
    def blocking(self) -> BlockingReason:
        return self._inputs.blocking

    def pool_counts(self) -> dict[SourceName, int]:
        return dict(zip(self.targets.sources, self._inputs.pool.counts(), strict=True))

    def admitted_counts(self) -> dict[SourceName, int]:
        return dict(zip(self.targets.sources, self._inputs.admitted, strict=True))

    def source_targets(self) -> dict[SourceName, int]:
        """⌈τ_{i,t}⌉ per source for the next mini-batch; empty when the policy has no source predicates."""
        return dict(zip(self.targets.sources, self._inputs.source_targets, strict=False))

    def status(self) -> EngineStatus:
        counts = self._inputs.pool.counts()
        return EngineStatus(
            train_batch_index=self._inputs.train_batch_index,
            minibatches_admitted=self._inputs.minibatch_index,
            num_minibatches=self.targets.num_minibatches,
            train_version=self.train_version,
            pool_size=self._inputs.pool.total,
            sources=tuple(
                SourceStatus(source=name, quota=quota, admitted=admitted, ready=ready, target=target)
                for name, quota, admitted, ready, target in zip(
                    self.targets.sources,
                    self.targets.quotas,
                    self._inputs.admitted,
                    counts,
                    self._inputs.source_targets or [0] * len(counts),
                    strict=True,
                )
            ),
            blocking=self._inputs.blocking,
            blocked_since=self._inputs.blocked_since,
            relaxed=self._inputs.relaxed,
        )

    # -- inputs ----------------------------------------------------------------------------------------

    def add(self, entry: PoolEntry) -> None:
        """Report one finished trajectory. Filtered ones are dropped by the next decision."""
        source = self._source_index.get(entry.source)
        if source is None:
            known = ", ".join(self.targets.sources)
            raise InvalidArgument(f"unknown source {entry.source!r}; configured: {known}", field="source")
        trajectory_id = entry.trajectory_id
        inputs = self._inputs
        if trajectory_id in self._unit_of or trajectory_id in inputs.pool.units:
            raise Conflict(f"trajectory {trajectory_id!r} is already in the pool", field="trajectory_id")
        self._generation += 1
        if inputs.completion is not None:
            inputs.completion.add_completed(entry.rollout_step)
        if self._grouped:
            self._add_to_group(entry, source)
        elif entry.accepted:
            seq = self._seq
            self._seq = seq + 1
            key = (entry.oldest_version, entry.ready_at, trajectory_id)
            # tuple.__new__ skips the named tuple's Python-level __new__: one unit per report, on the hot path.
            inputs.pool.insert(tuple.__new__(PooledUnit, (key, source, (trajectory_id,), seq)))
        else:
            inputs.filtered.append(trajectory_id)

    def add_many(self, entries: PoolEntries) -> None:
        """Report many finished trajectories at once: the same state as :meth:`add` for each, in order, but all
        or nothing (an unknown source or a trajectory already in the pool changes nothing). With ``group``
        admission units the rows are added one by one, as :meth:`add` would."""
        count = len(entries)
        if not count:
            return
        source_index = self._source_index
        unknown = set(entries.sources).difference(source_index)
        if unknown:
            i = next(i for i, name in enumerate(entries.sources) if name in unknown)
            known = ", ".join(self.targets.sources)
            raise InvalidArgument(
                f"unknown source {entries.sources[i]!r}; configured: {known}", field=f"sources[{i}]"
            )
        ids = entries.trajectory_ids
        if len(set(ids)) != count or not self._inputs.pool.units.keys().isdisjoint(ids) or (
            self._unit_of and not self._unit_of.keys().isdisjoint(ids)
        ):
            seen: set[str] = set()
            for trajectory_id in ids:
                if trajectory_id in seen or trajectory_id in self._unit_of or trajectory_id in self._inputs.pool.units:
                    raise Conflict(f"trajectory {trajectory_id!r} is already in the pool", field="trajectory_id")
                seen.add(trajectory_id)
        self._generation += 1
        if self._grouped:
            for i in range(count):
                self.add(entries.entry(i))
            return
        if self._inputs.completion is not None:
            completed: dict[int, int] = {}
            for step in entries.rollout_steps:
                completed[step] = completed.get(step, 0) + 1
            for step, number in completed.items():
                self._inputs.completion.add_completed(step, number)
        accepted = entries.accepted
        if all(accepted):
            kept_ids, kept_sources, kept_versions = ids, entries.sources, entries.oldest_versions
        else:
            kept = [i for i, flag in enumerate(accepted) if flag]
            self._inputs.filtered.extend(t for t, flag in zip(ids, accepted, strict=True) if not flag)
            kept_ids = [ids[i] for i in kept]
            kept_sources = [entries.sources[i] for i in kept]
            kept_versions = [entries.oldest_versions[i] for i in kept]
        # Built a column at a time (no Python loop per trajectory): keys in policy order, then the pooled units.
        count = len(kept_ids)
        seq = self._seq
        keys = list(zip(kept_versions, [entries.ready_at] * count, kept_ids, strict=True))
        sources = list(map(source_index.__getitem__, kept_sources))
        units = list(map(tuple.__new__, [PooledUnit] * count,
                         zip(keys, sources, zip(kept_ids), range(seq, seq + count), strict=True)))
        self._seq = seq + count
        self._inputs.pool.insert_many(keys, sources, units)

    def add_scheduled(self, rollout_step: int, count: int = 1) -> None:
        """Declare ``count`` trajectories scheduled at ``rollout_step`` (for completion quotas)."""
        if not isinstance(rollout_step, int) or isinstance(rollout_step, bool) or rollout_step < 0:
            raise InvalidArgument(f"must be a non-negative integer, got {rollout_step!r}", field="rollout_step")
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise InvalidArgument(f"must be a non-negative integer, got {count!r}", field="count")
        if self._inputs.completion is not None and count:
            self._inputs.completion.add_scheduled(rollout_step, count)
            self._generation += 1

    def expect_group(self, sample_id: SampleId, size: int) -> None:
        """Declare how many trajectories ``sample_id`` has (admission unit ``group``); else ``group_size``."""
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise InvalidArgument(f"must be a positive integer, got {size!r}", field="size")
        pending = self._groups.get(sample_id)
        if pending is not None and pending.reported > size:
            raise InvalidArgument(
                f"sample {sample_id!r} already has {pending.reported} trajectories", field="size"
            )
        self._group_sizes[sample_id] = size
        self._generation += 1
        if pending is not None:
            pending.size = size
            self._close_group_if_complete(sample_id, pending)

    def apply(self, decision: Decision) -> None:
        """Carry out a decision returned by :func:`decide` on this state (waits included)."""
        kind = type(decision)
        if kind is Wait:  # by far the most frequent
            assert isinstance(decision, Wait)
            inputs = self._inputs
            if decision is inputs.last_wait:
                return  # the wait in force, applied again: nothing changes
            self._generation += 1
            reason = decision.reason
            if reason is not inputs.blocking:
                inputs.blocking = reason
                inputs.blocked_since = decision.since
            inputs.last_wait = decision
            if reason in QUOTA_REASONS:
                if inputs.starving_since is None:
                    inputs.starving_since = decision.since
            else:
                inputs.starving_since = None
        elif kind is Admit:
            assert isinstance(decision, Admit)
            self._generation += 1
            self._apply_admit(decision)
        elif kind is Drop:
            assert isinstance(decision, Drop)
            self._generation += 1
            self._apply_drop(decision)
        else:
            raise InvalidArgument(f"not a decision: {decision!r}", field="decision")

    def first_rejected_addition(
        self, sample_ids: Sequence[str], sources: Sequence[str]
    ) -> tuple[int, str, str] | None:
        """Pure: the first of these new trajectories (in order) that :meth:`add` would reject for its group, as
        (index, field, reason), or None. Lets a caller refuse a report before journaling it."""
        if not self._grouped:
            return None
        reported: dict[str, int] = {}
        group_source: dict[str, int] = {}
        for i, (sample_id, source) in enumerate(zip(sample_ids, sources, strict=True)):
            if sample_id in self._closed_samples:
                return i, "sample_id", f"sample {sample_id!r} already has all its trajectories"
            source_index = self._source_index.get(SourceName(source))
            if source_index is None:
                return i, "source", f"unknown source {source!r}"
            pending = self._groups.get(SampleId(sample_id))
            first = group_source.setdefault(sample_id, pending.source if pending is not None else source_index)
            if first != source_index:
                mixed = f"{self.targets.sources[first]!r} and {source!r}"
                return i, "source", f"sample {sample_id!r} has trajectories from {mixed}"
            size: int | None
            if pending is not None:
                size = pending.size
            else:
                size = self._group_sizes.get(SampleId(sample_id), self.targets.group_size)
            if size is None:
                return i, "sample_id", f"the size of group {sample_id!r} is unknown: set group_size"
            count = reported[sample_id] = reported.get(sample_id, pending.reported if pending is not None else 0) + 1
            if count > size:
                return i, "sample_id", f"sample {sample_id!r} already has all its {size} trajectories"
        return None

    # -- transitions -----------------------------------------------------------------------------------

    def _add_to_group(self, entry: PoolEntry, source: int) -> None:
        sample_id = entry.sample_id
        pending = self._groups.get(sample_id)
        if pending is None:
            if sample_id in self._closed_samples:
                raise InvalidArgument(f"sample {sample_id!r} already has all its trajectories", field="sample_id")
            size = self._group_sizes.get(sample_id, self.targets.group_size)
            if size is None:
                raise InvalidArgument(
                    f"the size of group {sample_id!r} is unknown: set group_size or call expect_group",
                    field="group_size",
                )
            pending = self._groups[sample_id] = _PendingGroup(source, size)
        elif pending.source != source:
            raise InvalidArgument(
                f"sample {sample_id!r} has trajectories from {self.targets.sources[pending.source]!r} and "
                f"{entry.source!r}",
                field="source",
            )
        pending.reported += 1
        pending.ready_at = max(pending.ready_at, entry.ready_at)
        if entry.accepted:
            pending.accepted.append(entry.trajectory_id)
            self._unit_of[entry.trajectory_id] = sample_id
            pending.oldest_version = min(pending.oldest_version, entry.oldest_version)
        else:
            self._inputs.filtered.append(entry.trajectory_id)
        self._close_group_if_complete(sample_id, pending)

    def _close_group_if_complete(self, sample_id: SampleId, pending: _PendingGroup) -> None:
        if pending.reported < pending.size:
            return
        del self._groups[sample_id]
        self._group_sizes.pop(sample_id, None)
        self._closed_samples.add(sample_id)
        if pending.accepted:
            members = tuple(sorted(pending.accepted))
            key = (pending.oldest_version, pending.ready_at, sample_id)
            self._inputs.pool.insert(PooledUnit(key, pending.source, members, self._seq))
            self._seq += 1

    def check_admit(self, admit: Admit) -> None:
        """Raise what :meth:`apply` would raise for ``admit``, changing nothing: a service checks an admission
        before it journals it, so that a decision the state refuses never reaches the journal."""
        self._check_position(admit)
        self._admitted_units(admit.trajectory_ids, self.targets.sizes[self._inputs.minibatch_index])

    def _check_position(self, admit: Admit) -> None:
        inputs = self._inputs
        if admit.train_batch_index != inputs.train_batch_index or admit.minibatch_index != inputs.minibatch_index:
            raise FailedPrecondition(
                f"decision for mini-batch {admit.minibatch_index} of train batch {admit.train_batch_index}, "
                f"but the state is at mini-batch {inputs.minibatch_index} of train batch {inputs.train_batch_index}"
            )

    def _apply_admit(self, admit: Admit) -> None:
        inputs = self._inputs
        self._check_position(admit)
        size = self.targets.sizes[inputs.minibatch_index]
        units = self._take_units(admit.trajectory_ids, size)
        for unit in units:
            inputs.admitted[unit.source] += 1
        if self._grouped:
            for unit in units:
                for trajectory_id in unit.trajectory_ids:
                    del self._unit_of[trajectory_id]
        inputs.admitted_total += size
        inputs.minibatch_index += 1
        inputs.blocking = BlockingReason.NONE
        inputs.blocked_since = admit.admitted_at
        inputs.last_wait = None
        inputs.starving_since = None
        if admit.relaxed:
            inputs.relaxed = True
        if inputs.minibatch_index == self.targets.num_minibatches:
            self._start_next_train_batch()
        self._refresh_targets()

    def _take_units(self, trajectory_ids: tuple[TrajectoryId, ...], size: int) -> list[PooledUnit]:
        """Check, then remove, the units of these trajectories; a source's prefix goes in O(1) per unit."""
        unit_ids, by_source = self._admitted_units(trajectory_ids, size)
        pool = self._inputs.pool
        # Admissions from decide list each source's units in policy order, at its head.
        if all(pool.is_prefix(source, ids) for source, ids in by_source.items()):
            return pool.take_prefixes({source: len(ids) for source, ids in by_source.items()})
        return pool.remove_all(unit_ids)

    def _admitted_units(self, trajectory_ids: tuple[TrajectoryId, ...], size: int
                        ) -> tuple[list[str], dict[int, list[str]]]:
        """The pooled units these trajectories make up, all and by source, once checked to be exactly ``size``
        whole units of the pool."""
        pool_units = self._inputs.pool.units
        unit_ids: list[str] = []
        for trajectory_id in trajectory_ids:
            unit_id = self._unit_of.get(trajectory_id) if self._grouped else trajectory_id
            if unit_id is None or unit_id not in pool_units:
                raise InvalidArgument(f"trajectory {trajectory_id!r} is not in the pool", field="trajectory_ids")
            unit_ids.append(unit_id)
        if self._grouped:
            unit_ids = list(dict.fromkeys(unit_ids))
        if len(unit_ids) != size or len(set(unit_ids)) != size:
            raise InvalidArgument(
                f"admits {len(set(unit_ids))} units, the mini-batch takes {size}", field="trajectory_ids"
            )
        by_source: dict[int, list[str]] = {}
        members = 0
        for unit_id in unit_ids:
            unit = pool_units[unit_id]
            members += len(unit.trajectory_ids)
            by_source.setdefault(unit.source, []).append(unit_id)
        if members != len(trajectory_ids):
            raise InvalidArgument("must list every trajectory of each admitted group once", field="trajectory_ids")
        return unit_ids, by_source

    def _apply_drop(self, drop: Drop) -> None:
        dropped = set(drop.trajectory_ids)
        if self._inputs.filtered:
            filtered = dropped.intersection(self._inputs.filtered)
            if filtered:
                self._inputs.filtered = [t for t in self._inputs.filtered if t not in filtered]
                dropped -= filtered
        pool = self._inputs.pool
        unit_ids = {self._unit_of.get(t) if self._grouped else t for t in dropped}
        # Members of groups still waiting for their other trajectories are not in the pool yet.
        removed = pool.remove_all(sorted(u for u in unit_ids if u is not None and u in pool))
        carry_changed = False
        for unit in removed:
            for member in unit.trajectory_ids:
                self._unit_of.pop(member, None)
            if unit.seq < self._carry_seq:
                self._carry[unit.source] -= 1
                self._carry_total -= 1
                carry_changed = True
        if carry_changed:
            self._refresh_targets()

    def _refresh_targets(self) -> None:
        targets = self.targets
        inputs = self._inputs
        t = inputs.minibatch_index
        where = f"mini-batch {t + 1}/{targets.num_minibatches} of train batch {inputs.train_batch_index}"
        size_target = progressive_target(self._carry_total, targets.train_batch_size, targets.size_alpha[t])
        inputs.units_needed = max(targets.sizes[t], size_target - inputs.admitted_total)
        inputs.size_detail = f"{where} needs {inputs.units_needed} ready units"
        if targets.source_alpha is None:
            inputs.source_targets = []
            inputs.source_details = []
        else:
            alpha = targets.source_alpha[t]
            inputs.source_targets = [
                progressive_target(carry, quota, alpha)
                for carry, quota in zip(self._carry, targets.quotas, strict=True)
            ]
            inputs.source_details = [
                f"source {name} is below its target {target} (quota {quota}, ready plus admitted) for {where}"
                for name, target, quota in zip(targets.sources, inputs.source_targets, targets.quotas, strict=True)
            ]

    def _start_next_train_batch(self) -> None:
        inputs = self._inputs
        inputs.train_batch_index += 1
        inputs.minibatch_index = 0
        inputs.admitted = [0] * len(inputs.admitted)
        inputs.admitted_total = 0
        self._carry = inputs.pool.counts()
        self._carry_total = inputs.pool.total
        self._carry_seq = self._seq
        inputs.relaxed = False
        if inputs.completion is not None:
            inputs.completion.start_train_batch()
