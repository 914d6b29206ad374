"""Unit-store throughput, per backend, side by side with the raw Mooncake batch API and a numpy memcpy.

For 4 MiB and 4 KiB units it measures put and get (MB/s and units/s) and sliced reads (reads/s: each
read takes the two zigzag chunks of CP rank 0 of cp=2, with one token of look-ahead, i.e. about half of
the unit), and the over-read bytes: what the store's I/O really moved for the sliced reads (the counts
``preadv``/the mapped copies, the Mooncake transfer calls and Ray's whole-object fetches report) minus
what the reads asked for. The same run measures the two designs for
sliced Mooncake reads with the raw API: a get session (``batch_get_session_start``, then every range in one
``batch_get_into_multi_buffer_ranges``: what the store uses), ``get_into_ranges`` (what it used before), and
storing per-token fields in fixed chunks and reading whole chunks with ``batch_get_into``.

Each store round also copies the same bytes with numpy (``memcpy`` inside the backend's figures), so the
file store's ratios to memcpy come from one clock and interleaved arms. ``get`` is the first read of each unit;
``get_again`` and ``sliced`` read units the round read before, which the file store copies from the mapping it
kept open (:mod:`knittrans.store.file_mappings`).

Everything is printed as one JSON document on stdout; progress goes to stderr. Each figure is the best
of ``--rounds`` rounds (the CPU is shared, so the best round is the least disturbed one).

    python benchmarks/store.py [--rounds 3] [--large-units 16] [--small-units 2000] [--backends file,mooncake,ray]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from knittrans.launch.mooncake import MooncakeClusterConfig, start_mooncake
from knittrans.store.arrays import array_bytes, header_of
from knittrans.store.file import FileUnitStore
from knittrans.store.mooncake import MooncakeStoreConfig, MooncakeUnitStore
from knittrans.store.protocol import UnitRead, UnitStore, UnitWrite
from knittrans.types import ByteRange, DType, UnitKey

MIB = 1 << 20
TOKEN_BYTES = 4  # the units are float32 per-token fields
SIZES = {"4MiB": 4 * MIB, "4KiB": 4 * 1024}
CHUNKS_PER_UNIT = 16


def progress(message: str) -> None:
    print(f"[store-bench] {message}", file=sys.stderr, flush=True)


def zigzag_rank0_ranges(size: int) -> list[ByteRange]:
    """CP rank 0 of cp=2: chunks 0 and 3 of 4, the first with one token of look-ahead."""
    quarter = size // 4
    return [ByteRange(offset=0, length=quarter + TOKEN_BYTES), ByteRange(offset=3 * quarter, length=quarter)]


def best(rounds: int, run: Callable[[], float]) -> float:
    return min(run() for _ in range(rounds))


def timed(action: Callable[..., Any], *args: Any) -> float:
    started = time.perf_counter()
    action(*args)
    return time.perf_counter() - started


def rates(seconds: float, count: int, nbytes: int) -> dict[str, float]:
    return {"MB_s": round(nbytes / seconds / 1e6, 1), "units_s": round(count / seconds, 1)}


class Workload:
    """``count`` units of ``size`` bytes, their headers, and destination buffers."""

    def __init__(self, size: int, count: int, seed: int = 0) -> None:
        self.size, self.count = size, count
        self.source = np.random.default_rng(seed).integers(0, 255, size=size * count, dtype=np.uint8)
        self.arrays = [self.source[i * size : (i + 1) * size].view(np.float32) for i in range(count)]
        self.headers = [header_of(a, DType.FLOAT32, sequence=True) for a in self.arrays]
        self.destination = np.zeros(size * count, dtype=np.uint8)
        self.ranges = zigzag_rank0_ranges(size)
        self.sliced_bytes = sum(r.length for r in self.ranges)

    def writes(self, prefix: str) -> list[UnitWrite]:
        pairs = zip(self.headers, self.arrays, strict=True)
        return [UnitWrite.of(f"{prefix}/{i}", h, array_bytes(a)) for i, (h, a) in enumerate(pairs)]

    def keys(self, prefix: str) -> list[UnitKey]:
        return [UnitKey(f"{prefix}/{i}") for i in range(self.count)]

    def slot(self, i: int) -> memoryview:
        return memoryview(self.destination)[i * self.size : (i + 1) * self.size]

    def verify_whole(self) -> None:
        if not np.array_equal(self.destination, self.source):
            raise AssertionError("read back different bytes")


def copy_all(work: Workload) -> None:
    for i in range(work.count):
        np.copyto(work.destination[i * work.size : (i + 1) * work.size], work.arrays[i].view(np.uint8))


def bench_memcpy(work: Workload, rounds: int) -> dict[str, float]:
    return rates(best(rounds, lambda: timed(copy_all, work)), work.count, work.size * work.count)


def store_round(store: UnitStore, work: Workload) -> dict[str, float]:
    """One round through the UnitStore: writers' buffers as they come, readers' buffer registered."""
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    writes = work.writes(prefix)
    keys = work.keys(prefix)
    times = {"put": timed(store.put_many, writes), "memcpy": timed(copy_all, work)}
    work.destination[:] = 0
    times["get"] = timed(store.get_many_into, [UnitRead.of(k, work.slot(i)) for i, k in enumerate(keys)])
    work.verify_whole()
    work.destination[:] = 0
    times["get_again"] = timed(store.get_many_into, [UnitRead.of(k, work.slot(i)) for i, k in enumerate(keys)])
    work.verify_whole()
    sliced = [UnitRead.of(k, work.slot(i), work.ranges) for i, k in enumerate(keys)]
    store.stats.reset()
    times["sliced"] = timed(store.get_many_into, sliced)
    stats = store.stats.snapshot()
    times["over_read_bytes"] = stats.over_read_bytes
    times["requested_bytes"] = stats.requested_bytes
    times["moved_bytes"] = stats.moved_bytes
    store.delete_many(keys)
    return times


def raw_round(store: Any, work: Workload, staging: np.ndarray, with_chunks: bool) -> dict[str, float]:
    """The raw Mooncake batch API on the same objects: registered buffers, hard pin, one call per batch.

    With ``with_chunks`` it also measures the alternative layout for sliced reads: the same bytes stored
    as CHUNKS_PER_UNIT fixed chunks, reading every chunk a range touches with one ``batch_get_into``.
    """
    from mooncake.store import ReplicateConfig

    client = store.raw_client
    config = ReplicateConfig()
    config.with_hard_pin = True
    size, count = work.size, work.count
    src = [work.source.ctypes.data + i * size for i in range(count)]
    dst = [work.destination.ctypes.data + i * size for i in range(count)]
    prefix = f"raw-{uuid.uuid4().hex[:8]}"
    keys = [f"{prefix}/{i}" for i in range(count)]
    store.register_buffer(work.source)  # registration is not part of the raw figures
    try:
        times = {"put": timed(check_codes, client.batch_put_from, keys, src, [size] * count, config)}
        work.destination[:] = 0
        times["get"] = timed(check_codes, client.batch_get_into, keys, dst, [size] * count)
        work.verify_whole()
        offsets = [[[0, work.ranges[0].length]] for _ in range(count)]
        sources = [[[r.offset for r in work.ranges]] for _ in range(count)]
        lengths = [[[r.length for r in work.ranges]] for _ in range(count)]
        times["sliced"] = timed(client.get_into_ranges, dst, [[k] for k in keys], offsets, sources, lengths)
        times["sliced_session"] = timed(read_in_session, client, keys, dst, work.ranges)
        chunk_keys: list[str] = []
        if with_chunks:
            chunk = size // CHUNKS_PER_UNIT
            chunk_keys = [f"{prefix}/{i}#c{j}" for i in range(count) for j in range(CHUNKS_PER_UNIT)]
            chunk_sources = [src[i] + j * chunk for i in range(count) for j in range(CHUNKS_PER_UNIT)]
            check_codes(client.batch_put_from, chunk_keys, chunk_sources, [chunk] * len(chunk_keys), config)
            started = time.perf_counter()
            moved = read_chunked(client, work, prefix, staging, chunk)
            times["sliced_chunked"] = time.perf_counter() - started
            times["chunked_over_read_bytes"] = moved - work.sliced_bytes * count
    finally:
        store.unregister_buffer(work.source)
    client.batch_remove(keys + chunk_keys, True)
    return times


def read_in_session(client: Any, keys: list[str], destinations: list[int], ranges: Any) -> None:
    """Every unit's ``ranges`` back to back at its destination, in one get session."""
    check_codes(client.batch_get_session_start, keys)
    try:
        firsts = [0, *np.cumsum([r.length for r in ranges[:-1]]).tolist()]
        check_codes(client.batch_get_into_multi_buffer_ranges, keys,
                    [[d + first for first in firsts] for d in destinations],
                    [[r.length for r in ranges]] * len(keys), [[r.offset for r in ranges]] * len(keys))
    finally:
        client.batch_get_session_end(keys)


