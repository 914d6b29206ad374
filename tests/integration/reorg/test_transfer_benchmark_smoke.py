"""``benchmarks/transfer.py --smoke`` runs both KnitTrans arms one after the other on one cluster, end to end.

Each arm runs a warm-up step, the cold step (its clock started as the step's last trajectory is reported), the
extra cold step reported whole inside its clock, and the steady state. The arms share one admission service, so
the second must use trajectory ids of its own: an arm that reused the first one's would have its reports taken as
duplicates and wait for ever (the time-out below). Every step also checks inside the benchmark that every real
token and image was delivered. With ``--output`` the figure is written beside the JSON. A run that finishes
leaves no run directory behind (each left its logs and configs in the temporary directory, one per run)."""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.doc_blocks import ROOT


def _run_directories() -> set[Path]:
    return set(Path(tempfile.gettempdir()).glob("kt-transfer-*"))


def test_the_transfer_benchmark_runs_both_knittrans_arms_with_both_cold_clocks(tmp_path: Path) -> None:
    before = _run_directories()
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "transfer.py"), "--smoke", "--skip-transferqueue", "--store",
         "file", "--no-roles-arm", "--steps", "3", "--output", str(tmp_path / "transfer.json")],
        cwd=ROOT, capture_output=True, text=True, timeout=240, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    document = json.loads(result.stdout)
    assert json.loads((tmp_path / "transfer.json").read_text()) == document
    assert (tmp_path / "transfer.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # the figure, beside the JSON
    [run] = document["runs"]
    trajectories = document["workload"]["trajectories"]
    assert set(run["arms"]) == {"knittrans-iter-file", "knittrans-eager-file"}
    for arm in document["arms"]:
        steps = arm["steps"]
        assert [s["kind"] for s in steps] == ["cold", "cold-whole-step-report", "steady", "steady"]
        assert [s["trajectories_in_last_report"] for s in steps] == [1, trajectories, 1, 1]
        assert arm["steps_run"] == 5  # the warm-up step too
        assert arm["exposed_one_clock_cold_s"] == steps[0]["exposed_one_clock_s"]
        assert arm["exposed_one_clock_cold_whole_step_report_s"] == steps[1]["exposed_one_clock_s"]
        assert arm["amplification"] == 1.0
        figures = run["arms"][arm["arm"]]
        assert figures["exposed_one_clock_cold_whole_step_report_s"] > 0
        # The loop thread's CPU for its takes: some in every step, and the steady figure is the steady steps'.
        take_cpu = [max(s["loop_take_cpu_s_per_dp_group"]) for s in steps]
        assert all(cpu_s > 0 for cpu_s in take_cpu)
        assert figures["steady_loop_take_cpu_s_per_step"] == statistics.median(take_cpu[2:])
        cpu = arm["cold_step_cpu"]
        groups = ("admission", "backbone_sidecars", "encoder_sidecars", "trainer_processes", "driver")
        assert all(cpu[f"{group}_cpu_s"] > 0 for group in groups)  # each of them works in a cold step
        assert cpu["total_cpu_s"] == sum(cpu[f"{group}_cpu_s"] for group in groups)
        assert 0 < cpu["busy_fraction_of_cpus"] <= 1.1  # no more CPU than the machine had in the window
    assert document["knittrans"]["stores"]["file"]["logs"] is None
    assert _run_directories() <= before


def test_a_step_past_its_timeout_dumps_every_processs_stacks_and_keeps_the_logs() -> None:
    """A step timeout shorter than a step stands in for a hang: the run fails naming the stall and the cluster's
    log directory, kept, where the admission service and every sidecar wrote their threads' stacks (SIGUSR1); the
    DP groups wrote theirs to the benchmark's stderr."""
    before = _run_directories()
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "transfer.py"), "--smoke", "--skip-transferqueue", "--store",
         "file", "--no-roles-arm", "--steps", "2", "--step-timeout-s", "0.01"],
        cwd=ROOT, capture_output=True, text=True, timeout=240, check=False)
    kept = _run_directories() - before
    try:
        assert result.returncode != 0
        assert " s; every process's stacks were dumped" in result.stderr, result.stderr[-3000:]
        [directory] = kept
        assert str(directory) in result.stderr
        logs = {path.name: path.read_text() for path in directory.glob("*.log")}
        assert "admission.log" in logs and any(name.startswith("backbone") for name in logs), sorted(logs)
        assert any(name.startswith("encoder") for name in logs), sorted(logs)
        for name, text in logs.items():  # the admission service and every sidecar: nothing else logs here
            assert "Current thread" in text or "Thread 0x" in text, name
        assert result.stderr.count("Thread 0x") >= 2  # the DP groups' threads
    finally:
        for directory in kept:
            shutil.rmtree(directory, ignore_errors=True)
