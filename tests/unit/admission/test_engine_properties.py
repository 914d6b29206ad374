"""Property-based tests of the engine against an independent reference model with brute-force search.

Random small scenarios (reports, version advances, scheduling and decisions) drive the engine. Alongside,
a naive model recomputes every count and target from DESIGN.md §3 and checks each decision:

- every admitted candidate comes from the pool, has the mini-batch's size, is within the staleness bound,
  and satisfies every readiness predicate and (for guarded policies) the feasibility guard;
- every wait is justified: the blocking predicate really fails, and for a feasibility wait no candidate of
  that size passes the guard (searched over all per-source compositions, which is all candidates up to
  the guard's view of them: it depends only on per-source counts);
- drops are exactly the filtered reports, or exactly the units over the staleness bound;
- with ``on_starvation: relax_after=0``, a quota or the guard never makes the engine wait: an admission with
  them waived is justified only where one of them blocks, and the rest of its train batch stays relaxed (every
  candidate still of the mini-batch's size).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from knittrans.admission.engine import (
    AdmissionPolicy,
    AdmissionState,
    Admit,
    BlockingReason,
    Drop,
    DropReason,
    EngineConfig,
    PoolEntry,
    StarvationAction,
    Wait,
    decide,
)
from knittrans.admission.engine.guard import pick_by_priority, plan_forced_picks
from knittrans.admission.engine.pool import NO_VERSION, PooledUnit, ReadyPool
from knittrans.types import AdmissionUnit

SOURCE_NAMES = ("A", "B", "C")
RATIO_CHOICES = (0.0, 0.2, 0.25, 0.3, 0.4, 0.5)
GUARDED = {AdmissionPolicy.KNITTRANS, AdmissionPolicy.LINEAR, AdmissionPolicy.TRAIN_BATCH}
EPS = 1e-9


# -- the reference model ----------------------------------------------------------------------------------


def reference_quotas(ratios: tuple[float, ...], size: int) -> list[int]:
    ceilings = [math.ceil(r * size - EPS) for r in ratios]
    if sum(ceilings) <= size:
        return ceilings
    floors = [math.floor(r * size + EPS) for r in ratios]
    remainders = [r * size - f for r, f in zip(ratios, floors, strict=True)]
    for i in sorted((i for i in range(len(ratios)) if remainders[i] > EPS), key=lambda i: (-remainders[i], i))[
        : size - sum(floors)
    ]:
        floors[i] += 1
    return floors


def target(start: int, final: int, alpha: float) -> int:
    return math.ceil(start + alpha * (final - start) - EPS)


@dataclass
class Unit:
    unit_id: str
    source: int
    version: int
    members: list[str]


@dataclass
class Reference:
    config: EngineConfig
    version_base: int = 0
    pool: dict[str, Unit] = field(default_factory=dict)
    pending: dict[str, Unit] = field(default_factory=dict)  # groups still waiting for members
    reported: dict[str, int] = field(default_factory=dict)
    closed: set[str] = field(default_factory=set)
    filtered: list[str] = field(default_factory=list)
    carry: set[str] = field(default_factory=set)
    batch: int = 0
    minibatch: int = 0
    admitted: list[int] = field(default_factory=list)
    declared: dict[int, int] = field(default_factory=dict)
    completed: dict[int, int] = field(default_factory=dict)
    completed_at_start: dict[int, int] = field(default_factory=dict)
    relaxed: bool = False
    carry_sources: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.admitted = [0] * len(self.config.sources)
        n = self.config.num_minibatches
        size = self.config.train_batch_size
        self.sizes = [size // n + (1 if t < size % n else 0) for t in range(n)]
        self.cumulative = list(itertools.accumulate(self.sizes))
        self.quotas = reference_quotas(tuple(self.config.sources.values()), size)
        linear = [m / size for m in self.cumulative]
        policy = self.config.policy
        configured = list(self.config.source_schedule)
        if policy is AdmissionPolicy.TRAIN_BATCH:
            self.size_alpha, self.source_alpha, self.completion_alpha = [1.0] * n, [1.0] * n, [1.0] * n
        elif policy is AdmissionPolicy.LINEAR:
            self.size_alpha, self.source_alpha, self.completion_alpha = linear, linear, linear
        elif policy is AdmissionPolicy.STREAM:
            self.size_alpha, self.source_alpha, self.completion_alpha = linear, None, None
        else:
            self.size_alpha, self.source_alpha, self.completion_alpha = linear, configured, configured
        if self.config.completion_quota is None:
            self.completion_alpha = None

    @property
    def train_version(self) -> int:
        return self.version_base + self.batch

    def counts(self) -> list[int]:
        counts = [0] * len(self.admitted)
        for unit in self.pool.values():
            counts[unit.source] += 1
        return counts

    def add(self, trajectory_id: str, sample_id: str, source: int, version: int, accepted: bool, step: int) -> None:
        self.completed[step] = self.completed.get(step, 0) + 1
        if self.config.admission_unit is AdmissionUnit.TRAJECTORY:
            if accepted:
                self.pool[trajectory_id] = Unit(trajectory_id, source, version, [trajectory_id])
            else:
                self.filtered.append(trajectory_id)
            return
        unit = self.pending.setdefault(sample_id, Unit(sample_id, source, 1 << 40, []))
        self.reported[sample_id] = self.reported.get(sample_id, 0) + 1
        if accepted:
            unit.members.append(trajectory_id)
            unit.version = min(unit.version, version)
        else:
            self.filtered.append(trajectory_id)
        if self.reported[sample_id] == self.config.group_size:
            del self.pending[sample_id]
            self.closed.add(sample_id)
            if unit.members:
                self.pool[sample_id] = unit

    def scheduled(self, step: int) -> int:
        return max(self.declared.get(step, 0), self.completed.get(step, 0))

    def stale(self) -> list[Unit]:
        bound = self.config.staleness_bound
        if bound is None:
            return []
        return [u for u in self.pool.values() if self.train_version - u.version > bound]

    def blocking_predicate(self) -> BlockingReason | None:
        """The first readiness predicate P_{i,t} that fails, in the engine's order."""
        t = self.minibatch
        counts = self.counts()
        ready = sum(counts)
        carry_counts = [0] * len(counts)
        for unit_id in self.carry:
            carry_counts[self.carry_sources[unit_id]] += 1
        carry_total = sum(carry_counts)
        size_target = target(carry_total, self.config.train_batch_size, self.size_alpha[t])
        if ready < self.sizes[t] or ready + sum(self.admitted) < size_target:
            return BlockingReason.TRAIN_BATCH_SIZE
        if self.relaxed:
            return None
        if self.source_alpha is not None:
            for i, quota in enumerate(self.quotas):
                if counts[i] + self.admitted[i] < target(carry_counts[i], quota, self.source_alpha[t]):
                    return BlockingReason.SOURCE_QUOTA
        if self.completion_alpha is not None:
            rho = self.config.completion_quota
            for step in self.completed.keys() | self.declared.keys():
                if step > self.train_version:
                    continue
                final = math.ceil(rho * self.scheduled(step) - EPS)
                goal = target(self.completed_at_start.get(step, 0), final, self.completion_alpha[t])
                if self.completed.get(step, 0) < goal:
                    return BlockingReason.COMPLETION_QUOTA
        return None

    def guard_passes(self, composition: list[int]) -> bool:
        after = [b + c for b, c in zip(self.admitted, composition, strict=True)]
        deficit = sum(max(0, q - b) for q, b in zip(self.quotas, after, strict=True))
        return deficit <= self.config.train_batch_size - sum(after)

    def some_candidate_passes_the_guard(self) -> bool:
        counts = self.counts()
        size = self.sizes[self.minibatch]
        ranges = [range(min(c, size) + 1) for c in counts]
        return any(sum(c) == size and self.guard_passes(list(c)) for c in itertools.product(*ranges))

    def start_train_batch(self) -> None:
        self.batch += 1
        self.minibatch = 0
        self.admitted = [0] * len(self.admitted)
        self.carry = set(self.pool)
        self.carry_sources = {u.unit_id: u.source for u in self.pool.values()}
        self.completed_at_start = dict(self.completed)
        self.relaxed = False


