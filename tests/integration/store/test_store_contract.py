"""The UnitStore contract, checked against every backend (file, mooncake, ray)."""

import uuid

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from knittrans.errors import Conflict, InvalidArgument, UnitNotFound
from knittrans.store.arrays import array_bytes, header_of
from knittrans.store.hashing import content_hash
from knittrans.store.protocol import UnitRead, UnitStore, UnitWrite
from knittrans.types import ByteRange, DType, TokenSpan, UnitHeader, UnitKey
from tests.integration.store.units import unit


def test_store_satisfies_the_protocol(unit_store):
    assert isinstance(unit_store, UnitStore)
    assert unit_store.backend in ("file", "mooncake", "ray")


def test_put_then_read_whole_units_in_one_batch(unit_store, prefix):
    rng = np.random.default_rng(0)
    arrays = {f"{prefix}/u{i}": rng.integers(0, 1000, size=(50 + i, 3), dtype=np.int32) for i in range(5)}
    result = unit_store.put_many([unit(k, a) for k, a in arrays.items()])
    assert set(result.created) == set(arrays) and result.already_present == ()
    outputs = {k: np.zeros_like(a) for k, a in arrays.items()}
    counts = unit_store.get_many_into([UnitRead.of(k, outputs[k]) for k in arrays])
    assert counts == [a.nbytes for a in arrays.values()]
    for key, array in arrays.items():
        np.testing.assert_array_equal(outputs[key], array)
    assert unit_store.exists([*arrays, f"{prefix}/missing"]) == [True] * 5 + [False]


def test_sliced_reads_move_only_the_requested_bytes(unit_store, prefix):
    logprobs = np.arange(1000, dtype=np.float32)
    routing = np.arange(1000 * 8, dtype=np.uint8).reshape(1000, 8)
    units = [unit(f"{prefix}/logprobs", logprobs), unit(f"{prefix}/routing", routing)]
    unit_store.put_many(units)
    unit_store.stats.reset()
    # zigzag CP rank 0 of cp=2: chunks 0 and 3 of 4, with one token of look-ahead on the first
    spans = [TokenSpan(start=0, end=251), TokenSpan(start=750, end=1000)]
    reads, buffers = [], []
    for write in units:
        ranges = [write.header.byte_range(s) for s in spans]
        buffers.append(bytearray(sum(r.length for r in ranges)))
        reads.append(UnitRead.of(write.key, buffers[-1], ranges))
    unit_store.get_many_into(reads)
    np.testing.assert_array_equal(np.frombuffer(buffers[0], np.float32), np.r_[logprobs[:251], logprobs[750:]])
    got_routing = np.frombuffer(buffers[1], np.uint8).reshape(-1, 8)
    np.testing.assert_array_equal(got_routing, np.r_[routing[:251], routing[750:]])
    stats = unit_store.stats.snapshot()
    assert stats.requested_bytes == sum(len(b) for b in buffers)
    assert stats.moved_bytes == moved_for_ranges(unit_store, stats.requested_bytes, logprobs.nbytes + routing.nbytes)


def test_one_call_reads_the_same_unit_several_times_with_different_ranges(unit_store, prefix):
    """Two CP ranks' reads of one unit, a whole read of it and a read of another unit, in one call."""
    data = np.random.default_rng(3).integers(0, 255, size=4000, dtype=np.uint8)
    other = np.arange(100, dtype=np.uint8)
    unit_store.put_many([unit(f"{prefix}/t", data), unit(f"{prefix}/o", other)])
    pieces = [[ByteRange(offset=0, length=1001), ByteRange(offset=3000, length=1000)],
              [ByteRange(offset=1000, length=2000)], None, [ByteRange(offset=2999, length=1)]]
    buffers = [bytearray(4000 if ranges is None else sum(r.length for r in ranges)) for ranges in pieces]
    reads = [UnitRead.of(f"{prefix}/t", buffer, ranges) for buffer, ranges in zip(buffers, pieces, strict=True)]
    got = bytearray(100)
    counts = unit_store.get_many_into([*reads, UnitRead.of(f"{prefix}/o", got, [ByteRange(offset=0, length=100)])])
    assert counts == [2001, 2000, 4000, 1, 100]
    expected = [np.r_[data[:1001], data[3000:]], data[1000:3000], data, data[2999:3000]]
    for buffer, want in zip(buffers, expected, strict=True):
        np.testing.assert_array_equal(np.frombuffer(buffer, np.uint8), want)
    np.testing.assert_array_equal(np.frombuffer(got, np.uint8), other)


