"""A wait hold (engine.holding) may only say a wait holds when ``decide`` itself, asked again, waits the same way.

The oracle is ``decide``: after every report or scheduling that the hold let through, the state is decided
afresh, without applying, and must give a wait with the hold's reason, the same ``since`` and wake-up, and the
same detail (a completion wait's counts aside). Events come in random order from random small configs.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from knittrans.admission.engine import (
    AdmissionPolicy,
    AdmissionState,
    BlockingReason,
    EngineConfig,
    PoolEntry,
    Wait,
    decide,
)
from knittrans.admission.engine.holding import WaitHold, wait_hold
from knittrans.errors import InvalidArgument
from knittrans.types import AdmissionUnit

SOURCES = ("A", "B", "C")


@st.composite
def configs(draw: st.DrawFn) -> EngineConfig:
    num_sources = draw(st.integers(1, 3))
    size = draw(st.integers(1, 5))
    n = draw(st.integers(1, min(4, size)))
    steps = sorted(draw(st.lists(st.sampled_from((0.0, 0.5, 1.0)), min_size=n - 1, max_size=n - 1)))
    return EngineConfig(
        train_batch_size=size,
        num_minibatches=n,
        sources={name: draw(st.sampled_from((0.0, 0.2, 1.0 / num_sources - 1e-6))) for name in SOURCES[:num_sources]},
        source_schedule=(*steps, 1.0),
        staleness_bound=draw(st.none() | st.integers(0, 2)),
        completion_quota=draw(st.none() | st.sampled_from((0.5, 0.75, 1.0))),
        policy=draw(st.sampled_from(list(AdmissionPolicy))),
        max_batches_ahead=draw(st.sampled_from((None, 0, 1))),
        on_starvation=draw(st.sampled_from(("wait", "relax_after=5"))),
    )


# ("report", source, version, rollout step, accepted) | ("schedule", rollout step, count) | ("train",)
REPORT = st.tuples(
    st.just("report"),
    st.sampled_from((0, 0, 1, 2)),
    st.integers(0, 3),
    st.sampled_from((0, 0, 1, 2)),
    st.sampled_from((True, True, True, False)),
)
SCHEDULE = st.tuples(st.just("schedule"), st.sampled_from((0, 0, 1, 2)), st.integers(1, 8))
EVENT = st.one_of(REPORT, REPORT, SCHEDULE, st.tuples(st.just("train")))


def _decide_until_wait(state: AdmissionState, now: float, version: int) -> Wait:
    while True:
        decision = decide(state, now, version)
        state.apply(decision)
        if isinstance(decision, Wait):
            return decision


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=configs(), events=st.lists(EVENT, max_size=120))
def test_a_held_wait_is_what_decide_gives_again(config: EngineConfig, events: list[tuple]) -> None:
    _check_every_held_wait(config, events)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    size=st.integers(1, 4),
    minibatches=st.integers(1, 2),
    quota=st.sampled_from((0.5, 0.75, 1.0)),
    scheduled=st.lists(st.tuples(st.integers(0, 2), st.integers(1, 6)), min_size=1, max_size=4),
    events=st.lists(st.one_of(REPORT, REPORT, REPORT, SCHEDULE, st.tuples(st.just("train"))), max_size=80),
)
@example(size=1, minibatches=2, quota=1.0, scheduled=[(0, 4)], events=[("report", 0, 0, 0, True)] * 5)
def test_a_held_completion_wait_is_what_decide_gives_again(
    size: int, minibatches: int, quota: float, scheduled: list[tuple[int, int]], events: list[tuple]
) -> None:
    """Completion waits, which the mixed configs above rarely reach: trajectories scheduled up front, sources
    without quotas, the KnitTrans policy."""
    config = EngineConfig(
        train_batch_size=size * minibatches,
        num_minibatches=minibatches,
        sources={"A": 0.0, "B": 0.0},
        completion_quota=quota,
        policy=AdmissionPolicy.KNITTRANS,
    )
    _check_every_held_wait(config, [("schedule", step, count) for step, count in scheduled] + events)


def _check_every_held_wait(config: EngineConfig, events: list[tuple]) -> None:
    state = AdmissionState(config, version=0)
    sources = state.targets.sources
    version, now = 0, 0.0
    wait = _decide_until_wait(state, now, version)
    hold = wait_hold(state.decision_view, wait)
    for i, event in enumerate(events):
        now += 0.5
        if now >= (wait.wake_at if wait.wake_at is not None else float("inf")):
            hold = None  # a wake-up ends any wait; the caller decides again then
        if event[0] == "report":
            _, source, entry_version, step, accepted = event
            entry = PoolEntry(
                trajectory_id=f"t{i}",
                sample_id=f"s{i}",
                source=sources[source % len(sources)],
                ready_at=now,
                oldest_version=min(entry_version, version),
                rollout_step=step,
                accepted=accepted,
            )
            state.add(entry)
            held = hold is not None and hold.survives_report(state.decision_view, entry)
        elif event[0] == "schedule":
            state.add_scheduled(event[1], event[2])
            held = hold is not None  # scheduling more only raises completion targets
        else:
            train_version = state.decision_view.version_base + state.decision_view.train_batch_index
            version = min(version + 1, train_version)
            held = False  # the policy version moved: the caller decides again
        if held:
            assert hold is not None
            again = decide(state, now, version)
            assert isinstance(again, Wait), (hold, again)
            assert (again.reason, again.since, again.wake_at) == (wait.reason, wait.since, wait.wake_at)
            if again.reason is not BlockingReason.COMPLETION_QUOTA:
                assert again.detail == wait.detail
            continue
        try:
            wait = _decide_until_wait(state, now, version)
        except Exception as error:  # fail_after is not drawn; nothing else may end the loop
            raise AssertionError(f"decide failed: {error}") from error
        hold = wait_hold(state.decision_view, wait)


def test_group_units_and_feasibility_waits_are_never_held() -> None:
    grouped = AdmissionState(
        EngineConfig(
            train_batch_size=4, num_minibatches=1, sources={"A": 0.5}, admission_unit=AdmissionUnit.GROUP, group_size=2
        ),
        version=0,
    )
    wait = _decide_until_wait(grouped, 0.0, 0)
    assert wait.reason is BlockingReason.TRAIN_BATCH_SIZE
    assert wait_hold(grouped.decision_view, wait) is None
    with pytest.raises(InvalidArgument) as error:
        WaitHold(reason=BlockingReason.FEASIBILITY)
    assert error.value.field == "reason"


def test_a_size_wait_holds_until_the_mini_batch_has_its_units() -> None:
    state = AdmissionState(EngineConfig(train_batch_size=3, num_minibatches=1, sources={"A": 0.0}), version=0)
    wait = _decide_until_wait(state, 0.0, 0)
    hold = wait_hold(state.decision_view, wait)
    assert hold is not None and hold.reason is BlockingReason.TRAIN_BATCH_SIZE
    survived = []
    for i in range(3):
        entry = PoolEntry(trajectory_id=f"t{i}", sample_id=f"s{i}", source="A", ready_at=1.0)
        state.add(entry)
        survived.append(hold.survives_report(state.decision_view, entry))
    assert survived == [True, True, False]
    filtered = PoolEntry(trajectory_id="f", sample_id="f", source="A", ready_at=1.0, accepted=False)
    assert not hold.survives_report(state.decision_view, filtered)
