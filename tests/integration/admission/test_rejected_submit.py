"""A submit the admission service rejects fails with a clear error, at that submit or the next, and leaves no units
behind in the store; valid trajectories reported alongside it still get in, and units they share stay."""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from knittrans.admission.service.app import start_admission_service
from knittrans.client.admission import AdmissionClient
from knittrans.client.reporter import BatchingReporter
from knittrans.errors import InvalidArgument
from knittrans.rollout import MultimodalInput, RolloutClient
from knittrans.store.factory import open_store
from knittrans.types import TokenSpan, TrajectoryMeta, VersionSegment

from .builders import SOURCES, service_settings


def stored_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def submit(rollout: RolloutClient, name: str, *, sample: str, source: str = "A", encoder: str = "vision",
           version: int = 0, image: int = 0, finished_at: float | None = None):
    tokens = 40
    return rollout.submit(
        {"input_ids": np.arange(tokens, dtype=np.int32), "loss_mask": (np.arange(tokens) >= 8).astype(np.uint8),
         "logprobs": np.zeros(tokens, np.float32)},
        trajectory_id=name, sample_id=sample, source=source, rollout_step=0, finished_at=finished_at,
        segments=(VersionSegment(version=version, num_tokens=32),),
        multimodal=(MultimodalInput(data=np.full((8, 8, 3), image, np.uint8), encoder=encoder, cost=4.0,
                                    placeholder=TokenSpan(start=2, end=6)),),
    )


def metadata_of(tmp_path: Path, name: str, **inputs) -> TrajectoryMeta:
    """The metadata a submit of these inputs reports (unit keys depend only on them), from a scratch store."""
    scratch = open_store(f"file://{tmp_path / 'scratch'}")
    try:
        return submit(RolloutClient(scratch, namespace="job"), name, **inputs)
    finally:
        scratch.close()


async def with_service(tmp_path: Path, scenario) -> None:
    store_url = f"file://{tmp_path / 'units'}"
    running = await start_admission_service(service_settings(store=store_url, job=f"t{uuid.uuid4().hex[:6]}"))
    try:
        await asyncio.to_thread(scenario, running.address, store_url)
    finally:
        await running.stop(0)


async def test_a_first_submit_from_an_unknown_source_fails_there_and_leaves_nothing(tmp_path: Path) -> None:
    def scenario(address: str, store_url: str) -> None:
        store = open_store(store_url)
        with AdmissionClient(address) as client:
            reporter = BatchingReporter(client)
            rollout = RolloutClient(store, namespace="job", reporter=reporter)
            with pytest.raises(InvalidArgument) as failure:
                submit(rollout, "t0", sample="s0", source="math")
            assert failure.value.field == "source"
            message = str(failure.value)
            assert "'math'" in message and "t0" in message
            assert all(repr(source) in message for source in SOURCES)  # what the job does accept
            assert stored_files(tmp_path / "units") == []
            assert client.status().pool_size == 0
            reporter.close()  # nothing else is pending
        store.close()

    await with_service(tmp_path, scenario)


async def test_a_later_rejection_fails_the_next_call_and_removes_only_the_rejected_units(tmp_path: Path) -> None:
    def scenario(address: str, store_url: str) -> None:
        store = open_store(store_url)
        with AdmissionClient(address) as client:
            reporter = BatchingReporter(client)
            rollout = RolloutClient(store, namespace="job", reporter=reporter)
            good = [submit(rollout, f"good-{i}", sample="s0", image=0) for i in range(3)]
            reporter.flush()
            # Rejected by the service only: a version from the future, and an encoder the topology lacks. The
            # first shares its sample's image with the good ones; the second has an image of its own.
            future = submit(rollout, "future", sample="s0", version=5, image=0)
            no_encoder = submit(rollout, "no-such-encoder", sample="s1", encoder="audio", image=1)
            # The rejection surfaces at the next call: this submit when the background flush already got the
            # answer, otherwise the flush. Either way good-3 is written and reported.
            rejected = r"rejected trajectory '(future|no-such-encoder)'"
            with pytest.raises(InvalidArgument, match=rejected):
                submit(rollout, "good-3", sample="s2", image=2)
                reporter.flush()
            try:  # the other rejection, when its answer came after the first was raised, surfaces here
                reporter.close()
            except InvalidArgument as second:
                assert re.search(rejected, str(second)), second
                reporter.close()
            good.append(metadata_of(tmp_path, "good-3", sample="s2", image=2))
            status = client.status()
            assert status.pool_size + status.admitted_total == len(good)
            good_keys = sorted({u.key for m in good for u in (*m.units, *m.multimodal)})
            assert store.exists(good_keys) == [True] * len(good_keys)  # the shared image of s0 included
            rejected_keys = [u.key for u in (*future.units, *no_encoder.units, *no_encoder.multimodal)]
            assert store.exists(rejected_keys) == [False] * len(rejected_keys)
            assert len(stored_files(tmp_path / "units")) == len(good_keys)
        store.close()

    await with_service(tmp_path, scenario)


