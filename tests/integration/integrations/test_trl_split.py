"""TRL's GRPOTrainer split across processes through KnitTrans: one rollout process generates and submits, two
trainer processes (dp=2, gloo through accelerate) train, each on its own reorg sidecar's micro-batches, with two
sources under quotas and a staleness bound. Every train batch meets the quotas, every trajectory trains exactly
once, and the gradient of every optimizer step equals a plain single-process loss and backward over that step's
trajectories, computed here from what the rollout generated, with no packing."""

from __future__ import annotations

import json
import math
import sys
import uuid
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("trl")

import torch

from knittrans.client.admission import AdmissionClient
from knittrans.integrations.trl import KnitTransGRPOSettings, TrainBatchShape, engine_config, trajectory_schema
from tests.gloo_ranks import run_ranks
from tests.integration.integrations import tiny_trl
from tests.integration.reorg.processes import spawn, start_admission, start_sidecar

WORKER = Path(__file__).with_name("trl_split_worker.py")
STEPS = 3
GROUP = 4
QUOTAS = {"math": 0.5, "code": 0.25}
GRAD_TOLERANCE = 1e-5  # relative to each tensor's largest entry


def reference_gradients(params: dict[str, torch.Tensor], trajectories: list[dict]) -> dict[str, torch.Tensor]:
    """TRL's dapo loss at ratio 1, the plain way: one unpadded forward per trajectory, the completion tokens'
    log-probs weighted by the advantage, summed and divided by the step's completion tokens."""
    model = tiny_trl.model()
    model.load_state_dict(params)
    model.train()
    total_tokens = sum(len(t["completion"]) for t in trajectories)
    loss = torch.zeros(())
    for trajectory in trajectories:
        tokens = torch.tensor(trajectory["prompt"] + trajectory["completion"])
        logits = model(input_ids=tokens[None]).logits[0].float()
        start = len(trajectory["prompt"])
        log_probs = torch.log_softmax(logits[start - 1:-1], dim=-1).gather(1, tokens[start:, None])[:, 0]
        ratio = torch.exp(log_probs - log_probs.detach())  # 1, with the policy's gradient
        advantage = torch.tensor(trajectory["advantage"], dtype=torch.float32)
        loss = loss - (ratio * advantage).sum()
    (loss / total_tokens).backward()
    return {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}


def test_rollout_process_and_two_trainer_ranks(tmp_path: Path) -> None:
    settings = KnitTransGRPOSettings(sources=QUOTAS, staleness_bound=1, namespace="split")
    shape = TrainBatchShape.of(per_device_train_batch_size=8, gradient_accumulation_steps=1, steps_per_generation=1,
                               num_generations=GROUP, world_size=2)
    job = f"trls{uuid.uuid4().hex[:6]}"
    store = f"file://{tmp_path / 'units'}"
    admission = start_admission(
        tmp_path, job=job, store=store, topology={"backbone": {"dp": 2, "cp": 1, "max_tokens_per_microbatch": 24}},
        train_batch_size=1, num_minibatches=1, schema=trajectory_schema(old_logprobs=False),
        settings={"engine": engine_config(settings, shape)})
    address = admission.ready["address"]
    sidecars = [start_sidecar(tmp_path, job=job, store=store, admission=address, dp_rank=rank, cp_rank=0)
                for rank in range(2)]
    rollout = spawn("rollout", [sys.executable, str(WORKER), "--role", "rollout", f"--out={tmp_path}",
                                f"--admission={address}", f"--store={store}"], tmp_path)
    try:
        ranks = run_ranks(WORKER, 2, tmp_path, timeout=240, extra_args=[
            f"--admission={address}", f"--sidecars={','.join(s.ready['address'] for s in sidecars)}"])
        assert rollout.popen.wait(timeout=120) == 0, rollout.tail()
        with AdmissionClient(address) as client:
            status = client.status()
    finally:
        for process in (rollout, *sidecars, admission):
            process.stop()
    rolled = json.loads((tmp_path / "rollout.json").read_text())
    assert "crash" not in rolled, rolled.get("crash")
    generated = rolled["trajectories"]

    assert all(rank["world"] == 2 and rank["engine"] == engine_config(settings, shape) for rank in ranks)
    steps = [[rank["steps"][k] for rank in ranks] for k in range(STEPS)]
    assert all(len(rank["steps"]) == STEPS for rank in ranks)
    trained: list[str] = []
    for k, parts in enumerate(steps):
        assert len({part["micro_batches"] for part in parts}) == 1  # equal counts per rank: no collective hangs
        ids = [i for part in parts for i in part["ids"]]
        trained.extend(ids)
        assert len(ids) == shape.trajectories
        # Whole GRPO groups, and the quotas of the train batch (one mini-batch per train batch here).
        groups = Counter(i.rsplit("-t", 1)[0] + f"/{int(i.rsplit('-t', 1)[1]) // GROUP}" for i in ids)
        assert set(groups.values()) == {GROUP}, groups
        per_source = Counter(generated[i]["source"] for i in ids)
        for source, share in QUOTAS.items():
            assert per_source[source] >= math.ceil(share * shape.groups) * GROUP, (k, per_source)
        assert parts[0]["global_loss_tokens"] == sum(len(generated[i]["completion"]) for i in ids)
    # Every trajectory trained exactly once. Every submitted one was admitted, dropped over the staleness bound, or
    # still waits; admitted but untrained are only the next train batch's (max_batches_ahead = 1).
    assert len(trained) == len(set(trained)) == STEPS * shape.trajectories
    assert set(trained) <= set(generated)
    assert len(generated) == rolled["submitted"]
    assert rolled["submitted"] == status.admitted_total + status.dropped_stale + status.pool_size * GROUP
    assert status.admitted_total - len(trained) in (0, shape.trajectories)
    assert status.policy_version == STEPS

    for k, parts in enumerate(steps):
        ids = [i for part in parts for i in part["ids"]]
        expected = reference_gradients(torch.load(tmp_path / f"params-{k}.pt"), [generated[i] for i in ids])
        for rank in range(2):
            grads = torch.load(tmp_path / f"grads-{k}-rank{rank}.pt")
            assert grads.keys() == expected.keys()
            for name, grad in expected.items():
                error = (grads[name] - grad).abs().max() / grad.abs().max().clamp(min=1e-12)
                assert error < GRAD_TOLERANCE, (k, rank, name, float(error))
