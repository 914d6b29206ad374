"""A multimodal unit shared by a sample's trajectories outlives every trajectory that may still reference it,
including a sibling whose units are written but whose report has not arrived yet.

The race (issue 13 §1): a sibling's write finds the sample's image present and skips it; the release of an
earlier mini-batch drops the image's last *reported* reference and deletes it; then the sibling is reported
and admitted, and its sidecar finds nothing. The test holds the sibling's report until after that release,
through a real admission service, a real file store and the real rollout client, and then reads the image
back from the store: the oracle is the bytes the rollout wrote.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from knittrans.admission.service.app import start_admission_service
from knittrans.client.admission import AdmissionClient, ProgressStage
from knittrans.errors import InvalidArgument, StoreError
from knittrans.reservations import UnitReservation
from knittrans.rollout import MultimodalInput, RolloutClient
from knittrans.store.factory import open_store
from knittrans.store.protocol import UnitRead
from knittrans.types import TokenSpan, TrajectoryId, TrajectoryMeta, VersionSegment

from .builders import service_settings
from .test_admission_service import CONSUMERS


class HeldReports:
    """A reporter that reserves through the real client at once but holds reports until released: a rollout
    worker whose report is slow to arrive."""

    def __init__(self, client: AdmissionClient) -> None:
        self._client = client
        self.held: list[TrajectoryMeta] = []

    def __getattr__(self, name: str):  # reserve_units / cancel_reservations go straight to the service
        return getattr(self._client, name)

    def report(self, trajectories: Sequence[TrajectoryMeta]) -> None:
        self.held.extend(trajectories)

    def send(self) -> None:
        self._client.report(self.held)
        self.held.clear()


def image_of(sample: int) -> np.ndarray:
    return np.random.default_rng(1000 + sample).integers(0, 255, (16, 16, 3), dtype=np.uint8)


def submit(rollout: RolloutClient, index: int, sample: int, *, with_image: bool = True) -> TrajectoryMeta:
    tokens = 40 + index
    multimodal = (MultimodalInput(data=image_of(sample), encoder="vision", cost=4.0,
                                  placeholder=TokenSpan(start=2, end=6)),) if with_image else ()
    return rollout.submit(
        {"input_ids": np.arange(tokens, dtype=np.int32), "loss_mask": np.ones(tokens, np.uint8)},
        trajectory_id=f"t{index}", sample_id=f"s{sample}", source="AB"[index % 2], rollout_step=0,
        segments=(VersionSegment(version=0, num_tokens=tokens),), multimodal=multimodal,
    )


def wait_until(predicate, what: str) -> None:
    deadline = time.monotonic() + 30
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def release(client: AdmissionClient, sequence: int) -> None:
    for consumer in CONSUMERS:
        client.report_progress(consumer, sequence, ProgressStage.OPTIMIZER_STEP)


def deletions_done(running) -> bool:
    """The service has deleted (and journaled) every unit it released so far."""
    return not running.servicer._ledger.pending_deletes


@pytest.fixture(params=["file", "mooncake"])
async def stack(request, tmp_path: Path):
    if request.param == "mooncake":
        store_url = request.getfixturevalue("mooncake_cluster").store_url
    else:
        store_url = f"file://{tmp_path / 'units'}"
    running = await start_admission_service(service_settings(store=store_url, job=f"t{uuid.uuid4().hex[:6]}"))
    try:
        yield running, store_url
    finally:
        await running.stop(0)


async def test_a_sibling_reported_after_the_release_still_finds_its_image(stack) -> None:
    running, store_url = stack

    def scenario() -> None:
        store = open_store(store_url)
        with AdmissionClient(running.address) as client:
            direct = RolloutClient(store, namespace="job", reporter=client)
            held = HeldReports(client)
            slow = RolloutClient(store, namespace="job", reporter=held)
            first = [submit(direct, i, sample=i) for i in range(4)]  # t0 of sample s0 holds s0's image
            assert client.status().admitted_total == 4
            image_key = first[0].multimodal[0].key
            own_key = first[0].units[0].key
            sibling = submit(slow, 4, sample=0)  # t4 of s0: its write finds s0's image present and skips it
            assert sibling.multimodal[0].key == image_key and held.held
            release(client, 1)  # the release of mini-batch 1 drops t0, the image's only reported reference
            wait_until(lambda: deletions_done(running), "the released units to be deleted")
            assert not store.exists([own_key])[0]
            held.send()
            for i in range(5, 8):
                submit(direct, i, sample=i)
            assert client.status().admitted_total == 8  # t4 is in the second mini-batch
            buffer = bytearray(image_of(0).nbytes)
            try:
                store.get_many_into([UnitRead.of(image_key, memoryview(buffer))])
            except StoreError as exc:
                raise AssertionError(f"the image t4 references was deleted before t4 was admitted: {exc}") from exc
            assert bytes(buffer) == image_of(0).tobytes()
            release(client, 2)
            wait_until(lambda: deletions_done(running), "the units of mini-batch 2 to be deleted")
            assert not store.exists([image_key])[0]
        store.close()

    await asyncio.to_thread(scenario)


async def test_a_failed_submit_cancels_its_reservation_and_leaves_no_image(stack) -> None:
    running, store_url = stack

    class FailingStore:
        """The real store, whose writes fail right after the images are stored: a submit that dies part-way."""

        def __init__(self, inner) -> None:
            self._inner = inner
            self.images: list[str] = []

        def __getattr__(self, name: str):
            return getattr(self._inner, name)

        def put_many(self, writes):
            images = [w for w in writes if w.content_addressed]
            self._inner.put_many(images)
            self.images.extend(w.key for w in images)
            raise StoreError("the store went away")

    def scenario() -> None:
        store = open_store(store_url)
        failing = FailingStore(store)
        with AdmissionClient(running.address) as client:
            rollout = RolloutClient(failing, namespace="job", reporter=client)
            with pytest.raises(StoreError):
                submit(rollout, 0, sample=0)
            assert failing.images
            wait_until(lambda: deletions_done(running), "the unreferenced image of the failed submit to be deleted")
            assert not any(store.exists(failing.images))
            assert client.cancel_reservations([TrajectoryId("t0")]) == 0  # the submit cancelled it already
        store.close()

    await asyncio.to_thread(scenario)


async def test_reservations_are_validated_naming_the_field(stack) -> None:
    running, _ = stack

    def scenario() -> None:
        with AdmissionClient(running.address) as client:
            ok = UnitReservation(trajectory_id="t1", sample_id="s1", multimodal_keys=("s1/img",))
            assert client.reserve_units([ok]).reserved == 1
            assert client.reserve_units([ok]).reserved == 0  # idempotent
            other_sample = UnitReservation(trajectory_id="t2", sample_id="s2", multimodal_keys=("s1/img",))
            with pytest.raises(InvalidArgument) as caught:
                client.reserve_units([ok, other_sample])
            assert caught.value.field == "reservations[1].multimodal_keys"
            changed = UnitReservation(trajectory_id="t1", sample_id="s1", multimodal_keys=("s1/other",))
            with pytest.raises(InvalidArgument) as caught:
                client.reserve_units([changed])
            assert caught.value.field == "reservations[0].multimodal_keys"
            assert client.cancel_reservations([TrajectoryId("t1"), TrajectoryId("unknown")]) == 1

    await asyncio.to_thread(scenario)


async def test_a_reservation_during_the_units_deletion_waits_and_the_write_stores_it_again(stack) -> None:
    """The deletion of the released image is held at the store (as if the store were slow) while the sibling
    submits: its reservation must wait for that deletion to end, so that its write stores the image again."""
    running, store_url = stack
    started, proceed = threading.Event(), threading.Event()
    delete = running.servicer._deleter._delete_keys

    def held_delete(keys: list[str]) -> None:
        started.set()
        proceed.wait(30)
        delete(keys)

    running.servicer._deleter._delete_keys = held_delete

    def scenario() -> None:
        store = open_store(store_url)
        with AdmissionClient(running.address) as client:
            rollout = RolloutClient(store, namespace="job", reporter=client)
            metas = [submit(rollout, i, sample=i) for i in range(4)]
            image_key = metas[0].multimodal[0].key
            release(client, 1)
            assert started.wait(30)
            sibling = threading.Thread(target=submit, args=(rollout, 4, 0))
            sibling.start()
            sibling.join(0.5)
            assert sibling.is_alive(), "the reservation returned while the image was being deleted"
            proceed.set()
            sibling.join(30)
            for i in range(5, 8):
                submit(rollout, i, sample=i)
            assert client.status().admitted_total == 8
            buffer = bytearray(image_of(0).nbytes)
            store.get_many_into([UnitRead.of(image_key, memoryview(buffer))])
            assert bytes(buffer) == image_of(0).tobytes()
        store.close()

    await asyncio.to_thread(scenario)
