"""The integration examples run against a real admission service and a real reorg sidecar (subprocesses)."""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from pathlib import Path

import yaml

from knittrans.stack.processes import ProcessGroup

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples" / "integration"


def test_rollout_worker_and_trainer_loop_examples(tmp_path: Path) -> None:
    job = f"ex{uuid.uuid4().hex[:6]}"
    store = f"file://{tmp_path / 'units'}"
    config = tmp_path / "admission.yaml"
    config.write_text(yaml.safe_dump({
        "job": job, "store": store,
        "engine": {"train_batch_size": 8, "num_minibatches": 2, "sources": {"math": 0.5, "code": 0.5}},
        "topology": {"backbone": {"dp": 1, "cp": 1, "max_tokens_per_microbatch": 96},
                     "encoders": [{"name": "vision", "dp": 1, "max_cost_per_microbatch": 16}]},
        "server": {"port": 0, "metrics": {"port": -1}},
    }))
    group = ProcessGroup(tmp_path / "logs")
    try:
        admission = group.start("admission", [sys.executable, "-m", "knittrans.cli", "admission", "serve",
                                              "--config", str(config), "--ready-file", str(tmp_path / "a.json")])
        address = group.wait_ready(admission, tmp_path / "a.json")["address"]
        # No --job: the sidecar serves the admission service's job, where that job's trainers look for it.
        sidecar = group.start("sidecar", [sys.executable, "-m", "knittrans.cli", "reorg", "serve",
                                          "--store", store, "--admission", address, "--metrics-port", "-1",
                                          "--ready-file", str(tmp_path / "s.json")])
        socket = group.wait_ready(sidecar, tmp_path / "s.json")["address"]
        assert socket == f"unix:/tmp/knittrans-{job}/reorg-backbone-dp0-cp0.sock"
        # Every planned consumer runs its sidecar: a mini-batch goes out once every one verified its part. Nobody
        # consumes the encoder's micro-batches here; its sidecar verifies regardless.
        encoder = group.start("encoder-sidecar", [sys.executable, "-m", "knittrans.cli", "reorg", "serve", "--job",
                                                  job, "--role", "encoder:vision", "--store", store, "--admission",
                                                  address, "--metrics-port", "-1", "--ready-file",
                                                  str(tmp_path / "e.json")])
        group.wait_ready(encoder, tmp_path / "e.json")
        rollout = subprocess.run(
            [sys.executable, str(EXAMPLES / "rollout_worker.py"), "--admission", address, "--store", store,
             "--count", "8", "--encoder", "vision"], capture_output=True, text=True, timeout=120,
        )
        assert rollout.returncode == 0, rollout.stderr
        assert rollout.stdout.count("submitted example-") == 8
        assert "admitted 8" in rollout.stdout  # both mini-batches of the train batch
        trainer = subprocess.run(
            [sys.executable, str(EXAMPLES / "trainer_loop.py"), "--sidecar", socket, "--admission", address,
             "--minibatches", "2"], capture_output=True, text=True, timeout=120,
        )
        assert trainer.returncode == 0, trainer.stderr
        assert "step 0: train batch 0 mini-batch 0" in trainer.stdout
        assert "step 1: train batch 0 mini-batch 1" in trainer.stdout
        # One rank holds the whole mini-batch here: the positions its loss selects are all the loss tokens.
        counts = re.findall(r"loss tokens here (\d+) of (\d+) in the mini-batch", trainer.stdout)
        assert len(counts) == 2 and all(here == total for here, total in counts), trainer.stdout
        group.check()  # the service and the sidecar are still up
    finally:
        group.stop_all()


