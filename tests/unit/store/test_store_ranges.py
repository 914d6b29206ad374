"""Headers turn token ranges into byte ranges; requests validate buffers; arrays become unit bytes."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from knittrans.errors import InvalidArgument
from knittrans.store.arrays import array_bytes, header_of, numpy_dtype, to_numpy, view_unit
from knittrans.store.hashing import content_hash
from knittrans.store.protocol import ReadStats, ReadStatsSnapshot, UnitRead, UnitWrite, dedupe_writes
from knittrans.types import ByteRange, DType, TokenSpan, UnitHeader

NUMERIC_DTYPES = [d for d in DType if d is not DType.BFLOAT16]


@given(
    dtype=st.sampled_from(NUMERIC_DTYPES),
    tokens=st.integers(1, 64),
    inner=st.lists(st.integers(1, 4), max_size=2),
    data=st.data(),
)
def test_token_span_maps_to_exactly_the_bytes_of_the_slice(dtype, tokens, inner, data):
    shape = (tokens, *inner)
    array = np.arange(int(np.prod(shape))).astype(numpy_dtype(dtype)).reshape(shape)
    header = header_of(array, dtype, sequence=True)
    start = data.draw(st.integers(0, tokens))
    end = data.draw(st.integers(start, tokens))
    byte_range = header.byte_range(TokenSpan(start=start, end=end))
    raw = bytes(array_bytes(array))
    assert raw[byte_range.offset : byte_range.end] == array[start:end].tobytes()
    assert byte_range.length == array[start:end].nbytes


def test_span_past_the_end_is_invalid():
    header = header_of(np.zeros((8, 2), dtype=np.float32), DType.FLOAT32, sequence=True)
    with pytest.raises(InvalidArgument) as excinfo:
        header.byte_range(TokenSpan(start=4, end=9))
    assert excinfo.value.field == "range"


def test_header_rejects_shape_that_does_not_match_bytes():
    with pytest.raises(InvalidArgument) as excinfo:
        UnitHeader(dtype=DType.INT32, shape=(4,), byte_length=15, content_hash="ab" * 16, seq_axis=0)
    assert excinfo.value.field == "byte_length"


def test_header_rejects_unknown_dtype():
    with pytest.raises(InvalidArgument) as excinfo:
        UnitHeader(dtype="complex64", shape=(4,), byte_length=32, content_hash="ab" * 16)
    assert excinfo.value.field == "dtype"


def test_write_rejects_data_that_does_not_match_its_header():
    array = np.zeros(4, dtype=np.int32)
    header = header_of(array, DType.INT32, sequence=True)
    with pytest.raises(InvalidArgument) as excinfo:
        UnitWrite.of("t/a/x", header, b"\0" * 15)
    assert excinfo.value.field == "data"


def test_write_rejects_non_contiguous_data():
    array = np.zeros((4, 4), dtype=np.int32)
    header = header_of(np.zeros(8, dtype=np.int32), DType.INT32, sequence=True)
    with pytest.raises(InvalidArgument, match="contiguous"):
        UnitWrite.of("t/a/x", header, array[:, ::2])


def test_read_rejects_read_only_or_too_small_buffers():
    with pytest.raises(InvalidArgument, match="writable"):
        UnitRead.of("t/a/x", b"abc")
    with pytest.raises(InvalidArgument) as excinfo:
        UnitRead.of("t/a/x", bytearray(4), [ByteRange(offset=0, length=3), ByteRange(offset=8, length=2)])
    assert excinfo.value.field == "buffer"


def test_read_counts_requested_bytes():
    read = UnitRead.of("t/a/x", bytearray(16), [ByteRange(offset=0, length=3), ByteRange(offset=8, length=5)])
    assert read.requested_bytes == 8


def test_dedupe_keeps_identical_and_rejects_different_content_for_one_key():
    header = header_of(np.ones(4, dtype=np.uint8), DType.UINT8, sequence=False)
    same = [UnitWrite.of("k", header, bytes([1] * 4)), UnitWrite.of("k", header, bytes([1] * 4))]
    assert len(dedupe_writes(same)) == 1
    from knittrans.errors import Conflict

    other = np.full(4, 2, dtype=np.uint8)
    with pytest.raises(Conflict):
        dedupe_writes([UnitWrite.of("k", header, bytes([1] * 4)),
                       UnitWrite.of("k", header_of(other, DType.UINT8, sequence=False), other)])


def test_read_stats_over_read():
    stats = ReadStats()
    stats.record(units=2, requested_bytes=100, moved_bytes=130)
    assert stats.snapshot().over_read_bytes == 30
    stats.reset()
    assert stats.snapshot().moved_bytes == 0


@pytest.mark.parametrize("dtype", ["<i4", ">i4", ">f8", "<u2", "bool", "int8"])
def test_arrays_become_little_endian_bytes_and_view_back(dtype):
    array = np.arange(12).astype(dtype).reshape(6, 2)
    converted, unit_dtype = to_numpy(array, field="x")
    header = header_of(converted, unit_dtype, sequence=True)
    raw = bytes(array_bytes(converted))
    assert raw == array.astype(np.dtype(dtype).newbyteorder("<")).tobytes()
    np.testing.assert_array_equal(view_unit(raw, header), array)
    np.testing.assert_array_equal(view_unit(raw, header, num_tokens=2), array[:2])


def test_non_contiguous_arrays_are_made_contiguous():
    array = np.arange(20, dtype=np.int64).reshape(4, 5)[:, ::2]
    converted, _ = to_numpy(array, field="x")
    assert converted.flags.c_contiguous
    np.testing.assert_array_equal(converted, array)


@pytest.mark.parametrize("value", [np.zeros(3, dtype=np.complex64), np.zeros(3, dtype=np.uint64), np.array(["a"])])
def test_unknown_dtypes_are_rejected_with_the_field_named(value):
    with pytest.raises(InvalidArgument) as excinfo:
        to_numpy(value, field="fields.bad")
    assert excinfo.value.field == "fields.bad"
    assert "unknown dtype" in excinfo.value.message


def test_torch_tensors_including_bfloat16():
    torch = pytest.importorskip("torch")
    tensor = torch.arange(6, dtype=torch.float32).reshape(3, 2).to(torch.bfloat16)
    array, dtype = to_numpy(tensor, field="x")
    assert dtype is DType.BFLOAT16
    assert array.tobytes() == tensor.view(torch.int16).numpy().tobytes()
    array, dtype = to_numpy(torch.ones(4, dtype=torch.bool), field="x")
    assert dtype is DType.BOOL
    with pytest.raises(InvalidArgument, match="unknown dtype"):
        to_numpy(torch.zeros(2, dtype=torch.complex64), field="x")


def test_content_hash_is_stable_and_content_sensitive():
    a = np.arange(100, dtype=np.int32)
    assert content_hash(a) == content_hash(a.copy()) == content_hash(a.tobytes())
    b = a.copy()
    b[50] += 1
    assert content_hash(a) != content_hash(b)
    assert len(content_hash(a)) == 32


def test_write_rejects_a_header_whose_hash_is_of_other_bytes():
    array = np.arange(6, dtype=np.int16)
    header = header_of(array[::-1].copy(), DType.INT16, sequence=True)
    with pytest.raises(InvalidArgument) as excinfo:
        UnitWrite.of("t/a/x", header, array)
    assert excinfo.value.field == "header.content_hash"


def test_writes_built_from_arrays_carry_the_hash_of_their_bytes():
    array = np.arange(12, dtype=np.float32).reshape(4, 3)
    write = UnitWrite.of_array("t/a/x", array, DType.FLOAT32, sequence=True)
    assert write.header == header_of(array, DType.FLOAT32, sequence=True)
    assert UnitWrite.of("t/a/x", write.header, array) == write
    image = np.ones((2, 2), dtype=np.uint8)
    addressed = UnitWrite.content_addressed_of_array(lambda digest: f"t/s/mm/{digest}", image, DType.UINT8)
    assert addressed.key == f"t/s/mm/{header_of(image, DType.UINT8, sequence=False).content_hash}"
    assert addressed.content_addressed and addressed.header.seq_axis is None


def test_a_read_call_that_raises_records_only_its_moved_bytes():
    stats = ReadStats()
    with stats.call() as tally:
        tally.moved(10)
        tally.completed(requested_bytes=10)
        tally.completed(requested_bytes=0)
    with pytest.raises(InvalidArgument), stats.call() as tally:
        tally.moved(7)
        tally.completed(requested_bytes=7)
        raise InvalidArgument("bad range", field="range")
    assert stats.snapshot() == ReadStatsSnapshot(units=2, requested_bytes=10, moved_bytes=17)
