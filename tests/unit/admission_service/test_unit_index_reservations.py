"""Reservations in the hierarchical index, against a naive model: a key may be freed only when no trajectory
that is reserved (written, not reported yet) or reported and not released references it any more.

The model keeps each trajectory's state and recomputes the set of held keys from scratch after every step;
the index must return exactly the keys that left that set, whatever the order of reservations, reports,
releases and cancellations."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from knittrans.admission.service.index import IndexEntry, UnitIndex
from knittrans.errors import Conflict, InvalidArgument
from knittrans.types import SampleId, TrajectoryId, UnitKey

TRAJECTORIES = 6
IMAGES_PER_SAMPLE = 3


def sample_of(t: int) -> str:
    return f"s{t % 2}"


@st.composite
def scenarios(draw):
    images = [
        tuple(sorted(draw(st.sets(st.integers(0, IMAGES_PER_SAMPLE - 1), min_size=1, max_size=IMAGES_PER_SAMPLE))))
        for _ in range(TRAJECTORIES)
    ]
    steps = draw(st.lists(st.tuples(st.sampled_from(["reserve", "report", "release", "cancel"]),
                                    st.integers(0, TRAJECTORIES - 1)), max_size=40))
    return images, steps


def keys_of(t: int, images: list[tuple[int, ...]]) -> tuple[UnitKey, ...]:
    return tuple(UnitKey(f"{sample_of(t)}/img{k}") for k in images[t])


def held(states: dict[int, str], images: list[tuple[int, ...]]) -> set[str]:
    keys: set[str] = set()
    for t, state in states.items():
        if state in ("reserved", "reported"):
            keys.update(keys_of(t, images))
        if state == "reported":
            keys.add(f"t{t}/input_ids")
    return keys


@settings(max_examples=150, deadline=None)
@given(scenarios())
def test_keys_are_freed_exactly_when_nothing_holds_them(scenario) -> None:
    images, steps = scenario
    index = UnitIndex()
    states: dict[int, str] = {}
    for operation, t in steps:
        before = held(states, images)
        trajectory_id, sample_id = TrajectoryId(f"t{t}"), SampleId(sample_of(t))
        state = states.get(t, "new")
        freed: tuple[UnitKey, ...] = ()
        if operation == "reserve":
            if state == "released":
                continue  # the ledger skips reservations of trajectories it has seen reported
            changed = index.reserve(trajectory_id, sample_id, keys_of(t, images))
            assert changed == (state in ("new", "cancelled"))
            if state in ("new", "cancelled"):
                states[t] = "reserved"
        elif operation == "report":
            if state in ("reported", "released"):
                continue  # the service answers DUPLICATE without touching the index
            entry = IndexEntry(trajectory_id=trajectory_id, sample_id=sample_id,
                               unit_keys=(UnitKey(f"t{t}/input_ids"),), multimodal_keys=keys_of(t, images))
            assert index.add(entry)
            states[t] = "reported"
        elif operation == "release":
            freed = index.release([trajectory_id])
            if state == "reported":
                states[t] = "released"
            else:
                assert freed == ()
        else:
            freed = index.cancel_reservations([trajectory_id])
            if state == "reserved":
                states[t] = "cancelled"
            else:
                assert freed == ()
        after = held(states, images)
        assert set(freed) == before - after
        assert len(freed) == len(set(freed))
        assert index.live_keys() == after


def test_a_reservation_is_checked_like_a_reference() -> None:
    index = UnitIndex()
    index.add(IndexEntry(trajectory_id="t1", sample_id="s1", unit_keys=("t1/input_ids",)))
    with pytest.raises(InvalidArgument):  # a trajectory's own unit is no multimodal unit
        index.reserve(TrajectoryId("t2"), SampleId("s1"), [UnitKey("t1/input_ids")])
    assert index.reserve(TrajectoryId("t2"), SampleId("s1"), [UnitKey("s1/img")])
    with pytest.raises(InvalidArgument):  # another sample's image
        index.reserve(TrajectoryId("t3"), SampleId("s2"), [UnitKey("s1/img")])
    with pytest.raises(Conflict):
        index.reserve(TrajectoryId("t2"), SampleId("s1"), [UnitKey("s1/other")])
    assert not index.reserve(TrajectoryId("t1"), SampleId("s1"), [UnitKey("s1/img2")])  # reported already
