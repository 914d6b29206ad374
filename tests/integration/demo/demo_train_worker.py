"""One rank of the demo training-step tests (run by test_demo_training_distributed.py).

Every rank generates the same samples, stores them in its own file store, and plans each mini-batch twice:
for the distributed (dp × cp) world and for one process (dp = cp = 1). It trains a reference copy of the model
on the single-process plan (no collectives) and the real model on its part of the distributed plan, step by
step, and writes how far losses, gradients and parameters are apart to ``<out>/rank<r>.json``.
"""

from __future__ import annotations

import argparse
import copy
import json
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from knittrans.admission.planning import plan_minibatch
from knittrans.demo.local_feed import packed_micro_batches, plan_images, store_samples
from knittrans.demo.model import VisionLanguageConfig, VisionLanguageModel
from knittrans.demo.schedule_exchange import exchange_encoding_schedule, rank_part
from knittrans.demo.training import DemoTrainer, Parallelism
from knittrans.demo.workload import WorkloadSpec, generate_samples
from knittrans.packed.layout import item_offsets, packed_encoding_uses
from knittrans.store.factory import open_store
from knittrans.train import EncodingSchedule, schedule_from_plan
from knittrans.types import BACKBONE_ROLE, BackboneTopology, ConsumerId, EncoderTopology, Topology

SAMPLES_PER_MINIBATCH = 2
STEPS = 2


def topology(dp: int, cp: int, pad_multiple: int) -> Topology:
    return Topology(
        backbone=BackboneTopology(dp=dp, cp=cp, max_tokens_per_microbatch=128, pad_multiple=pad_multiple),
        encoders=(EncoderTopology(name="vision", dp=min(2, dp * cp), max_cost_per_microbatch=16),),
    )


def same_schedule(got: EncodingSchedule, want: EncodingSchedule) -> bool:
    """Equal up to the order of routes (the planner's encoding ids against sorted keys)."""

    def routes(schedule: EncodingSchedule) -> list:
        return sorted((r.key, r.num_rows, r.owner, r.consumers) for r in schedule.routes)

    return routes(got) == routes(want) and got.ranks == want.ranks


def relative_difference(got: torch.Tensor, want: torch.Tensor) -> float:
    scale = float(want.abs().max())
    return float((got - want).abs().max()) / scale if scale else float((got - want).abs().max())


def run(rank: int, world_size: int, dp: int, cp: int, port: int, out: Path) -> dict:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=60),
    )
    parallelism = Parallelism.from_world(dp=dp, cp=cp)
    config = VisionLanguageConfig()
    spec = WorkloadSpec(rows_per_image=config.rows_per_image, seed=7)
    store = open_store(f"file://{out / f'store{rank}'}")
    samples = generate_samples(spec, SAMPLES_PER_MINIBATCH * dp * STEPS)
    metas = store_samples(store, samples, workload=spec)
    per_minibatch = len(metas) // STEPS

    torch.manual_seed(0)
    model = VisionLanguageModel(config)
    reference = DemoTrainer(copy.deepcopy(model), Parallelism.single_process())
    trainer = DemoTrainer(model, parallelism)
    # Adam turns round-off-sized gradients into full-size steps of either sign; SGD keeps parameters
    # comparable to round-off, so the second step also checks that the first one moved both models alike.
    for t in (reference, trainer):
        t.optimizer = torch.optim.SGD(t.model.parameters(), lr=0.05)
    pad = 2 * cp  # both plans pad alike; padding never changes the loss, but keeps the packing identical

    steps = []
    cut_placeholders = 0
    schedules_agree = True
    for step in range(STEPS):
        chosen = metas[step * per_minibatch : (step + 1) * per_minibatch]
        single = plan_minibatch(chosen, topology(1, 1, pad))
        plan = plan_minibatch(chosen, topology(dp, cp, pad))
        reference.optimizer.zero_grad(set_to_none=True)
        want = reference.forward_backward(
            micro_batches=packed_micro_batches(single, store, dp_rank=0, cp_rank=0),
            images=plan_images(single, store),
            schedule=schedule_from_plan(single, encoder="vision"),
            global_loss_tokens=single.backbone.minibatch_loss_tokens,
        )
        schedule = schedule_from_plan(plan, encoder="vision")
        # What TrainerClient gives each rank (its consumers' assignments), gathered into the same schedule.
        backbone = plan.for_consumer(
            ConsumerId(role=BACKBONE_ROLE, dp_rank=parallelism.dp_rank, cp_rank=parallelism.cp_rank)
        )
        encoder_dp = plan.topology.encoder("vision").dp
        own = ConsumerId(role="encoder:vision", dp_rank=rank) if rank < encoder_dp else None
        exchanged = exchange_encoding_schedule(
            rank_part(
                dp_rank=parallelism.dp_rank,
                cp_rank=parallelism.cp_rank,
                backbone_uses=[packed_encoding_uses(mb, item_offsets(mb, cp)) for mb in backbone.microbatches],
                encoder_micro_batches=plan.for_consumer(own).encoder_microbatches if own else (),
            )
        )
        schedules_agree = schedules_agree and same_schedule(exchanged, schedule)
        cut_placeholders += sum(
            1 for micro in schedule.ranks[rank].backbone_micro_batches for use in micro.uses if use.first_row > 0
        )
        trainer.optimizer.zero_grad(set_to_none=True)
        got = trainer.forward_backward(
            micro_batches=packed_micro_batches(plan, store, dp_rank=parallelism.dp_rank, cp_rank=parallelism.cp_rank),
            images=plan_images(plan, store),
            schedule=exchanged,
            global_loss_tokens=plan.backbone.minibatch_loss_tokens,
        )
        grads = {
            part: max(
                relative_difference(p.grad, q.grad)
                for p, q in zip(
                    getattr(trainer.model, part).parameters(), getattr(reference.model, part).parameters(), strict=True
                )
            )
            for part in ("encoder", "backbone")
        }
        steps.append(
            {
                "loss": got.loss,
                "reference_loss": want.loss,
                "loss_tokens": got.loss_tokens,
                "reference_loss_tokens": want.loss_tokens,
                "encodings_computed": got.encodings_computed,
                "encoding_references": got.encoding_references,
                "grad_encoder": grads["encoder"],
                "grad_backbone": grads["backbone"],
            }
        )
        reference.optimizer.step()
        trainer.optimizer.step()
    params = max(
        relative_difference(p.detach(), q.detach())
        for p, q in zip(trainer.model.parameters(), reference.model.parameters(), strict=True)
    )
    store.close()
    dist.barrier()
    dist.destroy_process_group()
    return {
        "steps": steps,
        "params_after_steps": params,
        "cut_placeholders": cut_placeholders,
        "schedules_agree": schedules_agree,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("rank", "world-size", "dp", "cp", "port"):
        parser.add_argument(f"--{name}", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    try:
        result = run(args.rank, args.world_size, args.dp, args.cp, args.port, args.out)
    except Exception:
        result = {"crash": traceback.format_exc()}
    (args.out / f"rank{args.rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
