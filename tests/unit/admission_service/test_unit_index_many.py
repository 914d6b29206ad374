"""``UnitIndex.add_many`` (and ``check_many`` + ``add_checked``) act as ``add`` one entry at a time, all or nothing."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from knittrans.admission.service.index import IndexEntry, UnitIndex
from knittrans.errors import Conflict, InvalidArgument, KnitTransError


def state(index: UnitIndex) -> tuple:
    return (index.entries(), {s: index.trajectories(s) for s in index.samples()},
            {k: (index.refcount(k), index.owner(k)) for k in index.live_keys()})


def columns(entries: list[IndexEntry]) -> tuple:
    return ([e.trajectory_id for e in entries], [e.sample_id for e in entries], [e.unit_keys for e in entries],
            [e.multimodal_keys for e in entries])


@st.composite
def entry_batches(draw) -> list[list[IndexEntry]]:
    """Batches of entries whose keys sometimes collide (another trajectory's unit, another sample's image)."""
    batches = []
    for b in range(draw(st.integers(1, 4))):
        batch = []
        for i in range(draw(st.integers(0, 6))):
            trajectory = draw(st.sampled_from([f"t{b}{i}", f"t{b}{i}", "t00", "t10"]))
            sample = draw(st.sampled_from(["s0", "s1", "s2"]))
            units = tuple(dict.fromkeys(draw(st.lists(st.sampled_from(
                [f"{trajectory}/a", f"{trajectory}/b", "t00/a", "shared"]), max_size=3))))
            media = tuple(k for k in dict.fromkeys(draw(st.lists(st.sampled_from(
                [f"{sample}/img0", f"{sample}/img1", "s0/img0", "shared"]), max_size=3))) if k not in units)
            batch.append(IndexEntry(trajectory_id=trajectory, sample_id=sample, unit_keys=units,
                                    multimodal_keys=media))
        batches.append(batch)
    return batches


def add_one_by_one(index: UnitIndex, batch: list[IndexEntry]) -> KnitTransError | None:
    """Sequential adds, undone on the first error (the all-or-nothing reference)."""
    trial = UnitIndex(index.entries())
    try:
        for entry in batch:
            trial.add(entry)
    except (Conflict, InvalidArgument) as exc:
        return exc
    for entry in batch:
        index.add(entry)
    return None


@given(batches=entry_batches())
@settings(max_examples=200, deadline=None)
def test_add_many_equals_adding_one_by_one(batches: list[list[IndexEntry]]) -> None:
    reference, index = UnitIndex(), UnitIndex()
    for batch in batches:
        expected = add_one_by_one(reference, batch)
        try:
            index.add_many(*columns(batch))
            error = None
        except (Conflict, InvalidArgument) as exc:
            error = exc
        assert type(error) is type(expected)
        if expected is not None:
            assert (error.field, error.message) == (expected.field, expected.message)
        assert state(index) == state(reference)
    for entry in reference.entries():  # releasing works the same on entries added in bulk
        assert index.release([entry.trajectory_id]) == reference.release([entry.trajectory_id])
        assert state(index) == state(reference)


def test_checked_entries_are_checked_again_if_the_index_changed() -> None:
    index = UnitIndex()
    checked = index.check_many(["t1"], ["s1"], [("t1/a",)], [("s1/img",)])
    index.add(IndexEntry(trajectory_id="t2", sample_id="s2", unit_keys=("t1/a",)))
    with pytest.raises(InvalidArgument, match="already referenced by 't2'"):
        index.add_checked(checked)
    assert index.trajectories("s1") == ()
    checked = index.check_many(["t3"], ["s1"], [("t3/a",)], [("s1/img",)])
    assert index.add_checked(checked) == 1
    assert index.refcount("s1/img") == 1 and index.refcount("t3/a") == 1 and index.refcount("nothing") == 0
