"""Recovery time and memory of the admission service with a Redis journal: snapshots against today's full replay.

Recovery: a journal of N trajectories reported 10 at a time (admitted in mini-batches of 250, each released by
its optimizer step, released units journaled as deleted) is written for each arm into one real redis-server
started here: ``snapshot`` (the default, a snapshot every ``snapshot_every_records`` records, the journal
truncated behind it) and ``full`` (the baseline: ``snapshot_every_records: 0``, the whole journal replayed, as
before snapshots). Driving a million trajectories through gRPC would take most of an hour, so the journal is
fed in bulk: the real servicer runs in this process against an in-memory journal that behaves like the Redis one
(fenced appends, the snapshot script's truncation), its snapshots taken by the service's own background task,
and the result is written to Redis as the service would have left it. Recovery is then measured by the real
start-up path: `knittrans admission serve` as a process, from spawn to its ready file (what a startupProbe
sees), with ``empty`` (a job without a journal) giving the process's own start-up time; the arms alternate,
``--rounds`` starts each. ``recovery_seconds`` is an arm's median ready time minus the empty arm's;
``replay_seconds`` is what the service logs for its recovery (snapshot restore plus the tail).

Memory: per pending trajectory (reported, not admitted), for reports of 10 and of 1,000 trajectories (the
admission_service benchmark's trajectory: 4 per-token fields, 4 images), the service's RSS growth while it
ingests them live, and the RSS of a service that recovered them from the journal minus an empty service's.

Targets (issue 15): recovery <= 2 s after 1M trajectories reported 10 at a time; <= 2 KB per pending trajectory
whatever the report size.

    python benchmarks/recovery.py [--quick] [--trajectories N] [--rounds R] [--memory-trajectories M] [--memory-only]

Memory before and after a change to the ledger, side by side (``--script head``: the baseline's script may lack
``--memory-only``; each arm still imports its own code):

    python benchmarks/ab.py --base main --benchmark recovery --script head --rounds 1 -- --memory-only
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
import redis
import yaml
from prometheus_client import CollectorRegistry

from knittrans.admission.engine import EngineConfig
from knittrans.admission.service.journal import AppendOutcome, StoredSnapshot
from knittrans.admission.service.ledger import AdmissionLedger, LedgerSettings
from knittrans.admission.service.metrics import AdmissionMetrics
from knittrans.admission.service.servicer import AdmissionServicer
from knittrans.launch.redis import start_redis
from knittrans.types import BackboneTopology, EncoderTopology, Topology
from knittrans.v1 import admission_service_pb2 as pb
from knittrans.v1 import journal_pb2, trajectory_pb2
from knittrans.wire import consumer_to_proto
from knittrans.wire.columns import batch_from_messages

sys.path.insert(0, str(Path(__file__).parent))
from admission_service import trajectory as heavy_trajectory

SOURCES = {"A": 0.25, "B": 0.25}
TRAIN_BATCH, MINIBATCHES = 1000, 4
SNAPSHOT_EVERY = 1000
TARGET_RECOVERY_SECONDS = 2.0
TARGET_BYTES_PER_PENDING = 2048
RECOVERED = re.compile(r"recovered (\d+) journal records in ([0-9.]+)s")


def log(message: str) -> None:
    print(f"[recovery] {message}", file=sys.stderr, flush=True)


def light_trajectory(index: int) -> trajectory_pb2.TrajectoryMetadata:
    trajectory_id = f"t{index}"
    return trajectory_pb2.TrajectoryMetadata(
        trajectory_id=trajectory_id, sample_id=f"s{index}", source="AB"[index % 2], num_tokens=64,
        num_loss_tokens=32, segments=[trajectory_pb2.VersionSegment(version=0, num_tokens=64)],
        units=[trajectory_pb2.UnitRef(
            key=f"{trajectory_id}/input_ids", field_name="input_ids", kind=trajectory_pb2.UNIT_KIND_TOKEN_FIELD,
            header=trajectory_pb2.UnitHeader(dtype=trajectory_pb2.D_TYPE_INT32, shape=[64], seq_axis=0,
                                             byte_length=256, content_hash="0" * 32))],
        accepted=True,
    )


class BulkJournal:
    """The Redis journal's behaviour in memory (fenced appends, snapshots that drop the records they include),
    written to Redis at the end as the service would have left it there."""

    keeps_records = True

    def __init__(self) -> None:
        self.records: list[bytes] = []  # the list's records, sequences end - len + 1 .. end
        self.end = 0
        self.snapshot: bytes | None = None
        self.chunks: list[bytes] = []

    async def append(self, record: journal_pb2.JournalRecord) -> AppendOutcome:
        assert record.sequence == self.end + 1
        self.records.append(record.SerializeToString(deterministic=True))
        self.end += 1
        return AppendOutcome.APPENDED

    async def replay(self, after: int = 0):
        for raw in self.records[after - (self.end - len(self.records)):]:
            yield journal_pb2.JournalRecord.FromString(raw)

    async def read_snapshot(self) -> StoredSnapshot | None:
        return None if self.snapshot is None else StoredSnapshot(state=self.snapshot, chunks=list(self.chunks))

    async def write_snapshot(self, sequence: int, state: bytes, chunks_before: int, new_chunk: bytes) -> None:
        assert sequence == self.end and chunks_before == len(self.chunks)
        if new_chunk:
            self.chunks.append(new_chunk)
        self.snapshot = state
        self.records.clear()

    async def close(self) -> None:
        return None

    def write_to(self, client: redis.Redis, job: str) -> None:
        key = f"knittrans:{job}:journal"
        client.delete(key, f"{key}:end", f"{key}:snapshot", f"{key}:fingerprints")
        for start in range(0, len(self.records), 10_000):
            client.rpush(key, *self.records[start : start + 10_000])
        client.set(f"{key}:end", self.end)
        if self.snapshot is not None:
            client.set(f"{key}:snapshot", self.snapshot)
            if self.chunks:
                client.rpush(f"{key}:fingerprints", *self.chunks)


async def feed(trajectories: int, report_size: int, snapshot_every: int) -> BulkJournal:
    """The journal the real servicer writes for ``trajectories`` reported ``report_size`` at a time, each
    mini-batch stepped (so released) as soon as it is admitted."""
    engine = EngineConfig(train_batch_size=TRAIN_BATCH, num_minibatches=MINIBATCHES, sources=SOURCES,
                          max_batches_ahead=None)
    topology = Topology(backbone=BackboneTopology(dp=1, cp=1, max_tokens_per_microbatch=65536),
                        encoders=(EncoderTopology(name="vision", dp=1, max_cost_per_microbatch=4096),))
    journal = BulkJournal()
    ledger = AdmissionLedger(LedgerSettings(engine=engine, topology=topology, max_report_batch=1000))
    clock = [1_000_000.0]
    servicer = AdmissionServicer(ledger=ledger, journal=journal, metrics=AdmissionMetrics(CollectorRegistry(),
                                 SOURCES), job="feed", clock=lambda: clock[0], snapshot_every=snapshot_every)
    await servicer.recover()
    servicer.start_background()
    consumers = [consumer_to_proto(c) for c in ledger.consumers]
    stepped = 0
    for start in range(0, trajectories, report_size):
        clock[0] += 0.001
        batch = batch_from_messages([light_trajectory(i) for i in range(start, start + report_size)])
        await servicer.ReportTrajectories(pb.ReportTrajectoriesRequest(request_id=f"r{start}", batch=batch), None)
        while stepped < ledger.next_sequence - 1:
            stepped += 1
            for consumer in consumers:
                await servicer.ReportProgress(pb.ReportProgressRequest(
                    consumer=consumer, sequence=stepped, stage=pb.PROGRESS_STAGE_OPTIMIZER_STEP), None)
        for _ in range(3):  # the background tasks (deletions, snapshots) run between calls, as in the service
            await asyncio.sleep(0)
        if start % 100_000 == 0:
            log(f"  fed {start:,} trajectories ({journal.end:,} records, {len(journal.records):,} in the list)")
    for _ in range(20):
        await asyncio.sleep(0.01)
    await servicer.close()
    return journal


def write_config(path: Path, redis_url: str, job: str, snapshot_every: int, *, train_batch: int = TRAIN_BATCH,
                 max_report_batch: int = 1000) -> Path:
    path.write_text(yaml.safe_dump({
        "job": job, "state": redis_url, "snapshot_every_records": snapshot_every, "max_report_batch": max_report_batch,
        "engine": {"train_batch_size": train_batch, "num_minibatches": MINIBATCHES, "sources": SOURCES,
                   "max_batches_ahead": None},
        "topology": {"backbone": {"dp": 1, "cp": 1, "max_tokens_per_microbatch": 65536},
                     "encoders": [{"name": "vision", "dp": 1, "max_cost_per_microbatch": 4096}]},
        "server": {"port": 0, "metrics": {"port": -1}, "max_message_bytes": 256 << 20},
    }))
    return path


class Service:
    def __init__(self, config: Path, workdir: Path) -> None:
        self.ready = workdir / "ready.json"
        self.ready.unlink(missing_ok=True)
        self.log_path = workdir / "service.log"
        self.log = open(self.log_path, "wb")
        self.started = time.perf_counter()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "knittrans.cli", "admission", "serve", "--config", str(config),
             "--ready-file", str(self.ready)], stdout=self.log, stderr=subprocess.STDOUT)
        while not self.ready.exists():
            if self.process.poll() is not None:
                raise RuntimeError(f"service failed, see {self.log_path}")
            time.sleep(0.005)
        self.ready_seconds = time.perf_counter() - self.started
        self.address = json.loads(self.ready.read_text())["address"]

    def rss(self) -> int:
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        return int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) * 1024

    def replay_seconds(self) -> float | None:
        found = RECOVERED.findall(self.log_path.read_text())
        return float(found[-1][1]) if found else None

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=60)
        self.log.close()


def measure_recovery(redis_url: str, workdir: Path, trajectories: int, rounds: int) -> dict:
    client = redis.Redis.from_url(redis_url)
    arms = {"full": 0, "snapshot": SNAPSHOT_EVERY}
    result: dict = {"trajectories": trajectories, "report_size": 10, "snapshot_every_records": SNAPSHOT_EVERY}
    for arm, every in arms.items():
        log(f"feeding the {arm} arm's journal ({trajectories:,} trajectories in reports of 10)")
        started = time.perf_counter()
        journal = asyncio.run(feed(trajectories, 10, every))
        journal.write_to(client, f"recovery-{arm}")
        result[arm] = {"journal_records": journal.end, "records_in_redis": len(journal.records),
                       "snapshot_bytes": len(journal.snapshot or b""),
                       "fingerprint_chunk_bytes": sum(map(len, journal.chunks)),
                       "ready_seconds": [], "replay_seconds": []}
        log(f"  {journal.end:,} records ({len(journal.records):,} left in the list) in "
            f"{time.perf_counter() - started:.0f}s")
        del journal
    result["empty"] = {"ready_seconds": []}
    client.close()
    order = ["empty", "full", "snapshot"]
    for round_index in range(rounds):
        for arm in order if round_index % 2 == 0 else order[::-1]:  # interleaved, alternating
            arm_dir = workdir / arm
            arm_dir.mkdir(exist_ok=True)
            config = write_config(arm_dir / "admission.yaml", redis_url, f"recovery-{arm}",
                                  arms.get(arm, SNAPSHOT_EVERY))
            service = Service(config, arm_dir)
            result[arm]["ready_seconds"].append(round(service.ready_seconds, 3))
            if arm != "empty":
                result[arm]["replay_seconds"].append(service.replay_seconds())
            service.stop()
            log(f"  round {round_index + 1}/{rounds} {arm}: ready in {service.ready_seconds:.2f}s")
    empty = statistics.median(result["empty"]["ready_seconds"])
    for arm in arms:
        ready = statistics.median(result[arm]["ready_seconds"])
        result[arm]["median_ready_seconds"] = round(ready, 3)
        result[arm]["recovery_seconds"] = round(ready - empty, 3)
    result["empty"]["median_ready_seconds"] = round(empty, 3)
    result["speedup"] = round(result["full"]["recovery_seconds"] / max(result["snapshot"]["recovery_seconds"], 1e-3),
                              1)
    result["target_met"] = result["snapshot"]["recovery_seconds"] <= TARGET_RECOVERY_SECONDS
    return result


def measure_memory(redis_url: str, workdir: Path, trajectories: int) -> dict:
    result: dict = {"trajectories": trajectories}
    for size in (10, 1000):
        arm_dir = workdir / f"memory-{size}"
        arm_dir.mkdir(exist_ok=True)
        job = f"recovery-memory-{size}"
        config = write_config(arm_dir / "admission.yaml", redis_url, job, SNAPSHOT_EVERY, train_batch=10_000_000)
        redis.Redis.from_url(redis_url).delete(*(f"knittrans:{job}:journal{s}" for s in ("", ":end", ":snapshot",
                                                                                            ":fingerprints")))
        service = Service(config, arm_dir)
        channel = grpc.insecure_channel(service.address, options=[("grpc.max_send_message_length", 256 << 20)])
        send = channel.unary_unary("/knittrans.v1.AdmissionService/ReportTrajectories",
                                   request_serializer=lambda raw: raw,
                                   response_deserializer=pb.ReportTrajectoriesResponse.FromString)

        def report(start: int, count: int, size: int = size, send=send) -> None:
            for first in range(start, start + count, size):
                messages = [heavy_trajectory("m", i, 512) for i in range(first, first + size)]
                send(pb.ReportTrajectoriesRequest(request_id=f"r{first}", batch=batch_from_messages(messages))
                     .SerializeToString(), timeout=60)

        warm = max(size, trajectories // 10)
        report(0, warm)
        before = service.rss()
        report(warm, trajectories)
        time.sleep(0.5)
        live = (service.rss() - before) / trajectories
        channel.close()
        service.stop()
        empty_dir = workdir / "memory-empty"
        empty_dir.mkdir(exist_ok=True)
        empty = Service(write_config(empty_dir / "admission.yaml", redis_url, f"recovery-memory-empty-{size}", 0),
                        empty_dir)
        empty_rss = empty.rss()
        empty.stop()
        recovered = Service(config, arm_dir)
        time.sleep(0.5)
        recovered_bytes = (recovered.rss() - empty_rss) / (warm + trajectories)
        recovered.stop()
        result[f"report_size_{size}"] = {
            "live_bytes_per_pending_trajectory": round(live),
            "recovered_bytes_per_pending_trajectory": round(recovered_bytes),
        }
        log(f"  reports of {size}: {live:.0f} B per pending trajectory live, {recovered_bytes:.0f} B recovered")
    result["target_met"] = all(v["live_bytes_per_pending_trajectory"] <= TARGET_BYTES_PER_PENDING
                               and v["recovered_bytes_per_pending_trajectory"] <= TARGET_BYTES_PER_PENDING
                               for k, v in result.items() if k.startswith("report_size"))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a small run (well under a minute on 2 cores)")
    parser.add_argument("--trajectories", type=int, default=1_000_000, help="trajectories in the recovery journal")
    parser.add_argument("--rounds", type=int, default=3, help="starts of each arm")
    parser.add_argument("--memory-trajectories", type=int, default=100_000, help="pending trajectories measured")
    parser.add_argument("--memory-only", action="store_true", help="measure the memory per pending trajectory only")
    args = parser.parse_args()
    if args.quick:
        args.trajectories, args.rounds, args.memory_trajectories = 20_000, 2, 5_000
    with tempfile.TemporaryDirectory(prefix="knittrans-bench-") as tmp:
        workdir = Path(tmp)
        server = start_redis(workdir / "redis")
        try:
            log("memory per pending trajectory")
            memory = measure_memory(server.url, workdir, args.memory_trajectories)
            recovery = None
            if not args.memory_only:
                log("recovery")
                recovery = measure_recovery(server.url, workdir, args.trajectories, args.rounds)
        finally:
            server.stop()
    print(json.dumps({
        "benchmark": "recovery", "baseline": "full replay (snapshot_every_records: 0)", "recovery": recovery,
        "memory": memory, "targets": {"recovery_seconds": TARGET_RECOVERY_SECONDS,
                                      "bytes_per_pending_trajectory": TARGET_BYTES_PER_PENDING},
    }, indent=2))


if __name__ == "__main__":
    main()
