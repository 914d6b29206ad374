"""docs/integrations/trl.md runs verbatim: its ```bash block, in one bash session, in a directory that holds a copy
of `examples/`, as a reader at the repository root runs it. The example writes its stack config, `knittrans up`
starts the job's services, and the script, which names no address, trains four steps through KnitTrans and saves
a checkpoint that it reports. The oracle is what the page promises: four optimizer steps, four policy versions,
the whole of every train batch admitted, a checkpoint that says which KnitTrans step it holds, and once the stack
is stopped nothing of the job left behind."""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.doc_blocks import ROOT, bash_blocks, commands, run_bash_blocks
from tests.integration.examples.test_docs import environment, repository_copy
from tests.live_processes import running_with

pytest.importorskip("trl")

PAGE = ROOT / "docs" / "integrations" / "trl.md"
JOB = "trl"  # written by the example's --write-config


@pytest.fixture
def job_paths() -> Iterator[None]:
    """The page's job name is fixed, so its paths are global: one run at a time on this machine."""
    with open(f"/tmp/knittrans-{JOB}-doc-test.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def test_the_page_names_no_address() -> None:
    lines = [c for block in bash_blocks(PAGE) for c in commands(block)]
    assert "knittrans up --config trl-stack.yaml &" in lines
    assert not any(flag in line for line in lines for flag in ("--admission", "--sidecar", "--store", "unix:"))


def test_the_trl_example_trains_through_knittrans_up(tmp_path: Path, job_paths: None) -> None:
    work = repository_copy(tmp_path)
    returncode, stdout, stderr = run_bash_blocks(PAGE, cwd=work, env={**environment(), "HF_HUB_OFFLINE": "1"},
                                                 timeout=400)
    assert returncode == 0, stdout[-3000:] + stderr[-5000:]
    assert f"knittrans up: job {JOB} is ready" in stdout
    assert [line.split(":")[0] for line in stdout.splitlines() if line.startswith("step ")] == [
        "step 1", "step 2", "step 3", "step 4"]
    # Each train batch is one TRL generation batch (8 prompts x 4 generations), admitted whole.
    assert "trained 4 steps through KnitTrans: policy version 4, admitted 32" in stdout, stdout
    step = json.loads((work / "trl-knittrans-out" / "checkpoint-2" / "knittrans-step.json").read_text())
    assert step, "the checkpoint says which KnitTrans step it holds"
    assert running_with(f"--job {JOB} ") == []
    left = [p for p in (work / "knittrans-connection.json", Path(f"/tmp/knittrans-{JOB}"),
                        Path(f"/dev/shm/knittrans-{JOB}")) if p.exists()]
    left += [n for n in os.listdir("/dev/shm") if n.startswith(f"knittrans-{JOB}@")]
    assert left == []
