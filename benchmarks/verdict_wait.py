"""From a mini-batch's verdict to a trainer rank holding its first micro-batch, when the verdict is the last thing
the sidecar waits for.

At cluster scale a sidecar's verdict waits for the slowest of hundreds of consumers' verifications, while the
sidecar's own CPU is idle. Whatever the sidecar does for micro-batch 0 after the verdict (reading its bytes out
of the store and packing them) is then exposed to every rank it serves. This measures exactly that window.

One reorg sidecar in this process (backbone DP rank 0, CP rank 0 of dp 1 x cp 2 x tp 1, so its reads are the
CP-ranged slices a real sidecar makes) on the file store or Mooncake, a real TrainerClient, and an assignment
source that gives each mini-batch's verdict only once the rank finished the mini-batch before it and ``--hold-ms``
more have passed. Per mini-batch: verdict given -> micro-batch 0 held by the rank. No baseline arm runs inside
this script: the baseline is the sidecar that reads micro-batch 0 after the verdict, an earlier revision, run
interleaved with :mod:`ab`:

    python benchmarks/verdict_wait.py --store mooncake
    python benchmarks/ab.py --base 684bc9d --script head --benchmark verdict_wait --rounds 3 -- --store mooncake

JSON on stdout; progress on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from knittrans.admission.planning import plan_minibatch
from knittrans.reorg.assignments import Admission, PlannedAssignmentSource, Verdict
from knittrans.reorg.endpoint import start_reorg
from knittrans.reorg.settings import ReorgSettings, RingSettings
from knittrans.rollout import RolloutClient
from knittrans.serving.settings import MetricsSettings, ServerSettings
from knittrans.store.factory import open_store
from knittrans.trainer import TrainerClient, TrainerSettings
from knittrans.types import BackboneTopology, ConsumerId, Topology, VersionSegment

logger = logging.getLogger("verdict_wait")
MAX_TOKENS_PER_MICROBATCH = 524_288


class VerdictOnCue(PlannedAssignmentSource):
    """Gives mini-batch ``sequence``'s verdict once the driver cues it (from another thread)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cues: dict[int, asyncio.Event] = {}
        self.given_at: dict[int, float] = {}

    def cue(self, sequence: int) -> asyncio.Event:
        return self.cues.setdefault(sequence, asyncio.Event())

    async def wait_verdict(self, sequence: int) -> Verdict:
        await self.cue(sequence).wait()
        self.given_at[sequence] = time.perf_counter()
        return await super().wait_verdict(sequence)


