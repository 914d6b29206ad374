"""Demo rollout workers against a real admission service and file store: everything they generate is stored
once (images once per sample) and reported, quotas can be met, and the version throttle holds a worker back
until training advances the policy version."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np

from knittrans.admission.engine import EngineConfig
from knittrans.admission.service.app import start_admission_service
from knittrans.admission.service.settings import AdmissionServiceSettings
from knittrans.client.admission import AdmissionClient
from knittrans.demo.workload import WorkloadSpec, generate_sample, source_sequence
from knittrans.serving.settings import MetricsSettings, ServerSettings
from knittrans.store.factory import open_store
from knittrans.types import BackboneTopology, EncoderTopology, Topology

WORKLOAD = WorkloadSpec(group_size=4, seed=5)
TRAIN_BATCH = 16  # four samples: one per source, so every source quota (a quarter) can be met
NUM_SAMPLES = 8


def service_settings(store_url: str) -> AdmissionServiceSettings:
    return AdmissionServiceSettings(
        engine=EngineConfig(
            train_batch_size=TRAIN_BATCH,
            num_minibatches=2,
            sources={s.name: s.share for s in WORKLOAD.sources},
        ),
        topology=Topology(
            backbone=BackboneTopology(dp=2, cp=2, max_tokens_per_microbatch=256),
            encoders=(EncoderTopology(name="vision", dp=2, max_cost_per_microbatch=64),),
        ),
        job=f"demo{uuid.uuid4().hex[:6]}",
        state="memory",
        store=store_url,
        server=ServerSettings(port=0, metrics=MetricsSettings(port=0)),
    )


def wait_for(condition, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def start_worker(index: int, address: str, store_url: str, manifest: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "knittrans.demo.rollout_worker",
            f"--admission={address}",
            f"--store={store_url}",
            f"--num-samples={NUM_SAMPLES}",
            f"--worker-index={index}",
            "--num-workers=2",
            f"--seed={WORKLOAD.seed}",
            f"--group-size={WORKLOAD.group_size}",
            "--time-scale=0.02",
            "--concurrency=2",
            f"--train-batch-size={TRAIN_BATCH}",
            "--max-versions-ahead=0",
            "--poll-seconds=0.02",
            f"--manifest={manifest}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


async def test_workers_store_and_report_everything_and_wait_for_training(tmp_path: Path) -> None:
    store_url = f"file://{tmp_path / 'units'}"
    running = await start_admission_service(service_settings(store_url))
    manifests = [tmp_path / f"worker{i}.json" for i in range(2)]
    workers = [start_worker(i, running.address, store_url, manifests[i]) for i in range(2)]
    try:

        def scenario() -> None:
            with AdmissionClient(running.address) as client:
                # Train batch 0 (samples 0-3) is generated at version 0 and admitted whole; the samples meant
                # for train batch 1 wait for version 1, which training announces.
                wait_for(lambda: client.status().admitted_total == TRAIN_BATCH, "train batch 0")
                assert client.advance_version(0, 1) == 1
                for worker in workers:
                    log = worker.communicate(timeout=60)[0].decode(errors="replace")
                    assert worker.returncode == 0, log
                wait_for(lambda: client.status().admitted_total == NUM_SAMPLES * WORKLOAD.group_size, "train batch 1")

        await asyncio.to_thread(scenario)
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
        await running.stop(0)

    reports = [json.loads(m.read_text()) for m in manifests]
    trajectories = {tid: t for r in reports for tid, t in r["trajectories"].items()}
    assert len(trajectories) == NUM_SAMPLES * WORKLOAD.group_size
    assert sum(r["samples"] for r in reports) == NUM_SAMPLES
    sources = source_sequence(WORKLOAD, NUM_SAMPLES)
    assert {t["source"] for t in trajectories.values()} == set(WORKLOAD.source_names)
    for trajectory in trajectories.values():
        sample_index = int(trajectory["sample_id"].split("-s")[1])
        assert trajectory["source"] == sources[sample_index]
        assert trajectory["version"] == (0 if sample_index < 4 else 1)  # generated under the version it waited for
        assert {u["field"] for u in trajectory["units"].values()} == {"input_ids", "loss_mask", "logprobs", "routing"}
        assert len(trajectory["multimodal"]) == 1
    images = {key for t in trajectories.values() for key in t["multimodal"]}
    assert len(images) == NUM_SAMPLES  # one stored image per sample, shared by its group
    unit_bytes = sum(u["bytes"] for t in trajectories.values() for u in t["units"].values())
    image_bytes = NUM_SAMPLES * int(np.prod(WORKLOAD.image_shape))
    assert sum(r["bytes_written"] for r in reports) == unit_bytes + image_bytes

    # The stored bytes are the generated ones.
    store = open_store(store_url)
    try:
        for trajectory_id, trajectory in trajectories.items():
            sample_index = int(trajectory["sample_id"].split("-s")[1])
            member = int(trajectory_id.rsplit("-t", 1)[1])
            sample = generate_sample(WORKLOAD, sample_index, sources[sample_index])
            for key, unit in trajectory["units"].items():
                buffer = np.zeros(unit["bytes"], dtype=np.uint8)
                store.get_into(key, buffer)
                assert buffer.tobytes() == sample.trajectories[member].fields[unit["field"]].tobytes(), key
            (key,) = trajectory["multimodal"]
            image = np.zeros(sample.image.nbytes, dtype=np.uint8)
            store.get_into(key, image)
            assert image.tobytes() == sample.image.tobytes()
    finally:
        store.close()
