"""``knittrans reorg serve`` lowers its CPU priority (``cpu_nice``, default 10) before any of its threads start, so
every thread of the running process has it: read from /proc for each of the real process's threads once it
packed a mini-batch (its reader and store threads are up). A setting out of range is refused naming the field."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from knittrans.client.admission import AdmissionClient
from knittrans.errors import InvalidArgument
from knittrans.reorg.settings import ReorgSettings
from knittrans.rollout import RolloutClient
from knittrans.shm import list_segments
from knittrans.store.factory import open_store
from knittrans.types import VersionSegment

from .processes import Process, start_admission, start_sidecar

TOPOLOGY = {"backbone": {"dp": 1, "cp": 1, "tp": 1, "max_tokens_per_microbatch": 4096}}


def thread_niceness(pid: int) -> dict[int, int]:
    """Each thread's nice value (field 19 of /proc/<pid>/task/<tid>/stat, counted after the command name)."""
    values = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "stat").read_text()
        values[int(task.name)] = int(text[text.rindex(")") + 2:].split()[16])
    return values


def packed_something(sidecar: Process, job: str, store_url: str, address: str) -> None:
    store = open_store(store_url, job=job)
    try:
        rollout = RolloutClient(store, namespace=job)
        metas = [rollout.submit({"input_ids": np.arange(1, 9 + i, dtype=np.int32)}, trajectory_id=f"t{i}",
                                sample_id=f"s{i}", source="A", rollout_step=0, loss_mask_field=None,
                                segments=(VersionSegment(version=0, num_tokens=8 + i),)) for i in range(2)]
        with AdmissionClient(address) as client:
            client.report(metas)
        prefix = ReorgSettings(job=job, store="file:///unused").segment_prefix
        deadline = time.monotonic() + 60
        while not list_segments(prefix):
            assert sidecar.alive() and time.monotonic() < deadline, sidecar.tail()
            time.sleep(0.1)
    finally:
        store.close()


@pytest.mark.parametrize(("settings", "expected"), [({}, 10), ({"cpu_nice": 0}, 0), ({"cpu_nice": 19}, 19)])
def test_every_thread_of_a_sidecar_runs_at_its_niceness(tmp_path: Path, settings: dict, expected: int) -> None:
    job = f"nice{uuid.uuid4().hex[:8]}"
    store_url = f"file://{tmp_path / 'units'}"
    admission = start_admission(tmp_path, job=job, store=store_url, topology=TOPOLOGY, train_batch_size=2,
                                num_minibatches=1)
    sidecar = None
    try:
        address = admission.ready["address"]
        sidecar = start_sidecar(tmp_path, job=job, store=store_url, admission=address, dp_rank=0, cp_rank=0,
                                settings=settings)
        packed_something(sidecar, job, store_url, address)  # its reader and store threads are up too
        ours = os.getpriority(os.PRIO_PROCESS, 0)  # a process started nicer keeps its own
        niceness = thread_niceness(sidecar.popen.pid)
        assert len(niceness) > 1
        assert set(niceness.values()) == {max(expected, ours)}, niceness
        assert set(thread_niceness(admission.popen.pid).values()) == {ours}  # the admission service keeps ours
    finally:
        for process in [sidecar, admission]:
            if process is not None:
                process.stop()


@pytest.mark.parametrize("value", [-1, 20])
def test_a_niceness_out_of_range_is_refused_naming_the_field(value: int) -> None:
    with pytest.raises(InvalidArgument) as raised:
        ReorgSettings(store="file:///unused", cpu_nice=value)
    assert raised.value.field == "cpu_nice"
