"""The training loop of examples/integration/trainer_loop.py, written with ``async for``.

    python examples/integration/async_trainer_loop.py \
        --sidecar unix:/tmp/knittrans-quickstart/reorg-backbone-dp0-cp0.sock --admission unix:admission.sock \
        [--token TOKEN] [--minibatches 2]

``AsyncTrainerClient`` delivers exactly what ``TrainerClient`` delivers (it drives the same iterators from one
worker thread), for a trainer whose loop runs in an event loop next to other coroutines (a weight-sync server,
metrics, a rollout controller): waiting for the next micro-batch does not block the loop.
"""

from __future__ import annotations

import argparse
import asyncio

import torch

from knittrans.aio import AsyncAdmissionClient, AsyncTrainerClient
from knittrans.client.connection import ConnectionSettings
from knittrans.trainer import TrainerSettings


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sidecar", required=True, help="unix:/path of this rank's reorg sidecar")
    parser.add_argument("--admission", required=True,
                        help="the admission service (progress reports): host:port or unix:PATH")
    parser.add_argument("--token", default="")
    parser.add_argument("--global-rank", type=int, default=0)
    parser.add_argument("--minibatches", type=int, default=2, help="optimizer steps to run")
    args = parser.parse_args()

    torch.manual_seed(0)
    embedding = torch.nn.Embedding(32000, 16)
    head = torch.nn.Linear(16, 32000)
    optimizer = torch.optim.SGD([*embedding.parameters(), *head.parameters()], lr=0.1)
    connection = ConnectionSettings(target=args.admission, token=args.token)
    settings = TrainerSettings(sidecar=args.sidecar, global_rank=args.global_rank, admission=connection)
    async with AsyncTrainerClient(settings) as client:
        step = 0
        async for mini in client.mini_batches():
            optimizer.zero_grad()
            total, counted = 0.0, 0
            async for micro in mini:
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
            await mini.complete()
            step += 1
            if step >= args.minibatches:
                break
    async with AsyncAdmissionClient(connection) as admission:
        status = await admission.status()
    print(f"admission: admitted {status.admitted_total} trajectories, released {status.released_minibatches} "
          f"mini-batches, policy version {status.policy_version}")


if __name__ == "__main__":
    asyncio.run(main())
