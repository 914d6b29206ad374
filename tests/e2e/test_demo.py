"""`knittrans demo`, shortened: the whole stack as real processes, checked end to end.

The demo itself verifies that every admitted trajectory was trained exactly once, that every complete train
batch met its source quotas, that the bytes the trainer ranks received reassemble to the content hashes the
rollout workers wrote (per-token fields across CP ranks, and every image), and that the loss decreased. This
test runs it, reads its report, and checks that nothing it started is left behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from knittrans.shm import list_segments


def running_with(marker: str) -> list[str]:
    """Command lines of live processes that mention ``marker`` (the run's output directory)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in command:
            found.append(command)
    return found


@pytest.mark.parametrize(
    ("store", "state"),
    [("file", "memory"), ("mooncake", "redis")],
    ids=["file-memory", "mooncake-redis"],
)
def test_demo_end_to_end(tmp_path: Path, store: str, state: str) -> None:
    out = tmp_path / "demo-out"
    result = subprocess.run(
        [sys.executable, "-m", "knittrans.cli", "demo", "--train-batches", "2", "--store", store, "--state", state,
         "--out", str(out)],
        capture_output=True, text=True, timeout=400,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    checks = report["checks"]
    assert checks["passed"], checks
    assert checks["trained_exactly_once"] and checks["quotas_held"] and checks["bytes_match"]
    assert checks["images_match"] and checks["loss_decreased"]
    assert checks["details"]["trained"] == checks["details"]["admitted"] == 64
    assert report["bytes_read"] == report["bytes_needed"] > 0  # nothing read that the plans did not need
    assert len(report["steps"]) == 8
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
