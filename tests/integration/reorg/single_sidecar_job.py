"""One job run as real processes: its admission service, its file store, and sidecars of DP rank 0 / CP rank 0
started with ``knittrans reorg serve``; :meth:`Job.feed` gives them a mini-batch to pack."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from knittrans.client.admission import AdmissionClient
from knittrans.reorg.settings import ReorgSettings
from knittrans.rollout import RolloutClient
from knittrans.shm import list_segments
from knittrans.store.factory import open_store
from knittrans.types import VersionSegment

from .processes import Process, start_admission, start_sidecar

TOPOLOGY = {"backbone": {"dp": 1, "cp": 1, "tp": 1, "max_tokens_per_microbatch": 4096}}


def segments_of(job: str) -> list[str]:
    return list_segments(ReorgSettings(job=job, store="file:///unused").segment_prefix)


def wait_for(condition: Callable[[], object], what: str, process: Process | None = None,
             timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if process is not None:
            assert process.alive(), f"{process.name} exited while waiting for {what}:\n{process.tail()}"
        assert time.monotonic() < deadline, f"no {what} after {timeout}s" + (
            f":\n{process.tail()}" if process is not None else "")
        time.sleep(0.02)


class Job:
    """One job: its admission service and store, and the sidecars started for it."""

    def __init__(self, root: Path, job: str) -> None:
        self.job = job
        self.directory = root / job
        self.directory.mkdir()
        self.store_url = f"file://{self.directory / 'units'}"
        self.admission = start_admission(self.directory, job=job, store=self.store_url, topology=TOPOLOGY,
                                         train_batch_size=2, num_minibatches=1)
        self.address = self.admission.ready["address"]
        self.sidecars: list[Process] = []

    def start_sidecar(self, settings: dict | None = None) -> Process:
        """``settings``: more sidecar config keys."""
        sidecar = start_sidecar(self.directory, job=self.job, store=self.store_url, admission=self.address,
                                dp_rank=0, cp_rank=0, generation=len(self.sidecars), settings=settings)
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
