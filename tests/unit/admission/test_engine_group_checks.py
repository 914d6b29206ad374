"""`first_rejected_addition` predicts exactly what `add` rejects in group mode, without changing the state."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from knittrans.admission.engine import AdmissionState, EngineConfig, PoolEntry
from knittrans.errors import KnitTransError
from knittrans.types import AdmissionUnit

CONFIG = EngineConfig(train_batch_size=8, num_minibatches=2, sources={"A": 0.25, "B": 0.25},
                      admission_unit=AdmissionUnit.GROUP, group_size=2)


@given(st.lists(st.tuples(st.integers(0, 3), st.sampled_from("AB")), max_size=12))
@settings(max_examples=150, deadline=None)
def test_prediction_matches_add(additions: list[tuple[int, str]]) -> None:
    predicted_state = AdmissionState(CONFIG)
    samples = [f"s{s}" for s, _ in additions]
    sources = [source for _, source in additions]
    predicted = predicted_state.first_rejected_addition(samples, sources)
    actual = AdmissionState(CONFIG)
    first_failure = None
    for i, (sample, source) in enumerate(zip(samples, sources, strict=True)):
        try:
            actual.add(PoolEntry(trajectory_id=f"t{i}", sample_id=sample, source=source, ready_at=float(i)))
        except KnitTransError:
            first_failure = i
            break
    assert (predicted[0] if predicted else None) == first_failure
    assert predicted_state.pool_size == 0  # the prediction changed nothing


def test_trajectory_mode_never_rejects() -> None:
    state = AdmissionState(EngineConfig(train_batch_size=8, num_minibatches=2, sources={"A": 0.5}))
    assert state.first_rejected_addition(["s1", "s1", "s1"], ["A", "A", "A"]) is None


@pytest.mark.parametrize(("samples", "sources", "field"), [
    (["s1", "s1", "s1"], ["A", "A", "A"], "sample_id"),
    (["s1", "s1"], ["A", "B"], "source"),
])
def test_the_reason_names_the_field(samples, sources, field) -> None:
    rejected = AdmissionState(CONFIG).first_rejected_addition(samples, sources)
    assert rejected is not None and rejected[1] == field