# Measured inside each store round, between its put and its reads: memcpy of the same bytes on the same clock,
# and a second whole read of the units the round just read.
_SAME_ROUND = ("memcpy", "get_again")


def summarise(rounds: list[dict[str, float]], work: Workload) -> dict[str, Any]:
    total = work.size * work.count
    needed = work.sliced_bytes * work.count
    fastest = {k: min(r[k] for r in rounds) for k in ("put", "get", "sliced", *_SAME_ROUND) if k in rounds[0]}
    summary: dict[str, Any] = {
        "put": rates(fastest["put"], work.count, total),
        "get": rates(fastest["get"], work.count, total),
        **{k: rates(fastest[k], work.count, total) for k in _SAME_ROUND if k in fastest},
        "sliced": {"reads_s": round(work.count / fastest["sliced"], 1),
                   "MB_s": round(needed / fastest["sliced"] / 1e6, 1)},
    }
    if "over_read_bytes" in rounds[0]:
        summary["over_read_bytes"] = max(r["over_read_bytes"] for r in rounds)
        summary["requested_bytes_per_sliced_round"] = rounds[0]["requested_bytes"]
        summary["moved_bytes_per_sliced_round"] = max(r["moved_bytes"] for r in rounds)
        summary["sliced_amplification"] = round(summary["moved_bytes_per_sliced_round"] / needed, 4)
    if "sliced_session" in rounds[0]:
        seconds = min(r["sliced_session"] for r in rounds)
        summary["sliced_session"] = {"reads_s": round(work.count / seconds, 1),
                                     "MB_s": round(needed / seconds / 1e6, 1)}
    if "sliced_chunked" in rounds[0]:
        seconds = min(r["sliced_chunked"] for r in rounds)
        summary["sliced_chunked"] = {
            "chunk_bytes": work.size // CHUNKS_PER_UNIT,
            "reads_s": round(work.count / seconds, 1),
            "MB_s": round(needed / seconds / 1e6, 1),
            "over_read_bytes": rounds[0]["chunked_over_read_bytes"],
        }
    return summary


