"""The replay driver is an optimisation of a plain event loop: its results must be exactly those of a naive
reference that rebuilds every entry, adds every arrival, and calls ``decide`` after every arrival time, timer and
training finish (DESIGN.md §3 semantics, written here independently of the driver's shortcuts)."""

from __future__ import annotations

import dataclasses
import json
import math
from collections import deque
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from knittrans.admission.engine import (
    AdmissionPolicy,
    AdmissionState,
    Admit,
    Drop,
    DropReason,
    PoolEntry,
    Wait,
    decide,
)
from knittrans.admission.replay import ReplayConfig, Trace, parse_lines, read_trace, replay_policy
from knittrans.admission.replay.driver import EntryCache, PolicyResult, TrainBatchResult
from knittrans.config import load_config
from knittrans.errors import StarvationError
from knittrans.types import AdmissionUnit

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE_TRACE = ROOT / "examples" / "traces" / "skewed-4src.jsonl"
EXAMPLE_CONFIG = ROOT / "examples" / "replay" / "skewed-4src.yaml"


def naive_replay(trace: Trace, config: ReplayConfig, policy: AdmissionPolicy) -> PolicyResult:
    """One decision loop per event time: training finishes, wake-ups and arrivals, nothing skipped or cached."""
    state = AdmissionState(dataclasses.replace(config, policy=policy), version=0)
    targets = state.targets
    sources = targets.sources
    quotas = dict(zip(sources, targets.quotas, strict=True))
    grouped = targets.admission_unit is AdmissionUnit.GROUP
    records = trace.records
    if grouped:
        for sample_id, size in trace.sample_sizes.items():
            state.expect_group(sample_id, size)
    by_id = {record.trajectory_id: record for record in records}
    arrivals = deque(sorted((r for r in records if r.end is not None), key=lambda r: (r.end, r.line)))
    scheduled = deque(sorted(records, key=lambda r: (r.start, r.line)))
    generated: dict[str, int] = {}
    finish_times: list[float] = []
    wake_ups: set[float] = set()
    trainer_free_at = -math.inf
    batches: list[TrainBatchResult] = []
    dropped = {DropReason.STALE: 0, DropReason.FILTERED: 0}
    admitted = staleness = 0
    failed = None

    def new_batch(start: float) -> dict:
        return {"start": start, "times": [], "units": dict.fromkeys(sources, 0), "count": 0, "staleness": 0,
                "relaxed": False}

    batch = new_batch(min((r.start for r in records), default=0.0))
    now = -math.inf
    while failed is None:
        # The next event: an arrival, a training finish not yet counted, or a wake-up.
        candidates = [t for t in finish_times if t > now] + list(wake_ups) + ([arrivals[0].end] if arrivals else [])
        if not candidates:
            break
        now = min(candidates)
        version = sum(1 for t in finish_times if t <= now)
        wake_ups = {t for t in wake_ups if t > now}
        while scheduled and scheduled[0].start <= now:
            state.add_scheduled(scheduled.popleft().rollout_step)
        while arrivals and arrivals[0].end == now:
            record = arrivals.popleft()
            oldest = record.version if record.version is not None else sum(1 for t in finish_times
                                                                            if t <= record.start)
            generated[record.trajectory_id] = oldest
            state.add(PoolEntry(trajectory_id=record.trajectory_id, sample_id=record.sample_id,
                                source=record.source, ready_at=now, oldest_version=oldest,
                                rollout_step=record.rollout_step, num_tokens=record.num_tokens,
                                accepted=record.accepted))
        while True:
            try:
                decision = decide(state, now, version)
            except StarvationError as exc:
                failed = str(exc)
                break
            state.apply(decision)
            if isinstance(decision, Wait):
                if decision.wake_at is not None:
                    wake_ups.add(decision.wake_at)
                break
            if isinstance(decision, Drop):
                dropped[decision.reason] += len(decision.trajectory_ids)
                continue
            assert isinstance(decision, Admit)
            trainer_free_at = max(now, trainer_free_at) + config.train_seconds_per_minibatch
            batch["times"].append(now)
            batch["relaxed"] = batch["relaxed"] or decision.relaxed
            samples = set()
            for trajectory_id in decision.trajectory_ids:
                record = by_id[trajectory_id]
                batch["staleness"] += decision.train_version - generated[trajectory_id]
                if not grouped or record.sample_id not in samples:
                    samples.add(record.sample_id)
                    batch["units"][record.source] += 1
            batch["count"] += len(decision.trajectory_ids)
            if decision.completes_train_batch:
                finish_times.append(trainer_free_at)
                batches.append(TrainBatchResult(
                    index=decision.train_batch_index, train_version=decision.train_version, start=batch["start"],
                    admit_times=tuple(batch["times"]), composition=batch["units"], quotas=quotas,
                    trajectories=batch["count"], mean_staleness=batch["staleness"] / batch["count"],
                    finished_training_at=trainer_free_at, relaxed=batch["relaxed"]))
                admitted += batch["count"]
                staleness += batch["staleness"]
                batch = new_batch(now)
    return PolicyResult(
        policy=policy, quotas=quotas, train_batches=tuple(batches), pending_admit_times=tuple(batch["times"]),
        dropped_stale=dropped[DropReason.STALE], dropped_filtered=dropped[DropReason.FILTERED],
        admitted_trajectories=admitted + batch["count"], staleness_sum=staleness + batch["staleness"],
        left_in_pool=state.pool_size, blocked_at_end=state.blocking, failed=failed,
    )



