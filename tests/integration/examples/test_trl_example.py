"""examples/integrations/trl/grpo.py runs as docs/integrations/trl.md runs it: its own admission config (moved to
a free port and a store of its own), the service, one sidecar, and the script training four steps through
KnitTrans, saving a checkpoint that it reports."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from knittrans.demo.stack.processes import ProcessGroup

pytest.importorskip("trl")

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "integrations" / "trl" / "grpo.py"


def test_the_trl_example_trains_through_knittrans(tmp_path: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    written = subprocess.run([sys.executable, str(EXAMPLE), "--write-config", str(tmp_path / "trl.yaml")],
                             capture_output=True, text=True, timeout=120, env=env)
    assert written.returncode == 0, written.stderr
    config = yaml.safe_load((tmp_path / "trl.yaml").read_text())
    config["job"] = f"trl{uuid.uuid4().hex[:6]}"
    store = f"file://{tmp_path / 'units'}"
    config["store"] = store
    config["server"] = {"host": "127.0.0.1", "port": 0, "metrics": {"port": -1}}
    (tmp_path / "trl.yaml").write_text(yaml.safe_dump(config))
    group = ProcessGroup(tmp_path / "logs")
    try:
        admission = group.start("admission", [sys.executable, "-m", "knittrans.cli", "admission", "serve",
                                              "--config", str(tmp_path / "trl.yaml"),
                                              "--ready-file", str(tmp_path / "a.json")])
        address = group.wait_ready(admission, tmp_path / "a.json")["address"]
        sidecar = group.start("sidecar", [sys.executable, "-m", "knittrans.cli", "reorg", "serve", "--store", store,
                                          "--admission", address, "--metrics-port", "-1",
                                          "--ready-file", str(tmp_path / "s.json")])
        socket = group.wait_ready(sidecar, tmp_path / "s.json")["address"]
        run = subprocess.run([sys.executable, str(EXAMPLE), "--admission", address, "--store", store, "--sidecar",
                              socket, "--output-dir", str(tmp_path / "out")],
                             capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
        assert run.returncode == 0, run.stderr[-4000:]
        assert [line.split(":")[0] for line in run.stdout.splitlines() if line.startswith("step ")] == [
            "step 1", "step 2", "step 3", "step 4"]
        assert "trained 4 steps through KnitTrans: policy version 4, admitted 32" in run.stdout, run.stdout
        step_file = tmp_path / "out" / "checkpoint-2" / "knittrans-step.json"
        assert step_file.exists()  # the checkpoint says which KnitTrans step it holds
        group.check()
    finally:
        group.stop_all()
