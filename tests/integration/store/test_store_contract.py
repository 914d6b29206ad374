"""The UnitStore contract, checked against every backend (file, mooncake, ray)."""

import numpy as np
import pytest

from knittrans.errors import Conflict, InvalidArgument, UnitNotFound
from knittrans.store.arrays import array_bytes
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
    assert stats.over_read_bytes == 0


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