def test_read_into_an_offset_of_a_larger_buffer(unit_store, prefix):
    array = np.arange(64, dtype=np.int64)
    unit_store.put_many([unit(f"{prefix}/x", array)])
    slot = np.zeros(100, dtype=np.int64)
    view = memoryview(slot).cast("B")[80:]
    assert unit_store.get_into(UnitKey(f"{prefix}/x"), view, [ByteRange(offset=8 * 10, length=8 * 5)]) == 40
    np.testing.assert_array_equal(slot[10:15], array[10:15])
    assert not slot[:10].any() and not slot[15:].any()


def test_identical_rewrite_succeeds_and_conflicting_rewrite_changes_nothing(unit_store, prefix):
    original = np.arange(256, dtype=np.int16)
    first = unit_store.put_many([unit(f"{prefix}/a", original)])
    again = unit_store.put_many([unit(f"{prefix}/a", original.copy())])
    assert first.created == (f"{prefix}/a",) and again.already_present == (f"{prefix}/a",)
    with pytest.raises(Conflict) as excinfo:
        unit_store.put_many([unit(f"{prefix}/a", original + 1)])
    assert excinfo.value.field == f"{prefix}/a"
    with pytest.raises(Conflict):
        unit_store.put_many([unit(f"{prefix}/a", np.arange(300, dtype=np.int16))])
    out = np.zeros_like(original)
    unit_store.get_into(UnitKey(f"{prefix}/a"), out)
    np.testing.assert_array_equal(out, original)


def test_a_batch_with_a_conflict_writes_nothing(unit_store, prefix):
    unit_store.put_many([unit(f"{prefix}/a", np.zeros(10, dtype=np.int32))])
    batch = [unit(f"{prefix}/new1", np.ones(10, dtype=np.int32)), unit(f"{prefix}/a", np.ones(10, dtype=np.int32)),
             unit(f"{prefix}/new2", np.ones(10, dtype=np.int32))]
    with pytest.raises(Conflict):
        unit_store.put_many(batch)
    assert unit_store.exists([UnitKey(f"{prefix}/new1"), UnitKey(f"{prefix}/new2")]) == [False, False]


def test_content_addressed_units_are_stored_once(unit_store, prefix):
    image = np.random.default_rng(1).integers(0, 255, size=(3, 16, 16), dtype=np.uint8)
    key = f"{prefix}/s/mm/{content_hash(image)}"
    first = unit_store.put_many([unit(key, image, sequence=False, content_addressed=True)])
    second = unit_store.put_many([unit(key, image, sequence=False, content_addressed=True)])
    assert first.created == (key,) and second.already_present == (key,)


def test_missing_key_raises_unit_not_found(unit_store, prefix):
    with pytest.raises(UnitNotFound) as excinfo:
        unit_store.get_into(UnitKey(f"{prefix}/nope"), bytearray(8))
    assert excinfo.value.field == f"{prefix}/nope"
    with pytest.raises(UnitNotFound):
        unit_store.get_into(UnitKey(f"{prefix}/nope"), bytearray(8), [ByteRange(offset=0, length=4)])


def test_range_outside_the_unit_is_invalid(unit_store, prefix):
    unit_store.put_many([unit(f"{prefix}/a", np.zeros(16, dtype=np.uint8))])
    with pytest.raises(InvalidArgument) as excinfo:
        unit_store.get_into(UnitKey(f"{prefix}/a"), bytearray(8), [ByteRange(offset=12, length=8)])
    assert excinfo.value.field == "range"


