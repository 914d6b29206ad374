"""``AdmissionState.add_many`` reaches the same state as ``add`` one entry at a time, and changes nothing when it
refuses a batch."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from knittrans.admission.engine import AdmissionState, EngineConfig, PoolEntries, PoolEntry, decide
from knittrans.admission.engine.decisions import Wait
from knittrans.errors import Conflict, InvalidArgument
from knittrans.types import AdmissionUnit

SOURCES = {"A": 0.25, "B": 0.25, "C": 0.0}


def config(grouped: bool = False, completion: bool = False) -> EngineConfig:
    return EngineConfig(
        train_batch_size=12, num_minibatches=3, sources=SOURCES, staleness_bound=2, max_batches_ahead=None,
        completion_quota=0.5 if completion else None,
        admission_unit=AdmissionUnit.GROUP if grouped else AdmissionUnit.TRAJECTORY, group_size=2 if grouped else None,
    )


def snapshot(state: AdmissionState) -> tuple:
    view = state.decision_view
    pool = view.pool
    return (
        state.status(),
        [queue.keys[queue.head:] for queue in pool.queues],
        sorted(pool.units.items()),
        pool.sizes, pool.total, pool.min_version,
        list(view.filtered), state._seq, dict(state._unit_of),
        None if view.completion is None else (dict(view.completion.completed), set(view.completion.unmet)),
    )


def entries_strategy(start: int):
    return st.lists(
        st.tuples(st.sampled_from(sorted(SOURCES)), st.integers(0, 3), st.integers(0, 2), st.booleans(),
                  st.booleans()),
        min_size=0, max_size=12,
    ).map(lambda rows: [
        dict(trajectory_id=f"t{start + i:03d}" if flip else f"u{(start + i) * 7919 % 1000:03d}-{start + i}",
             sample_id=f"s{(start + i) // 2}", source=source, oldest_version=version, rollout_step=step,
             num_tokens=10 + i, accepted=accepted or not flip)
        for i, (source, version, step, accepted, flip) in enumerate(rows)
    ])


@given(
    batches=st.lists(st.tuples(st.integers(0, 3), st.floats(0, 100)), min_size=1, max_size=6),
    data=st.data(), grouped=st.booleans(), completion=st.booleans(),
)
@settings(max_examples=120, deadline=None)
def test_add_many_equals_adding_one_by_one(batches, data, grouped: bool, completion: bool) -> None:
    one_by_one = AdmissionState(config(grouped, completion))
    many = AdmissionState(config(grouped, completion))
    start = 0
    for decisions, ready_at in batches:
        rows = data.draw(entries_strategy(start))
        start += len(rows)
        if grouped:  # a group's trajectories share a source
            for row in rows:
                row["source"] = sorted(SOURCES)[int(row["sample_id"][1:]) % 3]
        for row in rows:
            one_by_one.add(PoolEntry(ready_at=ready_at, **row))
        many.add_many(PoolEntries(
            trajectory_ids=[r["trajectory_id"] for r in rows], sample_ids=[r["sample_id"] for r in rows],
            sources=[r["source"] for r in rows], ready_at=ready_at,
            oldest_versions=[r["oldest_version"] for r in rows], rollout_steps=[r["rollout_step"] for r in rows],
            num_tokens=[r["num_tokens"] for r in rows], accepted=[r["accepted"] for r in rows],
        ))
        assert snapshot(many) == snapshot(one_by_one)
        for _ in range(decisions):  # move the queues' heads between batches
            version = one_by_one.train_version
            first, second = decide(one_by_one, ready_at, version), decide(many, ready_at, version)
            assert first == second
            one_by_one.apply(first)
            many.apply(second)
            if isinstance(first, Wait):
                break
        assert snapshot(many) == snapshot(one_by_one)


def columns(ids: list[str], sources: list[str] | None = None) -> PoolEntries:
    count = len(ids)
    return PoolEntries(trajectory_ids=ids, sample_ids=[f"s{t}" for t in ids], sources=sources or ["A"] * count,
                       ready_at=1.0, oldest_versions=[0] * count, rollout_steps=[0] * count, num_tokens=[5] * count,
                       accepted=[True] * count)


@pytest.mark.parametrize(
    ("batch", "error"),
    [
        (columns(["x", "t1"]), Conflict),  # t1 is in the pool
        (columns(["x", "y", "x"]), Conflict),  # twice in the batch
        (columns(["x", "y"], ["A", "Z"]), InvalidArgument),  # unknown source
    ],
)
def test_a_refused_batch_changes_nothing(batch: PoolEntries, error: type) -> None:
    state = AdmissionState(config())
    state.add_many(columns(["t1", "t2"]))
    before = snapshot(state)
    with pytest.raises(error):
        state.add_many(batch)
    assert snapshot(state) == before


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        (dict(trajectory_ids=["", "b"]), "trajectory_ids"),
        (dict(sources=["A", 3]), "sources"),
        (dict(oldest_versions=[0, -1]), "oldest_versions"),
        (dict(rollout_steps=[0, True]), "rollout_steps"),
        (dict(accepted=[True, 1]), "accepted"),
        (dict(num_tokens=[1]), "num_tokens"),
        (dict(ready_at=float("nan")), "ready_at"),
    ],
)
def test_columns_are_checked_like_entries(fields: dict, field: str) -> None:
    values = dict(trajectory_ids=["a", "b"], sample_ids=["s", "s"], sources=["A", "B"], ready_at=1.0,
                  oldest_versions=[0, 1], rollout_steps=[0, 0], num_tokens=[3, 4], accepted=[True, False])
    values.update(fields)
    with pytest.raises(InvalidArgument) as info:
        PoolEntries(**values)
    assert info.value.field == field
