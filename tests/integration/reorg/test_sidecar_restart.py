"""A sidecar killed with kill -9 while its trainer rank is in the middle of a mini-batch (issue 15 §4, DESIGN.md §9
"Services restart cleanly"), through real processes: ``knittrans admission serve`` on port 0, a ``knittrans reorg
serve`` sidecar on a file store, and a trainer rank process (``stopping_trainer.py``) that stops itself with
SIGSTOP right after its training loop got a given micro-batch.

While the rank is stopped there, the sidecar is killed with SIGKILL and a new one started for the same consumer;
then the rank continues. From outside, in what the rank wrote: every optimizer step it made used its whole
mini-batch (micro-batches 0..n-1, each once, the last published by the successor), with every byte as the
rollout wrote it; the mini-batches it got are the admitted ones, each once, in order, none lost and none twice;
or, if it could not, it stopped with a typed error within its deadline, never a partial step.
"""

from __future__ import annotations

import json
import shutil
import signal
import sys
import time
import uuid
import zlib
from pathlib import Path

import numpy as np
import pytest

from knittrans.client.admission import AdmissionClient
from knittrans.job import job_run_directory
from knittrans.reorg.settings import ReorgSettings
from knittrans.rollout import RolloutClient
from knittrans.shm import owner_lease_path, remove_segments
from knittrans.store.factory import open_store
from knittrans.types import VersionSegment

from .processes import Process, spawn, start_admission, start_sidecar

# One trajectory (40..55 tokens) per micro-batch: three micro-batches a mini-batch.
TOPOLOGY = {"backbone": {"dp": 1, "cp": 1, "tp": 1, "max_tokens_per_microbatch": 64}}
PER_MINIBATCH = 3
MINIBATCHES = 4
DEADLINE = 20.0  # the rank's sidecar_timeout_seconds
# Without a successor the rank waits out its whole deadline; nothing there needs the longer one.
NO_SUCCESSOR_DEADLINE = 6.0
WORKER = str(Path(__file__).with_name("stopping_trainer.py"))


def crc(array: np.ndarray) -> int:
    return zlib.crc32(np.ascontiguousarray(array).tobytes())


