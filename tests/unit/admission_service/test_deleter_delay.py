"""The unit deleter deletes a batch ``delay_seconds`` after its first key was released (not at the moment the
trainers take the next mini-batch), in batches of at most ``batch_size``, each key once; a key revived during the
delay (reserved or reported again) is not deleted.

The store is a stand-in that records when each call started, on the thread that ran it; the oracle is those times
and the keys it was handed, not the deleter's own bookkeeping."""

from __future__ import annotations

import asyncio
import time

import pytest

from knittrans.admission.service.deleter import UnitDeleter


class RecordingStore:
    def __init__(self) -> None:
        self.calls: list[tuple[float, list[str]]] = []

    def delete(self, keys: list[str]) -> None:
        self.calls.append((time.monotonic(), list(keys)))


class Deleter:
    def __init__(self, keys: list[str], *, batch_size: int, delay_seconds: float) -> None:
        self.store = RecordingStore()
        self.pending = set(keys)
        self.journaled: list[list[str]] = []
        self.deleter = UnitDeleter(delete_keys=self.store.delete, batch_size=batch_size,
                                   delay_seconds=delay_seconds, pending=lambda: self.pending, lock=asyncio.Lock(),
                                   commit=self.commit, clock=time.time, on_deleted=lambda n: None)

    async def commit(self, record) -> None:
        self.journaled.append(list(record.deleted.keys))
        self.pending.difference_update(record.deleted.keys)


@pytest.mark.parametrize(("count", "batch_size", "delay_seconds"), [(100, 32, 0.0), (7, 32, 0.2), (64, 16, 0.05)])
async def test_every_released_key_is_deleted_once_and_not_before_the_delay(count: int, batch_size: int,
                                                                          delay_seconds: float) -> None:
    keys = [f"unit-{i:03d}" for i in reversed(range(count))]  # released in no particular order
    deleter = Deleter(keys, batch_size=batch_size, delay_seconds=delay_seconds)
    task = asyncio.create_task(deleter.deleter.run())
    try:
        released = time.monotonic()
        deleter.deleter.enqueue(keys)
        await asyncio.wait_for(deleter.deleter.wait_gone(keys), timeout=30)
    finally:
        task.cancel()
    batches = [batch for _, batch in deleter.store.calls]
    assert all(0 < len(batch) <= batch_size for batch in batches)
    assert sorted(key for batch in batches for key in batch) == sorted(keys)
    assert deleter.journaled == batches  # each batch journaled as deleted once it is gone
    assert deleter.store.calls[0][0] - released >= delay_seconds


async def test_a_key_revived_during_the_delay_is_not_deleted() -> None:
    keys = ["a", "b", "c"]
    deleter = Deleter(keys, batch_size=8, delay_seconds=0.3)
    task = asyncio.create_task(deleter.deleter.run())
    try:
        deleter.deleter.enqueue(keys)
        await asyncio.sleep(0.05)
        assert deleter.store.calls == []  # still waiting
        deleter.pending.discard("b")  # reserved again: it is not released any more
        await asyncio.wait_for(deleter.deleter.wait_gone(["a", "c"]), timeout=30)
    finally:
        task.cancel()
    assert [batch for _, batch in deleter.store.calls] == [["a", "c"]]
