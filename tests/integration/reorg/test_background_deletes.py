"""The file store's released units are deleted by a helper process at the lowest CPU priority
(knittrans.admission.service.background_deletes): it leads a session of its own at niceness 19, threads and
session group alike, while the admission service keeps its own priority; it dies with the service, even by
kill -9; and a helper killed -9 mid-job is replaced, its batch retried, nothing else touched.

Real processes throughout: ``knittrans admission serve``, and the helper it starts; the oracle is /proc and the
store's files, not the module's own state."""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from knittrans.admission.service.background_deletes import HelperDeletes
from knittrans.errors import Unavailable
from knittrans.store.factory import open_store
from knittrans.store.protocol import DType, UnitWrite

from .processes import start_admission
from .test_sidecar_priority import autogroup_niceness, thread_niceness

TOPOLOGY = {"backbone": {"dp": 1, "cp": 1, "max_tokens_per_microbatch": 4096}}


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat[stat.rindex(")") + 2:].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def helper_of(service_pid: int) -> int:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for child in children(service_pid):
            if b"background_deletes" in Path(f"/proc/{child}/cmdline").read_bytes():
                return child
        time.sleep(0.05)
    raise AssertionError(f"no deletion helper under {service_pid}")


def wait_gone(pid: int, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        time.sleep(0.05)
    return False


def test_the_helper_runs_at_the_lowest_priority_and_dies_with_the_service(tmp_path: Path) -> None:
    service = start_admission(tmp_path, job=f"bd{uuid.uuid4().hex[:8]}", store=f"file://{tmp_path / 'units'}",
                              topology=TOPOLOGY, train_batch_size=4, num_minibatches=1)
    try:
        helper = helper_of(service.popen.pid)
        assert os.getsid(helper) == helper
        ours = os.getpriority(os.PRIO_PROCESS, 0)
        deadline = time.monotonic() + 30  # it lowers its priority once it has imported its store
        while set(thread_niceness(helper).values()) != {19} and time.monotonic() < deadline:
            time.sleep(0.05)
        assert set(thread_niceness(helper).values()) == {19}
        assert set(thread_niceness(service.popen.pid).values()) == {ours}
        if autogroup_niceness(os.getpid()) is not None:
            assert autogroup_niceness(helper) == 19
            assert autogroup_niceness(service.popen.pid) == 0
        service.kill()  # kill -9: nothing of the service runs to stop it
        assert wait_gone(helper), "the deletion helper outlived the admission service"
    finally:
        service.stop()


def test_a_killed_helper_is_replaced_and_its_batch_retried(tmp_path: Path) -> None:
    job = f"bd{uuid.uuid4().hex[:8]}"
    url = f"file://{tmp_path / 'units'}"
    store = open_store(url, job=job)
    keys = [f"{job}/t{i}/input_ids" for i in range(6)]
    store.put_many([UnitWrite.of_array(key, np.arange(1000 + i, dtype=np.int32), DType.INT32, sequence=True)
                    for i, key in enumerate(keys)])
    helper = HelperDeletes(url, job)
    try:
        helper.delete(keys[:2])
        assert store.exists(keys) == [False, False, True, True, True, True]
        first = helper.pid
        os.kill(first, signal.SIGKILL)
        assert wait_gone(first)
        with pytest.raises(Unavailable):
            helper.delete(keys[2:4])  # it went with the helper: the deleter retries it
        helper.delete(keys[2:4])
        assert helper.pid != first
        assert store.exists(keys) == [False, False, False, False, True, True]
        helper.delete(keys[2:4])  # deleting what is gone already is no error
    finally:
        last = helper.pid
        helper.close()
        store.close()
    assert wait_gone(last, timeout=10)
