"""``benchmarks/dispatch_build.py`` plans and builds a mini-batch's messages for the cluster-scale topology and
prints its figures as JSON."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.doc_blocks import ROOT


def test_the_dispatch_build_benchmark_builds_every_consumer_s_message_and_reports_its_figures() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "dispatch_build.py"), "--trajectories", "64", "--rounds", "1",
         "--repeats", "1"], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    [cell] = json.loads(result.stdout)["cells"]
    # One message per backbone DP rank (its CP ranks share it) and one per encoder rank: 64 + 64.
    assert cell["trajectories"] == 64 and cell["consumers"] == 128
    assert cell["message_bytes"] > 64 * 100  # every trajectory's metadata went out
    assert 0 < cell["plan_ms"] and 0 < cell["build_ms"]
    assert cell["plan_and_build_ms"] >= max(cell["plan_ms"], cell["build_ms"])
