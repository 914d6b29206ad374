"""The PPO actor: GAE advantages from the ``critic`` role's values, and the clipped policy loss.

    python examples/roles/ppo_actor.py --admission unix:ppo.sock \
        --sidecar unix:/tmp/knittrans-ppo-example/reorg-backbone-dp0-cp0.sock --minibatches 2 \
        [--epochs 2] [--record ppo-actor.json]

Advantages are this script's own arithmetic, per trajectory over its response tokens: the reward (the
``reward`` scalar) comes with the last token, and ``common.gae`` runs the GAE recursion over the attached
``values`` (gamma 1, lambda 0.95). In the packed micro-batch, ``values``, ``old_logprobs`` and the loss mask are
label-aligned: position t concerns the prediction of ``labels[t]``, and ``values.mask`` is 1 exactly on each
response's positions.

Old log-probs: the rollout reports them (a response-only, token-aligned field), because the importance ratio
needs the log-probs of the policy that *sampled* the tokens, and the rollout engine has them for free.
Recomputing them would cost a forward pass of the actor over each mini-batch before its update; do that instead
(in a first pass, like examples/roles/grpo_actor.py's) when the inference engine's numerics differ from the
trainer's. Each mini-batch is trained ``--epochs`` times (PPO epochs: ``passes``, read from the store once).
"""

from __future__ import annotations

import argparse
import json

import torch
from common import build_policy, clipped_surrogate, gae, label_logprobs, response_rows

from knittrans.client.connection import ConnectionSettings
from knittrans.trainer import TrainerClient, TrainerSettings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sidecar", required=True, help="unix:/path of this rank's backbone sidecar")
    parser.add_argument("--admission", required=True, help="the admission service: host:port or unix:PATH")
    parser.add_argument("--minibatches", type=int, default=2, help="mini-batches to train on")
    parser.add_argument("--epochs", type=int, default=2, help="optimizer steps per mini-batch")
    parser.add_argument("--record", default="", help="write what the first epoch used, per trajectory (JSON)")
    args = parser.parse_args()

    policy = build_policy()
    optimizer = torch.optim.SGD(policy.parameters(), lr=0.5)
    trainer = TrainerClient(TrainerSettings(sidecar=args.sidecar, admission=ConnectionSettings(target=args.admission),
                                            sidecar_timeout_seconds=120.0))
    steps = []
    try:
        for step, mini in enumerate(trainer.mini_batches(passes=args.epochs)):
            for epoch in range(args.epochs):
                optimizer.zero_grad()
                used = {}
                for micro in mini:
                    logprobs = label_logprobs(policy, micro)
                    values, old = micro["values"], micro["old_logprobs"]
                    advantages = torch.zeros_like(logprobs)
                    rows = response_rows(micro)
                    for trajectory_id, r, reward in zip(micro.trajectory_ids, rows, micro["scalar.reward"].tolist(),
                                                        strict=True):
                        advantages[r] = gae(values[r], reward)
                        used[trajectory_id] = {"reward": reward, "values": values[r].tolist(),
                                               "advantages": advantages[r].tolist(),
                                               "ratio": torch.exp(logprobs[r] - old[r]).tolist()}
                    selected = (micro["labels"] != -100) & (micro["loss_mask"] != 0)
                    loss = clipped_surrogate(logprobs, old, advantages) * selected
                    (loss.sum() / mini.global_loss_tokens).backward()
                optimizer.step()
                if epoch == 0:
                    steps.append({"sequence": mini.sequence, "used": used})
            mini.complete()  # after the last epoch: once the critic reported its step too, the units are released
            print(f"step {step}: mini-batch {mini.sequence}, {len(steps[-1]['used'])} trajectories, "
                  f"{args.epochs} epochs")
            if step + 1 >= args.minibatches:
                break
    finally:
        trainer.close()
    if args.record:
        with open(args.record, "w") as out:
            json.dump(steps, out)


if __name__ == "__main__":
    main()
