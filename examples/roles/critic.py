"""The ``critic`` role of the PPO example: attaches its ``values`` over each response, then trains on them.

    python examples/roles/critic.py --admission unix:ppo.sock --store file:///dev/shm/knittrans-ppo-example \
        --sidecar unix:/tmp/knittrans-ppo-example/reorg-role_critic-dp0-cp0.sock --minibatches 2 \
        [--record ppo-critic.json]

Row j of a trajectory's ``values`` is the value of the state that generated response token j (the critic's
output at the position before it): a response-only field (``coverage`` "response", ``num_tokens -
response_start`` rows) that is token-aligned like the rollout's ``old_logprobs``, so the actor's sidecar lands it
on the same packed positions. The critic attaches the values it computed before its update (what the actor's
GAE must see), then regresses them on the returns (GAE advantages + values, the same arithmetic as the actor's)
and reports its own optimizer step with ``mini.complete()``. The mini-batch is released once both did.
"""

from __future__ import annotations

import argparse
import json

import torch
from common import build_critic, gae, response_rows

from knittrans.client.connection import ConnectionSettings
from knittrans.trainer import TrainerClient, TrainerSettings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sidecar", required=True, help="unix:/path of this rank's role:critic sidecar")
    parser.add_argument("--admission", required=True, help="the admission service: host:port or unix:PATH")
    parser.add_argument("--store", required=True, help="the unit store the attached fields are written to")
    parser.add_argument("--minibatches", type=int, default=2, help="optimizer steps to run")
    parser.add_argument("--record", default="", help="write the values attached, per trajectory (JSON)")
    args = parser.parse_args()

    critic = build_critic()
    optimizer = torch.optim.SGD(critic.parameters(), lr=0.5)
    trainer = TrainerClient(TrainerSettings(
        sidecar=args.sidecar, admission=ConnectionSettings(target=args.admission), store=args.store,
        namespace="critic", sidecar_timeout_seconds=120.0))  # the sidecar may still be starting
    attached = {}
    try:
        for step, mini in enumerate(trainer.mini_batches()):
            optimizer.zero_grad()
            for micro in mini:
                values = critic(micro["input_ids"]).squeeze(-1)
                rows = response_rows(micro)
                responses = [values[r].detach().clone() for r in rows]
                trainer.attach(micro, {"values": responses}, coverage={"values": "response"},
                               alignment={"values": "token"})
                loss = torch.zeros(())
                for trajectory_id, r, reward in zip(micro.trajectory_ids, rows, micro["scalar.reward"].tolist(),
                                                    strict=True):
                    returns = gae(values[r].detach(), reward) + values[r].detach()
                    loss = loss + 0.5 * ((values[r] - returns) ** 2).sum()
                    attached[trajectory_id] = values[r].tolist()
                (loss / mini.global_loss_tokens).backward()
            optimizer.step()
            mini.complete()
            print(f"critic: step {step}, attached values to mini-batch {mini.sequence}")
            if step + 1 >= args.minibatches:
                break
    finally:
        trainer.close()
    if args.record:
        with open(args.record, "w") as out:
            json.dump(attached, out)


if __name__ == "__main__":
    main()
