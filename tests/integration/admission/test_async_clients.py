"""The SDK's asyncio clients (``knittrans.aio``) against a real admission service on port 0, and the one set of
retry rules they share with the sync clients (DESIGN.md §10, "Async")."""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from knittrans import aio
from knittrans.admission.service.app import start_admission_service
from knittrans.client.admission import AdmissionClient, AdmissionStatus
from knittrans.client.connection import ConnectionSettings
from knittrans.errors import Conflict, InvalidArgument, Unauthenticated
from knittrans.reorg import assignments
from knittrans.rollout import MultimodalInput, RolloutClient
from knittrans.store.factory import open_store
from knittrans.store.protocol import PutResult, UnitStore, UnitWrite
from knittrans.types import ConsumerId, TokenSpan, VersionSegment

from .builders import service_settings

FLAVOURS = ["sync", "async"]


def stored_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


class StatusCaller:
    """``status()`` of the sync client (in a thread, as sync code would call it) or of the async client."""

    def __init__(self, flavour: str, connection: ConnectionSettings) -> None:
        self.flavour = flavour
        if flavour == "sync":
            self.sync = AdmissionClient(connection)
        else:
            self.async_ = aio.AsyncAdmissionClient(connection)

    def status(self) -> Awaitable[AdmissionStatus]:
        return asyncio.to_thread(self.sync.status) if self.flavour == "sync" else self.async_.status()

    async def close(self) -> None:
        if self.flavour == "sync":
            self.sync.close()
        else:
            await self.async_.close()


