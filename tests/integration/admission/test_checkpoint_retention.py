"""Retention follows checkpoints through a real admission service journaled in a real Redis: stepped mini-batches
are held until a reported checkpoint covers them, their assignments can be streamed again, and a kill -9 and
restart keeps the checkpoint and what it released (DESIGN.md §9)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from knittrans.client.admission import AdmissionClient, ProgressStage
from knittrans.errors import FailedPrecondition
from knittrans.steps import StepId
from knittrans.types import ConsumerId

from .builders import SOURCES, make_meta
from .test_crash_recovery import ServiceProcess

CONSUMER = ConsumerId(role="backbone", dp_rank=0, cp_rank=0)


def write_config(path: Path, redis_url: str) -> Path:
    path.write_text(yaml.safe_dump({
        "job": "retention",
        "state": redis_url,
        "engine": {"train_batch_size": 8, "num_minibatches": 4, "sources": SOURCES},
        "topology": {"backbone": {"dp": 1, "cp": 1, "max_tokens_per_microbatch": 4096}},
        "server": {"port": 0, "metrics": {"port": -1}},
        "retain_until_checkpoint": True,
    }))
    return path


def step(minibatch: int) -> StepId:
    return StepId(train_batch_index=0, minibatch_index=minibatch)


def test_stepped_minibatches_wait_for_a_checkpoint_across_a_kill_9(tmp_path: Path, redis_server) -> None:
    config = write_config(tmp_path / "admission.yaml", redis_server.url)
    service = ServiceProcess(config, tmp_path)
    try:
        with AdmissionClient(service.address) as client:
            client.report([make_meta(i, source="AB"[i % 2]) for i in range(8)])  # four mini-batches of two
            for sequence in (1, 2, 3):
                client.report_progress(CONSUMER, sequence, ProgressStage.OPTIMIZER_STEP)
            assert client.status().released_minibatches == 0  # stepped, but no checkpoint covers them
            third = next(client.watch_assignments(CONSUMER, after_sequence=2))
            assert client.report_checkpoint(step(1)) == step(1)
            assert client.status().released_minibatches == 2
    finally:
        service.kill()

    service = ServiceProcess(config, tmp_path)
    try:
        with AdmissionClient(service.address) as client:
            assert client.status().released_minibatches == 2
            assert client.report_checkpoint(step(0)) == step(1)  # the journaled checkpoint is the latest
            again = next(client.watch_assignments(CONSUMER, after_sequence=2))  # stepped on, still retained
            assert (again.sequence, again.trajectory_ids) == (3, third.trajectory_ids)
            with pytest.raises(FailedPrecondition) as info:  # released: never a silent gap
                next(client.watch_assignments(CONSUMER, after_sequence=0))
            assert info.value.field == "after_sequence"
            client.report_checkpoint(step(2))
            assert client.status().released_minibatches == 3
    finally:
        service.kill()
