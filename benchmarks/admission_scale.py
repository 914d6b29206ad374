"""The admission service at cluster scale: report-to-last-assignment latency and bytes sent per mini-batch.

One service process per cell (trajectories per mini-batch × assignment streams), in memory. A watcher process
holds every planned consumer's WatchAssignments stream (asyncio, raw bytes: decoding is the consumers' own
work) and records when each stream receives each mini-batch and how many bytes it carried. Per round, the
mini-batch's trajectories but one are reported (in reports of at most 1,000), then the clock starts and the
last one is reported: the latency runs to the LAST stream receiving the mini-batch's assignment (and, beside it,
to the first), the ack to that report's answer. One untimed round warms each cell up; the figures are medians
over the timed rounds.

Streams: 5 = backbone dp 2 × cp 2 + 1 encoder rank; 80 = dp 16 × cp 4 + 16; 320 = dp 64 × cp 4 + 64.

    python benchmarks/admission_service.py --scale [--scale-quick]
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import statistics
import sys
import time
from pathlib import Path

import grpc
import numpy as np
import yaml

from knittrans.client.admission import AdmissionClient
from knittrans.client.connection import ConnectionSettings, open_channel
from knittrans.types import BACKBONE_ROLE, ENCODER_ROLE_PREFIX
from knittrans.v1 import admission_service_pb2 as pb
from knittrans.v1 import topology_pb2

TRAJECTORIES = (64, 512, 4096)
STREAMS = {5: (2, 2, 1), 80: (16, 4, 16), 320: (64, 4, 64)}  # streams -> (backbone dp, cp, encoder dp)
NUM_MINIBATCHES = 4
MAX_MESSAGE = 256 << 20
TARGETS_MS = {"4096x320": 200.0, "512x320": 40.0}
TARGET_BYTES = {"4096x320": 12_000_000}


def _write_config(path: Path, trajectories: int, streams: int) -> Path:
    dp, cp, encoder_dp = STREAMS[streams]
    path.write_text(yaml.safe_dump({
        "job": "bench-scale",
        "state": "memory",
        "max_report_batch": 1000,
        "engine": {"train_batch_size": trajectories * NUM_MINIBATCHES, "num_minibatches": NUM_MINIBATCHES,
                   "sources": {"A": 0.25, "B": 0.25}, "max_batches_ahead": None},
        "topology": {"backbone": {"dp": dp, "cp": cp, "max_tokens_per_microbatch": 16384},
                     "encoders": [{"name": "vision", "dp": encoder_dp, "max_cost_per_microbatch": 4096}]},
        "server": {"port": 0, "metrics": {"port": -1}, "max_message_bytes": MAX_MESSAGE},
    }))
    return path


def _consumers(streams: int) -> list[topology_pb2.ConsumerId]:
    dp, cp, encoder_dp = STREAMS[streams]
    consumers = [topology_pb2.ConsumerId(role=BACKBONE_ROLE, dp_rank=d, cp_rank=c)
                 for d in range(dp) for c in range(cp)]
    consumers += [topology_pb2.ConsumerId(role=f"{ENCODER_ROLE_PREFIX}vision", dp_rank=d) for d in range(encoder_dp)]
    return consumers


def _sequence_of(raw: bytes) -> int:
    """The response's sequence (field 1, serialised first), without decoding the rest."""
    if raw[:1] == b"\x08":
        value, shift = 0, 0
        for byte in raw[1:11]:
            value |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                return value
    return pb.WatchAssignmentsResponse.FromString(raw).sequence


def _watch_all(address: str, streams: int, connected, arrivals) -> None:
    """Hold every consumer's stream; put (sequence, stream, arrival time, bytes) for each message received."""

    async def watch(channel: grpc.aio.Channel, index: int, consumer: topology_pb2.ConsumerId) -> None:
        call = channel.unary_stream("/knittrans.v1.AdmissionService/WatchAssignments",
                                    request_serializer=pb.WatchAssignmentsRequest.SerializeToString,
                                    response_deserializer=lambda raw: raw)(
            pb.WatchAssignmentsRequest(consumer=consumer))
        async for raw in call:
            arrivals.put((_sequence_of(raw), index, time.perf_counter(), len(raw)))

    async def main() -> None:
        options = [("grpc.max_receive_message_length", MAX_MESSAGE), ("grpc.use_local_subchannel_pool", 1)]
        # A few connections, as many sidecars would use: one HTTP/2 connection for 320 streams is its own limit.
        channels = [grpc.aio.insecure_channel(address, options=[*options, ("grpc.channel_id", k)])
                    for k in range(8)]
        for channel in channels:
            await channel.channel_ready()
        watches = [asyncio.ensure_future(watch(channels[i % len(channels)], i, consumer))
                   for i, consumer in enumerate(_consumers(streams))]
        # A stream opened late still gets every mini-batch (after_sequence 0), and the first round is untimed.
        await asyncio.sleep(1.0)
        connected.set()
        await asyncio.gather(*watches)

    asyncio.run(main())


