"""A SIGTERM to ``benchmarks/transfer.py`` in the middle of a run ends it through its clean-up: the admission
service and the sidecars it started (each in a session of its own, so nothing else stops them) are stopped, and
its file store leaves /dev/shm. Before, they ran on as orphans, with the store's units in /dev/shm.

The oracle is /proc and /dev/shm: the benchmark's child processes, found while it runs, and its store's
directory, read from the admission service's config."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from knittrans.shm import remove_segments
from tests.doc_blocks import ROOT
from tests.live_processes import children_of, live_processes


def test_a_terminated_transfer_benchmark_stops_its_cluster_and_removes_its_store(tmp_path: Path) -> None:
    log = tmp_path / "benchmark.log"
    with open(log, "wb") as output:
        benchmark = subprocess.Popen(
            [sys.executable, str(ROOT / "benchmarks" / "transfer.py"), "--smoke", "--skip-transferqueue", "--store",
             "file", "--no-roles-arm", "--steps", "30"],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=output)
    cluster: dict[int, str] = {}
    config: dict = {}
    run_directory: Path | None = None  # a run that did not finish keeps its logs there
    try:
        deadline = time.monotonic() + 180
        while "step 1 (cold)" not in log.read_text():  # its cluster is up and running a measured step
            assert benchmark.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        cluster = {pid: command for pid, command in children_of(benchmark.pid).items()
                   if "admission serve" in command or "reorg serve" in command}
        assert sum("reorg serve" in command for command in cluster.values()) >= 2
        admission = next(command for command in cluster.values() if "admission serve" in command)
        config_path = Path(admission.split("--config ")[1].split()[0])
        run_directory = config_path.parent
        config = yaml.safe_load(config_path.read_text())
        store = Path(config["store"].removeprefix("file://"))
        assert store.is_dir()

        benchmark.send_signal(signal.SIGTERM)
        assert benchmark.wait(timeout=120) == 128 + signal.SIGTERM, log.read_text()[-3000:]
        deadline = time.monotonic() + 30
        while set(cluster) & set(live_processes()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [cluster[pid] for pid in set(cluster) & set(live_processes())]
        assert not store.exists()
    finally:
        if benchmark.poll() is None:
            benchmark.kill()
            benchmark.wait()
        for pid in set(cluster) & set(live_processes()):  # what a failed clean-up left
            os.kill(pid, signal.SIGKILL)
        if run_directory is not None:
            shutil.rmtree(run_directory, ignore_errors=True)
        if config:
            shutil.rmtree(config["store"].removeprefix("file://"), ignore_errors=True)
            remove_segments(f"knittrans-{config['job']}@")


_START_WITH_BROKEN_SIDECARS = """
import sys
from pathlib import Path

from transfer_knittrans_cluster import start_cluster
from transfer_workload import SMOKE

try:
    start_cluster(SMOKE, store="file", directory=Path(sys.argv[1]), slots=0, encoder_microbatch_images=4)
except RuntimeError as error:
    print("start failed:", str(error).splitlines()[0])
    sys.exit(3)
"""


def test_a_cluster_whose_sidecars_cannot_start_stops_what_did_start(tmp_path: Path) -> None:
    """A ring of 0 slots is refused by every sidecar, after the admission service started: the failed start
    stops the admission service and removes the store, where before both outlived the benchmark."""
    run_directory = tmp_path / "run"
    run_directory.mkdir()
    before = set(live_processes())
    try:
        result = subprocess.run([sys.executable, "-c", _START_WITH_BROKEN_SIDECARS, str(run_directory)],
                                cwd=ROOT / "benchmarks", capture_output=True, text=True, timeout=120)
        assert result.returncode == 3, result.stdout + result.stderr
        assert "did not start" in result.stdout
        config = yaml.safe_load((run_directory / "admission.yaml").read_text())
        left = [command for pid, command in live_processes().items()
                if pid not in before and str(run_directory) in command]
        assert not left
        assert not Path(config["store"].removeprefix("file://")).exists()
    finally:
        for pid, command in live_processes().items():  # what a failed clean-up left
            if pid not in before and str(run_directory) in command:
                os.kill(pid, signal.SIGKILL)
