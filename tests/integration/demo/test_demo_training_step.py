"""The demo training step in one process, on mini-batches planned and packed as the real pipeline does
(file unit store, planner, reorg packer): the loss falls on a fixed dataset, and bad inputs fail loudly."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from knittrans.admission.planning import plan_minibatch
from knittrans.demo.local_feed import packed_micro_batches, plan_images, store_samples
from knittrans.demo.model import VisionLanguageConfig, VisionLanguageModel, initial_model
from knittrans.demo.training import DemoTrainer, Parallelism, label_logprobs, packed_kl_sum
from knittrans.demo.workload import WorkloadSpec, generate_samples
from knittrans.errors import FailedPrecondition
from knittrans.plan import Plan
from knittrans.store.factory import open_store
from knittrans.train import schedule_from_plan
from knittrans.types import BackboneTopology, EncoderTopology, Topology

CONFIG = VisionLanguageConfig()
TOPOLOGY = Topology(
    backbone=BackboneTopology(dp=1, cp=1, max_tokens_per_microbatch=128),
    encoders=(EncoderTopology(name="vision", dp=1, max_cost_per_microbatch=32),),
)


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture
def minibatches(tmp_path: Path):
    """Four mini-batches of four samples (16 trajectories each), packed for one rank."""
    spec = WorkloadSpec(rows_per_image=CONFIG.rows_per_image, seed=3)
    store = open_store(f"file://{tmp_path / 'units'}")
    metas = store_samples(store, generate_samples(spec, 16), workload=spec)
    out = []
    for k in range(4):
        plan = plan_minibatch(metas[16 * k : 16 * (k + 1)], TOPOLOGY)
        out.append((plan, packed_micro_batches(plan, store, dp_rank=0, cp_rank=0), plan_images(plan, store)))
    yield out
    store.close()


def step(trainer: DemoTrainer, plan: Plan, micro_batches, images):
    return trainer.step(
        micro_batches=micro_batches,
        images=images,
        schedule=schedule_from_plan(plan, encoder="vision"),
        global_loss_tokens=plan.backbone.minibatch_loss_tokens,
    )


def test_loss_falls_over_a_few_epochs(minibatches) -> None:
    torch.manual_seed(0)
    trainer = DemoTrainer(VisionLanguageModel(CONFIG), Parallelism.single_process(), learning_rate=3e-3)
    epochs = []
    for _ in range(4):
        results = [step(trainer, plan, micro, images) for plan, micro, images in minibatches]
        epochs.append(sum(r.loss for r in results) / len(results))
        for (plan, _, _), result in zip(minibatches, results, strict=True):
            assert result.loss_tokens == plan.backbone.minibatch_loss_tokens
            assert result.encodings_computed == 4  # one per sample, not one per trajectory
            assert result.encoding_references == 16
            assert result.dedup_factor == pytest.approx(plan.quality.dedup_factor)
            assert torch.isfinite(torch.tensor(result.loss))
    assert all(later < earlier for earlier, later in itertools.pairwise(epochs)), epochs
    assert epochs[-1] < 0.85 * epochs[0], epochs


def test_a_loss_mask_that_disagrees_with_the_global_count_is_refused(minibatches) -> None:
    plan, micro_batches, images = minibatches[0]
    trainer = DemoTrainer(VisionLanguageModel(CONFIG), Parallelism.single_process())
    with pytest.raises(FailedPrecondition, match="loss tokens"):
        trainer.forward_backward(
            micro_batches=micro_batches,
            images=images,
            schedule=schedule_from_plan(plan, encoder="vision"),
            global_loss_tokens=plan.backbone.minibatch_loss_tokens + 1,
        )


def test_a_missing_image_is_named_before_any_backward(minibatches) -> None:
    plan, micro_batches, images = minibatches[0]
    missing = sorted(images)[0]
    trainer = DemoTrainer(VisionLanguageModel(CONFIG), Parallelism.single_process())
    with pytest.raises(FailedPrecondition, match="no image"):
        step(trainer, plan, micro_batches, {k: v for k, v in images.items() if k != missing})
    assert all(p.grad is None for p in trainer.model.parameters())


def test_micro_batches_must_match_the_schedule(minibatches) -> None:
    plan, micro_batches, images = minibatches[0]
    trainer = DemoTrainer(VisionLanguageModel(CONFIG), Parallelism.single_process())
    with pytest.raises(FailedPrecondition, match="not in the schedule"):
        step(trainer, plan, [*micro_batches, micro_batches[0]], images)
    assert len(micro_batches) > 1
    with pytest.raises(FailedPrecondition, match="more backbone micro-batches"):
        step(trainer, plan, micro_batches[:-1], images)


def naive_k3(logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor, ref: torch.Tensor) -> float:
    """Token by token: exp(ref − logp) − (ref − logp) − 1 over the positions with a label and a loss mask."""
    total = 0.0
    for t in range(len(labels)):
        if int(labels[t]) == -100 or int(mask[t]) == 0:
            continue
        logp = float(torch.log_softmax(logits[t].double(), dim=-1)[int(labels[t])])
        delta = float(ref[t]) - logp
        total += math.exp(delta) - delta - 1
    return total


def test_the_k3_term_counts_each_masked_label_token_once() -> None:
    generator = torch.Generator().manual_seed(5)
    logits = torch.randn(12, 9, generator=generator)
    labels = torch.randint(0, 9, (12,), generator=generator)
    labels[[3, 11]] = -100
    mask = (torch.rand(12, generator=generator) < 0.7).to(torch.uint8)
    ref = -torch.rand(12, generator=generator) * 4
    assert float(packed_kl_sum(logits, labels, mask, ref)) == pytest.approx(naive_k3(logits, labels, mask, ref),
                                                                            rel=1e-5)
    # Against itself the estimate is 0, and so is its gradient.
    own = label_logprobs(logits, labels).detach()
    logits.requires_grad_(True)
    kl = packed_kl_sum(logits, labels, mask, own)
    kl.backward()
    assert float(kl.detach()) == pytest.approx(0.0, abs=1e-6) and float(logits.grad.abs().max()) < 1e-6


def test_the_actor_adds_the_weighted_kl_when_the_micro_batches_carry_ref_logprobs(minibatches) -> None:
    plan, micro_batches, images = minibatches[0]
    generator = torch.Generator().manual_seed(1)
    with_ref = [{**micro, "ref_logprobs": -torch.rand(len(micro["labels"]), generator=generator) * 3}
                for micro in micro_batches]
    results = {}
    for name, coefficient, micros in (("plain", 0.0, micro_batches), ("ignored", 0.0, with_ref),
                                      ("kl", 0.25, with_ref)):
        trainer = DemoTrainer(initial_model(0), Parallelism.single_process(), kl_coefficient=coefficient)
        results[name] = trainer.forward_backward(
            micro_batches=micros, images=images, schedule=schedule_from_plan(plan, encoder="vision"),
            global_loss_tokens=plan.backbone.minibatch_loss_tokens)
    assert results["ignored"].loss == results["plain"].loss and results["plain"].kl == 0.0
    assert results["kl"].kl > 0
    assert results["kl"].loss == pytest.approx(results["plain"].loss + 0.25 * results["kl"].kl, rel=1e-6)
    assert results["kl"].loss_tokens == results["plain"].loss_tokens == plan.backbone.minibatch_loss_tokens
