"""``decisions_until_wait``, the one decide-until-wait loop: the same decisions as calling ``decide`` and
``apply`` by hand until a wait, on random reports; ``send((now, version))`` decides the next step later."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from knittrans.admission.engine import (
    AdmissionState,
    Admit,
    BlockingReason,
    Decision,
    EngineConfig,
    PoolEntry,
    Wait,
    decide,
    decisions_until_wait,
)

CONFIG = EngineConfig(
    train_batch_size=6, num_minibatches=3, sources={"A": 0.5, "B": 0.25}, staleness_bound=1, max_batches_ahead=1,
)


def by_hand(state: AdmissionState, now: float, version: int) -> list[Decision]:
    decisions = []
    while True:
        decision = decide(state, now, version)
        state.apply(decision)
        decisions.append(decision)
        if isinstance(decision, Wait):
            return decisions


reports = st.lists(
    st.tuples(st.sampled_from("AB"), st.integers(0, 2), st.booleans(), st.integers(0, 2)), min_size=1, max_size=40
)


@given(reports)
@settings(max_examples=60, deadline=None)
def test_the_loop_decides_what_decide_and_apply_by_hand_decide(rows: list[tuple[str, int, bool, int]]) -> None:
    looped, manual = AdmissionState(CONFIG), AdmissionState(CONFIG)
    version = 0
    for i, (source, oldest, accepted, version_step) in enumerate(rows):
        version = min(version + (version_step == 2), looped.train_version)
        entry = PoolEntry(trajectory_id=f"t{i}", sample_id=f"s{i}", source=source, ready_at=float(i),
                          oldest_version=oldest, accepted=accepted)
        looped.add(entry)
        manual.add(entry)
        expected = by_hand(manual, float(i), version)
        got = []
        for decision in decisions_until_wait(looped, float(i), version):
            looped.apply(decision)
            got.append(decision)
        assert got == expected
        assert looped.status() == manual.status()


def test_send_decides_the_next_step_at_a_later_version() -> None:
    config = EngineConfig(train_batch_size=2, num_minibatches=1, sources={"A": 0.0}, max_batches_ahead=0)
    state = AdmissionState(config)
    for i in range(4):
        state.add(PoolEntry(trajectory_id=f"t{i}", sample_id=f"s{i}", source="A", ready_at=0.0))
    decisions = decisions_until_wait(state, 1.0, 0)
    first = next(decisions)
    assert isinstance(first, Admit) and first.train_batch_index == 0
    state.apply(first)
    # Train batch 0 trained meanwhile: at version 1 the next one is admitted at once, instead of a wait.
    second = decisions.send((2.0, 1))
    assert isinstance(second, Admit) and second.train_batch_index == 1 and second.admitted_at == 2.0
    state.apply(second)
    last = next(decisions)
    assert isinstance(last, Wait) and last.reason is BlockingReason.TRAIN_BATCH_COMPLETE
    state.apply(last)
    assert list(decisions) == []
