"""`knittrans demo --chaos SEED`, short: the documented commands run verbatim and pass, with faults injected.

The run's own oracle (knittrans.demo.chaos.oracle, unit-tested in tests/unit/demo/test_chaos_oracle.py) judges it
from the clients' logs; this test also checks from outside that nothing the run started is left behind.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from knittrans.shm import list_segments
from tests.doc_blocks import ROOT, bash_blocks, commands
from tests.live_processes import running_with

CHAOS_COMMANDS = [c for b in bash_blocks(ROOT / "docs" / "failures.md") for c in commands(b) if "--chaos" in c]


def test_the_failures_doc_shows_chaos_commands() -> None:
    assert len(CHAOS_COMMANDS) >= 2
    assert all(c.startswith("knittrans demo ") for c in CHAOS_COMMANDS)


@pytest.mark.parametrize("command", CHAOS_COMMANDS)
def test_chaos_run_passes_with_faults_injected(tmp_path: Path, command: str) -> None:
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    environment = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    result = subprocess.run(shlex.split(command), cwd=tmp_path, env=environment, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-3000:]
    *summary_lines, line = result.stdout.strip().splitlines()
    summary = json.loads("\n".join(summary_lines))
    assert line.startswith(f"chaos seed {summary['seed']}: PASSED")
    assert summary["passed"] and summary["faults_injected"] >= 1
    checks = summary["checks"]
    for name in ("trained_exactly_once", "no_partial_step", "quotas_held", "finished", "nothing_left_behind"):
        assert checks[name], checks
    details = checks["details"]
    # 4 train batches of 16: each trained once, or lost with a unit when a store kill took it (and reported so).
    assert details["acked"] == 64 and details["trained"] + details["lost"] == 64, details
    assert len(details.get("lost_with_a_unit", [])) == min(details["lost"], 10)
    out = Path(summary["out"])
    assert json.loads((out / "chaos-report.json").read_text()) == summary
    # The admission service journals in the run's Redis: in memory, its kills would lose the job's state.
    assert yaml.safe_load((out / "admission.yaml").read_text())["state"].startswith("redis://")
    assert running_with(str(out)) == []
    assert list_segments(f"knittrans-{summary['job']}") == []
    assert not Path(f"/tmp/knittrans-{summary['job']}").exists()
