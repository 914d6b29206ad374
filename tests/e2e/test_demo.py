"""`knittrans demo`, shortened: the whole stack as real processes, checked end to end.

The demo itself verifies that every admitted trajectory was trained exactly once, that every complete train
batch met its source quotas, that the bytes the trainer ranks received reassemble to the content hashes the
rollout workers wrote (per-token fields across CP ranks, and every image), and that the loss decreased. This
test runs it, reads its report, and checks that nothing it started is left behind.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.e2e.demo_runs import (
    DEMO_COMMANDS,
    MAKE_DEMO,
    README_DEMOS,
    ROLES_DEMOS,
    check_demo_run,
    run_readme_demo,
)
from tests.live_processes import running_with


def test_the_readme_shows_demo_commands() -> None:
    assert MAKE_DEMO == ["knittrans demo"]
    assert any("--state redis" in c for c in DEMO_COMMANDS) and any("--store mooncake" in c for c in DEMO_COMMANDS)
    assert ROLES_DEMOS and set(README_DEMOS) | set(MAKE_DEMO) == set(DEMO_COMMANDS) | set(ROLES_DEMOS) | set(MAKE_DEMO)


@pytest.mark.parametrize("command", DEMO_COMMANDS)
def test_demo_end_to_end(tmp_path: Path, command: str) -> None:
    check_demo_run(run_readme_demo(command, tmp_path), tmp_path / "demo-out")


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
    """`make demo`'s command, twice at once from one directory: each gets its own job id (printed at start), so no
    store key, segment, socket or journal is shared, and the second writes to demo-out-<job> while the first holds
    demo-out. Each run is checked as fully as any other."""
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda _: run_readme_demo(MAKE_DEMO[0], tmp_path), range(2)))
    jobs = []
    for result in results:
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        job, out = re.search(r"^knittrans demo: job (\S+), writing to (\S+)$", result.stderr, re.MULTILINE).groups()
        report = check_demo_run(result, Path(out))
        assert report["job"] == job
        jobs.append((job, Path(out)))
    (first_job, first_out), (second_job, second_out) = jobs
    assert first_job != second_job
    assert {first_out, second_out} == {tmp_path / "demo-out", tmp_path / f"demo-out-{second_job}"} or \
        {first_out, second_out} == {tmp_path / "demo-out", tmp_path / f"demo-out-{first_job}"}
