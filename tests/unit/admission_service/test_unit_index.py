"""The hierarchical index: sample -> trajectories -> keys, with reference counts and release decisions."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from knittrans.admission.service.index import IndexEntry, UnitIndex
from knittrans.errors import Conflict, InvalidArgument
from knittrans.store.keys import multimodal_unit_key, trajectory_unit_key
from knittrans.types import SampleId, TrajectoryId

HASH_A = "a" * 32
HASH_B = "b" * 32


def entry(trajectory: str, sample: str, fields=("input_ids", "logprobs"), images=()) -> IndexEntry:
    tid = TrajectoryId(trajectory)
    return IndexEntry(
        trajectory_id=tid,
        sample_id=SampleId(sample),
        unit_keys=tuple(trajectory_unit_key("job", tid, f) for f in fields),
        multimodal_keys=tuple(multimodal_unit_key("job", SampleId(sample), h) for h in images),
    )


def test_group_shares_one_multimodal_key_until_the_last_trajectory_is_released():
    index = UnitIndex()
    group = [entry(f"s1-{i}", "s1", images=(HASH_A,)) for i in range(4)]
    for e in group:
        assert index.add(e)
    image = multimodal_unit_key("job", SampleId("s1"), HASH_A)
    assert index.refcount(image) == 4
    assert index.trajectories(SampleId("s1")) == tuple(e.trajectory_id for e in group)
    freed = index.release([group[0].trajectory_id, group[1].trajectory_id])
    assert set(freed) == set(group[0].unit_keys + group[1].unit_keys)
    assert index.refcount(image) == 2
    freed = index.release([group[2].trajectory_id, group[3].trajectory_id])
    assert image in freed
    assert index.samples() == ()
    assert len(index) == 0


def test_re_adding_the_same_entry_is_idempotent_and_a_different_one_conflicts():
    index = UnitIndex()
    assert index.add(entry("t1", "s1"))
    assert not index.add(entry("t1", "s1"))
    assert index.refcount(trajectory_unit_key("job", TrajectoryId("t1"), "input_ids")) == 1
    with pytest.raises(Conflict):
        index.add(entry("t1", "s1", fields=("input_ids",)))


def test_multimodal_keys_are_scoped_to_their_sample():
    index = UnitIndex()
    index.add(entry("t1", "s1", images=(HASH_A,)))
    foreign = IndexEntry(
        trajectory_id=TrajectoryId("t2"),
        sample_id=SampleId("s2"),
        multimodal_keys=(multimodal_unit_key("job", SampleId("s1"), HASH_A),),
    )
    with pytest.raises(InvalidArgument, match="belongs to"):
        index.add(foreign)


def test_a_trajectory_unit_cannot_be_shared():
    index = UnitIndex()
    index.add(entry("t1", "s1"))
    thief = IndexEntry(
        trajectory_id=TrajectoryId("t2"),
        sample_id=SampleId("s1"),
        unit_keys=(trajectory_unit_key("job", TrajectoryId("t1"), "input_ids"),),
    )
    with pytest.raises(InvalidArgument, match="already referenced"):
        index.add(thief)
    assert "t2" not in index


def test_release_of_unknown_or_released_trajectories_is_harmless():
    index = UnitIndex()
    index.add(entry("t1", "s1"))
    assert len(index.release([TrajectoryId("t1")])) == 2
    assert index.release([TrajectoryId("t1"), TrajectoryId("nope")]) == ()


def test_entries_rebuild_the_same_index():
    index = UnitIndex()
    for i in range(6):
        index.add(entry(f"t{i}", f"s{i % 2}", images=(HASH_A if i % 2 else HASH_B,)))
    rebuilt = UnitIndex(index.entries())
    assert rebuilt.entries() == index.entries()
    assert rebuilt.live_keys() == index.live_keys()


operations = st.lists(
    st.tuples(st.booleans(), st.integers(0, 7), st.integers(0, 2), st.sampled_from([(), (HASH_A,), (HASH_A, HASH_B)])),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(operations)
def test_every_key_is_freed_exactly_once_when_nothing_references_it(ops):
    index = UnitIndex()
    live: dict[str, IndexEntry] = {}
    freed_total: list[str] = []
    for is_add, t, s, images in ops:
        tid = f"t{t}"
        if is_add:
            if tid in live:
                continue
            e = entry(tid, f"s{s}", images=images)
            index.add(e)
            live[tid] = e
        else:
            freed = index.release([TrajectoryId(tid)])
            live.pop(tid, None)
            still_referenced = {k for e in live.values() for k in e.keys}
            assert not set(freed) & still_referenced
            freed_total.extend(freed)
        referenced = {k for e in live.values() for k in e.keys}
        assert index.live_keys() == referenced
        for key in referenced:
            assert index.refcount(key) == sum(key in e.keys for e in live.values())
    # a key is freed once per time it became unreferenced; never while referenced
    everything = index.release(list(live))
    assert index.live_keys() == frozenset()
    assert len(set(everything)) == len(everything)
