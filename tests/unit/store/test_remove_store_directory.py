"""A file store's directory is removed at the end of a job (``FileUnitStore.purge``, the local stack's stop); on
tmpfs what is left holds memory, so what cannot be removed is logged, never silently ignored."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from knittrans.store.arrays import header_of, to_numpy
from knittrans.store.file import FileUnitStore, remove_store_directory
from knittrans.store.protocol import UnitWrite


def filled_store(root: Path) -> FileUnitStore:
    store = FileUnitStore(root)
    array = np.arange(64, dtype=np.int32)
    raw, dtype = to_numpy(array, field="input_ids")
    header = header_of(raw, dtype, sequence=True)
    store.put_many([UnitWrite(key=f"job/t{i}/input_ids", data=raw.tobytes(), header=header) for i in range(3)])
    return store


def test_a_purged_store_leaves_nothing_and_logs_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = filled_store(tmp_path / "store")
    assert any(p.is_file() for p in (tmp_path / "store").rglob("*"))
    with caplog.at_level(logging.WARNING):
        store.purge()
        remove_store_directory(tmp_path / "store")  # gone already: nothing to say
        remove_store_directory(tmp_path / "never-there")
    assert not (tmp_path / "store").exists()
    assert caplog.records == []


def test_what_cannot_be_removed_is_logged_naming_it(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    filled_store(tmp_path / "elsewhere").close()
    (tmp_path / "store").symlink_to(tmp_path / "elsewhere")  # rmtree refuses to follow a link
    with caplog.at_level(logging.WARNING, logger="knittrans.store.file"):
        remove_store_directory(tmp_path / "store")
    [record] = caplog.records
    assert str(tmp_path / "store") in record.getMessage() and "(1 failures)" in record.getMessage()
    assert len([p for p in (tmp_path / "elsewhere").rglob("*") if p.is_file()]) == 3  # the link's target is kept
