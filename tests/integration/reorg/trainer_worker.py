"""One trainer rank for the reorg integration tests: consumes mini-batches through ``TrainerClient`` and writes
what it received as JSON (per item: the global token positions it holds and CRCs of every field there).

    python tests/integration/reorg/trainer_worker.py --socket unix:/... --tp-rank 0 --global-rank 0 \
        --admission 127.0.0.1:PORT --minibatches 4 --output out.json [--sleep 0.1] [--mode iter] [--asyncio]

With ``--asyncio`` it consumes them with ``async for`` through ``knittrans.aio.AsyncTrainerClient`` instead, and
records them the same way.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
import zlib

import numpy as np

from knittrans.aio import AsyncTrainerClient
from knittrans.client.connection import ConnectionSettings
from knittrans.errors import KnitTransError
from knittrans.trainer import TrainerClient, TrainerSettings


def crc(array: np.ndarray) -> int:
    return zlib.crc32(np.ascontiguousarray(array).tobytes())


def describe(micro) -> dict:
    t = {name: tensor.numpy() for name, tensor in micro.tensors.items()}
    cu, lengths, positions = t["cu_seqlens"], t["seq_lengths"], t["position_ids"]
    items = []
    for i, trajectory_id in enumerate(micro.trajectory_ids):
        rows = np.arange(cu[i], cu[i + 1])
        real = rows[positions[rows] < lengths[i]]
        padding = rows[positions[rows] >= lengths[i]]
        items.append({
            "trajectory_id": trajectory_id,
            "positions": positions[real].tolist(),
            "input_ids": crc(t["input_ids"][real]),
            "routing": crc(t["routing"][real]),
            "loss_mask": crc(t["loss_mask"][real]),
            "labels": crc(t["labels"][real]),
            "padding_is_clean": bool(np.all(t["input_ids"][padding] == 0) and np.all(t["labels"][padding] == -100)
                                     and np.all(t["loss_mask"][padding] == 0)),
        })
    return {"index": micro.index, "last": micro.last, "loss_tokens": micro.loss_tokens,
            "trajectory_ids": list(micro.trajectory_ids), "items": items,
            "tensors": sorted(micro.keys())}


def describe_mini(mini, micros: list[dict]) -> dict:
    return {"sequence": mini.sequence, "train_batch_index": mini.train_batch_index,
            "minibatch_index": mini.minibatch_index, "global_loss_tokens": mini.global_loss_tokens,
            "num_microbatches": mini.num_microbatches, "consumer": str(mini.consumer), "microbatches": micros}


def consume(settings: TrainerSettings, args: argparse.Namespace, result: dict) -> None:
    with TrainerClient(settings) as client:
        for mini in client.mini_batches():
            micros = []
            for micro in mini:
                micros.append(describe(micro))
                time.sleep(args.sleep)
            mini.complete()  # the optimizer step is done
            result["minibatches"].append(describe_mini(mini, micros))
            if len(result["minibatches"]) == args.minibatches:
                break
        result["stats"] = {"restarts_seen": client.stats.restarts_seen,
                           "skipped_after_restart": client.stats.skipped_after_restart}


async def consume_async(settings: TrainerSettings, args: argparse.Namespace, result: dict) -> None:
    async with AsyncTrainerClient(settings) as client:
        async for mini in client.mini_batches():
            micros = []
            async for micro in mini:
                micros.append(describe(micro))
                await asyncio.sleep(args.sleep)
            await mini.complete()
            result["minibatches"].append(describe_mini(mini, micros))
            if len(result["minibatches"]) == args.minibatches:
                break
        result["stats"] = {"restarts_seen": client.stats.restarts_seen,
                           "skipped_after_restart": client.stats.skipped_after_restart}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--socket", required=True)
    parser.add_argument("--tp-rank", type=int, required=True)
    parser.add_argument("--global-rank", type=int, required=True)
    parser.add_argument("--admission", required=True)
    parser.add_argument("--minibatches", type=int, required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--sleep", type=float, default=0.0, help="simulated compute per micro-batch")
    parser.add_argument("--mode", default="iter")
    parser.add_argument("--asyncio", action="store_true", help="consume through AsyncTrainerClient")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    settings = TrainerSettings(sidecar=args.socket, tp_rank=args.tp_rank, global_rank=args.global_rank,
                               mode=args.mode, admission=ConnectionSettings(target=args.admission),
                               sidecar_timeout_seconds=20.0, poll_seconds=2.0)
    result: dict = {"minibatches": []}
    try:
        if args.asyncio:
            asyncio.run(consume_async(settings, args, result))
        else:
            consume(settings, args, result)
    except KnitTransError as error:
        result["error"] = f"{type(error).__name__}: {error}"
    with open(args.output, "w") as handle:
        json.dump(result, handle)
    return 0 if "error" not in result else 3


if __name__ == "__main__":
    sys.exit(main())
