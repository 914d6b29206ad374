"""Staleness accounting per version segment equals accounting per token, at a fraction of the cost."""

from __future__ import annotations

from bisect import bisect_right

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from knittrans.admission.simulate.segments import version_at, version_token_sum


def per_token(version_times: list[float], start: float, end: float, tokens: int) -> float:
    """The reference: each token's version at its own (evenly spaced, mid-interval) generation time."""
    step = (end - start) / tokens
    return float(sum(bisect_right(version_times, start + (k + 0.5) * step) - 1 for k in range(tokens)))


@st.composite
def timelines(draw: st.DrawFn) -> tuple[list[float], float, float]:
    gaps = draw(st.lists(st.integers(0, 50), min_size=0, max_size=12))  # 0: several versions at one instant
    version_times = [0.0]
    for gap in gaps:
        version_times.append(version_times[-1] + gap)
    horizon = version_times[-1] + 50
    start = draw(st.integers(0, int(horizon) - 1))
    end = draw(st.integers(start + 1, int(horizon)))
    return version_times, float(start), float(end)


def test_one_segment() -> None:
    assert version_token_sum([0.0, 100.0], 10.0, 60.0, 500) == (0, 0.0)
    assert version_token_sum([0.0, 100.0], 110.0, 160.0, 500) == (1, 500.0)


def test_two_segments_split_tokens_by_time() -> None:
    # 40% of the interval before the change to version 1, 60% after.
    oldest, total = version_token_sum([0.0, 40.0], 0.0, 100.0, 1000)
    assert oldest == 0
    assert total == pytest.approx(600.0)


def test_versions_that_change_at_one_instant_count_the_latest() -> None:
    version_times = [0.0, 10.0, 10.0, 10.0]  # colocated: three train batches between two rollout instants
    assert version_at(version_times, 10.0) == 3
    oldest, total = version_token_sum(version_times, 5.0, 15.0, 10)
    assert oldest == 0
    assert total == pytest.approx(5 * 0 + 5 * 3)
    assert version_token_sum(version_times, 10.0, 12.0, 4) == (3, 12.0)


@settings(max_examples=200, deadline=None)
@given(timelines(), st.integers(1, 400))
def test_segment_sum_matches_the_per_token_sum(timeline: tuple[list[float], float, float], tokens: int) -> None:
    version_times, start, end = timeline
    oldest, total = version_token_sum(version_times, start, end, tokens)
    assert oldest == version_at(version_times, start)
    newest = bisect_right(version_times, end) - 1
    assert tokens * oldest - 1e-6 <= total <= tokens * newest + 1e-6
    # Even spacing misplaces at most one token per version boundary inside the interval.
    assert abs(total - per_token(version_times, start, end, tokens)) <= (newest - oldest) + 1e-6


@settings(max_examples=200, deadline=None)
@given(timelines(), st.floats(0.01, 0.99))
def test_segment_sums_add_up_over_a_split(timeline: tuple[list[float], float, float], where: float) -> None:
    version_times, start, end = timeline
    middle = start + where * (end - start)
    tokens = 1000.0
    _, whole = version_token_sum(version_times, start, end, tokens)
    _, left = version_token_sum(version_times, start, middle, tokens * where)
    _, right = version_token_sum(version_times, middle, end, tokens * (1 - where))
    assert whole == pytest.approx(left + right, rel=1e-9, abs=1e-6)
