"""A trainer rank that stops itself (SIGSTOP) at a known point, for tests that kill a process while it is there:
after the training loop got micro-batch ``MICRO`` of its ``MINI``-th mini-batch (both from 0). It consumes
``--minibatches`` mini-batches and writes, per mini-batch, what ``trainer_worker.describe`` says of each
micro-batch plus the sidecar incarnation that published it; a typed error ends the run and is written too.

    python tests/integration/reorg/stopping_trainer.py --socket unix:/... --admission 127.0.0.1:PORT \
        --minibatches 4 --stop-at 1:1 --output out.json
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time

# Run as a script: its directory is on sys.path, so the other worker script imports by its name.
from trainer_worker import describe

from knittrans.client.connection import ConnectionSettings
from knittrans.errors import KnitTransError
from knittrans.trainer import TrainerClient, TrainerSettings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--socket", required=True)
    parser.add_argument("--admission", required=True)
    parser.add_argument("--minibatches", type=int, required=True)
    parser.add_argument("--stop-at", required=True, help="MINI:MICRO, both counted from 0")
    parser.add_argument("--deadline", type=float, default=20.0, help="sidecar_timeout_seconds")
    parser.add_argument("--output", required=True)
    args = parser.parse_args(argv)
    stop_mini, stop_micro = (int(part) for part in args.stop_at.split(":"))
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    settings = TrainerSettings(sidecar=args.socket, admission=ConnectionSettings(target=args.admission),
                               device="cpu", poll_seconds=2.0, sidecar_timeout_seconds=args.deadline)
    result: dict = {"minibatches": []}
    started = time.monotonic()
    try:
        with TrainerClient(settings) as client:
            for count, mini in enumerate(client.mini_batches()):
                micros = []
                result["current"] = mini.sequence
                for micro in mini:
                    micros.append({**describe(micro), "incarnation": micro.descriptor.incarnation})
                    if (count, micro.index) == (stop_mini, stop_micro):
                        os.kill(os.getpid(), signal.SIGSTOP)  # the test kills something, then continues us
                        started = time.monotonic()
                mini.complete()
                result["minibatches"].append({"sequence": mini.sequence, "num_microbatches": mini.num_microbatches,
                                              "microbatches": micros})
                if len(result["minibatches"]) == args.minibatches:
                    break
            result["restarts_seen"] = client.stats.restarts_seen
    except KnitTransError as error:
        result["error"] = {"type": type(error).__name__, "message": str(error),
                           "after_seconds": time.monotonic() - started}
    with open(args.output, "w") as handle:
        json.dump(result, handle)
    return 0 if "error" not in result else 3


if __name__ == "__main__":
    sys.exit(main())