async def test_an_earlier_rejection_raised_at_a_submit_leaves_that_submit_reported_and_whole(tmp_path: Path) -> None:
    """The ordering the test above leaves to chance, made certain: the service's answer to the rejected report has
    come back (its units are gone) before the next submit, which then raises that earlier rejection. The next
    submit's trajectory was queued and gets reported and acknowledged, so none of its units may go (they used to:
    the submit took the earlier rejection for its own and removed them, and cancelled the reservation of its
    image, which the service then deleted)."""

    def scenario(address: str, store_url: str) -> None:
        store = open_store(store_url)
        with AdmissionClient(address) as client:
            reporter = BatchingReporter(client)
            rollout = RolloutClient(store, namespace="job", reporter=reporter)
            good = [submit(rollout, "good-0", sample="s0", image=0)]
            reporter.flush()
            future = submit(rollout, "future", sample="s1", version=5, image=1)
            future_keys = [u.key for u in (*future.units, *future.multimodal)]
            deadline = time.monotonic() + 30
            while any(store.exists(future_keys)):  # rejected and discarded by the reporter's thread
                assert time.monotonic() < deadline, "the rejected trajectory's units were not removed"
                time.sleep(0.01)
            with pytest.raises(InvalidArgument, match="rejected trajectory 'future'"):
                submit(rollout, "good-1", sample="s2", image=2)
            reporter.close()
            good.append(metadata_of(tmp_path, "good-1", sample="s2", image=2))
            assert client.status().pool_size + client.status().admitted_total == len(good)
            good_keys = sorted({u.key for m in good for u in (*m.units, *m.multimodal)})
            assert store.exists(good_keys) == [True] * len(good_keys)
            time.sleep(0.3)  # a delete the service decided would land in this time
            assert store.exists(good_keys) == [True] * len(good_keys)
        store.close()

    await with_service(tmp_path, scenario)


async def test_a_resubmit_of_an_acknowledged_trajectory_never_touches_its_units(tmp_path: Path) -> None:
    """A restarted rollout worker submits ids the service acknowledged before. Rejected as invalid, the resubmit
    must not remove the acknowledged trajectory's units (they share its keys). With other content, after the store
    lost the original units (a Mooncake store restarted empty), the service answers CONFLICT, and the submit must
    not have stored its bytes under the acknowledged keys, where a sidecar would read them as that trajectory's.
    The same content again is a duplicate: accepted, nothing written."""
    from knittrans.errors import Conflict

    def scenario(address: str, store_url: str) -> None:
        store = open_store(store_url)
        with AdmissionClient(address) as client:
            rollout = RolloutClient(store, namespace="job", reporter=client)
            acknowledged = submit(rollout, "t0", sample="s0", finished_at=100.0)
            own_keys = [unit.key for unit in acknowledged.units]
            with pytest.raises(InvalidArgument):
                submit(rollout, "t0", sample="s0", version=1)  # from the future: refused
            assert store.exists(own_keys) == [True] * len(own_keys)
            store.delete_many(own_keys)  # lost with the store
            with pytest.raises(Conflict):
                submit(rollout, "t0", sample="s0", image=7)
            assert store.exists(own_keys) == [False] * len(own_keys)
            assert client.status().pool_size == 1
            assert submit(rollout, "t0", sample="s0", finished_at=100.0) == acknowledged
            assert store.exists(own_keys) == [False] * len(own_keys)
        store.close()

    await with_service(tmp_path, scenario)
