"""A rollout worker's submit path: ``RolloutClient.submit`` of text-only trajectories through a
``BatchingReporter``, against the real admission service (its own process, in memory) and the file store on
/dev/shm, as a rollout worker calls it when completions trickle in one at a time.

Per round, ``--calls`` submits of new trajectories are timed one by one (latency from the call to its
return: the store write, the reservation of its units and the queued report); throughput is the round's
trajectories over its wall time, including the reporter's flush at the end. Compare revisions with
``benchmarks/ab.py`` (the script only uses names present before and after the TTL reservations landed):

    python benchmarks/rollout_submit.py [--quick]
    python benchmarks/ab.py --base 8c65b29 --benchmark rollout_submit --script head --rounds 3 -- --quick
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from admission_service import Service, write_config

from knittrans.client.admission import AdmissionClient
from knittrans.client.reporter import BatchingReporter
from knittrans.rollout import RolloutClient
from knittrans.store.file import FileUnitStore
from knittrans.types import VersionSegment

TOKENS = 400


def progress(message: str) -> None:
    print(f"[rollout-submit] {message}", file=sys.stderr, flush=True)


def submit_round(
    rollout: RolloutClient, reporter: BatchingReporter, prefix: str, calls: int
) -> tuple[list[float], float]:
    tokens = np.arange(TOKENS, dtype=np.int32)
    mask = np.ones(TOKENS, dtype=np.int32)
    latencies = []
    started = time.perf_counter()
    for index in range(calls):
        before = time.perf_counter()
        rollout.submit(
            {"input_ids": tokens, "loss_mask": mask},
            trajectory_id=f"{prefix}-{index}",
            sample_id=f"{prefix}-s{index}",
            source="A" if index % 2 else "B",
            rollout_step=0,
            segments=[VersionSegment(version=0, num_tokens=TOKENS)],
        )
        latencies.append((time.perf_counter() - before) * 1e6)
    reporter.flush()
    return latencies, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=500, help="submits per round")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--quick", action="store_true", help="200 submits x 3 rounds")
    args = parser.parse_args()
    calls, rounds = (200, 3) if args.quick else (args.calls, args.rounds)
    latencies: list[float] = []
    rates: list[float] = []
    with tempfile.TemporaryDirectory(prefix="knittrans-bench-") as scratch, \
            tempfile.TemporaryDirectory(prefix="knittrans-bench-", dir="/dev/shm") as units:
        workdir = Path(scratch)
        # One mini-batch admits nothing within the run: reports only enter the pool.
        config = write_config(workdir / "admission.yaml", "memory", train_batch_size=1 << 20, num_minibatches=1)
        service = Service(config, workdir)
        client = AdmissionClient(service.address)
        reporter = BatchingReporter(client)
        store = FileUnitStore(units)
        rollout = RolloutClient(store, namespace="bench", reporter=reporter)
        try:
            submit_round(rollout, reporter, "warm", 20)
            for number in range(rounds):
                round_latencies, seconds = submit_round(rollout, reporter, f"r{number}", calls)
                latencies.extend(round_latencies)
                rates.append(calls / seconds)
                progress(f"round {number + 1}/{rounds}: {calls / seconds:.0f} trajectories/s")
        finally:
            reporter.close()
            client.close()
            service.stop()
    ordered = sorted(latencies)
    print(json.dumps({
        "benchmark": "rollout_submit",
        "tokens_per_trajectory": TOKENS,
        "submits": len(ordered),
        "submit_p50_us": round(ordered[len(ordered) // 2], 1),
        "submit_p99_us": round(ordered[int(len(ordered) * 0.99)], 1),
        "submit_mean_us": round(statistics.fmean(ordered), 1),
        "trajectories_per_second_median_round": round(statistics.median(rates), 1),
    }, indent=1))


if __name__ == "__main__":
    main()
