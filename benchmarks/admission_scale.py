"""The admission service at cluster scale: report-to-last-assignment latency and bytes sent per mini-batch.

One service process per cell (trajectories per mini-batch × consumers) and arm, in memory. A watcher process
holds the assignment streams (asyncio, raw bytes: decoding is the consumers' own work) and records when each
consumer receives each mini-batch and how many bytes its stream carried. Two arms, run one after the other for
each cell, alternating which goes first:

- ``consumer``: one WatchAssignments stream per planned consumer (a sidecar process each);
- ``node``: one WatchNodeAssignments stream per node of 8 GPUs, for the consumers placed on it (the backbone's
  (DP, CP) ranks in order, 8 to a node, and the encoder ranks spread over the same GPUs), as a sidecar process
  hosting a node's consumers holds it.

Per round, the mini-batch's trajectories but one are reported (in reports of at most 1,000), then the clock
starts and the last one is reported: the latency runs to the LAST consumer receiving its assignment (and,
beside it, to the first), the ack to that report's answer. One untimed round warms each cell up; the figures
are medians over the timed rounds.

Consumers: 5 = backbone dp 2 × cp 2 + 1 encoder rank; 80 = dp 16 × cp 4 + 16; 320 = dp 64 × cp 4 + 64.

    python benchmarks/admission_service.py --scale [--scale-quick] [--arms consumer node]
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
GPUS_PER_NODE = 8
ARMS = ("consumer", "node")


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


def _sequence_of(raw: bytes | memoryview) -> int:
    """The response's sequence (field 1, serialised first), without decoding the rest."""
    if raw[:1] == b"\x08":
        return _varint(raw, 1)[0]
    return pb.WatchAssignmentsResponse.FromString(bytes(raw)).sequence


