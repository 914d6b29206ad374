"""Invariants of the simulation on small random pipelines (hypothesis), and determinism."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from knittrans.admission.engine import AdmissionPolicy
from knittrans.admission.simulate import (
    MODES,
    LognormalDurations,
    RolloutScript,
    SimConfig,
    SourceRollout,
    simulate_mode,
    simulate_policy,
)
from knittrans.admission.simulate.report import simulation_json
from knittrans.errors import InvalidArgument
from knittrans.types import AdmissionUnit

QUOTA_PRESERVING = (AdmissionPolicy.TRAIN_BATCH, AdmissionPolicy.LINEAR, AdmissionPolicy.KNITTRANS)


@st.composite
def pipelines(draw: st.DrawFn) -> SimConfig:
    num_sources = draw(st.integers(1, 3))
    names = ["A", "B", "C"][:num_sources]
    train_batch_size = draw(st.integers(4, 24))
    values: dict[str, Any] = {
        "train_batch_size": train_batch_size,
        "num_minibatches": draw(st.integers(1, min(4, train_batch_size))),
        "sources": {n: draw(st.sampled_from([0.0, 0.1, 0.2, 0.3])) for n in names},
        "group_size": draw(st.integers(1, 4)),
        "admission_unit": draw(st.sampled_from(list(AdmissionUnit))),
        "rollout": {
            n: SourceRollout(mean_seconds=draw(st.integers(1, 100)), std_seconds=draw(st.sampled_from([0, 5, 40])))
            for n in names
        },
        "partial_rollout": draw(st.booleans()),
        "staleness_bound": draw(st.sampled_from([None, 1, 2, 4])),
        "next_step_after": draw(st.sampled_from([0.0, 0.5, 1.0])),
        "rollout_ahead": draw(st.integers(0, 2)),
        "stagger_seconds": draw(st.sampled_from([0.0, 10.0])),
        "sync_seconds": draw(st.sampled_from([0.0, 3.0])),
        "train_batches": 6,
        "warmup_steps": 1,
        "seed": draw(st.integers(0, 3)),
    }
    values["rollout_slots"] = values["group_size"] * draw(st.integers(1, 6))
    if draw(st.booleans()):
        values["train_seconds_per_minibatch"] = float(draw(st.integers(1, 60)))
    else:
        values["train_seconds_per_token"] = draw(st.sampled_from([0.001, 0.01]))
    try:
        return SimConfig(**values)
    except InvalidArgument:
        assume(False)
        raise


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(pipelines(), st.sampled_from(list(AdmissionPolicy)))
def test_simulation_invariants(config: SimConfig, policy: AdmissionPolicy) -> None:
    script = RolloutScript(config, LognormalDurations(config))
    for mode in MODES:
        result = simulate_mode(config, policy, mode, script)
        if result.failed:
            # The only way a run ends early: nothing is left to happen while admission waits.
            assert result.failed.startswith("stalled"), result.failed
        else:
            assert len(result.steps) == config.train_batches
        for index, step in enumerate(result.steps):
            assert step.index == index and step.train_version == index
            assert sum(step.composition.values()) == config.train_batch_size  # every train batch is full
            assert len(step.admit_times) == config.num_minibatches
            assert list(step.admit_times) == sorted(step.admit_times)
            assert step.admit_times[-1] <= step.trained_at
            # A token is never newer than the version that trains it, nor older than its trajectory's oldest.
            assert -1e-9 <= step.token_staleness <= step.max_trajectory_staleness + 1e-9
            assert 0 <= step.trajectory_staleness <= step.max_trajectory_staleness
        if config.staleness_bound is not None and result.trajectory_staleness_counts:
            assert max(result.trajectory_staleness_counts) <= config.staleness_bound
        if policy in QUOTA_PRESERVING:
            assert result.violations == 0
        admitted = sum(step.trajectories for step in result.steps)
        assert sum(result.trajectory_staleness_counts.values()) >= admitted
        if config.admission_unit is AdmissionUnit.TRAJECTORY and not result.failed:
            # Every finished trajectory was admitted, dropped as stale, or is still waiting in the pool.
            assert result.completed == admitted + result.dropped_stale + result.left_in_pool
        assert result.launched >= result.completed + result.discarded
        trained = [step.trained_at for step in result.steps]
        assert trained == sorted(trained)


def test_same_input_same_output() -> None:
    config = SimConfig(
        train_batch_size=32,
        num_minibatches=4,
        sources={"A": 0.3, "B": 0.3},
        group_size=4,
        rollout_slots=24,
        rollout={
            "A": SourceRollout(mean_seconds=20, std_seconds=10),
            "B": SourceRollout(mean_seconds=60, std_seconds=30),
        },
        train_seconds_per_token=0.002,
        staleness_bound=2,
        partial_rollout=True,
        next_step_after=0.8,
        train_batches=12,
    )

    def run() -> str:
        script = RolloutScript(config, LognormalDurations(config))
        results = [simulate_policy(config, policy, script) for policy in AdmissionPolicy]
        return json.dumps(simulation_json(config, results, config_path="c", trace_path=None), sort_keys=True)

    assert run() == run()


def test_a_run_that_can_never_fill_its_train_batch_stops_with_the_reason() -> None:
    # Colocated rollout without partial rollout discards what is unfinished at the end of a phase, so a
    # completion quota of 100% can never be met again: the run must say so instead of hanging.
    config = SimConfig(
        train_batch_size=8,
        num_minibatches=2,
        sources={"A": 1.0},
        rollout_slots=16,
        rollout={"A": SourceRollout(mean_seconds=10, std_seconds=5)},
        train_seconds_per_minibatch=100,
        completion_quota=1.0,
        next_step_after=0.0,
        train_batches=5,
        warmup_steps=1,
    )
    result = simulate_policy(config, AdmissionPolicy.KNITTRANS, RolloutScript(config, LognormalDurations(config)))
    assert result.disaggregated.failed is None and len(result.disaggregated.steps) == 5
    assert result.colocated.discarded > 0
    failed = result.colocated.failed
    assert failed is not None and failed.startswith("stalled after 1 train batches")
    assert "completion_quota" in failed


def test_starvation_handling_wakes_the_engine_on_the_simulated_clock() -> None:
    # B is far slower than its quota can wait for: relax_after waives the quotas after 50 simulated seconds,
    # which only happens if the simulator calls decide again at the engine's wake_at.
    config = SimConfig(
        train_batch_size=8,
        num_minibatches=2,
        sources={"A": 0.5, "B": 0.5},
        rollout_slots=32,
        rollout={"A": SourceRollout(mean_seconds=10), "B": SourceRollout(mean_seconds=1000)},
        train_seconds_per_minibatch=5,
        on_starvation="relax_after=50",
        next_step_after=0.0,
        rollout_ahead=3,
        train_batches=4,
        warmup_steps=1,
    )
    result = simulate_policy(config, AdmissionPolicy.KNITTRANS, RolloutScript(config, LognormalDurations(config)))
    for mode in result.modes:
        assert mode.failed is None and len(mode.steps) == 4
        first = mode.steps[0]
        assert first.relaxed and not first.quota_met
        assert 50 <= first.admit_times[-1] < 1000  # relaxed after waiting, long before B could finish