SOURCES = ("A", "B", "C")


@st.composite
def cases(draw: st.DrawFn) -> tuple[ReplayConfig, list[str]]:
    """Small traces with ties in time, filtered and unfinished lines, explicit versions and several rollout steps,
    under configs that reach every branch of a decision: staleness drops, waits for training, quota waits with a
    wake-up (relax or fail after a while), completion quotas and group units."""
    num_sources = draw(st.integers(1, 3))
    names = SOURCES[:num_sources]
    grouped = draw(st.booleans())
    size = draw(st.integers(1, 6))
    config = ReplayConfig(
        train_batch_size=size,
        num_minibatches=draw(st.integers(1, min(3, size))),
        sources={name: draw(st.sampled_from((0.0, 0.2, 1.0 / num_sources - 1e-6))) for name in names},
        train_seconds_per_minibatch=draw(st.sampled_from((0.5, 3.0, 10.0))),
        completion_quota=draw(st.sampled_from((None, 0.5, 0.8))),
        staleness_bound=draw(st.sampled_from((None, 0, 1, 3))),
        max_batches_ahead=draw(st.sampled_from((None, 0, 1, 2))),
        on_starvation=draw(st.sampled_from(("wait", "relax_after=4", "relax_after=0", "fail_after=15"))),
        admission_unit=AdmissionUnit.GROUP if grouped else AdmissionUnit.TRAJECTORY,
    )
    lines = []
    for i in range(draw(st.integers(0, 40))):
        source = draw(st.sampled_from(names))
        sample = f"{source}-s{draw(st.integers(0, 6))}" if grouped else f"s{i}"
        start = float(draw(st.integers(0, 30)))
        record = {"id": f"t{i}", "sample_id": sample, "source": source, "start": start, "num_tokens": 1,
                  "end": None if draw(st.integers(0, 9)) == 0 else start + draw(st.integers(0, 12)) / 2,
                  "rollout_step": draw(st.integers(0, 3)), "accepted": draw(st.integers(0, 7)) != 0}
        if draw(st.integers(0, 4)) == 0:
            record["version"] = draw(st.integers(0, 3))
        lines.append(json.dumps(record))
    return config, lines


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
def test_replay_matches_the_naive_reference_on_every_policy(case: tuple[ReplayConfig, list[str]]) -> None:
    config, lines = case
    trace = parse_lines(lines)
    shared = EntryCache(trace)
    for policy in AdmissionPolicy:
        expected = naive_replay(trace, config, policy)
        assert replay_policy(trace, config, policy) == expected, policy
        assert replay_policy(trace, config, policy, entries=shared) == expected, policy


@pytest.mark.parametrize("policy", list(AdmissionPolicy), ids=str)
def test_bundled_example_matches_the_naive_reference(policy: AdmissionPolicy) -> None:
    config = load_config(ReplayConfig, path=EXAMPLE_CONFIG, env={})
    trace = read_trace(EXAMPLE_TRACE)
    assert replay_policy(trace, config, policy) == naive_replay(trace, config, policy)
