"""File backend details: random ranges on both read paths, atomic publishing, safe names."""

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from knittrans.store.file import MMAP_READ_THRESHOLD, FileUnitStore, file_name
from knittrans.types import ByteRange, UnitKey
from tests.integration.store.units import unit

UNIT_BYTES = 2 * MMAP_READ_THRESHOLD + 12345
DATA = np.random.default_rng(3).integers(0, 255, size=UNIT_BYTES, dtype=np.uint8)


@pytest.fixture(scope="module")
def filled_store(tmp_path_factory):
    store = FileUnitStore(tmp_path_factory.mktemp("file-store"))
    store.put_many([unit("big", DATA)])
    return store


byte_ranges = st.integers(0, UNIT_BYTES).flatmap(
    lambda start: st.integers(0, UNIT_BYTES - start).map(lambda length: ByteRange(offset=start, length=length))
)


@settings(max_examples=60, deadline=None)
@given(st.lists(byte_ranges, min_size=1, max_size=4))
def test_any_ranges_read_back_exactly_on_both_read_paths(filled_store, ranges):
    buffer = bytearray(sum(r.length for r in ranges))
    filled_store.stats.reset()
    assert filled_store.get_into(UnitKey("big"), buffer, ranges) == len(buffer)
    assert bytes(buffer) == b"".join(DATA[r.offset : r.end].tobytes() for r in ranges)
    assert filled_store.stats.snapshot().over_read_bytes == 0


def test_publishing_leaves_no_temporary_files_and_private_modes(tmp_path):
    store = FileUnitStore(tmp_path / "s")
    store.put_many([unit(f"t/{i}", np.full(100, i, dtype=np.int32)) for i in range(5)])
    assert os.listdir(tmp_path / "s" / "tmp") == []
    assert sorted(os.listdir(tmp_path / "s" / "units")) == sorted(file_name(f"t/{i}") for i in range(5))
    assert (tmp_path / "s").stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "s" / "units" / file_name("t/0")).stat().st_mode & 0o777 == 0o600


def test_two_store_objects_on_one_directory_see_the_same_units(tmp_path):
    writer, reader = FileUnitStore(tmp_path / "s"), FileUnitStore(tmp_path / "s")
    writer.put_many([unit("shared/a", np.arange(10, dtype=np.int64))])
    out = np.zeros(10, dtype=np.int64)
    reader.get_into(UnitKey("shared/a"), out)
    np.testing.assert_array_equal(out, np.arange(10))
    reader.purge()
    assert not (tmp_path / "s").exists()
