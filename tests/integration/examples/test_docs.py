"""The docs' shell blocks and the README's commands run exactly as written, from a fresh directory.

Every ```bash block of docs/integration.md (the local quick start) runs verbatim, in order, in one bash
session in a directory that holds a copy of `examples/`, as a reader at the repository root would run them:
the servers its blocks start with `&` are stopped by its last block (and by this test, whatever happens). The
oracle is what the reader is promised: the data is admitted, trained and released, and the unit store is empty.
"""

from __future__ import annotations

import fcntl
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.doc_blocks import ROOT, bash_blocks, commands, readme_commands, run_bash_blocks

INTEGRATION = ROOT / "docs" / "integration.md"
ASYNC = ROOT / "docs" / "async.md"
QUICKSTART_STORE = Path("/dev/shm/knittrans-quickstart")  # the quick start's job and store are named in its config


def environment() -> dict[str, str]:
    """The reader's shell: the venv's `knittrans` and `python` first on PATH."""
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}


def repository_copy(tmp_path: Path) -> Path:
    work = tmp_path / "repo"
    shutil.copytree(ROOT / "examples", work / "examples")
    return work


@pytest.fixture
def quickstart_paths() -> Iterator[None]:
    """The quick start's paths are global (/dev/shm, /tmp): one run at a time on this machine."""
    with open("/tmp/knittrans-quickstart-test.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        shutil.rmtree(QUICKSTART_STORE, ignore_errors=True)  # what an earlier, killed run may have left
        try:
            yield
        finally:
            shutil.rmtree(QUICKSTART_STORE, ignore_errors=True)


def unit_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()] if root.exists() else []


def test_the_quick_start_has_runnable_blocks() -> None:
    blocks = bash_blocks(INTEGRATION)
    assert len(blocks) >= 3
    started = [c for b in blocks for c in commands(b) if c.endswith("&")]
    assert started[0].startswith("knittrans up --config")  # the quick start is one command
    assert any(c.startswith("knittrans admission serve") for c in started)  # and then the services one by one
    assert any(c.startswith("knittrans reorg serve") for c in started)
    assert commands(blocks[-1])[0].startswith("kill")  # the reader stops what the blocks started


def test_the_quick_start_runs_verbatim_and_releases_the_data(tmp_path: Path, quickstart_paths: None) -> None:
    work = repository_copy(tmp_path)
    returncode, stdout, stderr = run_bash_blocks(INTEGRATION, cwd=work, env=environment(), timeout=240)
    assert returncode == 0, stdout[-3000:] + stderr[-5000:]
    # Twice: on the stack `knittrans up` starts, then on the services started one by one.
    assert stdout.count("knittrans up: job quickstart is ready") == 1
    assert stdout.count("submitted example-") == 16
    assert stdout.count("admitted 8") == 4  # by the rollout worker and by the training loop, each run
    assert stdout.count("step 0: train batch 0 mini-batch 0") == 2
    assert stdout.count("step 1: train batch 0 mini-batch 1") == 2
    assert stdout.count("released 2 mini-batches") == 2  # every consumer reported its optimizer step
    assert not (work / "knittrans-connection.json").exists()  # the stack cleaned up after itself
    deadline = time.monotonic() + 30  # the service deletes released units in the background
    while unit_files(QUICKSTART_STORE) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert unit_files(QUICKSTART_STORE) == []
    assert not Path("/tmp/knittrans-quickstart/reorg-backbone-dp0-cp0.sock").exists()  # the sidecar cleaned up


def test_the_async_sdk_page_runs_verbatim_and_releases_the_data(tmp_path: Path, quickstart_paths: None) -> None:
    """docs/async.md's blocks: the async rollout example submits through AsyncRolloutClient and the async trainer
    loop trains on it with `async for`, through the real services."""
    work = repository_copy(tmp_path)
    returncode, stdout, stderr = run_bash_blocks(ASYNC, cwd=work, env=environment(), timeout=240)
    assert returncode == 0, stdout[-3000:] + stderr[-5000:]
    assert stdout.count("submitted async-example-") == 8
    assert "admitted 8" in stdout
    assert "step 0: train batch 0 mini-batch 0" in stdout and "step 1: train batch 0 mini-batch 1" in stdout
    assert "released 2 mini-batches" in stdout
    deadline = time.monotonic() + 30  # the service deletes released units in the background
    while unit_files(QUICKSTART_STORE) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert unit_files(QUICKSTART_STORE) == []


README_COMMANDS = readme_commands("knittrans replay") + readme_commands("knittrans simulate")


def test_the_readme_shows_replay_and_simulate_commands() -> None:
    assert len(README_COMMANDS) == 2


@pytest.mark.parametrize("command", README_COMMANDS)
def test_readme_command_runs_verbatim(tmp_path: Path, command: str) -> None:
    """(`knittrans demo` commands run in tests/e2e/test_demo.py.)"""
    result = subprocess.run(shlex.split(command), cwd=repository_copy(tmp_path), env=environment(),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "knittrans" in result.stdout and "train-batch" in result.stdout  # the policies, side by side