def test_whole_read_into_a_smaller_buffer_is_invalid(unit_store, prefix):
    unit_store.put_many([unit(f"{prefix}/a", np.zeros(16, dtype=np.uint8))])
    with pytest.raises(InvalidArgument) as excinfo:
        unit_store.get_into(UnitKey(f"{prefix}/a"), bytearray(8))
    assert excinfo.value.field == "buffer"


def test_header_that_does_not_match_the_bytes_is_rejected_before_writing(unit_store, prefix):
    data = np.zeros(10, dtype=np.int32)
    wrong = UnitHeader(dtype=DType.INT32, shape=(12,), byte_length=48, content_hash=content_hash(data), seq_axis=0)
    with pytest.raises(InvalidArgument):
        unit_store.put_many([UnitWrite.of(f"{prefix}/a", wrong, array_bytes(data))])
    assert unit_store.exists([UnitKey(f"{prefix}/a")]) == [False]


def test_delete_is_idempotent_and_removes_units(unit_store, prefix):
    keys = [UnitKey(f"{prefix}/d{i}") for i in range(3)]
    unit_store.put_many([unit(k, np.full(8, i, dtype=np.int8)) for i, k in enumerate(keys)])
    assert unit_store.delete_many([*keys[:2], UnitKey(f"{prefix}/never")]) == 2
    assert unit_store.exists(keys) == [False, False, True]
    assert unit_store.delete_many(keys[:2]) == 0
    with pytest.raises(UnitNotFound):
        unit_store.get_into(keys[0], bytearray(8))
    # a deleted key may be written again with new content
    unit_store.put_many([unit(keys[0], np.full(8, 7, dtype=np.int8))])
    out = np.zeros(8, dtype=np.int8)
    unit_store.get_into(keys[0], out)
    assert (out == 7).all()


def test_sizes_are_the_stored_byte_lengths_and_none_for_missing_or_deleted_units(unit_store, prefix):
    arrays = {UnitKey(f"{prefix}/z{i}"): np.arange(7 * i + 1, dtype=np.float64) for i in range(4)}
    unit_store.put_many([unit(k, a) for k, a in arrays.items()])
    keys = list(arrays)
    unit_store.delete_many([keys[3]])
    unit_store.stats.reset()
    asked = [keys[1], UnitKey(f"{prefix}/never"), keys[0], keys[3], keys[1], keys[2]]
    expected = [arrays[keys[1]].nbytes, None, arrays[keys[0]].nbytes, None, arrays[keys[1]].nbytes,
                arrays[keys[2]].nbytes]
    assert unit_store.sizes(asked) == expected
    assert unit_store.sizes([]) == []
    assert unit_store.stats.snapshot().moved_bytes == 0  # metadata only


def test_registered_buffers_are_read_into(unit_store, prefix):
    array = np.arange(4096, dtype=np.uint8)
    unit_store.put_many([unit(f"{prefix}/a", array)])
    ring = np.zeros(1 << 16, dtype=np.uint8)
    unit_store.register_buffer(ring)
    try:
        reads = [UnitRead.of(f"{prefix}/a", memoryview(ring)[1000:], [ByteRange(offset=100, length=50)]),
                 UnitRead.of(f"{prefix}/a", memoryview(ring)[2000:])]
        assert unit_store.get_many_into(reads) == [50, 4096]
        np.testing.assert_array_equal(ring[1000:1050], array[100:150])
        np.testing.assert_array_equal(ring[2000:6096], array)
    finally:
        unit_store.unregister_buffer(ring)


# -- zero-length reads, impossible ranges, content hashes -------------------------------------------------


def ten_byte_unit(unit_store, prefix) -> UnitKey:
    key = UnitKey(f"{prefix}/ten")
    unit_store.put_many([unit(key, np.arange(10, dtype=np.uint8))])
    return key


