"""docs/own-trainer.md runs verbatim: its ```bash blocks, in order, in one bash session in a directory that holds
a copy of `examples/`, as a reader at the repository root runs them. The oracle is what the page promises: the
data is admitted and trained on both ranks and released, and once the stack is stopped nothing of it is left:
no process of the job, no connection file, store, sockets, shared memory or temporary directory."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.doc_blocks import ROOT, bash_blocks, commands
from tests.integration.examples.test_docs import environment, repository_copy
from tests.live_processes import running_with

PAGE = ROOT / "docs" / "own-trainer.md"
JOB = "own-trainer"  # named in examples/stack/stack.yaml


@pytest.fixture
def job_paths() -> Iterator[None]:
    """The page's job name is fixed, so its paths are global: one run at a time on this machine."""
    with open(f"/tmp/knittrans-{JOB}-doc-test.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def test_the_page_starts_the_stack_uses_it_and_stops_it() -> None:
    blocks = [commands(block) for block in bash_blocks(PAGE)]
    assert blocks[0] == ["knittrans up --config examples/stack/stack.yaml &"]
    assert not any("--admission" in c or "--sidecar" in c or "--store" in c for b in blocks for c in b)
    assert blocks[-1][0].startswith("kill")


def test_the_page_runs_verbatim_and_leaves_nothing_behind(tmp_path: Path, job_paths: None) -> None:
    work = repository_copy(tmp_path)
    script = "set -e\n" + "\n".join(bash_blocks(PAGE))
    shell = subprocess.Popen(["bash", "-c", script], cwd=work, env=environment(), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = shell.communicate(timeout=300)
    finally:
        try:
            os.killpg(shell.pid, signal.SIGKILL)  # whatever a failed block left running
        except ProcessLookupError:
            pass
    assert shell.returncode == 0, stdout[-3000:] + stderr[-5000:]
    assert f"knittrans up: job {JOB} is ready" in stdout
    assert "rank 0" in stdout and "rank 1" in stdout  # each rank's sidecar socket, printed
    assert stdout.count("submitted example-") == 8
    assert "admitted 8" in stdout
    for step in (0, 1):  # both ranks took part in both mini-batches
        assert stdout.count(f"step {step}: train batch 0 mini-batch {step}") == 2
    assert "released 2 mini-batches" in stdout
    assert running_with(f"--job {JOB} ") == []
    left = [p for p in (work / "knittrans-connection.json", work / "knittrans-connection.json.lock",
                        Path(f"/tmp/knittrans-{JOB}"), Path(f"/dev/shm/knittrans-{JOB}")) if p.exists()]
    left += [n for n in os.listdir("/dev/shm") if n.startswith(f"knittrans-{JOB}@")]
    left += [n for n in os.listdir("/tmp") if n.startswith(f"knittrans-up-{JOB}-")]
    assert left == []
