"""TRL's GRPOTrainer through KnitTrans, generation and training in one process, equals plain TRL: the same seed
gives the same generations, and over three optimizer steps the logged losses and gradient norms agree to float
round-off while the tokens and advantages each step trains on are TRL's, bit for bit."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("trl")

import torch
from trl import GRPOConfig, GRPOTrainer

from knittrans.client.admission import AdmissionClient
from knittrans.client.connection import ConnectionSettings
from knittrans.integrations.trl import (
    KnitTransClients,
    KnitTransGRPOSettings,
    KnitTransGRPOTrainer,
    TrainBatchShape,
    engine_config,
    trajectory_schema,
)
from knittrans.rollout import RolloutClient
from knittrans.store.factory import open_store
from knittrans.trainer import TrainerClient, TrainerSettings
from tests.integration.integrations import tiny_trl
from tests.integration.reorg.processes import start_admission, start_sidecar

STEPS = 3


def grpo_config(out: Path) -> GRPOConfig:
    return GRPOConfig(output_dir=str(out), per_device_train_batch_size=8, num_generations=4,
                      max_completion_length=6, max_steps=STEPS, logging_steps=1, report_to=[], use_cpu=True, seed=0,
                      temperature=1.0, learning_rate=0.05, save_strategy="no", bf16=False, disable_tqdm=True)


Row = tuple[tuple[int, ...], int]  # the trajectory's tokens, and its advantage's float32 bits


def rows_of(output: dict[str, Any]) -> list[Row]:
    rows = []
    for i in range(output["prompt_ids"].shape[0]):
        prompt = output["prompt_ids"][i][output["prompt_mask"][i].bool()]
        completion = output["completion_ids"][i][output["completion_mask"][i].bool()]
        tokens = tuple(int(t) for t in torch.cat([prompt, completion]))
        rows.append((tokens, int(output["advantages"][i].view(torch.int32))))
    return sorted(rows)


class RecordingTRL(GRPOTrainer):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.generated: list[list[Row]] = []

    def _generate_and_score_completions(self, inputs: Any) -> dict[str, Any]:
        output = super()._generate_and_score_completions(inputs)
        self.generated.append(rows_of(output))
        return output


class RecordingKnitTrans(KnitTransGRPOTrainer):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.trained: dict[int, list[Row]] = {}

    def inspect_micro_batch(self, mini: Any, micro: Any) -> None:
        bounds = micro["cu_seqlens"].tolist()
        lengths = micro["seq_lengths"].tolist()
        advantages = micro["scalar.advantage"].to(torch.float32)
        for item, (start, length) in enumerate(zip(bounds[:-1], lengths, strict=True)):
            tokens = tuple(int(t) for t in micro["input_ids"][start:start + length])
            self.trained.setdefault(mini.sequence, []).append((tokens, int(advantages[item].view(torch.int32))))


def per_step(history: list[dict[str, Any]], key: str) -> list[float]:
    return [entry[key] for entry in history if key in entry and "train_runtime" not in entry]


def test_grpo_through_knittrans_equals_plain_trl(tmp_path: Path) -> None:
    plain = RecordingTRL(model=tiny_trl.model(), reward_funcs=tiny_trl.reward, args=grpo_config(tmp_path / "plain"),
                         train_dataset=tiny_trl.dataset(), processing_class=tiny_trl.tokenizer())
    plain.train()

    args = grpo_config(tmp_path / "knittrans")
    settings = KnitTransGRPOSettings(namespace="same")
    shape = TrainBatchShape.of(per_device_train_batch_size=args.per_device_train_batch_size,
                               gradient_accumulation_steps=args.gradient_accumulation_steps,
                               steps_per_generation=args.steps_per_generation, num_generations=args.num_generations,
                               world_size=1)
    job = f"trl{uuid.uuid4().hex[:6]}"
    store_url = f"file://{tmp_path / 'units'}"
    admission = start_admission(
        tmp_path, job=job, store=store_url, topology={"backbone": {"dp": 1, "cp": 1, "max_tokens_per_microbatch": 24}},
        train_batch_size=1, num_minibatches=1, schema=trajectory_schema(old_logprobs=False),
        settings={"engine": engine_config(settings, shape)})
    address = admission.ready["address"]
    sidecar = start_sidecar(tmp_path, job=job, store=store_url, admission=address, dp_rank=0, cp_rank=0)
    store = open_store(store_url)
    admission_client = AdmissionClient(ConnectionSettings(target=address))
    trainer_client = TrainerClient(TrainerSettings(sidecar=sidecar.ready["address"], device="cpu",
                                                   wait_timeout_seconds=60,
                                                   admission=ConnectionSettings(target=address)))
    try:
        clients = KnitTransClients(admission=admission_client, trainer=trainer_client,
                                   rollout=RolloutClient(store, namespace="same", reporter=admission_client))
        knit = RecordingKnitTrans(model=tiny_trl.model(), reward_funcs=tiny_trl.reward, args=args,
                                  train_dataset=tiny_trl.dataset(), processing_class=tiny_trl.tokenizer(),
                                  knittrans=clients, knittrans_settings=settings)
        assert knit.admission_config()["engine"] == engine_config(settings, shape)
        knit.train()
        status = admission_client.status()
    finally:
        trainer_client.close()
        admission_client.close()
        store.close()
        sidecar.stop()
        admission.stop()

    assert len(plain.generated) == STEPS
    # Every step trained exactly TRL's generation batch of that step: tokens and advantages bit for bit.
    assert [sorted(knit.trained[step]) for step in sorted(knit.trained)] == plain.generated
    assert any(len(set(len(t) for t, _ in rows)) > 1 for rows in plain.generated)  # lengths differ: real packing
    assert status.policy_version == STEPS and status.admitted_total == STEPS * 8
    for key in ("loss", "grad_norm"):
        ours, theirs = per_step(knit.state.log_history, key), per_step(plain.state.log_history, key)
        assert len(ours) == len(theirs) == STEPS
        assert ours == pytest.approx(theirs, rel=2e-5, abs=1e-6), key
    assert max(per_step(plain.state.log_history, "grad_norm")) > 0