def bench_store(store: UnitStore, work: Workload, rounds: int) -> dict[str, Any]:
    store.register_buffer(work.destination)
    try:
        results = []
        for index in range(rounds):
            results.append(store_round(store, work))
            progress(f"{store.backend} {work.size}B x{work.count} round {index + 1}/{rounds}")
    finally:
        store.unregister_buffer(work.destination)
    return summarise(results, work)


def bench_mooncake(store: Any, work: Workload, rounds: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The store and the raw batch API in alternating rounds, so drifting load hits both alike."""
    staging = np.zeros_like(work.destination)
    store.register_buffer(work.destination)
    store.register_buffer(staging)
    with_chunks = work.size // CHUNKS_PER_UNIT >= 64 * 1024  # tiny chunks are not a layout anyone would pick
    ours, raw = [], []
    try:
        store_round(store, work)  # warm-up: first-touch page faults in the segment owner
        for index in range(rounds):
            if index % 2:
                raw.append(raw_round(store, work, staging, with_chunks))
                ours.append(store_round(store, work))
            else:
                ours.append(store_round(store, work))
                raw.append(raw_round(store, work, staging, with_chunks))
            progress(f"mooncake vs raw {work.size}B x{work.count} round {index + 1}/{rounds}")
    finally:
        store.unregister_buffer(work.destination)
        store.unregister_buffer(staging)
    return summarise(ours, work), summarise(raw, work)


def check_codes(call: Callable[..., list[int]], *args: Any) -> None:
    codes = call(*args)
    if any(code < 0 for code in codes):
        raise RuntimeError(f"{call.__name__} failed: {sorted(set(c for c in codes if c < 0))}")


def read_chunked(client: Any, work: Workload, prefix: str, staging: np.ndarray, chunk: int) -> int:
    """Sliced reads in the chunked layout: fetch every chunk a range touches, then copy the ranges out."""
    size = work.size
    wanted, pointers = [], []
    for i in range(work.count):
        for byte_range in work.ranges:
            for j in range(byte_range.offset // chunk, (byte_range.end - 1) // chunk + 1):
                wanted.append(f"{prefix}/{i}#c{j}")
                pointers.append(staging.ctypes.data + i * size + j * chunk)
    client.batch_get_into(wanted, pointers, [chunk] * len(wanted))
    for i in range(work.count):
        position = i * size
        for byte_range in work.ranges:
            begin = i * size + byte_range.offset
            work.destination[position : position + byte_range.length] = staging[begin : begin + byte_range.length]
            position += byte_range.length
    return len(wanted) * chunk


def ratio(a: float, b: float) -> float:
    return round(a / b, 3) if b else float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--large-units", type=int, default=16, help="number of 4 MiB units per round")
    parser.add_argument("--small-units", type=int, default=2000, help="number of 4 KiB units per round")
    parser.add_argument("--backends", default="file,mooncake,ray")
    args = parser.parse_args(argv)
    logging.basicConfig(level="WARNING")
    backends = [b for b in args.backends.split(",") if b]
    counts = {"4MiB": args.large_units, "4KiB": args.small_units}
    workloads = {name: Workload(size, counts[name], seed=i) for i, (name, size) in enumerate(SIZES.items())}
    report: dict[str, Any] = {
        "benchmark": "store",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "rounds": args.rounds,
        "units": {name: {"bytes": SIZES[name], "count": counts[name]} for name in SIZES},
        "sliced_read": "2 byte ranges per unit: zigzag CP rank 0 of cp=2 with one token of look-ahead",
        "memcpy": {},
        "backends": {},
    }
    for name, work in workloads.items():
        progress(f"memcpy {name}")
        report["memcpy"][name] = bench_memcpy(work, args.rounds)

    if "file" in backends:
        root = Path(tempfile.mkdtemp(prefix="knittrans-bench-", dir="/dev/shm"))
        store = FileUnitStore(root)
        try:
            report["backends"]["file"] = {name: bench_store(store, w, args.rounds) for name, w in workloads.items()}
        finally:
            store.purge()

    if "mooncake" in backends:
        total = sum(w.size * w.count for w in workloads.values())
        cluster = start_mooncake(MooncakeClusterConfig(segment_size=max(512 * MIB, 4 * total)))
        try:
            store = MooncakeUnitStore(MooncakeStoreConfig(master_address=cluster.master_address))
            try:
                ours, raw = {}, {}
                for name, work in workloads.items():
                    ours[name], raw[name] = bench_mooncake(store, work, args.rounds)
                report["backends"]["mooncake"] = ours
                report["backends"]["mooncake_raw_batch_api"] = raw
            finally:
                store.close()
        finally:
            cluster.stop()

    if "ray" in backends:
        import ray

        from knittrans.store.ray_store import RayUnitStore

        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
                 object_store_memory=max(256 * MIB, 3 * args.large_units * 4 * MIB))
        try:
            store = RayUnitStore(registry=f"bench-{uuid.uuid4().hex[:8]}")
            report["backends"]["ray"] = {name: bench_store(store, w, args.rounds) for name, w in workloads.items()}
            store.destroy()
        finally:
            ray.shutdown()

    report["targets"] = targets(report)
    print(json.dumps(report, indent=2))
    return 0


def targets(report: dict[str, Any]) -> dict[str, Any]:
    backends = report["backends"]
    result: dict[str, Any] = {}
    if "file" in backends:
        large = backends["file"]["4MiB"]
        value = ratio(large["get"]["MB_s"], large["memcpy"]["MB_s"])
        result["file_get_4MiB_vs_memcpy"] = {"ratio": value, "target": 0.5, "met": value >= 0.5, "reads": "first"}
        for figure in ("get_again", "sliced"):
            value = ratio(large[figure]["MB_s"], large["memcpy"]["MB_s"])
            result[f"file_{figure}_4MiB_vs_memcpy"] = {
                "ratio": value, "target": 0.8, "met": value >= 0.8, "reads": "of units read before (kept mapping)"
            }
        result["file_get_4KiB_units_s"] = backends["file"]["4KiB"]["get"]["units_s"]
    if "mooncake" in backends:
        ours, raw = backends["mooncake"], backends["mooncake_raw_batch_api"]
        ratios = {
            f"{op}_{size}": ratio(ours[size][op]["MB_s"], raw[size][op]["MB_s"])
            for size in SIZES
            for op in ("put", "get", "sliced")
        }
        result["mooncake_vs_raw_batch_api"] = {
            "ratios": ratios, "target": 0.8, "met": all(v >= 0.8 for v in ratios.values())
        }
        result["mooncake_sliced_design"] = {
            size: {
                "get_into_ranges_reads_s": raw[size]["sliced"]["reads_s"],
                "get_session_reads_s": raw[size]["sliced_session"]["reads_s"],
                "chunked_reads_s": raw[size]["sliced_chunked"]["reads_s"],
                "chunked_over_read_bytes": raw[size]["sliced_chunked"]["over_read_bytes"],
            }
            for size in SIZES
            if "sliced_chunked" in raw[size]
        }
    # Ray fetches whole objects, so its sliced reads move whole units by design; the target is for the
    # backends that read byte ranges.
    over_read = {name: {size: b[size]["over_read_bytes"] for size in SIZES}
                 for name, b in backends.items() if name not in ("mooncake_raw_batch_api", "ray")}
    result["over_read_bytes"] = {"per_backend": over_read, "target": 0,
                                 "met": all(v == 0 for sizes in over_read.values() for v in sizes.values())}
    if "ray" in backends:
        result["ray_whole_object_over_read_bytes"] = {size: backends["ray"][size]["over_read_bytes"] for size in SIZES}
    return result


if __name__ == "__main__":
    sys.exit(main())
