"""A sidecar holds its node-local names (issue 15 §5), with ``knittrans reorg serve`` as real processes.

Two jobs run side by side: ``J`` and ``J-backbone-dp0-cp0``, a live other job whose segments began with J's
sidecar's prefix while prefixes ended in ``-``. Each has an admission service, a sidecar and a packed micro-batch
in shared memory.

- a second sidecar for the same (job, role, ranks) is refused, naming the holder, and touches nothing;
- after the holder is killed with kill -9, a new one starts at once, removes the dead holder's segments, and leaves
  the other job's segments alone.
"""

from __future__ import annotations

import socket
import time
import uuid
from pathlib import Path

import numpy as np

from knittrans.client.admission import AdmissionClient
from knittrans.reorg.settings import ReorgSettings
from knittrans.rollout import RolloutClient
from knittrans.shm import SHM_DIR, list_segments
from knittrans.store.factory import open_store
from knittrans.types import VersionSegment

from .processes import Process, start_admission, start_sidecar

TOPOLOGY = {"backbone": {"dp": 1, "cp": 1, "tp": 1, "max_tokens_per_microbatch": 4096}}


def segments_of(job: str) -> list[str]:
    return list_segments(ReorgSettings(job=job, store="file:///unused").segment_prefix)


def wait_for(condition, what: str, process: Process, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert process.alive(), f"{process.name} exited while waiting for {what}:\n{process.tail()}"
        assert time.monotonic() < deadline, f"no {what} after {timeout}s:\n{process.tail()}"
        time.sleep(0.1)


class Job:
    """One job: its admission service and store, and a mini-batch packed by its sidecar."""

    def __init__(self, root: Path, job: str) -> None:
        self.job = job
        self.directory = root / job
        self.directory.mkdir()
        self.store_url = f"file://{self.directory / 'units'}"
        self.admission = start_admission(self.directory, job=job, store=self.store_url, topology=TOPOLOGY,
                                         train_batch_size=2, num_minibatches=1)
        self.address = self.admission.ready["address"]
        self.sidecars: list[Process] = []

    def start_sidecar(self) -> Process:
        sidecar = start_sidecar(self.directory, job=self.job, store=self.store_url, admission=self.address,
                                dp_rank=0, cp_rank=0, generation=len(self.sidecars))
        self.sidecars.append(sidecar)
        return sidecar

    def feed(self) -> None:
        """A mini-batch for the sidecar to pack into its ring."""
        store = open_store(self.store_url, job=self.job)
        try:
            rollout = RolloutClient(store, namespace=self.job)
            metas = [rollout.submit({"input_ids": np.arange(1, 9 + i, dtype=np.int32),
                                     "loss_mask": np.ones(8 + i, dtype=np.uint8)},
                                    trajectory_id=f"t{i}", sample_id=f"s{i}", source="A", rollout_step=0,
                                    segments=(VersionSegment(version=0, num_tokens=8 + i),))
                     for i in range(2)]
            with AdmissionClient(self.address) as client:
                client.report(metas)
        finally:
            store.close()

    def stop(self) -> None:
        for process in [*self.sidecars, self.admission]:
            process.stop()


def test_a_sidecar_holds_its_names_and_cleans_up_only_after_a_dead_holder(tmp_path: Path) -> None:
    name = f"lease{uuid.uuid4().hex[:8]}"
    job, other = Job(tmp_path, name), None
    try:
        other = Job(tmp_path, f"{name}-backbone-dp0-cp0")
        other_sidecar = other.start_sidecar()
        other.feed()
        wait_for(lambda: segments_of(other.job), "segments of the other job", other_sidecar)
        other_segments = segments_of(other.job)

        holder = job.start_sidecar()
        job.feed()
        wait_for(lambda: segments_of(job.job), "segments of the holder", holder)
        held_segments = segments_of(job.job)

        try:
            job.start_sidecar()
            raise AssertionError("a second sidecar of the same job and ranks started")
        except RuntimeError as refused:
            message = str(refused)
        assert f"is held by pid {holder.popen.pid} on host {socket.gethostname()}, started " in message, message
        assert holder.alive() and set(held_segments) <= set(segments_of(job.job))  # touched nothing

        holder.kill()  # kill -9: its segments stay behind
        assert all((SHM_DIR / segment).exists() for segment in held_segments)
        successor = job.start_sidecar()  # at once: the kernel freed the dead holder's lock
        assert successor.alive(), successor.tail()
        assert not any((SHM_DIR / segment).exists() for segment in held_segments)
        assert all((SHM_DIR / segment).exists() for segment in other_segments), "another job's segments went"
        assert other_sidecar.alive(), other_sidecar.tail()
    finally:
        job.stop()
        if other is not None:
            other.stop()
