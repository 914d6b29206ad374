"""Sync admission client overhead: latency of small ``AdmissionClient.report()`` calls, side by side with the
old-style path (a sync gRPC stub with ``call_with_retry``, as ``AdmissionClient.report`` was written before it
wrapped the async core).

The service runs as its own process (`knittrans admission serve`, in memory). Each round times ``--calls``
reports of one trajectory (what a rollout worker's ``BatchingReporter`` sends when completions trickle in)
through each path, the paths interleaved and their order alternating between rounds; every trajectory is new.
Both paths are connected and warmed up before the first round. The old-style path uses only names that exist
before and after the change, so the script runs against either version of the client (``--label`` names the
run, e.g. when PYTHONPATH points at a baseline checkout).

    python benchmarks/admission_client.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from admission_service import Service, trajectory, write_config

from knittrans.client.admission import AdmissionClient
from knittrans.client.connection import ConnectionSettings, call_with_retry, open_channel
from knittrans.v1 import admission_service_pb2 as pb
from knittrans.v1 import admission_service_pb2_grpc
from knittrans.wire import trajectory_from_proto
from knittrans.wire.columns import batch_from_metas

TOKENS = 400


class OldStylePath:
    """What ``AdmissionClient.report`` did before it wrapped the async core: build the columnar request, one
    sync unary call retried with ``call_with_retry``, outcomes read back."""

    def __init__(self, address: str) -> None:
        self._channel = open_channel(ConnectionSettings(target=address))
        self._stub = admission_service_pb2_grpc.AdmissionServiceStub(self._channel)

    def report(self, metas, *, request_id: str) -> list[int]:
        request = pb.ReportTrajectoriesRequest(request_id=request_id)
        request.batch.CopyFrom(batch_from_metas(metas))
        response = call_with_retry(self._stub.ReportTrajectories, request, deadline=timedelta(seconds=10))
        return list(response.outcomes)

    def close(self) -> None:
        self._channel.close()


def metas(prefix: str, count: int) -> list:
    return [trajectory_from_proto(trajectory(prefix, i, TOKENS)) for i in range(count)]


def time_calls(report, batches, prefix: str) -> list[float]:
    """Per-call latency in microseconds."""
    latencies = []
    for index, batch in enumerate(batches):
        started = time.perf_counter()
        report(batch, request_id=f"{prefix}-{index}")
        latencies.append((time.perf_counter() - started) * 1e6)
    return latencies


def summary(latencies: list[float]) -> dict:
    ordered = sorted(latencies)
    return {"calls": len(ordered), "mean_us": round(statistics.fmean(ordered), 1),
            "p50_us": round(ordered[len(ordered) // 2], 1), "p99_us": round(ordered[int(len(ordered) * 0.99)], 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=400, help="report() calls per path per round")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--quick", action="store_true", help="150 calls x 4 rounds")
    parser.add_argument("--label", default="", help="a name for this run (the client version under test)")
    args = parser.parse_args()
    calls, rounds = (150, 4) if args.quick else (args.calls, args.rounds)
    results: dict[str, list[float]] = {"client": [], "old_style": []}
    with tempfile.TemporaryDirectory(prefix="knittrans-bench-") as scratch:
        workdir = Path(scratch)
        # One mini-batch admits nothing within the run: reports only enter the pool.
        config = write_config(workdir / "admission.yaml", "memory", train_batch_size=1 << 20, num_minibatches=1)
        service = Service(config, workdir)
        client = AdmissionClient(service.address)
        old_style = OldStylePath(service.address)
        try:
            paths = {"client": lambda batch, request_id: client.report(batch, request_id=request_id),
                     "old_style": old_style.report}
            for name, report in paths.items():  # connect and warm up
                time_calls(report, [metas(f"warm-{name}", 1) for _ in range(20)], f"warm-{name}")
            trajectories = iter(range(1 << 30))
            for number in range(rounds):
                order = list(paths) if number % 2 == 0 else list(reversed(paths))
                for name in order:
                    batches = [metas(f"{name}{number}-{next(trajectories)}", 1) for _ in range(calls)]
                    results[name].extend(time_calls(paths[name], batches, f"{name}{number}"))
        finally:
            client.close()
            old_style.close()
            service.stop()
    document = {"benchmark": "admission_client", "label": args.label, "trajectories_per_call": 1,
                "paths": {name: summary(latencies) for name, latencies in results.items()}}
    document["client_over_old_style_p50"] = round(
        document["paths"]["client"]["p50_us"] / document["paths"]["old_style"]["p50_us"], 3)
    print(json.dumps(document, indent=1))


if __name__ == "__main__":
    main()
