"""One trainer rank for the reorg integration tests: consumes mini-batches through ``TrainerClient`` and writes
what it received as JSON (per item: the global token positions it holds and CRCs of every field there).

    python tests/integration/reorg/trainer_worker.py --socket unix:/... --tp-rank 0 --global-rank 0 \
        --admission 127.0.0.1:PORT --minibatches 4 --output out.json [--sleep 0.1] [--mode iter] \
        [--progress progress.jsonl [--hold-at 1 [--hold-sequence 5] [--hold-until-restart]]] \
        [--checkpoint-at 2] [--restored-step 0:1] [--asyncio] [--passes 2 [--hold-pass 1] [--release-file F]]

With ``--progress`` it also appends one JSON line per micro-batch it takes, per restarted mini-batch and per
step, as it goes (a test reads it to kill the process at a chosen point). ``--hold-at I`` stops the training
loop at micro-batch I of the first mini-batch, holding it (a "holding" line says so): forever, or with
``--hold-until-restart`` until the client has learnt that the sidecar restarted the mini-batch; with
``--hold-sequence S``, at micro-batch I of mini-batch S instead. With ``--passes N`` it iterates each
mini-batch N times (``mini_batches(passes=N)``) and records every pass; ``--hold-pass P`` holds in pass P, and
``--release-file F`` ends the hold once F exists. A mini-batch that raises MiniBatchRestarted is
recorded and not counted as a step. ``--checkpoint-at S`` reports a checkpoint after the step on mini-batch S
(``ReportCheckpoint``); ``--restored-step T:M`` starts as a process restored from a checkpoint holding step
(train batch T, mini-batch M); ``--restored-step before-first``, as one of a job restarted without a
checkpoint. ``--record-admitted`` records each mini-batch's admitted trajectories as the sidecar retains them.

With ``--asyncio`` it consumes them with ``async for`` through ``knittrans.aio.AsyncTrainerClient`` instead, and
records them the same way (the progress, hold and checkpoint options are for the synchronous loop).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
import zlib

import numpy as np

from knittrans.aio import AsyncTrainerClient
from knittrans.client.admission import AdmissionClient
from knittrans.client.connection import ConnectionSettings
from knittrans.errors import KnitTransError, MiniBatchRestarted
from knittrans.trainer import BEFORE_FIRST_STEP, RestorePoint, StepId, TrainerClient, TrainerSettings


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


def describe_mini(mini, micros: list[dict], admitted: list[str] | None = None) -> dict:
    step = mini.step
    return {"sequence": mini.sequence, "train_batch_index": mini.train_batch_index,
            "minibatch_index": mini.minibatch_index, "global_loss_tokens": mini.global_loss_tokens,
            "num_microbatches": mini.num_microbatches, "consumer": str(mini.consumer),
            "step": [step.train_batch_index, step.minibatch_index, step.train_version], "admitted": admitted,
            "microbatches": micros}


def consume(settings: TrainerSettings, args: argparse.Namespace, result: dict, note,
            restored: StepId | RestorePoint | None) -> None:
    held = False
    with TrainerClient(settings, restored_step=restored) as client:
        for mini in client.mini_batches(passes=args.passes):
            micros = []
            passes: list[list[dict]] = []
            try:
                for number in range(args.passes):
                    micros = []
                    for micro in mini:
                        micros.append(describe(micro))
                        note(event="micro", sequence=mini.sequence, micro=micros[-1], **{"pass": number})
                        if micro.index == args.hold_at and not held and number == args.hold_pass and (
                                not args.hold_sequence or mini.sequence == args.hold_sequence):
                            held = True
                            note(event="holding", sequence=mini.sequence, index=micro.index, **{"pass": number})
                            while not ((args.hold_until_restart and client.stats.minibatch_restarts)
                                       or (args.release_file and os.path.exists(args.release_file))):
                                time.sleep(0.05)
                        time.sleep(args.sleep)
                    passes.append(micros)
                micros = passes[0]
            except MiniBatchRestarted as restarted:  # drop the partial gradient; it comes again
                result["restarted"].append({"sequence": restarted.sequence, "yielded": len(micros)})
                note(event="restarted", sequence=restarted.sequence, yielded=len(micros))
                continue
            # Asked before the step: once the mini-batch is released, the service no longer streams it.
            admitted = list(mini.context.admitted_trajectory_ids) if args.record_admitted else None
            mini.complete()  # the optimizer step is done
            step = mini.step
            if mini.sequence == args.checkpoint_at:
                with AdmissionClient(args.admission) as admission:
                    admission.report_checkpoint(step)
            note(event="step", sequence=mini.sequence, indices=[m["index"] for m in micros])
            result["minibatches"].append(describe_mini(mini, micros, admitted))
            if args.passes > 1:
                result["minibatches"][-1]["passes"] = passes
            if len(result["minibatches"]) == args.minibatches:
                break
        result["stats"] = {"restarts_seen": client.stats.restarts_seen,
                           "skipped_after_restart": client.stats.skipped_after_restart}


async def consume_async(settings: TrainerSettings, args: argparse.Namespace, result: dict) -> None:
    async with AsyncTrainerClient(settings) as client:
        async for mini in client.mini_batches(passes=args.passes):
            passes: list[list[dict]] = []
            for _ in range(args.passes):
                micros = []
                async for micro in mini:
                    micros.append(describe(micro))
                    await asyncio.sleep(args.sleep)
                passes.append(micros)
            await mini.complete()
            result["minibatches"].append(describe_mini(mini, passes[0]))
            if args.passes > 1:
                result["minibatches"][-1]["passes"] = passes
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
    parser.add_argument("--progress", default="")
    parser.add_argument("--hold-at", type=int, default=-1)
    parser.add_argument("--hold-until-restart", action="store_true")
    parser.add_argument("--hold-sequence", type=int, default=0)
    parser.add_argument("--hold-pass", type=int, default=0, help="hold in this pass over the mini-batch")
    parser.add_argument("--release-file", default="", help="stop holding once this file exists")
    parser.add_argument("--passes", type=int, default=1, help="iterate each mini-batch this many times")
    parser.add_argument("--checkpoint-at", type=int, default=0)
    parser.add_argument("--restored-step", default="")
    parser.add_argument("--record-admitted", action="store_true",
                        help="ask the sidecar (GetMiniBatch) for each mini-batch's admitted trajectories")
    args = parser.parse_args(argv)
    progress = open(args.progress, "a") if args.progress else None

    def note(**line: object) -> None:
        if progress is not None:
            progress.write(json.dumps(line) + "\n")
            progress.flush()

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    settings = TrainerSettings(sidecar=args.socket, tp_rank=args.tp_rank, global_rank=args.global_rank,
                               mode=args.mode, admission=ConnectionSettings(target=args.admission),
                               sidecar_timeout_seconds=20.0, poll_seconds=2.0)
    result: dict = {"minibatches": [], "restarted": []}
    restored: StepId | RestorePoint | None = None
    if args.restored_step == "before-first":
        restored = BEFORE_FIRST_STEP
    elif args.restored_step:
        train_batch, minibatch = (int(x) for x in args.restored_step.split(":"))
        restored = StepId(train_batch_index=train_batch, minibatch_index=minibatch)
    try:
        if args.asyncio:
            asyncio.run(consume_async(settings, args, result))
        else:
            consume(settings, args, result, note, restored)
    except KnitTransError as error:
        result["error"] = f"{type(error).__name__}: {error}"
    with open(args.output, "w") as handle:
        json.dump(result, handle)
    return 0 if "error" not in result else 3


if __name__ == "__main__":
    sys.exit(main())
