"""The planner's building blocks: first-fit decreasing, splitting, Karmarkar–Karp."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from knittrans.admission.planning.bins import first_fit_decreasing, split_heaviest
from knittrans.admission.planning.partition import karmarkar_karp


def reference_first_fit_decreasing(sizes: list[int], capacity: int) -> list[list[int]]:
    """The textbook O(n²) algorithm, to check the max-tree version against."""
    order = sorted(range(len(sizes)), key=lambda i: (-sizes[i], i))
    bins: list[list[int]] = []
    room: list[float] = []
    for i in order:
        for b in range(len(bins)):
            if sizes[i] <= capacity and room[b] >= sizes[i]:
                bins[b].append(i)
                room[b] -= sizes[i]
                break
        else:
            bins.append([i])
            room.append(capacity - sizes[i] if sizes[i] <= capacity else -1)
    return bins


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 120), min_size=0, max_size=80), st.integers(1, 150))
def test_first_fit_decreasing_matches_the_textbook_algorithm(sizes: list[int], capacity: int) -> None:
    bins = first_fit_decreasing(np.array(sizes, dtype=np.int64), capacity)
    assert bins == reference_first_fit_decreasing(sizes, capacity)
    for b in bins:
        assert len(b) == 1 or sum(sizes[i] for i in b) <= capacity


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 100), min_size=1, max_size=40), st.integers(1, 60))
def test_split_heaviest_reaches_the_target_when_it_can(weights: list[int], target: int) -> None:
    w = np.array(weights, dtype=np.float64)
    bins = split_heaviest([list(range(len(weights)))], w, target)
    assert len(bins) == max(1, min(target, len(weights)))
    assert sorted(i for b in bins for i in b) == list(range(len(weights)))
    assert all(b for b in bins)


def reference_karmarkar_karp(weights: list[float], parts: int, equal_count: bool) -> list[list[int]]:
    """Largest differencing spelled out: every state is its parts as (sum, members), heaviest first, kept in a
    plain list and scanned for the two of largest spread (ties: the older first). A state with one non-empty part
    adds it to the other's lightest part; otherwise the heaviest parts pair with the lightest."""
    order = sorted(range(len(weights)), key=lambda i: (-weights[i], i))
    step = parts if equal_count else 1
    states = []  # (age, parts)
    for start in range(0, len(order), step):
        group = [(weights[i], [i]) for i in order[start : start + step]]
        states.append((len(states), group + [(0.0, [])] * (parts - len(group))))
    if not states:
        return [[] for _ in range(parts)]
    age = len(states)
    while len(states) > 1:
        states.sort(key=lambda state: (state[1][-1][0] - state[1][0][0], state[0]))
        (_, a), (_, b) = states[0], states[1]
        del states[:2]
        filled_a = [k for k, part in enumerate(a) if part[1]]
        filled_b = [k for k, part in enumerate(b) if part[1]]
        if parts > 1 and (len(filled_b) == 1 or len(filled_a) == 1):
            many, one = (a, b[filled_b[0]]) if len(filled_b) == 1 else (b, a[filled_a[0]])
            grown = (many[-1][0] + one[0], many[-1][1] + one[1])
            rest = many[:-1]
            position = sum(1 for part in rest if part[0] >= grown[0])
            merged = [*rest[:position], grown, *rest[position:]]
        else:
            paired = [(x[0] + y[0], x[1] + y[1]) for x, y in zip(a, reversed(b), strict=True)]
            merged = sorted(paired, key=lambda part: -part[0])
        states.append((age, merged))
        age += 1
    return [sorted(members) for _, members in states[0][1]]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.integers(0, 4).map(float), st.floats(0, 1000)), min_size=0, max_size=70),
       st.integers(1, 9), st.booleans())
def test_karmarkar_karp_matches_the_spelled_out_algorithm(weights: list[float], parts: int, equal: bool) -> None:
    if equal:
        weights = weights[: len(weights) - len(weights) % parts]
    assert karmarkar_karp(weights, parts, equal_count=equal) == reference_karmarkar_karp(weights, parts, equal)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.floats(0, 1000), min_size=0, max_size=60), st.integers(1, 7), st.booleans())
def test_karmarkar_karp_partitions_every_item_once(weights: list[float], parts: int, equal: bool) -> None:
    if equal:
        weights = weights[: len(weights) - len(weights) % parts]
    result = karmarkar_karp(weights, parts, equal_count=equal)
    assert len(result) == parts
    assert sorted(i for part in result for i in part) == list(range(len(weights)))
    if equal:
        assert {len(part) for part in result} <= {len(weights) // parts}
    if weights:
        loads = [sum(weights[i] for i in part) for part in result]
        # Differencing never leaves a gap larger than the heaviest item (the greedy bound).
        assert max(loads) - min(loads) <= max(weights) + 1e-6


def test_karmarkar_karp_finds_the_perfect_split_that_greedy_misses() -> None:
    # Greedy (each item to the lighter part, largest first) ends at 15 / 17; differencing finds 16 / 16.
    weights = [10, 7, 6, 5, 4]
    parts = karmarkar_karp(weights, 2)
    assert sorted(sum(weights[i] for i in p) for p in parts) == [16, 16]


@pytest.mark.parametrize(("weights", "parts"), [([0.0, 0.0, 0.0], 3), ([0.0] * 7, 3), ([0.0, 0.0, 1.0, 0.0], 2)])
def test_karmarkar_karp_keeps_every_item_when_weights_tie_at_zero(weights: list[float], parts: int) -> None:
    """Found by hypothesis: a zero-weight part could sit below an empty one and be dropped in a merge."""
    result = karmarkar_karp(weights, parts)
    assert sorted(i for part in result for i in part) == list(range(len(weights)))
