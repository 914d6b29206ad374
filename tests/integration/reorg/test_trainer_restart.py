"""A trainer rank killed with SIGKILL in the middle of a mini-batch and restarted gets that mini-batch again from
its first micro-batch, never the rest of it alone, and no optimizer step uses a partial mini-batch (DESIGN.md
§9, docs/failures.md). Real processes: ``knittrans admission serve`` on port 0, one ``knittrans reorg serve``
sidecar on a file store and trainer ranks running ``trainer_worker.py`` (a real :class:`TrainerClient`).

The oracle is outside the code under test: what the rollout wrote (trajectory ids and field CRCs) against what
each rank's steps held, micro-batch by micro-batch, and the mini-batch's admitted trajectories.
"""

from __future__ import annotations

import json
import time
import uuid
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import grpc
import numpy as np
import pytest

from knittrans.client.admission import AdmissionClient
from knittrans.rollout import RolloutClient
from knittrans.store.factory import open_store
from knittrans.types import VersionSegment
from knittrans.v1 import reorg_service_pb2, reorg_service_pb2_grpc

from .processes import Process, start_admission, start_sidecar, start_trainer

TRAJECTORIES = 4  # one mini-batch per train batch; ~40 tokens each and 64 per micro-batch: 4 micro-batches
MINIBATCHES = 2
SLOTS = 3


@dataclass
class Stack:
    directory: Path
    admission: Process
    sidecar: Process
    written: dict[str, dict]  # trajectory id -> field CRCs as written

    @property
    def address(self) -> str:
        return self.admission.ready["address"]

    @property
    def socket(self) -> str:
        return self.sidecar.ready["address"]

    def status(self) -> reorg_service_pb2.GetReorgStatusResponse:
        with grpc.insecure_channel(self.socket) as channel:
            return reorg_service_pb2_grpc.ReorgServiceStub(channel).GetReorgStatus(
                reorg_service_pb2.GetReorgStatusRequest(), timeout=5)


def crc(array: np.ndarray) -> int:
    return zlib.crc32(np.ascontiguousarray(array).tobytes())


def write(store_url: str, admission: str, job: str, count: int) -> dict[str, dict]:
    rng = np.random.default_rng(11)
    written = {}
    store = open_store(store_url, job=job)
    try:
        rollout = RolloutClient(store, namespace=job)
        metas = []
        for i in range(count):
            length = int(rng.integers(36, 48))
            fields = {"input_ids": rng.integers(1, 50_000, length, dtype=np.int32),
                      "routing": rng.integers(0, 256, (length, 4), dtype=np.uint8),
                      "loss_mask": (rng.random(length) < 0.7).astype(np.uint8)}
            metas.append(rollout.submit(fields, trajectory_id=f"t{i}", sample_id=f"s{i}", source="A",
                                        rollout_step=0, segments=(VersionSegment(version=0, num_tokens=length),)))
            written[f"t{i}"] = {"input_ids": crc(fields["input_ids"]), "routing": crc(fields["routing"])}
        with AdmissionClient(admission, deadline=timedelta(seconds=10)) as client:
            client.report(metas)
    finally:
        store.close()
    return written


def start_stack(directory: Path, tp: int) -> Stack:
    job = f"tr{uuid.uuid4().hex[:8]}"
    store_url = f"file://{directory / 'units'}"
    topology = {"backbone": {"dp": 1, "cp": 1, "tp": tp, "max_tokens_per_microbatch": 64}}
    admission = start_admission(directory, job=job, store=store_url, topology=topology,
                                train_batch_size=TRAJECTORIES, num_minibatches=1)
    try:
        sidecar = start_sidecar(directory, job=job, store=store_url, admission=admission.ready["address"],
                                dp_rank=0, cp_rank=0, slots=SLOTS)
    except BaseException:
        admission.stop()
        raise
    written = write(store_url, admission.ready["address"], job, TRAJECTORIES * MINIBATCHES)
    return Stack(directory=directory, admission=admission, sidecar=sidecar, written=written)


@pytest.fixture
def stack_tp1(tmp_path) -> Iterator[Stack]:
    stack = start_stack(tmp_path, tp=1)
    yield stack
    stack.sidecar.stop()
    stack.admission.stop()


@pytest.fixture
def stack_tp2(tmp_path) -> Iterator[Stack]:
    stack = start_stack(tmp_path, tp=2)
    yield stack
    stack.sidecar.stop()
    stack.admission.stop()


