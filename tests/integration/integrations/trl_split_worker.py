"""One process of the split TRL test: ``--role rollout`` generates and submits (one process, no trainer client);
``--role trainer`` is one data-parallel rank (gloo) training on its sidecar's mini-batches. Each writes what it
did as JSON (and a trainer rank 0 the parameters before each step) into ``--out``."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
os.environ["HF_HUB_OFFLINE"] = "1"

STEPS = 3
NUM_GENERATIONS = 4


def grpo_config(out: Path, per_device: int, *, max_steps: int = STEPS, save_steps: int = 0, **extra: Any) -> Any:
    from trl import GRPOConfig

    saving: dict[str, Any] = {"save_strategy": "steps", "save_steps": save_steps} if save_steps else \
        {"save_strategy": "no"}
    return GRPOConfig(output_dir=str(out), per_device_train_batch_size=per_device, num_generations=NUM_GENERATIONS,
                      max_completion_length=6, max_steps=max_steps, logging_steps=1, report_to=[], use_cpu=True,
                      seed=0, temperature=1.0, learning_rate=0.05, bf16=False, disable_tqdm=True, max_grad_norm=0.0,
                      **saving, **extra)


def rollout(args: argparse.Namespace) -> dict[str, Any]:
    from knittrans.client.admission import AdmissionClient
    from knittrans.integrations.trl import KnitTransClients, KnitTransGRPOSettings, KnitTransGRPOTrainer
    from knittrans.rollout import RolloutClient
    from knittrans.store.factory import open_store
    from tests.integration.integrations import tiny_trl

    recorded: dict[str, Any] = {}

    class Recording(KnitTransGRPOTrainer):
        def _submit(self, inputs: Any, output: Any) -> None:
            before = len(self.submitted)
            super()._submit(inputs, output)
            for i, trajectory_id in enumerate(self.submitted[before:]):
                prompt = output["prompt_ids"][i][output["prompt_mask"][i].bool()].tolist()
                completion = output["completion_ids"][i][output["completion_mask"][i].bool()].tolist()
                recorded[trajectory_id] = {"prompt": prompt, "completion": completion,
                                           "advantage": float(output["advantages"][i]),
                                           "source": inputs[i]["source"]}

    settings = KnitTransGRPOSettings(sources={"math": 0.5, "code": 0.25}, staleness_bound=1, namespace="split")
    admission = AdmissionClient(args.admission)
    store = open_store(args.store)
    clients = KnitTransClients(admission=admission, rollout=RolloutClient(store, namespace="split",
                                                                          reporter=admission))
    trainer = Recording(model=tiny_trl.model(), reward_funcs=tiny_trl.reward, args=grpo_config(args.out / "rollout", 8),
                        train_dataset=tiny_trl.dataset(("math", "code")), processing_class=tiny_trl.tokenizer(),
                        knittrans=clients, knittrans_settings=settings)
    count = trainer.generate_and_submit(until_version=args.until_version)
    admission.close()
    store.close()
    return {"submitted": count, "trajectories": recorded}


def trainer_rank(args: argparse.Namespace) -> dict[str, Any]:
    os.environ.update({"RANK": str(args.rank), "LOCAL_RANK": str(args.rank), "WORLD_SIZE": str(args.world_size),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(args.port)})
    import torch
    from transformers import TrainerCallback

    from knittrans.client.admission import AdmissionClient
    from knittrans.client.connection import ConnectionSettings
    from knittrans.integrations.trl import (
        KnitTransClients,
        KnitTransGRPOSettings,
        KnitTransGRPOTrainer,
        ResumePoint,
        resume_point,
    )
    from knittrans.rollout import RolloutClient
    from knittrans.store.factory import open_store
    from knittrans.trainer import TrainerClient, TrainerSettings
    from tests.integration.integrations import tiny_trl

    steps: list[dict[str, Any]] = []

    class Recording(KnitTransGRPOTrainer):
        def inspect_micro_batch(self, mini: Any, micro: Any) -> None:
            if not steps or steps[-1]["sequence"] != mini.sequence:
                if args.kill_holding_step and self.state.global_step + 1 == args.kill_holding_step:
                    os.kill(os.getpid(), signal.SIGKILL)  # holding this step's mini-batch, as a crash would
                steps.append({"sequence": mini.sequence, "train_batch": mini.train_batch_index,
                              "global_loss_tokens": mini.global_loss_tokens, "ids": [], "micro_batches": 0})
            steps[-1]["ids"].extend(micro.trajectory_ids)
            steps[-1]["micro_batches"] += 1
            if args.steps_log is not None:  # survives a kill, unlike the result file
                with open(args.steps_log, "a") as log:
                    log.write(json.dumps({"sequence": mini.sequence, "ids": list(micro.trajectory_ids)}) + "\n")

    class Capture(TrainerCallback):
        def on_step_begin(self, a: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
            if args.rank == 0:
                torch.save({k: v.detach().clone() for k, v in model.state_dict().items()},
                           args.out / f"params-{state.global_step}.pt")

        def on_pre_optimizer_step(self, a: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
            grads = {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}
            torch.save(grads, args.out / f"grads-{state.global_step}-rank{args.rank}.pt")

    sidecar = args.sidecars.split(",")[args.rank]
    output_dir = args.out / f"trainer{args.rank}"
    point = resume_point(output_dir) if args.resume else ResumePoint(checkpoint=None, restored_step=None)
    admission = AdmissionClient(args.admission)
    client = TrainerClient(TrainerSettings(sidecar=sidecar, global_rank=args.rank, device="cpu",
                                           wait_timeout_seconds=30,
                                           admission=ConnectionSettings(target=args.admission)),
                           restored_step=point.restored_step)
    # --colocated: TRL's own loop, generating in this process too.
    rollout = RolloutClient(open_store(args.store), namespace="split", reporter=admission) if args.colocated else None
    settings = KnitTransGRPOSettings(sources={"math": 0.5, "code": 0.25}, staleness_bound=1, namespace="split")
    trainer = Recording(model=tiny_trl.model(), reward_funcs=tiny_trl.reward,
                        args=grpo_config(output_dir, 8, max_steps=args.max_steps, save_steps=args.save_steps,
                                         ddp_backend="gloo"),
                        train_dataset=tiny_trl.dataset(("math", "code")), processing_class=tiny_trl.tokenizer(),
                        knittrans=KnitTransClients(admission=admission, rollout=rollout, trainer=client),
                        knittrans_settings=settings, callbacks=[Capture()])
    engine = trainer.admission_config()["engine"]
    trainer.train(resume_from_checkpoint=None if point.checkpoint is None else str(point.checkpoint))
    world = trainer.accelerator.num_processes
    client.close()
    if rollout is not None:
        rollout.close()
    admission.close()
    return {"steps": steps, "engine": engine, "world": world, "global_step": trainer.state.global_step,
            "resumed_from": None if point.checkpoint is None else point.checkpoint.name,
            "restored_step": str(point.restored_step)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--role", choices=["rollout", "trainer"], default="trainer")
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--world-size", type=int, default=1)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--admission", required=True)
    parser.add_argument("--store", default="")
    parser.add_argument("--sidecars", default="")
    parser.add_argument("--until-version", type=int, default=STEPS, help="rollout: generate until this version")
    parser.add_argument("--max-steps", type=int, default=STEPS)
    parser.add_argument("--save-steps", type=int, default=0, help="0: no checkpoints")
    parser.add_argument("--kill-holding-step", type=int, default=0,
                        help="SIGKILL this process as it takes the first micro-batch of this optimizer step (1-based)")
    parser.add_argument("--colocated", action="store_true", help="trainer: generate and submit too (needs --store)")
    parser.add_argument("--resume", action="store_true", help="resume where resume_point(output_dir) says")
    parser.add_argument("--steps-log", type=Path, help="append each micro-batch's trajectory ids here as it trains")
    args = parser.parse_args()
    name = "rollout.json" if args.role == "rollout" else f"rank{args.rank}.json"
    try:
        result = rollout(args) if args.role == "rollout" else trainer_rank(args)
    except BaseException:
        result = {"crash": traceback.format_exc()}
    (args.out / name).write_text(json.dumps(result))


if __name__ == "__main__":
    main()
