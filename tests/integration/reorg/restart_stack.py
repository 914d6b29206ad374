"""A stack for the trainer restart and checkpoint restore tests: ``knittrans admission serve`` on port 0, one
``knittrans reorg serve`` sidecar (dp = cp = 1) on a file store, and trajectories written and reported through the
real clients, with what was written kept as CRCs (the tests' oracle)."""

from __future__ import annotations

import json
import time
import uuid
import zlib
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import grpc
import numpy as np

from knittrans.client.admission import AdmissionClient
from knittrans.rollout import RolloutClient
from knittrans.store.factory import open_store
from knittrans.types import VersionSegment
from knittrans.v1 import reorg_service_pb2, reorg_service_pb2_grpc

from .processes import Process, start_admission, start_sidecar

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


def start_stack(directory: Path, tp: int, *, num_minibatches: int = 1, train_batch_size: int = 4,
                minibatches: int = 2, admission_config: dict | None = None) -> Stack:
    job = f"tr{uuid.uuid4().hex[:8]}"
    store_url = f"file://{directory / 'units'}"
    topology = {"backbone": {"dp": 1, "cp": 1, "tp": tp, "max_tokens_per_microbatch": 64}}
    admission = start_admission(directory, job=job, store=store_url, topology=topology,
                                train_batch_size=train_batch_size, num_minibatches=num_minibatches,
                                settings=admission_config)
    try:
        sidecar = start_sidecar(directory, job=job, store=store_url, admission=admission.ready["address"],
                                dp_rank=0, cp_rank=0, slots=SLOTS)
    except BaseException:
        admission.stop()
        raise
    written = write(store_url, admission.ready["address"], job,
                    train_batch_size // num_minibatches * minibatches)
    return Stack(directory=directory, admission=admission, sidecar=sidecar, written=written)


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
    code = process.popen.wait(timeout=120)
    assert code == 0, f"{process.name} exited with {code}: {recorded_error(output)}\n{process.tail()}"
    return json.loads(output.read_text())


def recorded_error(output: Path) -> str:
    """The error the worker wrote to its output file: put first in a failure's message, since a CI excerpt may
    cut a long log short."""
    try:
        return str(json.loads(output.read_text()).get("error", "none recorded"))
    except (OSError, ValueError) as error:
        return f"no readable output ({type(error).__name__})"


def check_whole_steps(stack: Stack, result: dict, trajectories: int = TRAJECTORIES,
                      min_microbatches: int = 3) -> None:
    """Every step a rank made holds its whole mini-batch: micro-batches 0..n-1 in order, together exactly the
    admitted trajectories, each with the bytes the rollout wrote."""
    for step in result["minibatches"]:
        micros = step["microbatches"]
        assert [m["index"] for m in micros] == list(range(step["num_microbatches"])), step["sequence"]
        assert step["num_microbatches"] >= min_microbatches
        ids = [t for m in micros for t in m["trajectory_ids"]]
        assert sorted(ids) == sorted(step["admitted"]) and len(ids) == trajectories, step["sequence"]
        for micro in micros:
            for item in micro["items"]:
                assert item["input_ids"] == stack.written[item["trajectory_id"]]["input_ids"]
                assert item["routing"] == stack.written[item["trajectory_id"]]["routing"]
        assert step["step"][:2] == [step["train_batch_index"], step["minibatch_index"]]