def wait_for(what: str, condition, processes: list[Process], timeout: float = 60.0):
    deadline = time.monotonic() + timeout  # a hang guard only
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        for process in processes:
            assert process.alive() or process.popen.returncode == 0, f"{process.name}: {process.tail()}"
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}: " + "\n".join(p.tail() for p in processes))


def lines(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def finish(process: Process, output: Path) -> dict:
    assert process.popen.wait(timeout=120) == 0, process.tail()
    return json.loads(output.read_text())


def check_whole_steps(stack: Stack, result: dict) -> None:
    """Every step a rank made holds its whole mini-batch: micro-batches 0..n-1 in order, together exactly the
    admitted trajectories, each with the bytes the rollout wrote."""
    for step in result["minibatches"]:
        micros = step["microbatches"]
        assert [m["index"] for m in micros] == list(range(step["num_microbatches"])), step["sequence"]
        assert step["num_microbatches"] >= 3
        ids = [t for m in micros for t in m["trajectory_ids"]]
        assert sorted(ids) == sorted(step["admitted"]) and len(ids) == TRAJECTORIES, step["sequence"]
        for micro in micros:
            for item in micro["items"]:
                assert item["input_ids"] == stack.written[item["trajectory_id"]]["input_ids"]
                assert item["routing"] == stack.written[item["trajectory_id"]]["routing"]
        assert step["step"][:2] == [step["train_batch_index"], step["minibatch_index"]]


def test_a_rank_killed_mid_minibatch_gets_it_again_from_its_first_microbatch(stack_tp1: Stack) -> None:
    stack = stack_tp1
    progress = stack.directory / "rank0.progress"
    first, _ = start_trainer(stack.directory, socket=stack.socket, tp_rank=0, global_rank=0, admission=stack.address,
                             minibatches=MINIBATCHES, name="rank0-run1",
                             extra=("--progress", str(progress), "--hold-at", "1"))
    wait_for("rank 0 to hold micro-batch 1", lambda: any(x["event"] == "holding" for x in lines(progress)), [first])
    # Micro-batch 0 was released: its slot went to the next micro-batch (the ring had filled its 3 slots).
    wait_for("micro-batch 0's release", lambda: stack.status().published > SLOTS, [first])
    held = next(x for x in lines(progress) if x["event"] == "holding")
    first.kill()

    second, output = start_trainer(stack.directory, socket=stack.socket, tp_rank=0, global_rank=0,
                                   admission=stack.address, minibatches=MINIBATCHES, name="rank0-run2")
    result = finish(second, output)
    assert "error" not in result, result
    steps = result["minibatches"]
    assert [s["sequence"] for s in steps] == [held["sequence"], held["sequence"] + 1]
    check_whole_steps(stack, result)
    assert stack.sidecar.alive(), stack.sidecar.tail()


def test_the_live_tp_rank_restarts_the_minibatch_with_the_killed_one(stack_tp2: Stack) -> None:
    stack = stack_tp2
    live_progress, doomed_progress = stack.directory / "tp0.progress", stack.directory / "tp1.progress"
    live, live_output = start_trainer(
        stack.directory, socket=stack.socket, tp_rank=0, global_rank=0, admission=stack.address,
        minibatches=MINIBATCHES, name="tp0", extra=("--progress", str(live_progress), "--hold-at", "1",
                                                    "--hold-until-restart"))
    doomed, _ = start_trainer(stack.directory, socket=stack.socket, tp_rank=1, global_rank=1,
                              admission=stack.address, minibatches=MINIBATCHES, name="tp1-run1",
                              extra=("--progress", str(doomed_progress), "--hold-at", "1"))
    for progress, process in ((live_progress, live), (doomed_progress, doomed)):
        wait_for(f"{process.name} to hold micro-batch 1",
                 lambda p=progress: any(x["event"] == "holding" for x in lines(p)), [live, doomed])
    wait_for("micro-batch 0's release by both ranks", lambda: stack.status().published > SLOTS, [live, doomed])
    doomed.kill()

    restarted, restarted_output = start_trainer(stack.directory, socket=stack.socket, tp_rank=1, global_rank=1,
                                                admission=stack.address, minibatches=MINIBATCHES, name="tp1-run2")
    live_result, restarted_result = finish(live, live_output), finish(restarted, restarted_output)
    for result in (live_result, restarted_result):
        assert "error" not in result, result
        assert [s["sequence"] for s in result["minibatches"]] == [1, 2]
        check_whole_steps(stack, result)
    # The live rank learnt that the mini-batch it was in restarted, and dropped its part of it.
    assert live_result["restarted"] == [{"sequence": 1, "yielded": 2}]
    assert stack.status().delivery_round == 1