# -- checking each decision -------------------------------------------------------------------------------


def check_and_apply(ref: Reference, state: AdmissionState, decision, version: int) -> None:  # type: ignore[no-untyped-def]
    config = ref.config
    if ref.filtered:
        assert isinstance(decision, Drop) and decision.reason is DropReason.FILTERED
        assert sorted(decision.trajectory_ids) == sorted(ref.filtered)
        ref.filtered.clear()
        state.apply(decision)
        return
    stale = ref.stale()
    if stale:
        assert isinstance(decision, Drop) and decision.reason is DropReason.STALE
        assert sorted(decision.trajectory_ids) == sorted(m for u in stale for m in u.members)
        for unit in stale:
            del ref.pool[unit.unit_id]
            ref.carry.discard(unit.unit_id)
        state.apply(decision)
        return
    ahead = config.max_batches_ahead
    if ahead is not None and version < ref.train_version - ahead:
        assert isinstance(decision, Wait) and decision.reason is BlockingReason.TRAIN_BATCH_COMPLETE
        state.apply(decision)
        return
    blocking = ref.blocking_predicate()
    guarded = config.policy in GUARDED and not ref.relaxed
    # With relax_after=0 a quota or the guard never makes the engine wait: it waives them at once.
    relaxes_at_once = config.starvation.action is StarvationAction.RELAX and config.starvation.after_seconds == 0
    if isinstance(decision, Wait):
        if blocking is None:
            # Every predicate holds: the only justified wait is that no candidate passes the guard.
            assert decision.reason is BlockingReason.FEASIBILITY, decision
            assert guarded and not ref.some_candidate_passes_the_guard()
        else:
            assert decision.reason is blocking, (decision, blocking)
        assert not (relaxes_at_once and decision.reason.is_quota), decision
        state.apply(decision)
        return
    assert isinstance(decision, Admit), decision
    if decision.relaxed and not ref.relaxed:  # justified only by a quota or the guard it waives
        assert relaxes_at_once, decision
        assert (blocking is not None and blocking.is_quota) or (
            blocking is None and guarded and not ref.some_candidate_passes_the_guard()), (blocking, decision)
        ref.relaxed = True
        guarded = False
        blocking = ref.blocking_predicate()
    assert blocking is None, (blocking, decision)
    assert decision.relaxed == ref.relaxed
    assert decision.train_batch_index == ref.batch and decision.minibatch_index == ref.minibatch
    assert decision.train_version == ref.train_version
    member_of = {m: u for u in ref.pool.values() for m in u.members}
    units = {member_of[t].unit_id: member_of[t] for t in decision.trajectory_ids}  # KeyError: not in the pool
    assert sum(len(u.members) for u in units.values()) == len(decision.trajectory_ids)
    assert len(units) == ref.sizes[ref.minibatch]
    composition = [0] * len(ref.admitted)
    for unit in units.values():
        composition[unit.source] += 1
    if guarded:
        assert ref.guard_passes(composition)
    if config.policy is AdmissionPolicy.LINEAR and not decision.relaxed:  # relaxed, the mirror is waived too
        need = [
            max(0, math.ceil(ref.cumulative[ref.minibatch] * q / config.train_batch_size - EPS) - b)
            for q, b in zip(ref.quotas, ref.admitted, strict=True)
        ]
        if sum(need) <= ref.sizes[ref.minibatch]:
            assert all(c >= n for c, n in zip(composition, need, strict=True))
    state.apply(decision)
    for unit_id in units:
        del ref.pool[unit_id]
    ref.admitted = [b + c for b, c in zip(ref.admitted, composition, strict=True)]
    ref.minibatch += 1
    if ref.minibatch == config.num_minibatches:
        assert all(b >= q for b, q in zip(ref.admitted, ref.quotas, strict=True)) or not guarded
        ref.start_train_batch()


