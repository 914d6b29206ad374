"""Admission service benchmark: ingest throughput and report-to-assignment latency, in memory and with Redis.

The service runs as its own process (`knittrans admission serve`), as in production. Ingest clients are
separate processes that send pre-serialised reports of 1,000 trajectories per RPC, each trajectory with 4
per-token fields and 4 multimodal references. Latency is measured from sending the report that makes a
mini-batch admissible to the assignment arriving on a consumer's stream.

Targets (issue 6, on 2 cores): >= 50k reports/s in memory, >= 20k reports/s with Redis, p99 <= 10 ms.

    python benchmarks/admission_service.py [--quick]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import yaml

from knittrans.client.admission import AdmissionClient
from knittrans.client.connection import ConnectionSettings, open_channel
from knittrans.launch.redis import start_redis
from knittrans.types import ConsumerId
from knittrans.v1 import admission_service_pb2 as pb
from knittrans.v1 import admission_service_pb2_grpc, trajectory_pb2
from knittrans.wire import consumer_to_proto

BATCH = 1000
FIELDS = (("input_ids", trajectory_pb2.D_TYPE_INT32, 1), ("logprobs", trajectory_pb2.D_TYPE_FLOAT32, 1),
          ("loss_mask", trajectory_pb2.D_TYPE_UINT8, 1), ("routing", trajectory_pb2.D_TYPE_UINT8, 64))
ITEMSIZE = {trajectory_pb2.D_TYPE_INT32: 4, trajectory_pb2.D_TYPE_FLOAT32: 4, trajectory_pb2.D_TYPE_UINT8: 1}
HASH = hashlib.blake2b(b"bench", digest_size=16).hexdigest()
CONSUMER = ConsumerId(role="backbone", dp_rank=0, cp_rank=0)


def trajectory(prefix: str, index: int, tokens: int) -> trajectory_pb2.TrajectoryMetadata:
    trajectory_id = f"{prefix}-{index}"
    sample_id = f"{prefix}-s{index // 16}"
    return trajectory_pb2.TrajectoryMetadata(
        trajectory_id=trajectory_id, sample_id=sample_id, source="AB"[index % 2], num_tokens=tokens,
        num_loss_tokens=tokens // 2, segments=[trajectory_pb2.VersionSegment(version=0, num_tokens=tokens // 2)],
        units=[
            trajectory_pb2.UnitRef(
                key=f"{trajectory_id}/{name}", field_name=name, kind=trajectory_pb2.UNIT_KIND_TOKEN_FIELD,
                header=trajectory_pb2.UnitHeader(dtype=dtype, shape=[tokens] + ([width] if width > 1 else []),
                                                 seq_axis=0, byte_length=tokens * width * ITEMSIZE[dtype],
                                                 content_hash=HASH))
            for name, dtype, width in FIELDS
        ],
        multimodal=[
            trajectory_pb2.MultimodalRef(key=f"{sample_id}/img{k}", encoder="vision", cost=256.0,
                                         kind=trajectory_pb2.UNIT_KIND_IMAGE,
                                         placeholder=trajectory_pb2.TokenSpan(start=1 + 70 * k, end=65 + 70 * k))
            for k in range(4)
        ],
        accepted=True,
    )


def write_config(path: Path, state: str, *, train_batch_size: int, num_minibatches: int) -> Path:
    path.write_text(yaml.safe_dump({
        "job": "bench",
        "state": state,
        "max_report_batch": BATCH,
        "engine": {"train_batch_size": train_batch_size, "num_minibatches": num_minibatches,
                   "sources": {"A": 0.25, "B": 0.25}, "max_batches_ahead": None},
        "topology": {"backbone": {"dp": 4, "cp": 2, "max_tokens_per_microbatch": 16384},
                     "encoders": [{"name": "vision", "dp": 2, "max_cost_per_microbatch": 4096}]},
        "server": {"port": 0, "metrics": {"port": -1}},
    }))
    return path


class Service:
    def __init__(self, config: Path, workdir: Path) -> None:
        ready = workdir / "ready.json"
        ready.unlink(missing_ok=True)
        self.log = open(workdir / "service.log", "wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "knittrans.cli", "--log-level", "WARNING", "admission", "serve", "--config",
             str(config), "--ready-file", str(ready)], stdout=self.log, stderr=subprocess.STDOUT)
        while not ready.exists():
            if self.process.poll() is not None:
                raise RuntimeError(f"service failed, see {workdir / 'service.log'}")
            time.sleep(0.05)
        self.address = json.loads(ready.read_text())["address"]

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)
        self.log.close()


def _ingest_worker(address: str, prefix: str, rpcs: int, barrier, results) -> None:
    rng = np.random.default_rng(abs(hash(prefix)) % 2**32)
    requests = [
        pb.ReportTrajectoriesRequest(request_id=f"{prefix}-{r}", trajectories=[
            trajectory(prefix, r * BATCH + i, int(rng.integers(300, 4000))) for i in range(BATCH)]).SerializeToString()
        for r in range(rpcs)
    ]
    channel = open_channel(ConnectionSettings(target=address))
    send = channel.unary_unary("/knittrans.v1.AdmissionService/ReportTrajectories",
                               request_serializer=lambda raw: raw,
                               response_deserializer=pb.ReportTrajectoriesResponse.FromString)
    barrier.wait()
    started = time.perf_counter()
    for raw in requests:
        send(raw, timeout=60)
    results.put(time.perf_counter() - started)
    channel.close()


def measure_ingest(address: str, clients: int, rpcs_per_client: int, label: str) -> dict:
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(clients + 1)
    results = context.Queue()
    workers = [context.Process(target=_ingest_worker, args=(address, f"{label}{c}", rpcs_per_client, barrier, results))
               for c in range(clients)]
    for worker in workers:
        worker.start()
    barrier.wait()
    started = time.perf_counter()
    for worker in workers:
        worker.join()
    wall = time.perf_counter() - started
    reports = clients * rpcs_per_client * BATCH
    return {"clients": clients, "reports": reports, "seconds": round(wall, 3),
            "reports_per_second": round(reports / wall)}


def measure_latency(address: str, rounds: int, minibatch: int, num_minibatches: int) -> dict:
    """Send m−1 trajectories, then time the m-th report until its assignment arrives on the stream."""
    client = AdmissionClient(address)
    arrivals: dict[int, float] = {}
    arrived = threading.Condition()

    def watch() -> None:
        # Arrival is when the assignment message is received; turning it into domain objects is the consumer's
        # own work, so the raw stream is read here.
        watcher = admission_service_pb2_grpc.AdmissionServiceStub(open_channel(ConnectionSettings(target=address)))
        request = pb.WatchAssignmentsRequest(consumer=consumer_to_proto(CONSUMER))
        for response in watcher.WatchAssignments(request):
            with arrived:
                arrivals[response.sequence] = time.perf_counter()
                arrived.notify_all()

    threading.Thread(target=watch, daemon=True).start()
    channel = open_channel(ConnectionSettings(target=address))
    stub = admission_service_pb2_grpc.AdmissionServiceStub(channel)
    latencies = []
    index = 0
    for sequence in range(1, rounds + 1):
        batch = [trajectory("lat", index + i, 1000) for i in range(minibatch)]
        index += minibatch
        stub.ReportTrajectories(pb.ReportTrajectoriesRequest(request_id=f"lat{sequence}a", trajectories=batch[:-1]),
                                timeout=10)
        started = time.perf_counter()
        stub.ReportTrajectories(pb.ReportTrajectoriesRequest(request_id=f"lat{sequence}b", trajectories=batch[-1:]),
                                timeout=10)
        with arrived:
            arrived.wait_for(lambda s=sequence: s in arrivals, timeout=10)
        latencies.append((arrivals[sequence] - started) * 1000)
        if sequence % num_minibatches == 0:  # the train batch is complete: the trainer moves to the next version
            client.advance_version(train_batch_index=sequence // num_minibatches - 1,
                                   new_version=sequence // num_minibatches)
    channel.close()
    values = np.array(latencies)
    return {"rounds": rounds, "minibatch": minibatch, "p50_ms": round(float(np.percentile(values, 50)), 3),
            "p99_ms": round(float(np.percentile(values, 99)), 3), "max_ms": round(float(values.max()), 3)}


def run_mode(state_label: str, state: str, args: argparse.Namespace, workdir: Path) -> dict:
    result: dict = {"state": state_label}
    ingest = []
    for clients in (1, 4):
        config = write_config(workdir / f"ingest-{state_label}-{clients}.yaml", state, train_batch_size=1 << 20,
                              num_minibatches=4)
        service = Service(config, workdir)
        try:
            ingest.append(measure_ingest(service.address, clients, args.rpcs // clients, f"{state_label}{clients}-"))
        finally:
            service.stop()
        if state.startswith("redis"):
            import redis

            redis.Redis.from_url(state).flushall()
        print(f"  {state_label}: ingest with {clients} client(s): {ingest[-1]['reports_per_second']} reports/s",
              file=sys.stderr)
    result["ingest"] = ingest
    config = write_config(workdir / f"latency-{state_label}.yaml", state, train_batch_size=args.minibatch * 4,
                          num_minibatches=4)
    service = Service(config, workdir)
    try:
        result["report_to_assignment"] = measure_latency(service.address, args.rounds, args.minibatch, 4)
    finally:
        service.stop()
    print(f"  {state_label}: report-to-assignment p99 {result['report_to_assignment']['p99_ms']} ms", file=sys.stderr)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rpcs", type=int, default=40, help="report RPCs of 1,000 trajectories per run")
    parser.add_argument("--rounds", type=int, default=200, help="latency samples")
    parser.add_argument("--minibatch", type=int, default=64, help="trajectories per mini-batch in the latency run")
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    args = parser.parse_args()
    if args.quick:
        args.rpcs, args.rounds = 8, 40
    with tempfile.TemporaryDirectory(prefix="knittrans-bench-") as tmp:
        workdir = Path(tmp)
        modes = [run_mode("memory", "memory", args, workdir)]
        redis_server = start_redis(workdir / "redis")
        try:
            modes.append(run_mode("redis", redis_server.url, args, workdir))
        finally:
            redis_server.stop()
    targets = {"memory_reports_per_second": 50_000, "redis_reports_per_second": 20_000, "p99_ms": 10.0}
    print(json.dumps({"benchmark": "admission_service", "batch": BATCH, "modes": modes, "targets": targets}, indent=2))


if __name__ == "__main__":
    main()
