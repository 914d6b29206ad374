"""A rollout worker that stops itself (SIGSTOP) between writing a trajectory's units and reporting it: the
known point at which a test kills it. It submits through the real RolloutClient, reserving through the real
admission client; its reporter, called once every unit is written, stops the process instead of reporting.

    python tests/integration/reorg/stalled_rollout.py --store file:///... --job JOB --admission HOST:PORT \
        --trajectory t-lost --keys keys.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Sequence

import numpy as np

from knittrans.client.admission import AdmissionClient
from knittrans.rollout import MultimodalInput, RolloutClient
from knittrans.store.factory import open_store
from knittrans.types import TokenSpan, TrajectoryMeta, VersionSegment


class StopBeforeReporting:
    """Reserves through the admission client; where it would report, writes the keys and stops."""

    def __init__(self, client: AdmissionClient, keys_file: str) -> None:
        self._client = client
        self._keys_file = keys_file

    def reserve_units(self, reservations):
        return self._client.reserve_units(reservations)

    def cancel_reservations(self, trajectory_ids):
        return self._client.cancel_reservations(trajectory_ids)

    def report(self, trajectories: Sequence[TrajectoryMeta]) -> None:
        keys = [unit.key for meta in trajectories for unit in meta.units]
        keys += [ref.key for meta in trajectories for ref in meta.multimodal]
        with open(self._keys_file, "w") as handle:
            json.dump(keys, handle)
        os.kill(os.getpid(), signal.SIGSTOP)  # the test kills it here
        raise SystemExit("continued: the test was to kill this worker")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--store", required=True)
    parser.add_argument("--job", required=True)
    parser.add_argument("--admission", required=True)
    parser.add_argument("--trajectory", required=True)
    parser.add_argument("--sample", required=True)
    parser.add_argument("--keys", required=True)
    args = parser.parse_args(argv)
    store = open_store(args.store, job=args.job)
    client = AdmissionClient(args.admission)
    rollout = RolloutClient(store, namespace=args.job, reporter=StopBeforeReporting(client, args.keys))
    rng = np.random.default_rng(7)
    rollout.submit({"input_ids": rng.integers(1, 1000, 30, dtype=np.int32), "loss_mask": np.ones(30, np.uint8)},
                   trajectory_id=args.trajectory, sample_id=args.sample, source="A", rollout_step=0,
                   segments=(VersionSegment(version=0, num_tokens=30),),
                   multimodal=(MultimodalInput(data=rng.integers(0, 255, (8, 8, 3), dtype=np.uint8),
                                               encoder="vision", cost=4.0, placeholder=TokenSpan(start=2, end=6)),))
    return 1  # never reached: the reporter stops the process


if __name__ == "__main__":
    sys.exit(main())