# -- scenarios --------------------------------------------------------------------------------------------


@st.composite
def engine_configs(draw: st.DrawFn, grouped: bool, guard_binding: bool = False) -> EngineConfig:
    """Random small configs; ``guard_binding`` ones (shares filling the batch, fully relaxed early targets,
    KnitTrans) are where the feasibility guard decides."""
    if guard_binding:
        num_sources = draw(st.integers(2, 3))
        size = draw(st.integers(3, 8))
        n = draw(st.integers(2, min(4, size)))
        return EngineConfig(
            train_batch_size=size,
            num_minibatches=n,
            sources=dict.fromkeys(SOURCE_NAMES[:num_sources], 1.0 / num_sources - 1e-6),
            source_schedule=(0.0,) * (n - 1) + (1.0,),
            staleness_bound=draw(st.none() | st.integers(1, 2)),
            admission_unit=AdmissionUnit.GROUP if grouped else AdmissionUnit.TRAJECTORY,
            group_size=2 if grouped else None,
            policy=AdmissionPolicy.KNITTRANS,
            max_batches_ahead=None,
        )
    num_sources = draw(st.integers(1, 3))
    if draw(st.booleans()):  # shares filling the whole batch make the guard bind
        ratios = [1.0 / num_sources - 1e-6] * num_sources
    else:
        ratios = [draw(st.sampled_from(RATIO_CHOICES)) for _ in range(num_sources)]
        if sum(ratios) > 1:
            ratios = [r / sum(ratios) * 0.999 for r in ratios]
    size = draw(st.integers(1, 8))
    n = draw(st.integers(1, min(4, size)))
    steps = sorted(draw(st.lists(st.sampled_from((0.0, 0.25, 0.5, 0.75, 1.0)), min_size=n - 1, max_size=n - 1)))
    return EngineConfig(
        train_batch_size=size,
        num_minibatches=n,
        sources=dict(zip(SOURCE_NAMES, ratios, strict=False)),
        source_schedule=(*steps, 1.0),
        staleness_bound=draw(st.none() | st.integers(0, 2)),
        completion_quota=draw(st.none() | st.sampled_from((0.5, 0.75))),
        admission_unit=AdmissionUnit.GROUP if grouped else AdmissionUnit.TRAJECTORY,
        group_size=2 if grouped else None,
        policy=draw(st.sampled_from(list(AdmissionPolicy))),
        max_batches_ahead=draw(st.sampled_from((None, 0, 1))),
        on_starvation=draw(st.sampled_from(("wait", "wait", "relax_after=0"))),
    )


