"""Rollout clients retry a unit write that failed transiently, and only such a write.

Through both clients (sync and asyncio) over a real file store whose first writes fail; the oracle is the store
itself: after a submit that returned, every unit reads back byte for byte. The Mooncake case, a segment owner
killed under the writes, is in test_mooncake_put_retry.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from knittrans.aio import AsyncRolloutClient
from knittrans.errors import Conflict, InvalidArgument, StoreError, StoreFullError, Unavailable
from knittrans.rollout import RolloutClient
from knittrans.store.factory import open_store
from knittrans.store.protocol import PutResult, UnitStore, UnitWrite
from knittrans.types import TrajectoryMeta, VersionSegment


class FailingFirstWrites:
    """A real store whose first ``failures`` put_many calls raise ``error`` before writing anything."""

    def __init__(self, store: UnitStore, error: Exception, failures: int) -> None:
        self.store = store
        self.error = error
        self.failures = failures
        self.attempts = 0

    def put_many(self, writes: Sequence[UnitWrite]) -> PutResult:
        self.attempts += 1
        if self.attempts <= self.failures:
            raise self.error
        return self.store.put_many(writes)

    def __getattr__(self, name: str) -> object:
        return getattr(self.store, name)


FIELDS = {"input_ids": np.arange(1, 40, dtype=np.int32), "loss_mask": np.ones(39, dtype=np.uint8),
          "routing": np.random.default_rng(3).integers(0, 256, (39, 8), dtype=np.uint8)}


def submit(client: RolloutClient | AsyncRolloutClient) -> TrajectoryMeta:
    arguments = {"trajectory_id": "t0", "sample_id": "s0", "source": "A", "rollout_step": 0,
                 "segments": (VersionSegment(version=0, num_tokens=39),)}
    if isinstance(client, AsyncRolloutClient):
        return asyncio.run(client.submit(FIELDS, **arguments))
    return client.submit(FIELDS, **arguments)


def client_of(kind: str, store: FailingFirstWrites, retry_seconds: float) -> RolloutClient | AsyncRolloutClient:
    if kind == "async":
        return AsyncRolloutClient(store, namespace="job", store_retry_seconds=retry_seconds)  # type: ignore[arg-type]
    return RolloutClient(store, namespace="job", store_retry_seconds=retry_seconds)  # type: ignore[arg-type]


def stored(store: UnitStore, meta: TrajectoryMeta) -> dict[str, bytes]:
    found = {}
    for unit in meta.units:
        buffer = np.empty(unit.header.byte_length, dtype=np.uint8)
        store.get_into(unit.key, buffer)
        found[unit.field_name] = buffer.tobytes()
    return found


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("error", [StoreError("mooncake batch_put_from failed with TRANSFER_FAIL (-800)"),
                                   Unavailable("the store is restarting")], ids=["store-error", "unavailable"])
def test_a_transiently_failing_write_is_retried_and_stores_every_byte(tmp_path: Path, kind: str,
                                                                      error: Exception) -> None:
    store = FailingFirstWrites(open_store(f"file://{tmp_path}"), error, failures=3)
    meta = submit(client_of(kind, store, retry_seconds=60.0))
    assert store.attempts == 4
    assert stored(store.store, meta) == {name: np.ascontiguousarray(value).tobytes()
                                         for name, value in FIELDS.items()}


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("error", [StoreFullError("the store is full"), Conflict("key exists"),
                                   InvalidArgument("bad range", field="range")],
                         ids=["full", "conflict", "invalid"])
def test_a_write_no_retry_can_mend_fails_at_the_first_attempt(tmp_path: Path, kind: str, error: Exception) -> None:
    store = FailingFirstWrites(open_store(f"file://{tmp_path}"), error, failures=1)
    with pytest.raises(type(error)):
        submit(client_of(kind, store, retry_seconds=60.0))
    assert store.attempts == 1


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_write_still_failing_at_the_deadline_raises(tmp_path: Path, kind: str) -> None:
    store = FailingFirstWrites(open_store(f"file://{tmp_path}"), StoreError("still down"), failures=10**6)
    with pytest.raises(StoreError, match="still down"):
        submit(client_of(kind, store, retry_seconds=0.5))
    assert 1 < store.attempts < 10**6  # retried, then given up


@pytest.mark.parametrize("seconds", [-1.0, float("inf"), float("nan"), True, "30"])
def test_the_retry_bound_is_checked(tmp_path: Path, seconds: object) -> None:
    with pytest.raises(InvalidArgument) as raised:
        RolloutClient(open_store(f"file://{tmp_path}"), store_retry_seconds=seconds)  # type: ignore[arg-type]
    assert raised.value.field == "store_retry_seconds"