@pytest.mark.parametrize("ranges", [[], [ByteRange(offset=0, length=0)]], ids=["no-ranges", "zero-length-range"])
def test_a_zero_length_read_of_a_missing_unit_is_unit_not_found(unit_store, prefix, ranges):
    with pytest.raises(UnitNotFound) as excinfo:
        unit_store.get_into(UnitKey(f"{prefix}/nope"), bytearray(8), ranges)
    assert excinfo.value.field == f"{prefix}/nope"
    with pytest.raises(UnitNotFound):
        unit_store.get_many_into([UnitRead.of(f"{prefix}/nope", bytearray(8), ranges)])


def test_a_zero_length_range_must_still_lie_inside_the_unit(unit_store, prefix):
    key = ten_byte_unit(unit_store, prefix)
    assert unit_store.get_into(key, bytearray(8), [ByteRange(offset=10, length=0)]) == 0  # at the very end
    assert unit_store.get_into(key, bytearray(8), []) == 0
    with pytest.raises(InvalidArgument) as excinfo:
        unit_store.get_into(key, bytearray(8), [ByteRange(offset=100, length=0)])
    assert excinfo.value.field == "range"
    with pytest.raises(InvalidArgument):
        unit_store.get_into(key, bytearray(8), [ByteRange(offset=0, length=4), ByteRange(offset=11, length=0)])


@pytest.mark.parametrize(
    "byte_range",
    [ByteRange(offset=2**64, length=1), ByteRange(offset=2**64 - 1, length=2), ByteRange(offset=2**63, length=1),
     ByteRange(offset=2**70, length=0)],
    ids=["offset-2^64", "end-overflows-uint64", "offset-2^63", "empty-at-2^70"],
)
def test_a_range_far_beyond_the_unit_is_invalid(unit_store, prefix, byte_range):
    key = ten_byte_unit(unit_store, prefix)
    with pytest.raises(InvalidArgument) as excinfo:
        unit_store.get_into(key, bytearray(8), [byte_range])
    assert excinfo.value.field == "range"


def test_a_header_whose_hash_is_not_the_hash_of_the_bytes_is_rejected(unit_store, prefix):
    data = np.arange(10, dtype=np.int32)
    other = header_of(data + 1, DType.INT32, sequence=True)  # right shape and size, hash of other bytes
    with pytest.raises(InvalidArgument) as excinfo:
        unit_store.put_many([UnitWrite.of(f"{prefix}/a", other, array_bytes(data))])
    assert excinfo.value.field == "header.content_hash"
    assert unit_store.exists([UnitKey(f"{prefix}/a")]) == [False]


# -- the read statistics -----------------------------------------------------------------------------------


def moved_for_ranges(unit_store, requested: int, unit_sizes: int) -> int:
    """What a backend's I/O moves for ranged reads: the ranges, or the whole objects where the backend
    cannot fetch part of one (ray)."""
    return unit_sizes if unit_store.backend == "ray" else requested


def test_sliced_reads_count_what_the_backend_moved(unit_store, prefix):
    data = np.arange(4000, dtype=np.uint8)
    key = UnitKey(f"{prefix}/s")
    unit_store.put_many([unit(key, data)])
    unit_store.stats.reset()
    buffer = bytearray(300)
    unit_store.get_into(key, buffer, [ByteRange(offset=1000, length=100), ByteRange(offset=3, length=200)])
    stats = unit_store.stats.snapshot()
    assert (stats.units, stats.requested_bytes) == (1, 300)
    assert stats.moved_bytes == moved_for_ranges(unit_store, 300, data.nbytes)
    assert stats.over_read_bytes == stats.moved_bytes - 300


def test_zero_length_and_whole_reads_are_counted_by_one_rule(unit_store, prefix):
    key = ten_byte_unit(unit_store, prefix)
    unit_store.stats.reset()
    reads = [UnitRead.of(key, bytearray(0), []), UnitRead.of(key, bytearray(4), [ByteRange(offset=5, length=0)]),
             UnitRead.of(key, bytearray(16))]
    assert unit_store.get_many_into(reads) == [0, 0, 10]
    stats = unit_store.stats.snapshot()
    assert (stats.units, stats.requested_bytes) == (3, 10)
    assert stats.moved_bytes >= 10