def _nodes(streams: int) -> list[list[int]]:
    """Which consumers (positions in :func:`_consumers`) each node of 8 GPUs hosts."""
    dp, cp, encoder_dp = STREAMS[streams]
    gpus = dp * cp
    nodes: dict[int, list[int]] = {}
    for position in range(gpus):  # backbone (d, c) is GPU d·cp + c
        nodes.setdefault(position // GPUS_PER_NODE, []).append(position)
    for e in range(encoder_dp):  # encoder rank e on GPU e·gpus/encoder_dp
        nodes.setdefault(e * gpus // encoder_dp // GPUS_PER_NODE, []).append(gpus + e)
    return [nodes[k] for k in sorted(nodes)]


def _varint(raw: bytes | memoryview, at: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        byte = raw[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, at


def _node_parts(raw: bytes) -> list[tuple[int, list[int]]]:
    """(sequence, consumer positions) of each message of a WatchNodeAssignmentsResponse, read off the wire
    without decoding the messages (the consumers decode their own)."""
    parts, at = [], 0
    while at < len(raw):
        _, at = _varint(raw, at)  # field 1, length-delimited: one NodeAssignment
        size, at = _varint(raw, at)
        end, positions, sequence = at + size, [], 0
        while at < end:
            tag, at = _varint(raw, at)
            length, at = _varint(raw, at)
            if tag >> 3 == 1:  # packed consumer_indices
                stop = at + length
                while at < stop:
                    position, at = _varint(raw, at)
                    positions.append(position)
            else:  # the WatchAssignmentsResponse
                sequence = _sequence_of(memoryview(raw)[at:at + length])
                at += length
        parts.append((sequence, positions))
    return parts


def _watch_all(address: str, streams: int, arm: str, connected, arrivals) -> None:
    """Hold the arm's streams; put (sequence, consumer, arrival time, bytes) for each consumer's message received
    (a node stream's bytes counted once, on the first of its consumers)."""

    async def watch(channel: grpc.aio.Channel, index: int, consumer: topology_pb2.ConsumerId) -> None:
        call = channel.unary_stream("/knittrans.v1.AdmissionService/WatchAssignments",
                                    request_serializer=pb.WatchAssignmentsRequest.SerializeToString,
                                    response_deserializer=lambda raw: raw)(
            pb.WatchAssignmentsRequest(consumer=consumer))
        async for raw in call:
            arrivals.put((_sequence_of(raw), index, time.perf_counter(), len(raw)))

    async def watch_node(channel: grpc.aio.Channel, members: list[int],
                         consumers: list[topology_pb2.ConsumerId]) -> None:
        call = channel.unary_stream("/knittrans.v1.AdmissionService/WatchNodeAssignments",
                                    request_serializer=pb.WatchNodeAssignmentsRequest.SerializeToString,
                                    response_deserializer=lambda raw: raw)(
            pb.WatchNodeAssignmentsRequest(consumers=[consumers[m] for m in members]))
        async for raw in call:
            at, size = time.perf_counter(), len(raw)
            for sequence, positions in _node_parts(raw):
                for position in positions:
                    arrivals.put((sequence, members[position], at, size))
                    size = 0

    async def main() -> None:
        options = [("grpc.max_receive_message_length", MAX_MESSAGE), ("grpc.use_local_subchannel_pool", 1)]
        # A few connections, as many sidecars would use: one HTTP/2 connection for 320 streams is its own limit.
        channels = [grpc.aio.insecure_channel(address, options=[*options, ("grpc.channel_id", k)])
                    for k in range(8)]
        for channel in channels:
            await channel.channel_ready()
        consumers = _consumers(streams)
        if arm == "node":
            watches = [asyncio.ensure_future(watch_node(channels[k % len(channels)], members, consumers))
                       for k, members in enumerate(_nodes(streams))]
        else:
            watches = [asyncio.ensure_future(watch(channels[i % len(channels)], i, consumer))
                       for i, consumer in enumerate(consumers)]
        # A stream opened late still gets every mini-batch (after_sequence 0), and the first round is untimed.
        await asyncio.sleep(1.0)
        connected.set()
        await asyncio.gather(*watches)

    asyncio.run(main())


def _minibatch(prefix: str, trajectories: int, rng: np.random.Generator):
    from admission_service import trajectory  # the benchmark's own trajectory shape

    return [trajectory(prefix, i, int(rng.integers(300, 4000))) for i in range(trajectories)]


def measure_cell(workdir: Path, trajectories: int, streams: int, rounds: int, arm: str) -> dict:
    from admission_service import Service, report_request

    service = Service(_write_config(workdir / f"scale-{trajectories}-{streams}.yaml", trajectories, streams), workdir)
    context = multiprocessing.get_context("spawn")
    connected = context.Event()
    arrivals = context.Queue()
    watcher = context.Process(target=_watch_all, args=(service.address, streams, arm, connected, arrivals),
                              daemon=True)
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
        "cell": f"{trajectories}x{streams}", "arm": arm, "trajectories": trajectories, "consumers": streams,
        "streams": streams if arm == "consumer" else len(_nodes(streams)), "rounds": rounds,
        "last_assignment_p50_ms": round(statistics.median(latencies), 2),
        "last_assignment_max_ms": round(max(latencies), 2),
        "report_ack_p50_ms": round(statistics.median(acks), 2),
        "first_assignment_p50_ms": round(statistics.median(firsts_at), 2),
        "bytes_per_minibatch": int(statistics.median(sizes)),
    }


def run_scale(workdir: Path, *, rounds: int, trajectories: tuple[int, ...], streams: tuple[int, ...],
              arms: tuple[str, ...] = ARMS) -> dict:
    cells = []
    flip = False
    for count in trajectories:
        for stream_count in streams:
            for arm in (arms[::-1] if flip else arms):
                cell = measure_cell(workdir, count, stream_count, rounds, arm)
                print(f"  scale {cell['cell']} ({arm} streams: {cell['streams']}): last assignment p50 "
                      f"{cell['last_assignment_p50_ms']} ms, first {cell['first_assignment_p50_ms']} ms, ack p50 "
                      f"{cell['report_ack_p50_ms']} ms, {cell['bytes_per_minibatch']} bytes", file=sys.stderr)
                cells.append(cell)
            flip = not flip
    return {"benchmark": "admission_service", "mode": "scale", "cells": cells,
            "targets": {"last_assignment_p50_ms": TARGETS_MS, "bytes_per_minibatch": TARGET_BYTES}}


if __name__ == "__main__":
    print(json.dumps({"error": "run benchmarks/admission_service.py --scale"}))
