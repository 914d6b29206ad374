"""The optimizer-step report that releases a mini-batch: how long its caller waits for the answer.

Every consumer of a mini-batch reports its optimizer step (``ReportProgress``); the last report releases the
mini-batch, and its caller is a training loop (the TP rank 0 of the last consumer to step) that the whole job
then waits for at its next collective. The service runs as its own process (``knittrans admission serve``, in
memory, as in ``admission_service.py``: DP 4 x CP 2 backbone consumers and 2 vision encoder consumers). Each
round reports a mini-batch of N trajectories (4 per-token fields and 4 images each), lets it be admitted, then
reports the optimizer step of 9 consumers and times the 10th, the releasing one, until it is answered. Also
timed: one of the 9 (a report that releases nothing), the baseline of a plain progress report.

The revision to compare against is named on the command line, interleaved by ``benchmarks/ab.py``:

    python benchmarks/ab.py --base e73c1ab --script head --benchmark release_report --rounds 3
    python benchmarks/release_report.py [--sizes 256 4096] [--rounds 9]
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

from admission_service import Service, trajectory, write_config

from knittrans.client.admission import AdmissionClient, ProgressStage
from knittrans.types import ConsumerId

logger = logging.getLogger("release_report")

CONSUMERS = tuple(ConsumerId(role="backbone", dp_rank=dp, cp_rank=cp) for dp in range(4) for cp in range(2)) + tuple(
    ConsumerId(role="encoder:vision", dp_rank=dp) for dp in range(2))


def measure(workdir: Path, size: int, rounds: int) -> dict:
    config = write_config(workdir / f"release-{size}.yaml", "memory", train_batch_size=size, num_minibatches=1)
    service = Service(config, workdir)
    try:
        with AdmissionClient(service.address) as client:
            releasing: list[float] = []
            plain: list[float] = []
            for sequence in range(1, rounds + 2):  # the first round warms up
                batch = [trajectory(f"r{sequence}", i, 1000) for i in range(size)]
                for start in range(0, size, 1000):
                    client.report(batch[start:start + 1000])
                deadline = time.monotonic() + 60
                while client.status().admitted_total < sequence * size:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"mini-batch {sequence} was not admitted")
                    time.sleep(0.01)
                for index, consumer in enumerate(CONSUMERS):
                    started = time.perf_counter()
                    released = client.report_progress(consumer, sequence, ProgressStage.OPTIMIZER_STEP)
                    elapsed = (time.perf_counter() - started) * 1e3
                    if released != (index == len(CONSUMERS) - 1):
                        raise RuntimeError(f"report {index} of mini-batch {sequence}: released={released}")
                    if sequence > 1 and index == len(CONSUMERS) - 1:
                        releasing.append(elapsed)
                    elif sequence > 1 and index == 0:
                        plain.append(elapsed)
                logger.info("%d trajectories, round %d/%d: releasing report %.2f ms", size, sequence - 1, rounds,
                            releasing[-1] if releasing else float("nan"))
    finally:
        service.stop()
    return {"trajectories": size, "rounds": rounds,
            "releasing_report_p50_ms": round(statistics.median(releasing), 3),
            "releasing_report_max_ms": round(max(releasing), 3),
            "plain_report_p50_ms": round(statistics.median(plain), 3)}


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 4096], help="trajectories per mini-batch")
    parser.add_argument("--rounds", type=int, default=9, help="timed rounds per size (after one untimed)")
    arguments = parser.parse_args(argv)
    if arguments.rounds < 1 or any(size < 1 for size in arguments.sizes):
        parser.error("--rounds and --sizes must be at least 1")
    with tempfile.TemporaryDirectory(prefix="knittrans-release-") as scratch:
        results = [measure(Path(scratch), size, arguments.rounds) for size in arguments.sizes]
    print(json.dumps({"benchmark": "release_report", "consumers": len(CONSUMERS), "sizes": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