def stopped(process: Process) -> bool:
    state = Path(f"/proc/{process.popen.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return state == "T"


def wait_for(condition, what: str, process: Process, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert process.alive(), f"{process.name} exited while waiting for {what}:\n{process.tail()}"
        assert time.monotonic() < deadline, f"no {what} after {timeout}s:\n{process.tail()}"
        time.sleep(0.05)


def write_trajectories(store_url: str, job: str, address: str) -> dict[str, np.ndarray]:
    store = open_store(store_url, job=job)
    written = {}
    try:
        rollout = RolloutClient(store, namespace=job)
        metas = []
        for index in range(PER_MINIBATCH * MINIBATCHES):
            rng = np.random.default_rng(index)
            length = 40 + (index * 7) % 16
            fields = {"input_ids": rng.integers(1, 50_000, length, dtype=np.int32),
                      "loss_mask": np.ones(length, dtype=np.uint8),
                      "routing": rng.integers(0, 256, (length, 4), dtype=np.uint8)}
            metas.append(rollout.submit(fields, trajectory_id=f"t{index}", sample_id=f"s{index}", source="A",
                                        rollout_step=0, segments=(VersionSegment(version=0, num_tokens=length),)))
            written[f"t{index}"] = fields
        with AdmissionClient(address) as client:
            client.report(metas)
    finally:
        store.close()
    return written


@pytest.mark.parametrize(("stop_at", "restart"), [((1, 1), True), ((2, PER_MINIBATCH - 1), True), ((1, 1), False)],
                         ids=["mid-minibatch", "last-microbatch", "no-successor"])
def test_a_sidecar_killed_mid_minibatch_leaves_no_partial_step(tmp_path: Path, stop_at: tuple[int, int],
                                                               restart: bool) -> None:
    job = f"sr{uuid.uuid4().hex[:8]}"
    deadline = DEADLINE if restart else NO_SUCCESSOR_DEADLINE
    store_url = f"file://{tmp_path / 'units'}"
    admission = start_admission(tmp_path, job=job, store=store_url, topology=TOPOLOGY,
                                train_batch_size=PER_MINIBATCH, num_minibatches=1)
    address = admission.ready["address"]
    processes = [admission]
    try:
        first = start_sidecar(tmp_path, job=job, store=store_url, admission=address, dp_rank=0, cp_rank=0)
        processes.append(first)
        output = tmp_path / "trainer.json"
        trainer = spawn("trainer", [sys.executable, WORKER, "--socket", first.ready["address"], "--admission",
                                    address, "--minibatches", str(MINIBATCHES), "--stop-at",
                                    f"{stop_at[0]}:{stop_at[1]}", "--deadline", str(deadline), "--output",
                                    str(output)], tmp_path)
        processes.append(trainer)
        written = write_trajectories(store_url, job, address)

        wait_for(lambda: stopped(trainer), "stopped trainer rank", trainer)
        first.kill()  # kill -9, while the rank holds a micro-batch of its mini-batch
        if restart:
            processes.append(start_sidecar(tmp_path, job=job, store=store_url, admission=address, dp_rank=0,
                                           cp_rank=0, generation=1))
        trainer.signal(signal.SIGCONT)
        assert trainer.popen.wait(timeout=180) in (0, 3), trainer.tail()
        result = json.loads(output.read_text())
    finally:
        for process in reversed(processes):
            process.stop()
        if not restart:  # no successor cleans up after the killed sidecar: segments, lease and socket are the test's
            owner = ReorgSettings(job=job, store=store_url)
            remove_segments(owner.segment_prefix)
            owner_lease_path(job, owner.owner_name).unlink(missing_ok=True)
            shutil.rmtree(job_run_directory(job), ignore_errors=True)

    steps = result["minibatches"]
    if "error" in result:  # the other defined outcome: a typed error within the deadline, never a partial step
        error = result["error"]
        assert error["type"] in {"Unavailable", "DeadlineExceeded", "MiniBatchFailed"}, error
        assert error["after_seconds"] <= deadline + 10, error
        # (The interrupted mini-batch may still be whole: its rest may have been staged before the kill.)
        assert len(steps) <= MINIBATCHES
    else:
        assert restart, "a rank whose sidecar never came back finished its mini-batches"
        assert len(steps) == MINIBATCHES, result
        assert result["restarts_seen"] == 1, result
    # Each step the rank made used its whole mini-batch, every byte as written.
    trained = []
    incarnations = set()
    for step in steps:
        micros = step["microbatches"]
        assert [m["index"] for m in micros] == list(range(step["num_microbatches"])), step["sequence"]
        assert micros[-1]["last"], step["sequence"]
        for micro in micros:
            incarnations.add(micro["incarnation"])
            for item in micro["items"]:
                fields = written[item["trajectory_id"]]
                assert item["positions"] == list(range(len(fields["input_ids"])))
                assert item["input_ids"] == crc(fields["input_ids"])
                assert item["routing"] == crc(fields["routing"])
                trained.append(item["trajectory_id"])
    # The admitted mini-batches, each once and in order: none lost, none twice.
    assert [step["sequence"] for step in steps] == list(range(1, len(steps) + 1))
    assert len(trained) == len(set(trained))
    if "error" not in result:
        assert sorted(trained) == sorted(written)
        assert len(incarnations) == 2  # the successor published the rest


def test_a_successor_that_cannot_read_the_minibatch_a_rank_is_partway_through_fails_it(tmp_path: Path) -> None:
    """The store lost the units while the sidecar was down (the chaos run's kill of the store and of a sidecar):
    the successor fails, at micro-batch 0, the mini-batch the rank already took micro-batch 0 of. The rank gets
    ``MiniBatchFailed`` for that mini-batch, never the next mini-batch's micro-batches in its place."""
    job = f"sf{uuid.uuid4().hex[:8]}"
    units = tmp_path / "units"
    store_url = f"file://{units}"
    admission = start_admission(tmp_path, job=job, store=store_url, topology=TOPOLOGY,
                                train_batch_size=PER_MINIBATCH, num_minibatches=1)
    address = admission.ready["address"]
    processes = [admission]
    try:
        # One slot: while the rank holds micro-batch 0 of its second mini-batch, nothing more of it is published.
        first = start_sidecar(tmp_path, job=job, store=store_url, admission=address, dp_rank=0, cp_rank=0, slots=1)
        processes.append(first)
        output = tmp_path / "trainer.json"
        trainer = spawn("trainer", [sys.executable, WORKER, "--socket", first.ready["address"], "--admission",
                                    address, "--minibatches", str(MINIBATCHES), "--stop-at", "1:0", "--deadline",
                                    str(DEADLINE), "--output", str(output)], tmp_path)
        processes.append(trainer)
        write_trajectories(store_url, job, address)
        wait_for(lambda: stopped(trainer), "stopped trainer rank", trainer)
        first.kill()
        for unit in [path for path in units.rglob("*") if path.is_file()]:
            unit.unlink(missing_ok=True)  # the store lost everything (admission may delete released units first)
        processes.append(start_sidecar(tmp_path, job=job, store=store_url, admission=address, dp_rank=0,
                                       cp_rank=0, slots=1, generation=1))
        trainer.signal(signal.SIGCONT)
        assert trainer.popen.wait(timeout=180) == 3, trainer.tail()
        result = json.loads(output.read_text())
    finally:
        for process in reversed(processes):
            process.stop()

    assert [step["sequence"] for step in result["minibatches"]] == [1]
    assert result["current"] == 2
    assert result["error"]["type"] == "MiniBatchFailed", result["error"]
