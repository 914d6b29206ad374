"""``async for`` through :class:`knittrans.aio.AsyncTrainerClient` receives, through a real sidecar, what the sync
:class:`~knittrans.trainer.TrainerClient` receives for the same job: the two TP ranks of one consumer share a
sidecar and are sent the same micro-batches, one rank iterating synchronously and the other with ``async for``.

The oracle is independent of both clients: CRCs of the arrays the rollout submitted (through the
:class:`~knittrans.aio.AsyncRolloutClient`), at the positions each rank holds.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
import zlib
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest

from knittrans.aio import AsyncAdmissionClient, AsyncRolloutClient
from knittrans.client.admission import AdmissionClient
from knittrans.store.factory import open_store
from knittrans.types import VersionSegment

from .processes import start_admission, start_sidecar, start_trainer

TRAIN_BATCH, MINIBATCHES = 8, 2


def crc(array: np.ndarray) -> int:
    return zlib.crc32(np.ascontiguousarray(array).tobytes())


async def submit_all(store_url: str, admission: str, job: str) -> dict[str, dict[str, np.ndarray]]:
    rng = np.random.default_rng(11)
    arrays = {}
    for i in range(TRAIN_BATCH):
        length = int(rng.integers(20, 300))
        arrays[f"t{i}"] = {"input_ids": rng.integers(1, 150_000, length, dtype=np.int32),
                           "routing": rng.integers(0, 256, (length, 4), dtype=np.uint8),
                           "loss_mask": (rng.random(length) < 0.6).astype(np.uint8)}
    store = open_store(store_url)
    try:
        async with AsyncAdmissionClient(admission) as client:
            rollout = AsyncRolloutClient(store, namespace=job, reporter=client)
            await asyncio.gather(*(
                rollout.submit(fields, trajectory_id=name, sample_id=f"s{name}", source="A", rollout_step=0,
                               segments=(VersionSegment(version=0, num_tokens=len(fields["input_ids"])),))
                for name, fields in arrays.items()))
    finally:
        store.close()
    return arrays


def check_against_submitted(result: dict, arrays: dict[str, dict[str, np.ndarray]]) -> None:
    assert "error" not in result, result["error"]
    seen = []
    for mini in result["minibatches"]:
        for micro in mini["microbatches"]:
            for item in micro["items"]:
                fields = arrays[item["trajectory_id"]]
                length = len(fields["input_ids"])
                assert item["positions"] == list(range(length))  # cp=1: the whole trajectory
                assert item["input_ids"] == crc(fields["input_ids"])
                assert item["routing"] == crc(fields["routing"])
                # Submitted token-aligned (the default): delivered label-aligned, the next token's value.
                assert item["loss_mask"] == crc(np.append(fields["loss_mask"][1:], np.uint8(0)))
                assert item["labels"] == crc(np.append(fields["input_ids"][1:].astype(np.int64), np.int64(-100)))
                assert item["padding_is_clean"]
                seen.append(item["trajectory_id"])
    assert sorted(seen) == sorted(arrays)  # every trajectory exactly once


def test_async_for_receives_what_the_sync_client_receives(tmp_path: Path) -> None:
    job = f"aio{uuid.uuid4().hex[:8]}"
    store_url = f"file://{tmp_path / 'units'}"
    topology = {"backbone": {"dp": 1, "cp": 1, "tp": 2, "max_tokens_per_microbatch": 512}}
    admission = start_admission(tmp_path, job=job, store=store_url, topology=topology,
                                train_batch_size=TRAIN_BATCH, num_minibatches=MINIBATCHES)
    address = admission.ready["address"]
    sidecar, trainers = None, []
    try:
        sidecar = start_sidecar(tmp_path, job=job, store=store_url, admission=address, dp_rank=0, cp_rank=0)
        socket = sidecar.ready["address"]
        # The async rank is TP rank 0 and global rank 0: its reports are the ones that release and advance.
        async_rank, async_output = start_trainer(tmp_path, socket=socket, tp_rank=0, global_rank=0,
                                                 admission=address, minibatches=MINIBATCHES, use_asyncio=True)
        sync_rank, sync_output = start_trainer(tmp_path, socket=socket, tp_rank=1, global_rank=1,
                                               admission=address, minibatches=MINIBATCHES)
        trainers = [sync_rank, async_rank]
        arrays = asyncio.run(submit_all(store_url, address, job))
        for process in trainers:
            try:
                process.popen.wait(timeout=90)
            except Exception:
                pytest.fail(f"{process.name} did not finish:\n{process.tail()}")
            assert process.popen.returncode == 0, process.tail()
        sync_result = json.loads(sync_output.read_text())
        async_result = json.loads(async_output.read_text())
        check_against_submitted(sync_result, arrays)
        check_against_submitted(async_result, arrays)
        assert async_result["minibatches"] == sync_result["minibatches"]  # the same mini-batches, in order
        assert [m["minibatch_index"] for m in async_result["minibatches"]] == list(range(MINIBATCHES))
        with AdmissionClient(address, deadline=timedelta(seconds=5)) as client:
            deadline = time.monotonic() + 30
            while client.status().released_minibatches < MINIBATCHES:  # the async rank reported its steps
                assert time.monotonic() < deadline, "the optimizer steps did not release the mini-batches"
                time.sleep(0.05)
            assert client.status().policy_version == 1  # and advanced the version after the train batch
    finally:
        for process in trainers:
            process.stop(timeout=5)
        if sidecar is not None:
            sidecar.stop()
        admission.stop()
