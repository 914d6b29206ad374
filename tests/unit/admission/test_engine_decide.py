"""Example-based tests of ``decide`` and ``AdmissionState.apply``: each rule of DESIGN.md §3 on a small case."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from knittrans.admission.engine import (
    AdmissionPolicy,
    AdmissionState,
    Admit,
    BlockingReason,
    Decision,
    Drop,
    DropReason,
    EngineConfig,
    PoolEntry,
    Wait,
    decide,
)
from knittrans.errors import Conflict, FailedPrecondition, InvalidArgument, StarvationError
from knittrans.types import AdmissionUnit


def config(**overrides: Any) -> EngineConfig:
    values: dict[str, Any] = {
        "train_batch_size": 8,
        "num_minibatches": 4,
        "sources": {"A": 0.5, "B": 0.5},
        "source_schedule": (0.0, 0.0, 0.5, 1.0),
    }
    if "num_minibatches" in overrides and "source_schedule" not in overrides:
        values["source_schedule"] = None  # the policy default for that many mini-batches
    values.update(overrides)
    return EngineConfig(**values)


def entry(trajectory_id: str, source: str, ready_at: float = 0.0, **fields: Any) -> PoolEntry:
    fields.setdefault("sample_id", f"s-{trajectory_id}")
    return PoolEntry(trajectory_id=trajectory_id, source=source, ready_at=ready_at, **fields)


def drain(state: AdmissionState, now: float, version: int = 0) -> list[Decision]:
    """Decide and apply until the engine waits; the wait is the last element."""
    decisions: list[Decision] = []
    while True:
        decision = decide(state, now, version)
        state.apply(decision)
        decisions.append(decision)
        if isinstance(decision, Wait):
            return decisions


def snapshot(state: AdmissionState) -> str:
    """Everything the state holds, as text (its pool and trackers use __slots__)."""
    view = state.decision_view
    parts = {k: v for k, v in vars(state).items() if k not in ("config", "targets", "_inputs")}
    parts.update({k: getattr(view, k) for k in type(view).__slots__ if k not in ("targets", "pool", "completion")})
    pool = view.pool
    parts["pool"] = ([(list(q.keys), q.head) for q in pool.queues], dict(pool.units), pool.total, pool.min_version)
    return repr(parts)


def admits(decisions: list[Decision]) -> list[Admit]:
    return [d for d in decisions if isinstance(d, Admit)]


def sources_of(state_entries: dict[str, str], admit: Admit) -> dict[str, int]:
    counts: dict[str, int] = {}
    for trajectory_id in admit.trajectory_ids:
        counts[state_entries[trajectory_id]] = counts.get(state_entries[trajectory_id], 0) + 1
    return counts


def test_empty_pool_waits_for_size() -> None:
    state = AdmissionState(config())
    decision = decide(state, 5.0, 0)
    assert isinstance(decision, Wait)
    assert decision.reason is BlockingReason.TRAIN_BATCH_SIZE
    assert decision.since == 5.0
    assert "needs 2" in decision.detail


def test_wait_since_is_when_the_reason_began() -> None:
    state = AdmissionState(config())
    state.apply(decide(state, 5.0, 0))
    state.add(entry("a0", "A", 6.0))
    later = decide(state, 7.0, 0)
    assert isinstance(later, Wait) and later.since == 5.0
    assert state.status().blocked_since == 5.0


def test_decide_does_not_change_the_state() -> None:
    state = AdmissionState(config())
    for i in range(3):
        state.add(entry(f"a{i}", "A", float(i)))
        state.add(entry(f"b{i}", "B", float(i) + 0.5))
    state.add(entry("a9", "A", 9.0, accepted=False))
    before = snapshot(state)
    first = decide(state, 10.0, 0)
    assert snapshot(state) == before
    state.apply(first)
    before = snapshot(state)
    second = decide(state, 10.0, 0)
    assert isinstance(second, Admit)
    assert snapshot(state) == before
    assert decide(state, 10.0, 0) == second


def test_admits_in_policy_order_and_advances_train_batches() -> None:
    state = AdmissionState(config())
    for i in range(4):
        state.add(entry(f"a{i}", "A", float(i)))
        state.add(entry(f"b{i}", "B", float(i) + 0.5))
    decisions = drain(state, 10.0)
    batch = admits(decisions)
    assert [a.minibatch_index for a in batch] == [0, 1, 2, 3]
    assert batch[0].trajectory_ids == ("a0", "b0")  # oldest completion first
    assert all(a.train_batch_index == 0 and a.train_version == 0 for a in batch)
    assert batch[-1].completes_train_batch
    assert state.train_batch_index == 1 and state.train_version == 1
    assert isinstance(decisions[-1], Wait)


def test_paper_two_source_example_guard_prevents_the_violation() -> None:
    """§5.1: 100 = 50 A + 50 B in four mini-batches of 25; A finishes first (65 A, 10 B by the third)."""
    results = {}
    for policy in (AdmissionPolicy.NO_GUARD, AdmissionPolicy.KNITTRANS):
        cfg = config(train_batch_size=100, source_schedule=(0, 0, 0.2, 1.0), policy=policy)
        state = AdmissionState(cfg)
        source: dict[str, str] = {}
        for i in range(100):
            state.add(entry(f"a{i}", "A", float(i)))
            source[f"a{i}"] = "A"
        for i in range(10):
            state.add(entry(f"b{i}", "B", 100.0 + i))
            source[f"b{i}"] = "B"
        decisions = drain(state, 200.0)
        for i in range(10, 60):  # the rest of B arrives late
            state.add(entry(f"b{i}", "B", 300.0 + i))
            source[f"b{i}"] = "B"
        decisions += drain(state, 400.0)
        totals: dict[str, int] = {"A": 0, "B": 0}
        for admit in admits(decisions)[:4]:
            for name, count in sources_of(source, admit).items():
                totals[name] += count
        results[policy] = totals
    assert results[AdmissionPolicy.NO_GUARD]["B"] < 50  # relaxed targets alone let A take too many slots
    assert results[AdmissionPolicy.KNITTRANS] == {"A": 50, "B": 50}


def test_feasibility_wait_names_the_short_source() -> None:
    state = AdmissionState(config(train_batch_size=4, num_minibatches=2, source_schedule=(0.0, 1.0)))
    for i in range(4):
        state.add(entry(f"a{i}", "A", float(i)))
    decisions = drain(state, 10.0)
    first = admits(decisions)
    assert len(first) == 1 and len(first[0].trajectory_ids) == 2  # A fills only up to its own quota
    wait = decisions[-1]
    assert isinstance(wait, Wait)
    assert wait.reason in (BlockingReason.SOURCE_QUOTA, BlockingReason.FEASIBILITY)
    assert "B" in wait.detail


def test_guard_blocks_a_candidate_that_would_strand_a_quota() -> None:
    # Quotas 4 A + 4 B of 8; relaxed targets hold, but only A is ready beyond what A may take.
    state = AdmissionState(config(source_schedule=(0.0, 0.0, 0.0, 1.0)))
    for i in range(8):
        state.add(entry(f"a{i}", "A", float(i)))
    decisions = drain(state, 10.0)
    assert len(admits(decisions)) == 2  # 4 A in two mini-batches of 2; a third would leave 2 slots for 4 B
    wait = decisions[-1]
    assert isinstance(wait, Wait) and wait.reason is BlockingReason.FEASIBILITY


def test_filtered_trajectories_are_dropped_at_once() -> None:
    state = AdmissionState(config())
    state.add(entry("a0", "A", 1.0, accepted=False))
    state.add(entry("a1", "A", 2.0))
    decision = decide(state, 3.0, 0)
    assert decision == Drop(trajectory_ids=("a0",), reason=DropReason.FILTERED, detail=decision.detail)
    state.apply(decision)
    assert state.pool_size == 1
    assert isinstance(decide(state, 3.0, 0), Wait)


def test_stale_units_are_dropped_against_the_training_version() -> None:
    state = AdmissionState(config(staleness_bound=1), version=3)
    state.add(entry("old", "A", 1.0, oldest_version=1))  # train version 3: staleness 2 > 1
    state.add(entry("ok", "A", 2.0, oldest_version=2))
    decision = decide(state, 5.0, 3)
    assert isinstance(decision, Drop) and decision.reason is DropReason.STALE
    assert decision.trajectory_ids == ("old",)
    state.apply(decision)
    assert state.pool_counts() == {"A": 1, "B": 0}


def test_staleness_uses_the_version_that_trains_the_next_train_batch() -> None:
    state = AdmissionState(config(train_batch_size=2, num_minibatches=1, sources={"A": 1.0}, staleness_bound=0))
    state.add(entry("a0", "A", 0.0, oldest_version=0))
    state.add(entry("a1", "A", 0.0, oldest_version=0))
    state.add(entry("a2", "A", 0.0, oldest_version=0))
    admit, drop, wait = drain(state, 1.0, 0)
    assert isinstance(admit, Admit) and admit.trajectory_ids == ("a0", "a1")
    # Train batch 1 trains at version 1, so a2 (version 0) is one version stale: dropped.
    assert isinstance(drop, Drop) and drop.trajectory_ids == ("a2",) and drop.reason is DropReason.STALE
    assert isinstance(wait, Wait) and state.pool_size == 0


def test_admission_waits_for_the_version_beyond_max_batches_ahead() -> None:
    state = AdmissionState(config(train_batch_size=2, num_minibatches=1, sources={"A": 1.0}, max_batches_ahead=0))
    for i in range(4):
        state.add(entry(f"a{i}", "A", float(i)))
    decisions = drain(state, 5.0, version=0)
    assert len(admits(decisions)) == 1
    assert isinstance(decisions[-1], Wait) and decisions[-1].reason is BlockingReason.TRAIN_BATCH_COMPLETE
    assert len(admits(drain(state, 6.0, version=1))) == 1


def test_version_ahead_of_the_train_batch_is_an_error() -> None:
    state = AdmissionState(config())
    with pytest.raises(FailedPrecondition):
        decide(state, 0.0, 1)


def test_train_batch_policy_waits_for_the_whole_batch() -> None:
    state = AdmissionState(config(policy=AdmissionPolicy.TRAIN_BATCH))
    for i in range(4):
        state.add(entry(f"a{i}", "A", float(i)))
        state.add(entry(f"b{i}", "B", float(i)))
    state.add(entry("b-extra", "B", 0.0))
    state2 = AdmissionState(config(policy=AdmissionPolicy.TRAIN_BATCH))
    for i in range(3):  # one A short of its quota
        state2.add(entry(f"a{i}", "A", float(i)))
    for i in range(6):
        state2.add(entry(f"b{i}", "B", float(i)))
    waiting = drain(state2, 10.0)
    assert len(waiting) == 1 and waiting[0].reason is BlockingReason.SOURCE_QUOTA
    decisions = drain(state, 10.0)
    assert len(admits(decisions)) == 4  # all four mini-batches at once


def test_linear_mirrors_the_final_composition() -> None:
    state = AdmissionState(config(policy=AdmissionPolicy.LINEAR))
    source: dict[str, str] = {}
    for i in range(8):
        state.add(entry(f"a{i}", "A", float(i)))
        source[f"a{i}"] = "A"
    for i in range(4):
        state.add(entry(f"b{i}", "B", 100.0 + i))
        source[f"b{i}"] = "B"
    decisions = drain(state, 200.0)
    for admit in admits(decisions):
        assert sources_of(source, admit) == {"A": 1, "B": 1}


def test_completion_quota_blocks_until_enough_of_the_step_completed() -> None:
    cfg = config(train_batch_size=2, num_minibatches=1, sources={"A": 1.0}, completion_quota=0.5)
    state = AdmissionState(cfg)
    state.add_scheduled(0, 8)
    state.add(entry("a0", "A", 1.0))
    state.add(entry("a1", "A", 2.0))
    blocked = decide(state, 3.0, 0)
    assert isinstance(blocked, Wait) and blocked.reason is BlockingReason.COMPLETION_QUOTA
    assert "rollout step 0: 2 of 8" in blocked.detail
    state.apply(blocked)
    state.add(entry("a2", "A", 4.0, accepted=False))  # filtered trajectories completed too
    state.add(entry("a3", "A", 5.0))
    decisions = drain(state, 6.0)
    assert any(isinstance(d, Admit) for d in decisions)


def test_completion_quota_ignores_later_rollout_steps() -> None:
    cfg = config(train_batch_size=2, num_minibatches=1, sources={"A": 1.0}, completion_quota=0.5)
    state = AdmissionState(cfg)
    state.add_scheduled(1, 10)  # step 1 applies from train version 1 on
    state.add(entry("a0", "A", 1.0))
    state.add(entry("a1", "A", 2.0))
    assert isinstance(decide(state, 3.0, 0), Admit)


def test_group_admission_is_all_or_nothing() -> None:
    cfg = config(train_batch_size=2, num_minibatches=1, sources={"A": 1.0}, admission_unit=AdmissionUnit.GROUP,
                 group_size=3)
    state = AdmissionState(cfg)
    for member in range(3):
        state.add(entry(f"x{member}", "A", 1.0, sample_id="x"))
    state.add(entry("y0", "A", 2.0, sample_id="y"))
    state.add(entry("y1", "A", 2.5, sample_id="y", accepted=False))
    assert state.pool_size == 1  # y is not complete yet
    drop = decide(state, 3.0, 0)
    assert isinstance(drop, Drop) and drop.trajectory_ids == ("y1",)
    state.apply(drop)
    assert isinstance(decide(state, 3.0, 0), Wait)
    state.add(entry("y2", "A", 4.0, sample_id="y"))
    decisions = drain(state, 5.0)
    assert admits(decisions)[0].trajectory_ids == ("x0", "x1", "x2", "y0", "y2")


def test_group_size_can_be_declared_per_sample() -> None:
    cfg = config(train_batch_size=1, num_minibatches=1, sources={"A": 1.0}, admission_unit=AdmissionUnit.GROUP)
    state = AdmissionState(cfg)
    with pytest.raises(InvalidArgument, match="group_size"):
        state.add(entry("x0", "A", 1.0, sample_id="x"))
    state.expect_group("y", 2)
    state.add(entry("y0", "A", 1.0, sample_id="y"))
    assert state.pool_size == 0
    state.add(entry("y1", "A", 1.0, sample_id="y"))
    assert state.pool_size == 1


def test_relax_after_waives_the_quotas_for_the_rest_of_the_train_batch() -> None:
    state = AdmissionState(config(on_starvation="relax_after=60"))
    for i in range(8):
        state.add(entry(f"a{i}", "A", float(i)))
    decisions = drain(state, 10.0)
    wait = decisions[-1]
    assert isinstance(wait, Wait) and wait.reason.is_quota and wait.wake_at == 70.0
    assert isinstance(decide(state, 69.0, 0), Wait)
    late = drain(state, 70.0)
    relaxed = admits(late)
    assert relaxed and all(a.relaxed for a in relaxed)
    assert relaxed[-1].completes_train_batch
    assert not state.status().relaxed  # the next train batch starts strict again


@pytest.mark.parametrize("policy", [AdmissionPolicy.KNITTRANS, AdmissionPolicy.LINEAR], ids=str)
@pytest.mark.parametrize("members", [1, 2], ids=["trajectories", "groups-of-2"])
def test_after_a_relaxed_mini_batch_the_next_one_still_takes_its_size(policy: AdmissionPolicy,
                                                                       members: int) -> None:
    # Quotas A 1, B 0, C 1 of 2 units. Only B is ready, and relaxing at once admits it: A and C now lack 2 units
    # with 1 slot left, more than any candidate can make up. The last mini-batch must still take exactly 1 unit.
    grouped = {"admission_unit": AdmissionUnit.GROUP, "group_size": members} if members > 1 else {}
    state = AdmissionState(config(train_batch_size=2, num_minibatches=2, sources={"A": 0.2, "B": 0.0, "C": 0.2},
                                  policy=policy, on_starvation="relax_after=0", **grouped))

    def report(source: str, at: float) -> None:
        for member in range(members):
            state.add(entry(f"{source.lower()}{member}", source, at, sample_id=source))

    report("B", 0.0)
    first = admits(drain(state, 0.0))
    assert len(first) == 1 and len(first[0].trajectory_ids) == members and first[0].relaxed
    report("A", 3.0)
    report("C", 3.0)
    second = admits(drain(state, 3.0))
    assert len(second) == 1 and len(second[0].trajectory_ids) == members and second[0].relaxed
    assert second[0].completes_train_batch
    assert state.pool_size == 1  # the unit left out waits for the next train batch


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"trajectory_ids": ("a0", "b0", "a1")}, InvalidArgument),  # one unit more than the mini-batch takes
        ({"trajectory_ids": ("a0",)}, InvalidArgument),  # one fewer
        ({"trajectory_ids": ("a0", "nowhere")}, InvalidArgument),  # not in the pool
        ({"minibatch_index": 1}, FailedPrecondition),  # not the mini-batch the state is at
    ],
    ids=["too-many", "too-few", "unknown", "wrong-minibatch"],
)
def test_check_admit_refuses_what_apply_refuses_and_changes_nothing(change: dict[str, Any], error: type) -> None:
    state = AdmissionState(config(train_batch_size=4, num_minibatches=2, source_schedule=None))
    for name in ("a0", "a1", "b0", "b1"):
        state.add(entry(name, name[0].upper()))
    good = decide(state, 1.0, 0)
    assert isinstance(good, Admit) and len(good.trajectory_ids) == 2
    state.check_admit(good)  # decide's own admission passes
    bad = dataclasses.replace(good, **change)
    before = snapshot(state)
    with pytest.raises(error):
        state.check_admit(bad)
    assert snapshot(state) == before
    with pytest.raises(error):
        state.apply(bad)


def test_fail_raises_starvation_after_the_timeout() -> None:
    state = AdmissionState(config(on_starvation="fail_after=30"))
    for i in range(8):
        state.add(entry(f"a{i}", "A", float(i)))
    drain(state, 10.0)
    assert isinstance(decide(state, 39.0, 0), Wait)
    with pytest.raises(StarvationError, match="source B"):
        decide(state, 40.0, 0)


def test_apply_rejects_a_decision_for_another_mini_batch() -> None:
    state = AdmissionState(config())
    for i in range(2):
        state.add(entry(f"a{i}", "A", float(i)))
        state.add(entry(f"b{i}", "B", float(i)))
    decision = decide(state, 5.0, 0)
    state.apply(decision)
    with pytest.raises(FailedPrecondition):
        state.apply(decision)


def test_apply_rejects_unknown_trajectories_without_changing_anything() -> None:
    state = AdmissionState(config())
    state.add(entry("a0", "A"))
    bad = Admit(trajectory_ids=("a0", "zz"), train_batch_index=0, minibatch_index=0, num_minibatches=4,
                train_version=0, admitted_at=0.0)
    with pytest.raises(InvalidArgument, match="zz"):
        state.apply(bad)
    assert state.pool_size == 1


def test_apply_accepts_a_non_prefix_admission() -> None:
    state = AdmissionState(config())
    for i in range(3):
        state.add(entry(f"a{i}", "A", float(i)))
        state.add(entry(f"b{i}", "B", float(i)))
    chosen = Admit(trajectory_ids=("a2", "b1"), train_batch_index=0, minibatch_index=0, num_minibatches=4,
                   train_version=0, admitted_at=0.0)
    state.apply(chosen)
    assert state.admitted_counts() == {"A": 1, "B": 1}
    assert decide(state, 1.0, 0).trajectory_ids == ("a0", "b0")


def test_duplicate_and_unknown_reports_are_rejected() -> None:
    state = AdmissionState(config())
    state.add(entry("a0", "A"))
    with pytest.raises(Conflict):
        state.add(entry("a0", "A"))
    with pytest.raises(InvalidArgument, match="unknown source"):
        state.add(entry("c0", "C"))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("trajectory_id", ""),
        ("oldest_version", -1),
        ("ready_at", float("nan")),
        ("accepted", 1),
        ("rollout_step", True),
    ],
)
def test_pool_entry_validation_names_the_field(field: str, value: object) -> None:
    values: dict[str, Any] = {"trajectory_id": "t", "sample_id": "s", "source": "A", "ready_at": 0.0}
    values[field] = value
    with pytest.raises(InvalidArgument) as info:
        PoolEntry(**values)
    assert info.value.field == field


def test_status_reports_quota_slack() -> None:
    state = AdmissionState(config())
    state.add(entry("a0", "A"))
    status = state.status()
    assert [(s.source, s.quota, s.ready, s.slack) for s in status.sources] == [("A", 4, 1, -3), ("B", 4, 0, -4)]
    assert state.source_targets() == {"A": 0, "B": 0}  # relaxed: α = 0 for the first mini-batch
    for i in range(3):
        state.add(entry(f"a{i + 1}", "A", float(i)))
    for i in range(2):
        state.add(entry(f"b{i}", "B", float(i)))
    drain(state, 10.0)
    assert state.minibatches_admitted == 3  # the last mini-batch needs all four B
    assert state.source_targets() == {"A": 4, "B": 4}
    assert [s.target for s in state.status().sources] == [4, 4]
