"""The file store keeps a unit's mapping open between reads; it must never serve bytes the unit no longer has.

The oracle is a plain dict of what each key should hold now. A second store object on the same directory
stands for another process: it deletes and republishes units behind the reader's back, with other sizes and
bytes, so a mapping kept past its file would be caught.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from knittrans.errors import UnitNotFound
from knittrans.store.file import MMAP_READ_THRESHOLD, FileUnitStore
from knittrans.store.file_mappings import SWEEP_EVERY
from knittrans.types import ByteRange, UnitKey
from tests.integration.store.units import unit

KEYS = ("a", "b")
# Three of the largest units fit in the reader's budget, so eviction happens as well.
LARGEST = 3 * MMAP_READ_THRESHOLD
BUDGET = 3 * LARGEST


def content(seed: int, size: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 255, size=size, dtype=np.uint8)


operations = st.lists(
    st.one_of(
        st.tuples(st.just("publish"), st.sampled_from(KEYS), st.integers(0, 10**6), st.sampled_from((1, 2, 3))),
        st.tuples(st.just("delete_elsewhere"), st.sampled_from(KEYS)),
        st.tuples(st.just("delete_here"), st.sampled_from(KEYS)),
        st.tuples(st.just("read"), st.sampled_from(KEYS), st.floats(0, 1), st.floats(0, 1)),
    ),
    min_size=1,
    max_size=24,
)


@settings(max_examples=60, deadline=None)
@given(operations)
def test_reads_match_what_each_key_holds_now(tmp_path_factory, steps):
    root = tmp_path_factory.mktemp("mapped")
    reader = FileUnitStore(root, mapping_cache_bytes=BUDGET)
    other_process = FileUnitStore(root)
    expected: dict[str, np.ndarray] = {}
    for step in steps:
        kind, key = step[0], step[1]
        if kind == "publish":
            other_process.delete_many([UnitKey(key)])
            expected[key] = content(step[2], step[3] * MMAP_READ_THRESHOLD + step[2] % 4096)
            other_process.put_many([unit(key, expected[key])])
        elif kind in ("delete_elsewhere", "delete_here"):
            (other_process if kind == "delete_elsewhere" else reader).delete_many([UnitKey(key)])
            expected.pop(key, None)
        else:
            _check_read(reader, key, expected.get(key), step[2], step[3])
        assert reader.mappings.mapped_bytes <= BUDGET
    reader.close()
    assert len(reader.mappings) == 0


def _check_read(reader: FileUnitStore, key: str, want: np.ndarray | None, start: float, share: float) -> None:
    if want is None:
        with pytest.raises(UnitNotFound):
            reader.get_into(UnitKey(key), bytearray(LARGEST + 4096))
        return
    offset = int(start * (want.nbytes - MMAP_READ_THRESHOLD))
    length = max(MMAP_READ_THRESHOLD, int(share * (want.nbytes - offset)))
    buffer = bytearray(length)
    assert reader.get_into(UnitKey(key), buffer, [ByteRange(offset=offset, length=length)]) == length
    assert bytes(buffer) == want[offset : offset + length].tobytes()


def test_a_unit_read_again_is_copied_from_the_mapping_it_already_has(tmp_path):
    store = FileUnitStore(tmp_path)
    data = content(1, 2 * MMAP_READ_THRESHOLD)
    store.put_many([unit("u", data)])
    for _ in range(3):
        out = np.zeros_like(data)
        store.get_into(UnitKey("u"), out)
        np.testing.assert_array_equal(out, data)
    assert len(store.mappings) == 1
    assert store.mappings.mapped_bytes == data.nbytes


def test_mappings_of_units_deleted_elsewhere_are_dropped_by_the_sweep(tmp_path):
    """A kept mapping pins a deleted unit's tmpfs pages; the periodic sweep gives them back."""
    reader, other_process = FileUnitStore(tmp_path), FileUnitStore(tmp_path)
    size = MMAP_READ_THRESHOLD
    reader_budget_units = SWEEP_EVERY * 2
    other_process.put_many([unit(f"gone/{i}", content(i, size)) for i in range(3)])
    for i in range(3):
        reader.get_into(UnitKey(f"gone/{i}"), bytearray(size))
    other_process.delete_many([UnitKey(f"gone/{i}") for i in range(3)])
    other_process.put_many([unit(f"kept/{i}", content(i, size)) for i in range(reader_budget_units)])
    for i in range(SWEEP_EVERY):
        reader.get_into(UnitKey(f"kept/{i}"), bytearray(size))
    assert reader.mappings.mapped_bytes == SWEEP_EVERY * size


def test_a_unit_larger_than_the_budget_is_read_without_keeping_it(tmp_path):
    store = FileUnitStore(tmp_path, mapping_cache_bytes=MMAP_READ_THRESHOLD)
    data = content(2, 2 * MMAP_READ_THRESHOLD)
    store.put_many([unit("big", data)])
    out = np.zeros_like(data)
    store.get_into(UnitKey("big"), out)
    np.testing.assert_array_equal(out, data)
    assert len(store.mappings) == 0


def test_a_unit_deleted_and_published_again_elsewhere_is_mapped_anew(tmp_path):
    reader, other_process = FileUnitStore(tmp_path), FileUnitStore(tmp_path)
    first, second = content(3, 2 * MMAP_READ_THRESHOLD), content(4, 2 * MMAP_READ_THRESHOLD)
    other_process.put_many([unit("k", first)])
    out = np.zeros_like(first)
    reader.get_into(UnitKey("k"), out)
    other_process.delete_many([UnitKey("k")])
    other_process.put_many([unit("k", second)])
    reader.get_into(UnitKey("k"), out)
    np.testing.assert_array_equal(out, second)