# (kind, sample, version lag, accepted, rollout step, source); sources skew toward the first one.
ADD = st.tuples(
    st.just("add"),
    st.integers(0, 7),
    st.integers(0, 2),
    st.sampled_from((True, True, True, False)),
    st.integers(0, 2),
    st.sampled_from((0, 0, 0, 1, 2)),
)
# Rounds of reports, then maybe a version advance or scheduling, then a decision loop.
EVENTS = st.lists(
    st.tuples(
        st.lists(ADD, max_size=6),
        st.sampled_from([(), (("version",),), (("schedule", 0, 3),), (("schedule", 1, 2),)]),
    ),
    min_size=1,
    max_size=12,
).map(lambda rounds: [e for adds, extra in rounds for e in (*adds, *extra, ("decide",))])


def run_scenario(config: EngineConfig, events: list[tuple]) -> list[object]:
    state = AdmissionState(config)
    ref = Reference(config)
    version = 0
    now = 0.0
    trace: list[object] = []
    for number, event in enumerate(events):
        now += 1.0
        kind = event[0]
        if kind == "add":
            _, sample, lag, accepted, step, source = event
            trajectory_id = f"t{number}"
            if config.admission_unit is AdmissionUnit.GROUP:
                sample_id = f"s{sample}"
                source = sample % len(config.sources)  # a sample has one source
                if sample_id in ref.closed:
                    continue
            else:
                sample_id = f"s{number}"
                source %= len(config.sources)
            oldest = max(0, version - lag)
            state.add(PoolEntry(trajectory_id=trajectory_id, sample_id=sample_id, source=SOURCE_NAMES[source],
                                ready_at=now, oldest_version=oldest, rollout_step=step, accepted=accepted))
            ref.add(trajectory_id, sample_id, source, oldest, accepted, step)
        elif kind == "schedule":
            state.add_scheduled(event[1], event[2])
            ref.declared[event[1]] = ref.declared.get(event[1], 0) + event[2]
        elif kind == "version":
            version = min(version + 1, ref.train_version)
        else:
            for _ in range(50):
                decision = decide(state, now, version)
                check_and_apply(ref, state, decision, version)
                trace.append(decision)
                if isinstance(decision, Wait):
                    break
            else:
                pytest.fail("the engine never waited")
    return trace


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=engine_configs(grouped=False), events=EVENTS)
def test_every_decision_is_justified(config: EngineConfig, events: list[tuple]) -> None:
    run_scenario(config, events)


@settings(max_examples=75, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=engine_configs(grouped=True), events=EVENTS)
def test_every_group_decision_is_justified(config: EngineConfig, events: list[tuple]) -> None:
    run_scenario(config, events)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=st.booleans().flatmap(lambda g: engine_configs(grouped=g, guard_binding=True)), events=EVENTS)
def test_feasibility_waits_are_justified(config: EngineConfig, events: list[tuple]) -> None:
    run_scenario(config, events)


@settings(max_examples=30, deadline=None)
@given(config=engine_configs(grouped=False), events=EVENTS)
def test_same_input_same_decisions(config: EngineConfig, events: list[tuple]) -> None:
    assert run_scenario(config, events) == run_scenario(config, events)


# -- building blocks ---------------------------------------------------------------------------------------


