"""How a training loop (verl- or slime-style) consumes micro-batches from its node-local reorg sidecar.

    python examples/integration/trainer_loop.py --sidecar unix:/tmp/knittrans-quickstart/reorg-backbone-dp0-cp0.sock \
        --admission unix:admission.sock [--token TOKEN] [--minibatches 2]
    python examples/integration/trainer_loop.py --global-rank 1 [--minibatches 2]   # the stack of `knittrans up`

A sidecar started without ``--socket`` listens on /tmp/knittrans-<job>/reorg-<role>-dp<D>-cp<C>.sock, where
<job> is the admission service's job (``job:`` in its config; ``quickstart`` in the local quick start of
docs/integration.md).
Without ``--sidecar`` and ``--admission``, both come from the connection file of the stack ``knittrans up`` runs,
for this ``--global-rank`` (docs/own-trainer.md).

Each mini-batch is one optimizer step. Its micro-batches arrive in consumption order as torch tensors that view
shared memory (no copy); a background thread prefetches the next ones while this one computes. The loss of
every micro-batch is normalised by the mini-batch's global loss-token count, so gradient accumulation over
micro-batches and DP ranks gives the same result as one big batch. ``labels`` is already the next token and the
packed ``loss_mask`` is label-aligned (the sidecar shifted the token-aligned mask the rollout submitted), so the
logits at position t meet ``labels[t]`` with no further shift, and the positions selected below add up, over all
ranks and micro-batches, to exactly ``mini.global_loss_tokens`` (docs/integration.md, "Alignment").
Finishing a mini-batch reports the optimizer step (its units can then be released), and global rank 0 advances
the policy version after a train batch.
"""

from __future__ import annotations

import argparse

import torch

from knittrans.client.admission import AdmissionClient
from knittrans.client.connection import ConnectionSettings
from knittrans.trainer import TrainerClient, TrainerSettings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sidecar", help="unix:/path of this rank's reorg sidecar "
                                          "(default: from the connection file of `knittrans up`)")
    parser.add_argument("--admission", help="the admission service (progress reports): host:port or unix:PATH "
                                            "(default: as --sidecar)")
    parser.add_argument("--token", default="")
    parser.add_argument("--global-rank", type=int, default=0)
    parser.add_argument("--minibatches", type=int, default=2, help="optimizer steps to run")
    args = parser.parse_args()

    torch.manual_seed(0)
    embedding = torch.nn.Embedding(32000, 16)
    head = torch.nn.Linear(16, 32000)
    optimizer = torch.optim.SGD([*embedding.parameters(), *head.parameters()], lr=0.1)
    if bool(args.sidecar) != bool(args.admission):
        parser.error("give both --sidecar and --admission, or neither (the stack `knittrans up` runs)")
    if args.sidecar:
        client = TrainerClient(TrainerSettings(
            sidecar=args.sidecar, global_rank=args.global_rank,
            admission=ConnectionSettings(target=args.admission, token=args.token),
        ))
        admission = AdmissionClient(ConnectionSettings(target=args.admission, token=args.token))
    else:  # the stack of `knittrans up`: its connection file names this rank's sidecar and the service
        client = TrainerClient.from_env(args.global_rank)
        admission = AdmissionClient.from_env()
    try:
        for step, mini in enumerate(client.mini_batches()):
            optimizer.zero_grad()
            total = 0.0
            counted = 0
            for micro in mini:
                logits = head(embedding(micro["input_ids"].long()))
                labels = micro["labels"].long()  # the next token; -100 at each sequence's end and on padding
                token_losses = torch.nn.functional.cross_entropy(logits, labels.clamp(min=0), reduction="none")
                selected = (labels != -100) & (micro["loss_mask"] != 0)
                loss = (token_losses * selected).sum() / mini.global_loss_tokens
                loss.backward()
                total += float(loss)
                counted += int(selected.sum())
            optimizer.step()
            print(f"step {step}: train batch {mini.train_batch_index} mini-batch {mini.minibatch_index}, "
                  f"{mini.num_microbatches} micro-batches, loss {total:.4f}, "
                  f"loss tokens here {counted} of {mini.global_loss_tokens} in the mini-batch")
            mini.complete()
            if step + 1 >= args.minibatches:
                break
    finally:
        client.close()  # flushes the progress reports: the mini-batches' units can now be released
    with admission:
        status = admission.status()
    print(f"admission: admitted {status.admitted_total} trajectories, released {status.released_minibatches} "
          f"mini-batches, policy version {status.policy_version}")


if __name__ == "__main__":
    main()
