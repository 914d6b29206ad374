"""The admission service's CPU per admitted mini-batch, in process: planning it, and building every consumer's
message, for the cluster-scale topology of ``admission_service.py --scale`` (backbone dp 64 × cp 4, 64 vision
encoder ranks) and that benchmark's trajectories (4 token fields, 4 images each).

``admission_service.py --scale`` times the same work end to end (report to the last consumer holding its
assignment), where it shares 2 cores with the ingest, the streams and the watcher process, so that a change of
a few milliseconds in the build is lost in its spread. This times the two steps alone, best of ``--repeats`` per
round and the median over rounds; compare revisions with ``benchmarks/ab.py`` (both arms then run this script):

    python benchmarks/dispatch_build.py [--trajectories 512 4096] [--rounds 5] [--repeats 5]
    python benchmarks/ab.py --base <revision> --script head --benchmark dispatch_build --rounds 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np
from admission_service import trajectory  # the scale benchmark's trajectories (this script's folder is on the path)

from knittrans.admission.service.assignment_messages import assignment_bytes, planned_keys
from knittrans.admission.service.assignments import MiniBatchDispatch, gather_rows
from knittrans.admission.service.ledger import AdmittedMiniBatch
from knittrans.admission.service.trajectory_columns import TrajectoryColumns
from knittrans.types import BACKBONE_ROLE, BackboneTopology, EncoderTopology, Topology
from knittrans.v1 import admission_pb2
from knittrans.wire.columns import batch_from_messages

TOPOLOGY = Topology(backbone=BackboneTopology(dp=64, cp=4, max_tokens_per_microbatch=16384),
                    encoders=(EncoderTopology(name="vision", dp=64, max_cost_per_microbatch=4096),))


def measure(trajectories: int, rounds: int, repeats: int) -> dict:
    rng = np.random.default_rng(trajectories)
    columns = TrajectoryColumns.from_proto(batch_from_messages(
        [trajectory("s", i, int(rng.integers(300, 4000))) for i in range(trajectories)]))
    admission = admission_pb2.MiniBatchAdmission(train_batch_index=0, minibatch_index=0, num_minibatches=4)
    minibatch = AdmittedMiniBatch(sequence=1, admission=admission, trajectory_ids=(), owed_steps=set())
    keys = planned_keys(TOPOLOGY, BACKBONE_ROLE)

    def once() -> tuple[float, float, int]:
        started = time.perf_counter()
        dispatch = MiniBatchDispatch(gather_rows([(columns, row) for row in range(trajectories)]), TOPOLOGY, ())
        planned = time.perf_counter()
        size = sum(len(assignment_bytes(minibatch, dispatch, admission, key)) for key in keys)
        return planned - started, time.perf_counter() - planned, size

    once()  # imports, caches
    plans, builds, size = [], [], 0
    for _ in range(rounds):
        samples = [once() for _ in range(repeats)]
        plans.append(min(s[0] for s in samples))
        builds.append(min(s[1] for s in samples))
        size = samples[0][2]
    return {"trajectories": trajectories, "consumers": len(keys), "plan_ms": round(1e3 * statistics.median(plans), 3),
            "build_ms": round(1e3 * statistics.median(builds), 3),
            "plan_and_build_ms": round(1e3 * statistics.median(p + b for p, b in zip(plans, builds, strict=True)), 3),
            "message_bytes": size}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trajectories", type=int, nargs="+", default=[512, 4096])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    cells = []
    for count in args.trajectories:
        cells.append(measure(count, args.rounds, args.repeats))
        print(f"  {count} trajectories: plan {cells[-1]['plan_ms']} ms, build {cells[-1]['build_ms']} ms",
              file=sys.stderr, flush=True)
    print(json.dumps({"benchmark": "dispatch_build", "cells": cells}, indent=2))


if __name__ == "__main__":
    main()
