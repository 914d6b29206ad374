"""``benchmarks/release_report.py`` runs end to end on a small mini-batch: a real admission service admits each
round's trajectories, only the last consumer's optimizer step releases the mini-batch (the benchmark checks every
report's answer), and the figures come out as JSON."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.doc_blocks import ROOT


def test_the_release_report_benchmark_runs_and_reports_its_figures() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "release_report.py"), "--sizes", "64", "--rounds", "2"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout)
    assert figures["consumers"] == 10
    [size] = figures["sizes"]
    assert size["trajectories"] == 64 and size["rounds"] == 2
    assert 0 < size["plain_report_p50_ms"] and 0 < size["releasing_report_p50_ms"] <= size["releasing_report_max_ms"]
    assert "round 2/2" in result.stderr
