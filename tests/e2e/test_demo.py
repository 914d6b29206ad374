"""`knittrans demo`, shortened: the whole stack as real processes, checked end to end.

The demo itself verifies that every admitted trajectory was trained exactly once, that every complete train
batch met its source quotas, that the bytes the trainer ranks received reassemble to the content hashes the
rollout workers wrote (per-token fields across CP ranks, and every image), and that the loss decreased. This
test runs it, reads its report, and checks that nothing it started is left behind.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from knittrans.shm import list_segments
from tests.doc_blocks import make_recipe, readme_commands
from tests.live_processes import running_with

# `make demo`, then every `knittrans demo` command of the README, verbatim, from a fresh directory and with the
# default output directory; only `--train-batches 2` is added, to keep the run short.
DEMO_COMMANDS = make_recipe("demo") + readme_commands("knittrans demo")


def test_the_readme_shows_demo_commands() -> None:
    assert DEMO_COMMANDS[0] == "knittrans demo"
    assert any("--state redis" in c for c in DEMO_COMMANDS) and any("--store mooncake" in c for c in DEMO_COMMANDS)


@pytest.mark.parametrize("command", DEMO_COMMANDS)
def test_demo_end_to_end(tmp_path: Path, command: str) -> None:
    out = tmp_path / "demo-out"
    environment = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    result = subprocess.run(  # stdout and stderr are pipes, as in CI or `make demo > log`
        [*shlex.split(command), "--train-batches", "2"], cwd=tmp_path, env=environment,
        capture_output=True, text=True, timeout=400,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for stream in (result.stdout, result.stderr):
        assert "\r" not in stream and "\x1b" not in stream  # plain lines in a log, no terminal control
    assert "step 8/8" in result.stderr  # the progress still shows, one plain line at a time
    report = json.loads((out / "report.json").read_text())
    checks = report["checks"]
    assert checks["passed"], checks
    assert checks["trained_exactly_once"] and checks["quotas_held"] and checks["bytes_match"]
    assert checks["images_match"] and checks["loss_decreased"]
    assert checks["details"]["trained"] == checks["details"]["admitted"] == 64
    assert report["bytes_read"] == report["bytes_needed"] > 0  # nothing read that the plans did not need
    assert len(report["steps"]) == 8
    for step in report["steps"]:  # waiting for admission (slow rollouts) is not shown as waiting for data
        assert step["admission_wait_seconds"] >= 0 and step["data_wait_after_admission_seconds"] >= 0
        assert "data_wait_seconds" not in step
    assert (out / "report.png").stat().st_size > 0
    assert running_with(str(out)) == []
    assert list_segments(f"knittrans-{report['job']}") == []
    assert not Path(f"/dev/shm/knittrans-{report['job']}").exists()


def test_a_dead_sidecar_stops_the_demo_and_is_named(tmp_path: Path) -> None:
    out = tmp_path / "demo-out"
    demo = subprocess.Popen(
        [sys.executable, "-m", "knittrans.cli", "demo", "--train-batches", "20", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        victim = None
        deadline = time.monotonic() + 120
        while victim is None and time.monotonic() < deadline and demo.poll() is None:
            time.sleep(0.2)
            for entry in Path("/proc").iterdir():
                try:
                    command = (entry / "cmdline").read_bytes().split(b"\0")
                except OSError:
                    continue
                if b"reorg" in command and b"--dp-rank" in command and str(out).encode() in b" ".join(command) \
                        and (out / "run.json").exists():
                    victim = int(entry.name)
                    break
        assert victim is not None, "the demo never started its sidecars"
        os.kill(victim, signal.SIGKILL)
        _, stderr = demo.communicate(timeout=120)
    finally:
        if demo.poll() is None:
            demo.kill()
    assert demo.returncode == 1
    assert "a process failed: reorg-" in stderr and "exited with status -9" in stderr
    assert "last lines of" in stderr
    assert running_with(str(out)) == []


def test_two_demos_at_once_on_one_machine_both_pass(tmp_path: Path) -> None:
    """Two `knittrans demo` runs started together from one directory: each gets its own job id (printed at start),
    so no store key, segment, socket or journal is shared, and the second writes to demo-out-<job> while the first
    holds demo-out."""
    environment = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    runs = [subprocess.Popen(["knittrans", "demo", "--train-batches", "2"], cwd=tmp_path, env=environment,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        outputs = [run.communicate(timeout=600) for run in runs]
    finally:
        for run in runs:
            if run.poll() is None:
                run.kill()
    jobs = []
    for run, (stdout, stderr) in zip(runs, outputs, strict=True):
        assert run.returncode == 0, stdout[-3000:] + stderr[-3000:]
        job, out = re.search(r"^knittrans demo: job (\S+), writing to (\S+)$", stderr, re.MULTILINE).groups()
        report = json.loads((Path(out) / "report.json").read_text())
        assert report["job"] == job and report["checks"]["passed"], report["checks"]
        assert report["checks"]["details"]["trained"] == report["checks"]["details"]["admitted"] == 64
        assert list_segments(f"knittrans-{job}") == [] and not Path(f"/tmp/knittrans-{job}").exists()
        jobs.append((job, Path(out)))
    (first_job, first_out), (second_job, second_out) = jobs
    assert first_job != second_job
    assert {first_out, second_out} == {tmp_path / "demo-out", tmp_path / f"demo-out-{second_job}"} or \
        {first_out, second_out} == {tmp_path / "demo-out", tmp_path / f"demo-out-{first_job}"}