class RetriesSeen(logging.Handler):
    """Sets an event each time the SDK logs a call it is about to retry (from whatever thread)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.loop = asyncio.get_running_loop()
        self.event = asyncio.Event()
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "retrying" in record.getMessage():
            self.count += 1
            self.loop.call_soon_threadsafe(self.event.set)


@pytest.fixture
async def retries_seen():
    logger = logging.getLogger("knittrans.client.transport")
    handler = RetriesSeen()
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


async def test_sync_and_async_clients_share_one_registration_type_and_one_retry_policy() -> None:
    sync = AdmissionClient("127.0.0.1:1")
    async_ = aio.AsyncAdmissionClient("127.0.0.1:1")
    source = assignments.AdmissionAssignmentSource(ConnectionSettings(target="127.0.0.1:1"),
                                                   ConsumerId(role="backbone", dp_rank=0, cp_rank=0))
    try:
        assert sync.retry_policy is async_.retry_policy is aio.UNARY_RETRY
        assert sync.retry_codes is async_.retry_codes is source._client.retry_codes is aio.RETRYABLE_CODES
        assert assignments.Registration is aio.Registration
        hints = [inspect.signature(c.register_consumer).return_annotation for c in (sync, async_)]
        assert hints == ["Registration", "Registration"]
        # The reorg sidecar's back-off has its own bounds, in the same policy type.
        assert isinstance(source._client.retry_policy, aio.RetryPolicy)
    finally:
        sync.close()
        await async_.close()
        await source.close()


@pytest.mark.parametrize("flavour", FLAVOURS)
async def test_a_call_is_retried_while_the_service_is_stopped_and_answers_once_it_is_back(
    flavour: str, retries_seen: RetriesSeen
) -> None:
    settings = service_settings()
    running = await start_admission_service(settings)
    port = int(running.address.rsplit(":", 1)[1])
    client = StatusCaller(flavour, ConnectionSettings(target=running.address))
    restarted = None
    try:
        assert (await client.status()).pool_size == 0
        assert retries_seen.count == 0
        await running.stop(0)
        pending = asyncio.ensure_future(client.status())
        await asyncio.wait_for(retries_seen.event.wait(), timeout=30)  # it failed UNAVAILABLE and will retry
        assert not pending.done()
        restarted = await start_admission_service(replace(settings, server=replace(settings.server, port=port)))
        status = await asyncio.wait_for(pending, timeout=60)
        assert status.pool_size == 0 and retries_seen.count >= 1
    finally:
        await client.close()
        if restarted is not None:
            await restarted.stop(0)


@pytest.mark.parametrize("flavour", FLAVOURS)
async def test_a_refusal_is_not_retried(flavour: str, retries_seen: RetriesSeen) -> None:
    running = await start_admission_service(service_settings(token="secret"))
    client = StatusCaller(flavour, ConnectionSettings(target=running.address, token="wrong"))
    try:
        with pytest.raises(Unauthenticated):
            await client.status()
        assert retries_seen.count == 0
    finally:
        await client.close()
        await running.stop(0)


class ThreadRecordingStore:
    """A real file store that records which threads its writes and deletes ran on."""

    def __init__(self, store: UnitStore) -> None:
        self.store = store
        self.threads: set[int] = set()

    def put_many(self, writes: Sequence[UnitWrite]) -> PutResult:
        self.threads.add(threading.get_ident())
        return self.store.put_many(writes)

    def delete_many(self, keys: Sequence[str]) -> int:
        self.threads.add(threading.get_ident())
        return self.store.delete_many(keys)

    def __getattr__(self, name: str) -> object:
        return getattr(self.store, name)


def trajectory(rng: np.random.Generator, name: str, *, source: str = "A", encoder: str = "vision", image: int = 0,
               sample: str = "s0") -> dict:
    length = int(rng.integers(20, 60))
    return dict(fields={"input_ids": rng.integers(1, 1000, length, dtype=np.int32),
                        "loss_mask": (np.arange(length) >= 4).astype(np.uint8)},
                trajectory_id=name, sample_id=sample, source=source, rollout_step=0,
                segments=(VersionSegment(version=0, num_tokens=length - 4),),
                multimodal=(MultimodalInput(data=np.full((8, 8, 3), image, np.uint8), encoder=encoder, cost=4.0,
                                            placeholder=TokenSpan(start=1, end=3)),))


async def with_rollout(tmp_path: Path, scenario: Callable[..., Awaitable[None]]) -> None:
    store_url = f"file://{tmp_path / 'units'}"
    running = await start_admission_service(service_settings(store=store_url, job=f"a{uuid.uuid4().hex[:6]}"))
    store = ThreadRecordingStore(open_store(store_url))
    try:
        async with aio.AsyncAdmissionClient(running.address) as client:
            rollout = aio.AsyncRolloutClient(store, namespace="job", reporter=client)
            await scenario(rollout, client, store)
    finally:
        store.close()
        await running.stop(0)


async def test_concurrent_async_submits_are_admitted_and_never_touch_the_store_on_the_loop(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)

    async def scenario(rollout: aio.AsyncRolloutClient, client: aio.AsyncAdmissionClient,
                       store: ThreadRecordingStore) -> None:
        inputs = [trajectory(rng, f"t{i}", source="AB"[i % 2], sample=f"s{i // 2}", image=i // 2)
                  for i in range(8)]
        metas = await asyncio.gather(*(rollout.submit(**kwargs) for kwargs in inputs))
        assert [m.trajectory_id for m in metas] == [f"t{i}" for i in range(8)]
        status = await client.status()
        assert status.admitted_total + status.pool_size == 8
        keys = sorted({u.key for m in metas for u in (*m.units, *m.multimodal)})
        assert store.exists(keys) == [True] * len(keys)
        assert store.threads and threading.get_ident() not in store.threads  # off the event loop's thread

    await with_rollout(tmp_path, scenario)


@pytest.mark.parametrize("flavour", FLAVOURS)
async def test_a_rejected_submit_raises_naming_the_field_and_leaves_nothing(tmp_path: Path, flavour: str) -> None:
    """The sync client reporting through the admission client itself (no batching reporter) cleans up the same
    way as the async client: one core (before it, the sync client left the rejected submit's units behind)."""
    rng = np.random.default_rng(4)

    async def scenario(rollout: aio.AsyncRolloutClient, client: aio.AsyncAdmissionClient,
                       store: ThreadRecordingStore) -> None:
        sync_client = AdmissionClient(client.connection)
        sync = RolloutClient(store, namespace="job", reporter=sync_client)

        async def submit(**kwargs: object) -> object:
            if flavour == "sync":
                return await asyncio.to_thread(lambda: sync.submit(**kwargs))
            return await rollout.submit(**kwargs)

        try:
            with pytest.raises(InvalidArgument) as rejected:
                await submit(**trajectory(rng, "t0", source="poetry"))
            assert rejected.value.field == "source" and "'t0'" in str(rejected.value)
            with pytest.raises(InvalidArgument) as no_encoder:
                await submit(**trajectory(rng, "t1", encoder="audio", sample="s1", image=1))
            assert "encoder" in (no_encoder.value.field or "") and "'t1'" in str(no_encoder.value)
            assert stored_files(tmp_path / "units") == []
            assert (await client.status()).pool_size == 0
        finally:
            sync_client.close()

    await with_rollout(tmp_path, scenario)


async def test_an_async_resubmit_with_other_content_raises_conflict(tmp_path: Path) -> None:
    async def scenario(rollout: aio.AsyncRolloutClient, client: aio.AsyncAdmissionClient,
                       store: ThreadRecordingStore) -> None:
        first = await rollout.submit(**trajectory(np.random.default_rng(5), "t0"))
        with pytest.raises(Conflict):
            await rollout.submit(**trajectory(np.random.default_rng(6), "t0"))
        assert store.exists([u.key for u in first.units]) == [True] * len(first.units)

    await with_rollout(tmp_path, scenario)


def test_the_async_submit_takes_exactly_the_sync_submits_arguments() -> None:
    sync = inspect.signature(RolloutClient.submit)
    async_ = inspect.signature(aio.AsyncRolloutClient.submit)
    assert list(async_.parameters.values()) == list(sync.parameters.values())
    assert async_.return_annotation == sync.return_annotation
    assert inspect.iscoroutinefunction(aio.AsyncRolloutClient.submit)
