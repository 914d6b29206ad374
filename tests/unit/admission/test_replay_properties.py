"""Quotas hold: the guarded policies never finish a train batch below a source quota, and when the trace supplies
enough trajectories of every source they do finish the train batches it can fill."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from knittrans.admission.engine import AdmissionPolicy
from knittrans.admission.replay import ReplayConfig, parse_lines, replay_policy

SOURCES = ("A", "B", "C")
BATCHES = 2


@st.composite
def cases(draw: st.DrawFn) -> tuple[ReplayConfig, list[str]]:
    num_sources = draw(st.integers(2, 3))
    if draw(st.booleans()):
        ratios = [1.0 / num_sources - 1e-6] * num_sources
    else:
        ratios = [draw(st.sampled_from((0.1, 0.2, 0.3))) for _ in range(num_sources)]
    size = draw(st.integers(2, 8))
    config = ReplayConfig(
        train_batch_size=size,
        num_minibatches=draw(st.integers(1, min(4, size))),
        sources=dict(zip(SOURCES, ratios, strict=False)),
        train_seconds_per_minibatch=draw(st.sampled_from((0.5, 5.0, 30.0))),
        policy=draw(st.sampled_from((AdmissionPolicy.KNITTRANS, AdmissionPolicy.LINEAR, AdmissionPolicy.TRAIN_BATCH))),
    )
    lines = []
    for s, source in enumerate(SOURCES[:num_sources]):
        # Every source alone could fill BATCHES train batches; a skew factor makes some sources slow.
        slowness = draw(st.sampled_from((1.0, 3.0, 10.0)))
        for i in range(BATCHES * size):
            start = draw(st.integers(0, 50))
            duration = draw(st.integers(1, 20)) * slowness
            lines.append(json.dumps({"id": f"{source}{i}", "sample_id": f"{source}{i}", "source": source,
                                     "start": float(start), "end": start + duration, "num_tokens": 1}))
        if draw(st.booleans()):
            lines.append(json.dumps({"id": f"{source}-filtered", "sample_id": f"{source}-f{s}", "source": source,
                                     "start": 1.0, "end": 2.0, "num_tokens": 1, "accepted": False}))
    return config, lines


@settings(max_examples=60, deadline=None)
@given(case=cases())
def test_guarded_policies_meet_quotas_and_finish_what_the_supply_allows(case: tuple[ReplayConfig, list[str]]) -> None:
    config, lines = case
    result = replay_policy(parse_lines(lines), config, config.policy)
    assert result.failed is None
    assert result.violations == 0
    assert len(result.train_batches) >= BATCHES