def one_at_a_time(count: int, caps: list[int], priority: list[int]) -> list[int]:
    picks = [0] * len(caps)
    caps, priority = list(caps), list(priority)
    for _ in range(count):
        eligible = [i for i in range(len(caps)) if caps[i] > 0 and priority[i] > 0]
        if not eligible:
            break
        best = min(eligible, key=lambda i: (-priority[i], i))
        picks[best] += 1
        caps[best] -= 1
        priority[best] -= 1
    return picks


@settings(max_examples=200, deadline=None)
@given(
    count=st.integers(0, 30),
    sources=st.lists(st.tuples(st.integers(0, 12), st.integers(0, 12)), min_size=1, max_size=6),
)
def test_block_picks_equal_one_at_a_time(count: int, sources: list[tuple[int, int]]) -> None:
    caps = [c for c, _ in sources]
    priority = [p for _, p in sources]
    picks = [0] * len(sources)
    made = pick_by_priority(count, list(caps), list(priority), picks)
    assert picks == one_at_a_time(count, caps, priority)
    assert made == sum(picks)


def some_composition_passes(available: list[int], deficit: list[int], remaining_capacity: int, size: int) -> bool:
    """Brute force over every candidate of ``size`` units the pool can supply: does one leave no more deficit than
    the capacity left after it?"""
    ranges = [range(min(a, size) + 1) for a in available]
    return any(sum(c) == size and sum(max(0, d - x) for d, x in zip(deficit, c, strict=True))
               <= remaining_capacity - size for c in itertools.product(*ranges))


@settings(max_examples=300, deadline=None)
@given(
    sources=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5)), min_size=1, max_size=3),
    size=st.integers(1, 5),
    spare=st.integers(-4, 6),  # the capacity left beyond the candidate; below 0 only after a relaxed admission
    with_minimums=st.booleans(),
    data=st.data(),
)
def test_forced_picks_fit_the_candidate_and_report_exactly_when_the_guard_cannot_pass(
    sources: list[tuple[int, int]], size: int, spare: int, with_minimums: bool, data: st.DataObject
) -> None:
    available = [a for a, _ in sources]
    deficit = [d for _, d in sources]
    if sum(available) < size:
        available[0] += size - sum(available)  # decide builds a candidate only once the pool holds one
    remaining_capacity = size + spare
    minimums = ([data.draw(st.integers(0, 3)) for _ in sources] if with_minimums else None)
    picks, shortfall = plan_forced_picks(available=available, deficit=deficit, remaining_capacity=remaining_capacity,
                                         size=size, minimums=minimums, guard=True)
    assert sum(picks) <= size
    assert all(0 <= p <= a for p, a in zip(picks, available, strict=True))
    if minimums is None:
        assert (shortfall == 0) == some_composition_passes(available, deficit, remaining_capacity, size)
    if shortfall == 0:  # the picks and any fill from the rest of the pool pass
        after = [max(0, d - p) for d, p in zip(deficit, picks, strict=True)]
        assert sum(after) <= remaining_capacity - size


@settings(max_examples=100, deadline=None)
@given(
    units=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(0, 20)), max_size=40),
    offsets=st.lists(st.integers(0, 5), min_size=4, max_size=4),
    count=st.integers(0, 45),
)
def test_pool_merge_takes_the_policy_order(units: list[tuple[int, int, int]], offsets: list[int], count: int) -> None:
    pool = ReadyPool(4)
    keys_by_source: list[list[tuple]] = [[] for _ in range(4)]
    for number, (source, version, ready) in enumerate(units):
        key = (version, float(ready), f"u{number:03d}")
        pool.insert(PooledUnit(key, source, (key[2],), number))
        keys_by_source[source].append(key)
    remaining = [sorted(keys)[offset:] for keys, offset in zip(keys_by_source, offsets, strict=True)]
    expected = sorted(k for keys in remaining for k in keys)[:count]
    assert pool.merge_take(offsets, count) == expected
    assert pool.min_version == min((version for _, version, _ in units), default=NO_VERSION)
    assert pool.counts() == [len(keys) for keys in keys_by_source]
    taken = pool.take_prefixes({0: 2, 3: 1})
    assert [u.key for u in taken] == sorted(keys_by_source[0])[:2] + sorted(keys_by_source[3])[:1]
    assert pool.counts() == [max(0, len(keys_by_source[0]) - 2), len(keys_by_source[1]), len(keys_by_source[2]),
                             max(0, len(keys_by_source[3]) - 1)]
    assert pool.total == sum(pool.counts()) == len(pool.units)
    assert pool.min_version == min((u.key[0] for u in pool.units.values()), default=NO_VERSION)
