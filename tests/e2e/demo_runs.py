"""Shortened runs of the demo commands that `make demo` and the README give, and what every such run must show
from outside (the e2e tests of test_demo.py and test_demo_roles.py)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

from knittrans.shm import list_segments
from tests.doc_blocks import make_recipe, readme_commands
from tests.live_processes import running_with

# `make demo`, then every `knittrans demo` command of the README, verbatim, from a fresh directory and with the
# default output directory; only `--train-batches 2` is added, to keep the run short. `make demo` runs twice at
# once (test_two_demos_at_once_...), and the README's `--roles` commands run in test_demo_roles.py, whose checks
# go further; every other command runs here.
MAKE_DEMO = make_recipe("demo")
README_DEMOS = readme_commands("knittrans demo")
ROLES_DEMOS = [c for c in README_DEMOS if "--roles" in c]
DEMO_COMMANDS = [c for c in README_DEMOS if c not in ROLES_DEMOS and c not in MAKE_DEMO]
SHORTER = ("--train-batches", "2")
ENVIRONMENT = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}


def run_readme_demo(command: str, cwd: Path) -> subprocess.CompletedProcess:
    """``command`` verbatim but shorter, with the venv's ``knittrans`` on PATH; stdout and stderr are pipes, as in
    CI or `make demo > log`."""
    return subprocess.run([*shlex.split(command), *SHORTER], cwd=cwd, env=ENVIRONMENT, capture_output=True,
                          text=True, timeout=400)


def check_demo_run(result: subprocess.CompletedProcess, out: Path) -> dict:
    """What every shortened demo run must show from outside; returns its report."""
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
    assert not Path(f"/tmp/knittrans-{report['job']}").exists()  # the sidecars' sockets
    return report
