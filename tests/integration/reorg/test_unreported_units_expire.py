"""A rollout worker killed between writing a trajectory's units and reporting it (issue 15 §4, DESIGN.md §9):
its units are deleted once its reservation expires, and nothing acknowledged is touched. Real processes:
``knittrans admission serve`` (``unreported_unit_ttl_seconds: 1``) on a file store, and a rollout worker
process (``stalled_rollout.py``) that stops itself with SIGSTOP right after its write, where it would report.

The test kills it with SIGKILL there. Meanwhile another worker (this process) stores and reports a trajectory
of the same sample, sharing its image. Oracle, read from the store: the killed worker's own units disappear;
the shared image and every unit of the acknowledged trajectory stay, with the bytes written, and it stays in
the admission pool.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path

import numpy as np

from knittrans.client.admission import AdmissionClient
from knittrans.rollout import MultimodalInput, RolloutClient
from knittrans.store.factory import open_store
from knittrans.store.protocol import UnitRead
from knittrans.types import TokenSpan, VersionSegment

from .processes import Process, spawn, start_admission

TOPOLOGY = {"backbone": {"dp": 1, "cp": 1, "tp": 1, "max_tokens_per_microbatch": 4096},
            "encoders": [{"name": "vision", "dp": 1, "tp": 1, "max_cost_per_microbatch": 64}]}
WORKER = str(Path(__file__).with_name("stalled_rollout.py"))


def wait_for(condition, what: str, process: Process | None = None, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if process is not None:
            assert process.alive(), f"{process.name} exited while waiting for {what}:\n{process.tail()}"
        assert time.monotonic() < deadline, f"no {what} after {timeout}s"
        time.sleep(0.05)


def stopped(process: Process) -> bool:
    return Path(f"/proc/{process.popen.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"


def test_units_of_a_rollout_killed_before_its_report_are_deleted_after_the_ttl(tmp_path: Path) -> None:
    job = f"gc{uuid.uuid4().hex[:8]}"
    store_url = f"file://{tmp_path / 'units'}"
    admission = start_admission(tmp_path, job=job, store=store_url, topology=TOPOLOGY, train_batch_size=4,
                                num_minibatches=1, settings={"unreported_unit_ttl_seconds": 1.0})
    address = admission.ready["address"]
    store = open_store(store_url, job=job)
    processes = [admission]
    try:
        keys_file = tmp_path / "lost-keys.json"
        worker = spawn("rollout", [sys.executable, WORKER, "--store", store_url, "--job", job, "--admission",
                                   address, "--trajectory", "t-lost", "--sample", "s0", "--keys", str(keys_file)],
                       tmp_path)
        processes.append(worker)
        wait_for(lambda: stopped(worker), "stopped rollout worker", worker)
        lost = json.loads(keys_file.read_text())
        assert all(size is not None for size in store.sizes(lost))  # written, never to be reported
        worker.kill()

        # Another worker's trajectory of the same sample: the same image (content-addressed, one unit).
        rng = np.random.default_rng(7)
        tokens = rng.integers(1, 1000, 30, dtype=np.int32)
        image = rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)
        with AdmissionClient(address, deadline=timedelta(seconds=10)) as client:
            kept = RolloutClient(store, namespace=job, reporter=client).submit(
                {"input_ids": tokens, "loss_mask": np.ones(30, np.uint8)}, trajectory_id="t-kept", sample_id="s0",
                source="A", rollout_step=0, segments=(VersionSegment(version=0, num_tokens=30),),
                multimodal=(MultimodalInput(data=image, encoder="vision", cost=4.0,
                                            placeholder=TokenSpan(start=2, end=6)),))
            shared = kept.multimodal[0].key
            assert shared in lost  # the same unit
            own_lost = [key for key in lost if key != shared]

            wait_for(lambda: all(size is None for size in store.sizes(own_lost)), "deletion of unreported units",
                     admission)
            assert client.status().pool_size == 1  # the acknowledged trajectory is still there to be trained
        kept_keys = [unit.key for unit in kept.units]
        assert all(size is not None for size in store.sizes([*kept_keys, shared]))
        out = np.zeros(image.nbytes, dtype=np.uint8)
        store.get_many_into([UnitRead.of(shared, out)])
        np.testing.assert_array_equal(out.reshape(image.shape), image)
        out = np.zeros(tokens.nbytes, dtype=np.uint8)
        store.get_many_into([UnitRead.of(next(u.key for u in kept.units if u.field_name == "input_ids"), out)])
        np.testing.assert_array_equal(out.view(np.int32), tokens)
        assert admission.alive(), admission.tail()
    finally:
        store.close()
        for process in reversed(processes):
            process.stop()