def test_the_rollout_example_with_its_defaults_is_accepted_by_the_shipped_config(tmp_path: Path) -> None:
    """deploy/k8s's admission config, as shipped (only the listening addresses moved to loopback and free ports,
    and the job renamed: the session's live deploy stack serves the shipped job name, and a job has one service)."""
    shipped = ROOT / "deploy" / "k8s" / "base" / "admission" / "admission.yaml"
    store = f"file://{tmp_path / 'units'}"
    group = ProcessGroup(tmp_path / "logs")
    try:
        admission = group.start("admission", [
            sys.executable, "-m", "knittrans.cli", "admission", "serve", "--config", str(shipped),
            "--host", "127.0.0.1", "--port", "0", "--metrics-port", "-1", "--store", store,
            "--job", f"example-{uuid.uuid4().hex[:6]}", "--ready-file", str(tmp_path / "a.json")])
        address = group.wait_ready(admission, tmp_path / "a.json")["address"]
        rollout = subprocess.run(
            [sys.executable, str(EXAMPLES / "rollout_worker.py"), "--admission", address, "--store", store],
            capture_output=True, text=True, timeout=120,
        )
        assert rollout.returncode == 0, rollout.stderr
        assert "admission: pool 8" in rollout.stdout  # all accepted; a train batch of 256 is far away
    finally:
        group.stop_all()


def test_the_async_rollout_example_submits_concurrently_and_a_rejected_submit_leaves_nothing(tmp_path: Path) -> None:
    """examples/integration/async_rollout.py, as its docstring runs it, against the shipped quick-start config (the
    job renamed, on a free port and a store of its own): first with a source the job lacks, then as is."""
    config = yaml.safe_load((EXAMPLES / "admission.yaml").read_text())
    config["job"] = f"aex{uuid.uuid4().hex[:6]}"
    units = tmp_path / "units"
    store = f"file://{units}"
    config["store"] = store
    config["server"] = {"host": "127.0.0.1", "port": 0, "metrics": {"port": -1}}
    (tmp_path / "admission.yaml").write_text(yaml.safe_dump(config))
    group = ProcessGroup(tmp_path / "logs")
    try:
        admission = group.start("admission", [sys.executable, "-m", "knittrans.cli", "admission", "serve",
                                              "--config", str(tmp_path / "admission.yaml"),
                                              "--ready-file", str(tmp_path / "a.json")])
        address = group.wait_ready(admission, tmp_path / "a.json")["address"]
        command = [sys.executable, str(EXAMPLES / "async_rollout.py"), "--admission", address, "--store", store]
        rejected = subprocess.run([*command, "--sources", "poetry"], capture_output=True, text=True, timeout=120)
        assert rejected.returncode != 0
        assert "InvalidArgument" in rejected.stderr and "source" in rejected.stderr, rejected.stderr[-2000:]
        assert [p for p in units.rglob("*") if p.is_file()] == []  # nothing of the rejected submits stays
        rollout = subprocess.run([*command, "--count", "8", "--concurrency", "4"], capture_output=True, text=True,
                                 timeout=120)
        assert rollout.returncode == 0, rollout.stderr
        assert rollout.stdout.count("submitted async-example-") == 8
        assert "admitted 8" in rollout.stdout
        group.check()
    finally:
        group.stop_all()


def test_the_documented_schema_is_the_shipped_example_and_loads(tmp_path: Path) -> None:
    """docs/integration.md's schema block is examples/integration/admission-schema.yaml's, verbatim, and the one
    config loader builds it (unknown keys would be errors)."""
    from knittrans.admission.service.settings import AdmissionServiceSettings
    from knittrans.config import load_config
    from knittrans.types import Coverage
    from knittrans.values import MetadataKind, ScalarKind

    docs = (ROOT / "docs" / "integration.md").read_text()
    blocks = re.findall(r"```yaml\n(schema:\n.*?)```", docs, re.DOTALL)
    assert len(blocks) == 1
    shipped = (EXAMPLES / "admission-schema.yaml").read_text()
    assert blocks[0] in shipped
    settings = load_config(AdmissionServiceSettings, path=EXAMPLES / "admission-schema.yaml", env={})
    assert settings.schema is not None
    assert settings.schema.scalars["num_turns"].kind is ScalarKind.INT
    assert settings.schema.metadata["ground_truth"].kind is MetadataKind.JSON
    assert settings.schema.token_fields["old_logprobs"].coverage is Coverage.RESPONSE
    assert yaml.safe_load(blocks[0])["schema"].keys() == {"token_fields", "fields", "scalars", "metadata"}
