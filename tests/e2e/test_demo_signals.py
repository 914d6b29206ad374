"""`knittrans demo` stopped from outside: by SIGTERM (a CI runner, Kubernetes, `timeout`, `pkill`) as by Ctrl-C, and
by SIGKILL of the driver itself, in the plain run and in the chaos run after its supervisor restarted a process.

Everything is checked from outside, from /proc, /dev/shm and /tmp: no process of the run is left (the services and
workers name the run's output directory or job on their command lines; Mooncake's name its master's address, read
from the admission service's config), no shared-memory segment of the job, and after SIGTERM no socket directory.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from knittrans.shm import list_segments, remove_segments
from tests.doc_blocks import ROOT
from tests.live_processes import live_processes

START_TIMEOUT_SECONDS = 300.0  # the whole stack starting on a loaded machine
GONE_TIMEOUT_SECONDS = 120.0  # the run's stop grace is 10 s; this only bounds a broken run
Jobs = list[tuple[Path, str]]  # (output directory, job) of each run a test started


def _run_processes(out: Path, job: str) -> dict[int, str]:
    """The processes of the run: those naming its output directory or job, and its Mooncake master and store."""
    markers = [str(out), job]
    config = out / "admission.yaml"
    if config.exists():
        store = urlsplit(yaml.safe_load(config.read_text())["store"])
        if store.scheme == "mooncake":
            markers += [f"--master_server_address={store.netloc}", f"--rpc_port={store.port}"]
    return {pid: command for pid, command in live_processes().items() if any(m in command for m in markers)}


def _wait_until(condition, what: str, demo: subprocess.Popen, timeout: float = START_TIMEOUT_SECONDS) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert demo.poll() is None, f"the demo exited ({demo.returncode}) before {what}"
        assert time.monotonic() < deadline, f"not {what} after {timeout:.0f}s"
        time.sleep(0.2)


def _start(tmp_path: Path, *extra: str) -> tuple[subprocess.Popen, Path, str]:
    out = tmp_path / "demo-out"
    job = f"signals-{uuid.uuid4().hex[:8]}"
    with open(tmp_path / "stderr.log", "wb") as stderr:  # a file: a pipe nobody reads yet could fill up
        demo = subprocess.Popen(
            [sys.executable, "-m", "knittrans.cli", "demo", "--out", str(out), "--job", job, *extra],
            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=stderr,
        )
    return demo, out, job


def _wait_for_workers(demo: subprocess.Popen, out: Path, job: str) -> None:
    """Until the trainer ranks and rollout workers run: every service is up then."""
    def workers_up() -> bool:
        commands = _run_processes(out, job).values()
        return any("knittrans.demo.trainer_rank" in c for c in commands) and \
            any("knittrans.demo.rollout_worker" in c for c in commands)

    _wait_until(workers_up, "its trainer ranks and rollout workers ran", demo)


def _wait_for_a_restart(demo: subprocess.Popen, out: Path, job: str) -> None:
    """Until the chaos supervisor restarted a process it had seen killed: the same command line, another pid."""
    seen = _run_processes(out, job)
    faults = out / "chaos-faults.jsonl"

    def restarted() -> bool:
        seen.update(_run_processes(out, job))
        live = _run_processes(out, job)
        lines = faults.read_text().splitlines() if faults.exists() else []
        for fault in map(json.loads, lines):
            if fault["action"] != "kill" or fault["skipped"] or fault["pid"] not in seen:
                continue
            if any(command == seen[fault["pid"]] and pid != fault["pid"] for pid, command in live.items()):
                return True
        return False

    _wait_until(restarted, "a killed process was restarted", demo)


def _wait_gone(out: Path, job: str) -> None:
    deadline = time.monotonic() + GONE_TIMEOUT_SECONDS
    while _run_processes(out, job) and time.monotonic() < deadline:
        time.sleep(0.2)


@pytest.fixture
def clean_job():
    """What a SIGKILLed driver cannot remove itself (its file store, socket directory), and whatever a failed run
    left, removed after the test whatever happened."""
    jobs: list[tuple[Path, str]] = []
    yield jobs
    for out, job in jobs:
        for pid in _run_processes(out, job):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        remove_segments(f"knittrans-{job}@")
        shutil.rmtree(f"/dev/shm/knittrans-{job}", ignore_errors=True)
        shutil.rmtree(f"/tmp/knittrans-{job}", ignore_errors=True)


# Long enough (20 train batches) that a fault and its restart come well before the run would end by itself.
CHAOS = ("--config", str(ROOT / "examples" / "demo" / "chaos.yaml"), "--chaos", "1",
         "--chaos-targets", "redis,mooncake-store,sidecar", "--train-batches", "20")
RUNS = {"plain": ("--train-batches", "20"), "chaos": CHAOS}


def _start_running(tmp_path: Path, clean_job: Jobs, run: str) -> tuple[subprocess.Popen, Path, str]:
    """Start a demo of ``run`` and return once its workers run (and, with chaos, a fault was restarted)."""
    demo, out, job = _start(tmp_path, *RUNS[run])
    clean_job.append((out, job))
    try:
        _wait_for_workers(demo, out, job)
        if run == "chaos":
            _wait_for_a_restart(demo, out, job)
    except BaseException:
        demo.kill()
        demo.wait()
        raise
    return demo, out, job


@pytest.mark.parametrize("run", sorted(RUNS))
def test_sigterm_stops_the_demo_and_everything_it_started(tmp_path: Path, clean_job: Jobs, run: str) -> None:
    demo, out, job = _start_running(tmp_path, clean_job, run)
    try:
        demo.send_signal(signal.SIGTERM)
        demo.wait(timeout=GONE_TIMEOUT_SECONDS)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
    stderr = (tmp_path / "stderr.log").read_text(errors="replace")
    assert demo.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    assert "stopped by SIGTERM" in stderr
    assert _run_processes(out, job) == {}
    assert list_segments(f"knittrans-{job}") == []
    assert not Path(f"/tmp/knittrans-{job}").exists()  # the sidecars' socket directory
    assert not Path(f"/dev/shm/knittrans-{job}").exists()  # the file store


@pytest.mark.parametrize("run", sorted(RUNS))
def test_a_killed_demo_driver_takes_its_processes_with_it(tmp_path: Path, clean_job: Jobs, run: str) -> None:
    demo, out, job = _start_running(tmp_path, clean_job, run)
    try:
        demo.send_signal(signal.SIGKILL)
        demo.wait(timeout=GONE_TIMEOUT_SECONDS)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
        _wait_gone(out, job)
    assert _run_processes(out, job) == {}
    # Each process stopped by its own SIGTERM removes what it made in shared memory.
    assert list_segments(f"knittrans-{job}@") == []
