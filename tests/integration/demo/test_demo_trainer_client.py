"""The demo step on what ``TrainerClient`` delivers: embedded reorg sidecars (a backbone and an encoder consumer)
serve planned mini-batches from a real file store; one trainer rank steps on them with
``step_on_trainer_minibatch`` and must get exactly what the in-process packing path gives."""

from __future__ import annotations

import copy
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from knittrans.admission.planning import plan_minibatch
from knittrans.demo.local_feed import packed_micro_batches, plan_images, store_samples
from knittrans.demo.model import VisionLanguageConfig, VisionLanguageModel
from knittrans.demo.training import DemoTrainer, Parallelism, step_on_trainer_minibatch
from knittrans.demo.workload import WorkloadSpec, generate_samples
from knittrans.reorg.assignments import Admission, PlannedAssignmentSource
from knittrans.reorg.endpoint import start_reorg
from knittrans.reorg.settings import ReorgSettings, RingSettings
from knittrans.serving.settings import MetricsSettings, ServerSettings
from knittrans.shm import list_segments
from knittrans.store.file import FileUnitStore
from knittrans.train import schedule_from_plan
from knittrans.trainer import TrainerClient, TrainerSettings
from knittrans.types import BackboneTopology, ConsumerId, EncoderTopology, Topology
from tests.loop_thread import LoopThread

CONFIG = VisionLanguageConfig()
TOPOLOGY = Topology(
    backbone=BackboneTopology(dp=1, cp=1, max_tokens_per_microbatch=128),
    encoders=(EncoderTopology(name="vision", dp=1, max_cost_per_microbatch=32),),
)
MINIBATCHES = 3


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def test_steps_on_trainer_client_mini_batches_match_local_packing(tmp_path: Path) -> None:
    job = f"demo{uuid.uuid4().hex[:8]}"
    root = tmp_path / "units"
    store = FileUnitStore(root)
    spec = WorkloadSpec(rows_per_image=CONFIG.rows_per_image, seed=11, id_prefix=job)
    metas = store_samples(store, generate_samples(spec, 2 * MINIBATCHES), workload=spec, namespace=job)
    plans = [plan_minibatch(metas[8 * k : 8 * (k + 1)], TOPOLOGY) for k in range(MINIBATCHES)]
    admissions = [(Admission(minibatch_index=k, num_minibatches=MINIBATCHES), p) for k, p in enumerate(plans)]

    loop = LoopThread()
    backbone, encoder = ConsumerId(role="backbone", dp_rank=0), ConsumerId(role="encoder:vision", dp_rank=0)
    sidecars = {}
    try:
        for consumer in (backbone, encoder):
            settings = ReorgSettings(
                job=job,
                role=consumer.role,
                dp_rank=consumer.dp_rank,
                cp_rank=consumer.cp_rank,
                store=f"file://{root}",
                ring=RingSettings(slots=2),
                server=ServerSettings(metrics=MetricsSettings(port=-1)),
            )
            source = PlannedAssignmentSource(consumer, admissions, job=job)
            sidecars[consumer] = loop.run(start_reorg(settings, source=source, store=FileUnitStore(root)))

        torch.manual_seed(0)
        model = VisionLanguageModel(CONFIG)
        reference = DemoTrainer(copy.deepcopy(model), Parallelism.single_process())
        trainer = DemoTrainer(model, Parallelism.single_process())
        got, want = [], []
        clients = [
            TrainerClient(TrainerSettings(sidecar=sidecars[c].address, sidecar_timeout_seconds=5.0, poll_seconds=1.0))
            for c in (backbone, encoder)
        ]
        try:
            for (mini, encoder_mini), plan in zip(
                zip(clients[0].mini_batches(), clients[1].mini_batches(), strict=False), plans, strict=False
            ):
                got.append(step_on_trainer_minibatch(trainer, mini, encoder_mini=encoder_mini))
                want.append(
                    reference.step(
                        micro_batches=packed_micro_batches(plan, store, dp_rank=0, cp_rank=0),
                        images=plan_images(plan, store),
                        schedule=schedule_from_plan(plan, encoder="vision"),
                        global_loss_tokens=plan.backbone.minibatch_loss_tokens,
                    )
                )
                if mini.minibatch_index == MINIBATCHES - 1:
                    break
        finally:
            for client in clients:
                client.close()
    finally:
        for running in sidecars.values():
            loop.run(running.stop(grace=0))
        loop.close()
        store.close()
    assert list_segments(f"knittrans-{job}-") == []

    assert len(got) == MINIBATCHES
    for g, w in zip(got, want, strict=True):
        assert (g.loss, g.loss_tokens, g.encodings_computed, g.encoding_references) == (
            w.loss,
            w.loss_tokens,
            w.encodings_computed,
            w.encoding_references,
        )
    for p, q in zip(trainer.model.parameters(), reference.model.parameters(), strict=True):
        assert torch.equal(p, q)
    assert got[-1].loss < got[0].loss
    assert all(g.data_wait_seconds >= 0.0 for g in got)
