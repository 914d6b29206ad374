"""`knittrans admission serve` with a `ray://` store, as a real process on one node: it joins the Ray cluster the
URL names (`address=`), and the units a rollout wrote through that store are deleted once they are released."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np

from knittrans.client.admission import AdmissionClient, ProgressStage
from knittrans.client.reporter import BatchingReporter
from knittrans.rollout import RolloutClient
from knittrans.store.ray_store import RayUnitStore
from knittrans.types import VersionSegment
from tests.fixtures.ray import TEST_NAMESPACE

from .test_admission_service import CONSUMERS

CONFIG = """
job: {job}
store: "ray://{registry}?namespace={namespace}&address={address}"
engine: {{train_batch_size: 8, num_minibatches: 2, sources: {{A: 0.25, B: 0.25}}}}
topology:
  backbone: {{dp: 2, cp: 2, max_tokens_per_microbatch: 4096}}
  encoders: [{{name: vision, dp: 1, max_cost_per_microbatch: 64}}]
server: {{port: 0, metrics: {{port: -1}}}}
"""


def test_admission_serve_deletes_released_units_from_a_ray_store(ray_session, tmp_path: Path) -> None:
    import ray

    registry = f"knittrans-test-service-{uuid.uuid4().hex[:8]}"
    gcs = ray.get_runtime_context().gcs_address
    config = tmp_path / "admission.yaml"
    config.write_text(CONFIG.format(job=f"ray{uuid.uuid4().hex[:6]}", registry=registry, namespace=TEST_NAMESPACE,
                                    address=gcs))
    ready = tmp_path / "ready.json"
    log = tmp_path / "admission.log"
    with open(log, "wb") as output:
        service = subprocess.Popen([sys.executable, "-m", "knittrans.cli", "admission", "serve", "--config",
                                    str(config), "--ready-file", str(ready)], stdout=output, stderr=subprocess.STDOUT)
    store = None
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert service.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.1)
        address = json.loads(ready.read_text())["address"]
        store = RayUnitStore(registry=registry, namespace=TEST_NAMESPACE)  # the service created it, or will
        rng = np.random.default_rng(0)
        with AdmissionClient(address) as client:
            reporter = BatchingReporter(client)
            rollout = RolloutClient(store, namespace="job", reporter=reporter)
            for i in range(8):
                tokens = int(rng.integers(40, 90))
                rollout.submit(
                    {"input_ids": rng.integers(0, 1000, tokens, dtype=np.int32),
                     "loss_mask": (np.arange(tokens) > 10).astype(np.uint8)},
                    trajectory_id=f"t{i}", sample_id=f"s{i // 4}", source="AB"[i % 2], rollout_step=0,
                    segments=(VersionSegment(version=0, num_tokens=tokens - 11),),
                )
            reporter.close()
            assert client.status().admitted_total == 8
            assert store.count() == 16
            for sequence in (1, 2):
                for consumer in CONSUMERS:
                    client.report_progress(consumer, sequence, ProgressStage.OPTIMIZER_STEP)
            assert client.status().released_minibatches == 2
        deadline = time.monotonic() + 30  # the service deletes released units in the background
        while store.count() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert store.count() == 0
    finally:
        service.send_signal(signal.SIGTERM)
        code = service.wait(timeout=60)
        if store is not None:
            store.destroy()
    assert code == 0, log.read_text()[-3000:]