def _minibatch(prefix: str, trajectories: int, rng: np.random.Generator):
    from admission_service import trajectory  # the benchmark's own trajectory shape

    return [trajectory(prefix, i, int(rng.integers(300, 4000))) for i in range(trajectories)]


def measure_cell(workdir: Path, trajectories: int, streams: int, rounds: int) -> dict:
    from admission_service import Service, report_request

    service = Service(_write_config(workdir / f"scale-{trajectories}-{streams}.yaml", trajectories, streams), workdir)
    context = multiprocessing.get_context("spawn")
    connected = context.Event()
    arrivals = context.Queue()
    watcher = context.Process(target=_watch_all, args=(service.address, streams, connected, arrivals), daemon=True)
    watcher.start()
    try:
        if not connected.wait(timeout=120):
            raise RuntimeError("the watcher could not open every stream")
        client = AdmissionClient(service.address)
        channel = open_channel(ConnectionSettings(target=service.address))
        grpc.channel_ready_future(channel).result(timeout=30)
        send = channel.unary_unary("/knittrans.v1.AdmissionService/ReportTrajectories",
                                   request_serializer=lambda raw: raw,
                                   response_deserializer=pb.ReportTrajectoriesResponse.FromString)
        rng = np.random.default_rng(trajectories * 1000 + streams)
        latencies, acks, sizes, firsts_at = [], [], [], []
        received: dict[int, dict[int, tuple[float, int]]] = {}
        for sequence in range(1, rounds + 2):
            batch = _minibatch(f"s{sequence}", trajectories, rng)
            firsts = [report_request(f"r{sequence}-{k}", batch[k : min(k + 1000, trajectories - 1)], "batch")
                      for k in range(0, trajectories - 1, 1000)]
            last = report_request(f"r{sequence}-last", batch[-1:], "batch")
            for raw in firsts:
                send(raw, timeout=120)
            started = time.perf_counter()
            send(last, timeout=120)
            acked = time.perf_counter()
            got = received.setdefault(sequence, {})
            while len(got) < streams:
                s, index, at, size = arrivals.get(timeout=300)
                received.setdefault(s, {})[index] = (at, size)
            if sequence > 1:  # the first round warms up
                latencies.append((max(at for at, _ in got.values()) - started) * 1000)
                firsts_at.append((min(at for at, _ in got.values()) - started) * 1000)
                acks.append((acked - started) * 1000)
                sizes.append(sum(size for _, size in got.values()))
            if sequence % NUM_MINIBATCHES == 0:
                client.advance_version(train_batch_index=sequence // NUM_MINIBATCHES - 1,
                                       new_version=sequence // NUM_MINIBATCHES)
        channel.close()
    finally:
        watcher.kill()
        watcher.join()
        service.stop()
    return {
        "cell": f"{trajectories}x{streams}", "trajectories": trajectories, "streams": streams, "rounds": rounds,
        "last_assignment_p50_ms": round(statistics.median(latencies), 2),
        "last_assignment_max_ms": round(max(latencies), 2),
        "report_ack_p50_ms": round(statistics.median(acks), 2),
        "first_assignment_p50_ms": round(statistics.median(firsts_at), 2),
        "bytes_per_minibatch": int(statistics.median(sizes)),
    }


def run_scale(workdir: Path, *, rounds: int, trajectories: tuple[int, ...], streams: tuple[int, ...]) -> dict:
    cells = []
    for count in trajectories:
        for stream_count in streams:
            cell = measure_cell(workdir, count, stream_count, rounds)
            print(f"  scale {cell['cell']}: last assignment p50 {cell['last_assignment_p50_ms']} ms, first "
                  f"{cell['first_assignment_p50_ms']} ms, ack p50 {cell['report_ack_p50_ms']} ms, "
                  f"{cell['bytes_per_minibatch']} bytes", file=sys.stderr)
            cells.append(cell)
    return {"benchmark": "admission_service", "mode": "scale", "cells": cells,
            "targets": {"last_assignment_p50_ms": TARGETS_MS, "bytes_per_minibatch": TARGET_BYTES}}


if __name__ == "__main__":
    print(json.dumps({"error": "run benchmarks/admission_service.py --scale"}))
