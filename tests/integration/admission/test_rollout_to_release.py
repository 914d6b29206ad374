"""A rollout worker's submit() writes units to a real file store and reports them; once every planned
consumer reports the optimizer step, the service deletes the released units from that store."""

from __future__ import annotations

import asyncio
import uuid

import numpy as np

from knittrans.admission.service.app import start_admission_service
from knittrans.client.admission import AdmissionClient, ProgressStage
from knittrans.client.reporter import BatchingReporter
from knittrans.rollout import MultimodalInput, RolloutClient
from knittrans.store.factory import open_store
from knittrans.types import TokenSpan, VersionSegment

from .builders import service_settings
from .test_admission_service import CONSUMERS


async def test_submit_report_admit_release_delete(tmp_path) -> None:
    store_url = f"file://{tmp_path / 'units'}"
    running = await start_admission_service(service_settings(store=store_url, job=f"t{uuid.uuid4().hex[:6]}"))
    try:
        def scenario() -> None:
            store = open_store(store_url)
            rng = np.random.default_rng(0)
            with AdmissionClient(running.address) as client:
                reporter = BatchingReporter(client)
                rollout = RolloutClient(store, namespace="job", reporter=reporter)
                for i in range(8):
                    tokens = int(rng.integers(40, 90))
                    rollout.submit(
                        {"input_ids": rng.integers(0, 1000, tokens, dtype=np.int32),
                         "loss_mask": (np.arange(tokens) > 10).astype(np.uint8),
                         "routing": rng.integers(0, 8, (tokens, 4), dtype=np.uint8)},
                        trajectory_id=f"t{i}", sample_id=f"s{i // 4}", source="AB"[i % 2], rollout_step=0,
                        segments=(VersionSegment(version=0, num_tokens=tokens - 11),),
                        multimodal=(MultimodalInput(data=np.full((8, 8, 3), i // 4, np.uint8), encoder="vision",
                                                    cost=4.0, placeholder=TokenSpan(start=2, end=6)),),
                    )
                reporter.close()
                assert client.status().admitted_total == 8
                stored = sorted(p.name for p in (tmp_path / "units").rglob("*") if p.is_file())
                assert stored  # 8 trajectories x 3 fields + 2 shared images
                for sequence in (1, 2):
                    for consumer in CONSUMERS:
                        client.report_progress(consumer, sequence, ProgressStage.OPTIMIZER_STEP)
                assert client.status().released_minibatches == 2
            store.close()

        await asyncio.to_thread(scenario)
        for _ in range(100):  # deletion runs in the background, in batches
            if not any(p.is_file() for p in (tmp_path / "units").rglob("*")):
                break
            await asyncio.sleep(0.05)
        assert not any(p.is_file() for p in (tmp_path / "units").rglob("*"))
    finally:
        await running.stop(0)