@pytest.mark.parametrize("failing", ["missing", "outside"])
def test_a_failed_read_call_counts_no_units_and_only_what_it_moved(unit_store, prefix, failing):
    key = ten_byte_unit(unit_store, prefix)
    unit_store.stats.reset()
    good = UnitRead.of(key, bytearray(4), [ByteRange(offset=2, length=4)])
    bad = (UnitRead.of(f"{prefix}/nope", bytearray(4), [ByteRange(offset=0, length=4)]) if failing == "missing"
           else UnitRead.of(key, bytearray(4), [ByteRange(offset=8, length=4)]))
    with pytest.raises(UnitNotFound if failing == "missing" else InvalidArgument):
        unit_store.get_many_into([good, bad])
    stats = unit_store.stats.snapshot()
    assert (stats.units, stats.requested_bytes) == (0, 0)
    # What each backend's I/O did: file read the good range before it met the bad read; Mooncake queries every
    # unit's replica before moving anything (a missing one stops the call there), then moves every read of the
    # call in one transfer; Ray fetches no object when a key is missing, else every object whole.
    moved = {"file": 4, "mooncake": 0 if failing == "missing" else 4, "ray": 0 if failing == "missing" else 10}
    assert stats.moved_bytes == moved[unit_store.backend]


# -- random units, ranges and buffer offsets against numpy slicing ---------------------------------------------


@st.composite
def reads_of_a_unit(draw):
    size = draw(st.integers(min_value=1, max_value=70_000))
    ranged = draw(st.booleans())
    ranges = None
    if ranged:
        starts = st.integers(min_value=0, max_value=size)
        ranges = []
        for offset in draw(st.lists(starts, max_size=4)):
            ranges.append(ByteRange(offset=offset, length=draw(st.integers(min_value=0, max_value=size - offset))))
    buffer_offset = draw(st.integers(min_value=0, max_value=37))
    slack = draw(st.integers(min_value=0, max_value=9))
    return size, ranges, buffer_offset, slack


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(reads_of_a_unit(), min_size=1, max_size=4), st.integers(min_value=0, max_value=2**32 - 1))
def test_random_units_ranges_and_buffer_offsets_read_back_as_numpy_slices(unit_store, prefix, reads, seed):
    rng = np.random.default_rng(seed)
    batch = uuid.uuid4().hex[:8]
    originals, requests, buffers, expected = {}, [], [], []
    for i, (size, ranges, buffer_offset, slack) in enumerate(reads):
        key = UnitKey(f"{prefix}/{batch}/{i}")
        originals[key] = rng.integers(0, 256, size=size, dtype=np.uint8)
        want = originals[key] if ranges is None else np.concatenate(
            [originals[key][r.offset : r.offset + r.length] for r in ranges] or [np.empty(0, np.uint8)])
        canary = np.full(buffer_offset + want.nbytes + slack, 0xA5, dtype=np.uint8)
        buffers.append((canary, buffer_offset))
        requests.append(UnitRead.of(key, memoryview(canary)[buffer_offset : buffer_offset + want.nbytes + slack],
                                    ranges))
        expected.append(want)
    unit_store.put_many([unit(k, a, sequence=False) for k, a in originals.items()])
    unit_store.stats.reset()
    counts = unit_store.get_many_into(requests)
    assert counts == [w.nbytes for w in expected]
    for (canary, offset), want in zip(buffers, expected, strict=True):
        np.testing.assert_array_equal(canary[offset : offset + want.nbytes], want)
        assert (canary[:offset] == 0xA5).all() and (canary[offset + want.nbytes :] == 0xA5).all()
    stats = unit_store.stats.snapshot()
    requested = sum(w.nbytes for w in expected)
    assert (stats.units, stats.requested_bytes) == (len(requests), requested)
    assert stats.moved_bytes == moved_for_ranges(unit_store, requested, sum(a.nbytes for a in originals.values()))
    unit_store.delete_many(list(originals))
    assert unit_store.exists(list(originals)) == [False] * len(originals)
