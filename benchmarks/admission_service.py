"""Admission service benchmark: ingest throughput and report-to-assignment latency, in memory and with Redis.

The service runs as its own process (`knittrans admission serve`), as in production. Ingest clients are
separate processes that send pre-serialised reports of 1,000 trajectories per RPC, each trajectory with 4
per-token fields and 4 multimodal references, as a columnar TrajectoryBatch (what AdmissionClient sends) and,
as the baseline, as a list of TrajectoryMetadata messages; ingest time runs from the start signal until the
last report is acknowledged. Latency is measured from sending the report that makes a mini-batch of 64
admissible (its 64th trajectory; the other 63 are reported just before) to the assignment arriving on a
backbone consumer's stream, in both report forms, after one untimed round.

Targets (issue 6, on 2 cores): >= 50k reports/s in memory, >= 20k reports/s with Redis, p99 <= 10 ms.

``--scale`` measures instead the latency to the last of many consumers and the bytes sent per mini-batch, for
64/512/4,096 trajectories per mini-batch × 5/80/320 assignment streams (see admission_scale.py; issue 16
targets: <= 200 ms at 4,096 / 320, <= 40 ms at 512 / 320, <= 12 MB per mini-batch at 4,096 / 320).
``--scale-quick`` is the same grid with 2 timed rounds per cell.

    python benchmarks/admission_service.py [--quick | --scale [--scale-quick] [--rounds N]]
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

import grpc
import numpy as np
import yaml

from knittrans.client.admission import AdmissionClient
from knittrans.client.connection import ConnectionSettings, open_channel
from knittrans.launch.redis import start_redis
from knittrans.types import ConsumerId
from knittrans.v1 import admission_service_pb2 as pb
from knittrans.v1 import admission_service_pb2_grpc, trajectory_pb2
from knittrans.wire import consumer_to_proto
from knittrans.wire.columns import batch_from_messages

BATCH = 1000
# The columnar batch (what AdmissionClient sends) is measured against the baseline: a list of messages, the
# form plain gRPC users may send.
FORMS = ("batch", "messages")
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


def report_request(request_id: str, trajectories: list[trajectory_pb2.TrajectoryMetadata], form: str) -> bytes:
    """A serialised report in either form: ``batch`` (columns, what AdmissionClient sends) or ``messages``."""
    if form == "batch":
        request = pb.ReportTrajectoriesRequest(request_id=request_id, batch=batch_from_messages(trajectories))
        return request.SerializeToString()
    return pb.ReportTrajectoriesRequest(request_id=request_id, trajectories=trajectories).SerializeToString()


def _ingest_worker(address: str, prefix: str, rpcs: int, form: str, barrier, results) -> None:
    rng = np.random.default_rng(abs(hash(prefix)) % 2**32)
    requests = [
        report_request(f"{prefix}-{r}", [trajectory(prefix, r * BATCH + i, int(rng.integers(300, 4000)))
                                         for i in range(BATCH)], form)
        for r in range(rpcs)
    ]
    channel = open_channel(ConnectionSettings(target=address))
    grpc.channel_ready_future(channel).result(timeout=30)  # connect before the clock starts
    send = channel.unary_unary("/knittrans.v1.AdmissionService/ReportTrajectories",
                               request_serializer=lambda raw: raw,
                               response_deserializer=pb.ReportTrajectoriesResponse.FromString)
    barrier.wait()
    for raw in requests:
        send(raw, timeout=60)
    results.put(time.perf_counter())  # CLOCK_MONOTONIC: comparable across processes
    channel.close()


def measure_ingest(address: str, clients: int, rpcs_per_client: int, label: str, form: str) -> dict:
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(clients + 1)
    results = context.Queue()
    workers = [context.Process(target=_ingest_worker,
                               args=(address, f"{label}{c}", rpcs_per_client, form, barrier, results))
               for c in range(clients)]
    for worker in workers:
        worker.start()
    barrier.wait()
    started = time.perf_counter()
    # Until the last report is acknowledged (the workers' exit is not part of ingest).
    wall = max(results.get(timeout=600) for _ in workers) - started
    for worker in workers:
        worker.join()
    reports = clients * rpcs_per_client * BATCH
    return {"form": form, "clients": clients, "reports": reports, "seconds": round(wall, 3),
            "reports_per_second": round(reports / wall)}


def measure_latency(address: str, rounds: int, minibatch: int, num_minibatches: int, form: str) -> dict:
    """Send m−1 trajectories, then time the m-th report until its assignment arrives on the stream.

    Both channels are connected, and one round is run untimed, before the first timed round."""
    client = AdmissionClient(address)
    arrivals: dict[int, float] = {}
    arrived = threading.Condition()
    watching = threading.Event()

    def watch() -> None:
        # Arrival is when the assignment message is received; turning it into domain objects is the consumer's
        # own work, so the raw stream is read here.
        channel = open_channel(ConnectionSettings(target=address))
        grpc.channel_ready_future(channel).result(timeout=30)
        watcher = admission_service_pb2_grpc.AdmissionServiceStub(channel)
        request = pb.WatchAssignmentsRequest(consumer=consumer_to_proto(CONSUMER))
        stream = watcher.WatchAssignments(request)
        watching.set()
        for response in stream:
            with arrived:
                arrivals[response.sequence] = time.perf_counter()
                arrived.notify_all()

    threading.Thread(target=watch, daemon=True).start()
    channel = open_channel(ConnectionSettings(target=address))
    grpc.channel_ready_future(channel).result(timeout=30)
    watching.wait(timeout=30)
    send = channel.unary_unary("/knittrans.v1.AdmissionService/ReportTrajectories",
                               request_serializer=lambda raw: raw,
                               response_deserializer=pb.ReportTrajectoriesResponse.FromString)
    latencies = []
    index = 0
    for sequence in range(1, rounds + 2):
        batch = [trajectory("lat", index + i, 1000) for i in range(minibatch)]
        index += minibatch
        first = report_request(f"lat{sequence}a", batch[:-1], form)
        last = report_request(f"lat{sequence}b", batch[-1:], form)
        send(first, timeout=10)
        started = time.perf_counter()
        send(last, timeout=10)
        with arrived:
            arrived.wait_for(lambda s=sequence: s in arrivals, timeout=10)
        if sequence > 1:  # the first round warms up
            latencies.append((arrivals[sequence] - started) * 1000)
        if sequence % num_minibatches == 0:  # the train batch is complete: the trainer moves to the next version
            client.advance_version(train_batch_index=sequence // num_minibatches - 1,
                                   new_version=sequence // num_minibatches)
    channel.close()
    values = np.array(latencies)
    return {"form": form, "rounds": rounds, "minibatch": minibatch,
            "p50_ms": round(float(np.percentile(values, 50)), 3), "p99_ms": round(float(np.percentile(values, 99)), 3),
            "max_ms": round(float(values.max()), 3)}


def run_mode(state_label: str, state: str, args: argparse.Namespace, workdir: Path) -> dict:
    result: dict = {"state": state_label}
    ingest = []
    for form in FORMS:
        for clients in (1, 4):
            config = write_config(workdir / f"ingest-{state_label}-{clients}.yaml", state, train_batch_size=1 << 20,
                                  num_minibatches=4)
            service = Service(config, workdir)
            try:
                ingest.append(measure_ingest(service.address, clients, args.rpcs // clients,
                                             f"{state_label}{form}{clients}-", form))
            finally:
                service.stop()
            if state.startswith("redis"):
                import redis

                redis.Redis.from_url(state).flushall()
            print(f"  {state_label}: ingest of {form} with {clients} client(s): "
                  f"{ingest[-1]['reports_per_second']} reports/s", file=sys.stderr)
    result["ingest"] = ingest
    latency = []
    for form in FORMS:
        config = write_config(workdir / f"latency-{state_label}.yaml", state, train_batch_size=args.minibatch * 4,
                              num_minibatches=4)
        service = Service(config, workdir)
        try:
            latency.append(measure_latency(service.address, args.rounds, args.minibatch, 4, form))
        finally:
            service.stop()
        if state.startswith("redis"):
            import redis

            redis.Redis.from_url(state).flushall()
        print(f"  {state_label}: report-to-assignment ({form}) p50 {latency[-1]['p50_ms']} ms, "
              f"p99 {latency[-1]['p99_ms']} ms", file=sys.stderr)
    result["report_to_assignment"] = latency
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rpcs", type=int, default=40, help="report RPCs of 1,000 trajectories per run")
    parser.add_argument("--rounds", type=int, default=200, help="latency samples")
    parser.add_argument("--minibatch", type=int, default=64, help="trajectories per mini-batch in the latency run")
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    parser.add_argument("--scale", action="store_true", help="latency to the last of many consumers, and bytes")
    parser.add_argument("--scale-quick", action="store_true", help="--scale with 2 timed rounds per cell")
    parser.add_argument("--trajectories", type=int, nargs="+", default=None, help="--scale: mini-batch sizes")
    parser.add_argument("--streams", type=int, nargs="+", default=None,
                        help="--scale: consumer counts (5, 80, 320)")
    parser.add_argument("--arms", nargs="+", choices=("consumer", "node"), default=None,
                        help="--scale: a stream per consumer, and/or one per node of 8 GPUs (default both)")
    args = parser.parse_args()
    if args.scale or args.scale_quick:
        from admission_scale import ARMS, STREAMS, TRAJECTORIES, run_scale

        rounds = 2 if args.scale_quick else (args.rounds if args.rounds != 200 else 24)
        with tempfile.TemporaryDirectory(prefix="knittrans-bench-") as tmp:
            result = run_scale(Path(tmp), rounds=rounds, trajectories=tuple(args.trajectories or TRAJECTORIES),
                               streams=tuple(args.streams or STREAMS), arms=tuple(args.arms or ARMS))
        print(json.dumps(result, indent=2))
        return
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