def plans(rollout: RolloutClient, *, minibatches: int, trajectories: int, tokens: int, cp: int) -> list[Any]:
    rng = np.random.default_rng(7)
    topology = Topology(backbone=BackboneTopology(dp=1, cp=cp, tp=1,
                                                  max_tokens_per_microbatch=MAX_TOKENS_PER_MICROBATCH))
    planned = []
    for m in range(minibatches):
        lengths = rng.integers(tokens // 2, tokens * 3 // 2, trajectories)
        metas = [rollout.submit({"input_ids": rng.integers(1, 50_000, int(n), dtype=np.int32)},
                                trajectory_id=f"m{m}t{i}", sample_id=f"m{m}t{i}", source="A", rollout_step=0,
                                segments=(VersionSegment(version=0, num_tokens=int(n)),), loss_mask_field=None)
                 for i, n in enumerate(lengths)]
        planned.append((Admission(minibatch_index=m, num_minibatches=minibatches), plan_minibatch(metas, topology)))
    return planned


def run(store_url: str, args: argparse.Namespace) -> dict[str, Any]:
    job = f"vw{uuid.uuid4().hex[:6]}"
    writer = open_store(store_url)
    planned = plans(RolloutClient(writer, namespace=job), minibatches=args.minibatches,
                    trajectories=args.trajectories, tokens=args.tokens, cp=2)
    consumer = ConsumerId(role="backbone", dp_rank=0, cp_rank=0)
    source = VerdictOnCue(consumer, planned, job=job)
    settings = ReorgSettings(job=job, role=consumer.role, dp_rank=0, cp_rank=0, store=store_url,
                             ring=RingSettings(slots=2), server=ServerSettings(metrics=MetricsSettings(port=-1)))
    loop = asyncio.new_event_loop()
    loop_thread = threading.Thread(target=loop.run_forever, daemon=True)
    loop_thread.start()

    def on_loop(coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, loop).result(timeout=120)

    running = on_loop(start_reorg(settings, source=source, store=open_store(store_url)))
    held_at: dict[int, float] = {}
    finished = [threading.Event() for _ in planned]
    client = TrainerClient(TrainerSettings(sidecar=running.address, device="cpu", prefetch=1,
                                           report_progress=False))

    failed: list[BaseException] = []

    def train() -> None:
        try:
            for index, mini in zip(range(len(planned)), client.mini_batches(), strict=False):
                for position, _ in enumerate(mini):
                    if position == 0:
                        held_at[mini.sequence] = time.perf_counter()
                mini.complete()
                finished[index].set()
        except BaseException as error:  # raised by the driver, which would otherwise wait on the events
            failed.append(error)
            for event in finished:
                event.set()

    trainer = threading.Thread(target=train, daemon=True)
    trainer.start()
    try:
        for index in range(len(planned)):
            if index:
                finished[index - 1].wait(timeout=120)
            time.sleep(args.hold_ms / 1000)
            sequence = index + 1
            loop.call_soon_threadsafe(source.cue(sequence).set)
            print(f"mini-batch {sequence}/{len(planned)}", file=sys.stderr)
        trainer.join(timeout=120)
        if failed:
            raise RuntimeError("the trainer rank failed") from failed[0]
        if trainer.is_alive():
            raise RuntimeError("the trainer rank did not finish its mini-batches within 120 s")
        waits = [held_at[s] - source.given_at[s] for s in sorted(held_at)]
        counters = running.sidecar.counters
        return {
            "verdict_to_first_microbatch_ms": [round(w * 1000, 3) for w in waits],
            "verdict_to_first_microbatch_median_ms": round(statistics.median(waits) * 1000, 3),
            "verdict_to_first_microbatch_max_ms": round(max(waits) * 1000, 3),
            "microbatches_per_minibatch": planned[0][1].microbatches_per_rank,
            "bytes_per_minibatch_read": counters.bytes_read // len(planned),
            "amplification": counters.bytes_read / counters.bytes_needed,
        }
    finally:
        client.close()
        on_loop(running.stop(grace=0))
        loop.call_soon_threadsafe(loop.stop)
        loop_thread.join(timeout=10)
        writer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", choices=("file", "mooncake"), default="file")
    parser.add_argument("--minibatches", type=int, default=8)
    parser.add_argument("--trajectories", type=int, default=256, help="per mini-batch")
    parser.add_argument("--tokens", type=int, default=8192, help="mean tokens per trajectory")
    parser.add_argument("--hold-ms", type=float, default=200.0,
                        help="how long after the rank finished the previous mini-batch the verdict comes")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    # The file store lives on /dev/shm, as the transfer benchmark's does.
    with tempfile.TemporaryDirectory(prefix="verdict-wait-", dir="/dev/shm") as directory:
        if args.store == "mooncake":
            from knittrans.launch.mooncake import MooncakeClusterConfig, start_mooncake

            cluster = start_mooncake(MooncakeClusterConfig(segment_size=2048 << 20),
                                     log_dir=Path(directory) / "mooncake")
            try:
                result = run(cluster.store_url, args)
            finally:
                cluster.stop()
        else:
            result = run(f"file://{directory}/units", args)
    print(json.dumps({"benchmark": "verdict_wait", "store": args.store, "hold_ms": args.hold_ms, **result},
                     indent=2))


if __name__ == "__main__":
    main()
