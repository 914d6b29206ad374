"""``knittrans reorg serve`` lowers its CPU priority (``cpu_nice``, default 10) before any of its threads start, so
every thread of the running process has it: read from /proc for each of the real process's threads once it
packed a mini-batch (its reader and store threads are up). A setting out of range is refused naming the field."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from knittrans.errors import InvalidArgument
from knittrans.reorg.settings import ReorgSettings

from .single_sidecar_job import Job, segments_of, wait_for


def thread_niceness(pid: int) -> dict[int, int]:
    """Each thread's nice value (field 19 of /proc/<pid>/task/<tid>/stat, counted after the command name)."""
    values = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "stat").read_text()
        values[int(task.name)] = int(text[text.rindex(")") + 2:].split()[16])
    return values


@pytest.mark.parametrize(("settings", "expected"), [({}, 10), ({"cpu_nice": 0}, 0), ({"cpu_nice": 19}, 19)])
def test_every_thread_of_a_sidecar_runs_at_its_niceness(tmp_path: Path, settings: dict, expected: int) -> None:
    job = Job(tmp_path, f"nice{uuid.uuid4().hex[:8]}")
    try:
        sidecar = job.start_sidecar(settings)
        job.feed()
        wait_for(lambda: segments_of(job.job), "a packed micro-batch", sidecar)  # its reader and store threads too
        ours = os.getpriority(os.PRIO_PROCESS, 0)  # a process started nicer keeps its own
        niceness = thread_niceness(sidecar.popen.pid)
        assert len(niceness) > 1
        assert set(niceness.values()) == {max(expected, ours)}, niceness
        assert set(thread_niceness(job.admission.popen.pid).values()) == {ours}  # the admission service keeps ours
    finally:
        job.stop()


@pytest.mark.parametrize("value", [-1, 20])
def test_a_niceness_out_of_range_is_refused_naming_the_field(value: int) -> None:
    with pytest.raises(InvalidArgument) as raised:
        ReorgSettings(store="file:///unused", cpu_nice=value)
    assert raised.value.field == "cpu_nice"
