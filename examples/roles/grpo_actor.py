"""The GRPO actor: group-normalised advantages and a KL penalty against the ``reference`` role's log-probs.

    python examples/roles/grpo_actor.py --admission unix:grpo.sock \
        --sidecar unix:/tmp/knittrans-grpo-example/reorg-backbone-dp0-cp0.sock --minibatches 2 \
        [--beta 0.1] [--record grpo-actor.json]

Advantages are this script's own arithmetic: each trajectory's ``reward`` scalar, normalised within its group
(the trajectories sharing its ``uid``): A = (r - mean) / (std + 1e-6), the same for every token of its response.
A group can span several micro-batches, so each mini-batch is iterated twice (``passes=2``, read from the store
once): pass 0 only collects the rewards, pass 1 trains. The job admits whole groups (``admission_unit: group``)
and the actor has dp 1, so this rank sees every group whole; with dp > 1, all-gather (uid, reward) over the DP
ranks before normalising.

The loss per response token is PPO's clipped surrogate against the rollout's ``old_logprobs`` plus beta times
KL(policy || reference), with the k3 estimator exp(ref - logp) - (ref - logp) - 1, summed over the mini-batch's
loss tokens and divided by ``mini.global_loss_tokens``. ``ref_logprobs``, ``old_logprobs`` and the loss mask are
all label-aligned in the packed micro-batch, on the same positions as ``labels``.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
from common import build_policy, clipped_surrogate, label_logprobs, response_rows

from knittrans.client.connection import ConnectionSettings
from knittrans.trainer import TrainerClient, TrainerSettings


def group_advantages(rewards: dict[str, float], uids: dict[str, str]) -> dict[str, float]:
    groups: dict[str, list[float]] = {}
    for trajectory_id, reward in rewards.items():
        groups.setdefault(uids[trajectory_id], []).append(reward)
    stats = {uid: (statistics.fmean(r), statistics.stdev(r) if len(r) > 1 else 0.0) for uid, r in groups.items()}
    return {t: (r - stats[uids[t]][0]) / (stats[uids[t]][1] + 1e-6) for t, r in rewards.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sidecar", required=True, help="unix:/path of this rank's backbone sidecar")
    parser.add_argument("--admission", required=True, help="the admission service: host:port or unix:PATH")
    parser.add_argument("--minibatches", type=int, default=2, help="optimizer steps to run")
    parser.add_argument("--beta", type=float, default=0.1, help="weight of the KL term")
    parser.add_argument("--record", default="", help="write what each step used, per trajectory (JSON)")
    args = parser.parse_args()

    policy = build_policy()
    optimizer = torch.optim.SGD(policy.parameters(), lr=0.5)
    trainer = TrainerClient(TrainerSettings(sidecar=args.sidecar, admission=ConnectionSettings(target=args.admission),
                                            sidecar_timeout_seconds=120.0))
    steps = []
    try:
        for step, mini in enumerate(trainer.mini_batches(passes=2)):
            rewards, uids = {}, {}
            for micro in mini:  # pass 0: the rewards of every group
                rewards.update(zip(micro.trajectory_ids, micro["scalar.reward"].tolist(), strict=True))
                uids.update(zip(micro.trajectory_ids, micro.metadata["uid"], strict=True))
            advantage_of = group_advantages(rewards, uids)
            optimizer.zero_grad()
            used, total_kl = {}, 0.0
            for micro in mini:  # pass 1: train
                logprobs = label_logprobs(policy, micro)
                ref, old = micro["ref_logprobs"], micro["old_logprobs"]
                advantages = torch.zeros_like(logprobs)
                for trajectory_id, rows in zip(micro.trajectory_ids, response_rows(micro), strict=True):
                    advantages[rows] = advantage_of[trajectory_id]
                kl = torch.exp(ref - logprobs) - (ref - logprobs) - 1
                selected = (micro["labels"] != -100) & (micro["loss_mask"] != 0)
                per_token = clipped_surrogate(logprobs, old, advantages) + args.beta * kl
                (per_token * selected).sum().div(mini.global_loss_tokens).backward()
                total_kl += float((kl.detach() * selected).sum())
                for trajectory_id, rows in zip(micro.trajectory_ids, response_rows(micro), strict=True):
                    used[trajectory_id] = {"advantage": advantage_of[trajectory_id], "uid": uids[trajectory_id],
                                           "logprobs": logprobs[rows].tolist(), "ref_logprobs": ref[rows].tolist(),
                                           "kl": kl[rows].tolist()}
            optimizer.step()
            mini.complete()  # the step is reported: once every role reported theirs, the units are released
            steps.append({"sequence": mini.sequence, "global_loss_tokens": mini.global_loss_tokens, "used": used})
            print(f"step {step}: mini-batch {mini.sequence}, {len(used)} trajectories, "
                  f"mean KL {total_kl / mini.global_loss_tokens:.6f}")
            if step + 1 >= args.minibatches:
                break
    finally:
        trainer.close()  # flushes the step reports: the mini-batches can be released
    if args.record:
        with open(args.record, "w") as out:
            json.dump(steps, out)


if __name__ == "__main__":
    main()
