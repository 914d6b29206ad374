"""Every backend, for real: the contract suite runs once per store."""

import uuid
from collections.abc import Iterator

import pytest

from knittrans.store.file import FileUnitStore
from knittrans.store.protocol import UnitStore

BACKENDS = ["file", "mooncake", "ray"]


@pytest.fixture(params=BACKENDS)
def unit_store(request, tmp_path) -> Iterator[UnitStore]:
    if request.param == "file":
        store = FileUnitStore(tmp_path / "units")
        yield store
        store.close()
        return
    store = request.getfixturevalue("mooncake_store" if request.param == "mooncake" else "ray_store")
    store.stats.reset()
    yield store


@pytest.fixture
def prefix() -> str:
    """Keys unique to one test: the Mooncake and Ray stores are shared by the session."""
    return f"test-{uuid.uuid4().hex[:12]}"
