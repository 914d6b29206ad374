"""Cross-node batch reads from Mooncake, on an unlimited and a bandwidth-limited link, KnitTrans against raw Mooncake.

Three network hosts in Linux network namespaces (root only; knittrans.demo.stack.namespaces): the Mooncake master
on node0, the only segment on node1 (where the writer runs), the reader on node2, so every byte read crosses the
link from node1 to node2. Per link, the reader times one batch read of every unit into one registered buffer:

- ``knittrans``: ``MooncakeUnitStore.get_many_into`` (what the sidecars call);
- ``raw_mooncake``: ``MooncakeDistributedStore.batch_get_into`` on the same keys and buffer (the baseline).

The links: ``unlimited`` (veth), and ``tc qdisc ... tbf`` at each ``--rates`` entry on both nodes' ``eth0``
(netem does not work here). Each figure is the best of ``--rounds`` rounds. JSON on stdout, progress on stderr.

    sudo python benchmarks/multinode.py [--units 16] [--unit-mib 8] [--rounds 3] [--rates 1gbit]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

MIB = 1 << 20


def progress(message: str) -> None:
    print(f"[multinode-bench] {message}", file=sys.stderr, flush=True)


def write_units(url: str, count: int, size: int) -> None:
    """On node1: ``count`` units of ``size`` random bytes under ``bench/unitNNN``."""
    from knittrans.store.factory import open_store
    from knittrans.store.protocol import UnitWrite
    from knittrans.types import DType

    store = open_store(url)
    try:
        for index in range(count):
            data = np.random.default_rng(index).integers(0, 256, size, dtype=np.uint8)
            store.put_many([UnitWrite.of_array(f"bench/unit{index:03d}", data, DType.UINT8, sequence=True)])
    finally:
        store.close()


def read_units(url: str, count: int, size: int, rounds: int) -> dict[str, float]:
    """On node2: the best batch-read time of all units, through KnitTrans and through the raw client."""
    from knittrans.store.factory import open_store
    from knittrans.store.protocol import UnitRead
    from knittrans.types import UnitKey

    store = open_store(url)
    keys = [f"bench/unit{index:03d}" for index in range(count)]
    buffer = np.empty(count * size, dtype=np.uint8)
    store.register_buffer(buffer)
    views = [memoryview(buffer)[i * size:(i + 1) * size] for i in range(count)]
    reads = [UnitRead.of(UnitKey(key), view) for key, view in zip(keys, views, strict=True)]
    raw = store.raw_client
    addresses = [buffer.ctypes.data + i * size for i in range(count)]
    timings: dict[str, list[float]] = {"knittrans": [], "raw_mooncake": []}
    try:
        for _ in range(rounds):
            for arm in ("raw_mooncake", "knittrans"):
                buffer[:] = 0
                started = time.perf_counter()
                if arm == "knittrans":
                    counts = store.get_many_into(reads)
                else:
                    counts = raw.batch_get_into(keys, addresses, [size] * count)
                timings[arm].append(time.perf_counter() - started)
                if list(counts) != [size] * count:
                    raise RuntimeError(f"{arm}: short or failed reads: {counts}")
                expected = np.random.default_rng(count - 1).integers(0, 256, size, dtype=np.uint8)
                if not np.array_equal(buffer[(count - 1) * size:], expected):
                    raise RuntimeError(f"{arm}: the last unit came back wrong")
    finally:
        store.unregister_buffer(buffer)
        store.close()
    total = count * size
    return {f"{arm}_MBps": round(total / min(seconds) / 1e6, 1) for arm, seconds in timings.items()} | {
        f"{arm}_best_seconds": round(min(seconds), 4) for arm, seconds in timings.items()}


def shape(nodes: list[Any], rate: str | None) -> None:
    import subprocess

    for node in nodes:
        subprocess.run(node.command(["tc", "qdisc", "del", "dev", "eth0", "root"]), capture_output=True)
        if rate is not None:
            subprocess.run(node.command(["tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", rate,
                                         "burst", "256kb", "latency", "50ms"]), check=True)


def drive(layout: Path, units: int, size: int, rounds: int, rates: list[str]) -> dict[str, Any]:
    """On node0: the master here, the segment on node1, the writer on node1, the reader on node2."""
    import subprocess

    from knittrans.demo.stack.namespaces import Node
    from knittrans.launch.mooncake import MooncakeClusterConfig, start_master, start_segment_owner

    nodes = [Node(**node) for node in json.loads(layout.read_text())]
    logs = Path(tempfile.mkdtemp(prefix="knittrans-multinode-bench-"))
    segment = units * size + 64 * MIB
    master = start_master(MooncakeClusterConfig(segment_size=segment), bind_host=nodes[0].address, log_dir=logs)
    owner = start_segment_owner(master.address, segment_size=segment, bind_host=nodes[1].address, log_dir=logs,
                                command_prefix=nodes[1].enter())
    script = str(Path(__file__).resolve())

    def on(node: Node, *args: str) -> str:
        result = subprocess.run(node.command([sys.executable, script, *args]), capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"{args[0]} on {node.name} failed: {result.stderr[-3000:]}")
        return result.stdout

    try:
        url = f"mooncake://{master.address}?max_unit_size={segment}"
        progress(f"writing {units} units of {size // MIB} MiB from node1")
        on(nodes[1], "node-write", f"{url}&local_hostname={nodes[1].address}", str(units), str(size))
        links: dict[str, Any] = {}
        for rate in [None, *rates]:
            name = rate or "unlimited"
            shape(nodes[1:], rate)
            progress(f"reading on node2 over the {name} link")
            output = on(nodes[2], "node-read", f"{url}&local_hostname={nodes[2].address}", str(units), str(size),
                        str(rounds))
            links[name] = json.loads(output.strip().splitlines()[-1])  # Mooncake may print too
            links[name]["knittrans_over_raw"] = round(
                links[name]["knittrans_MBps"] / max(links[name]["raw_mooncake_MBps"], 1e-9), 3)
        shape(nodes[1:], None)
        return links
    finally:
        owner.stop()
        master.stop()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "node-write":
        write_units(argv[1], int(argv[2]), int(argv[3]))
        return 0
    if argv and argv[0] == "node-read":
        print(json.dumps(read_units(argv[1], int(argv[2]), int(argv[3]), int(argv[4]))))
        return 0
    if argv and argv[0] == "node-drive":
        layout, units, size, rounds, rates = argv[1:6]
        print(json.dumps(drive(Path(layout), int(units), int(size), int(rounds), [r for r in rates.split(",") if r])))
        return 0

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--units", type=int, default=16)
    parser.add_argument("--unit-mib", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rates", default="1gbit", help="tbf rates to measure besides the unlimited link")
    arguments = parser.parse_args(argv)

    import subprocess

    from knittrans.demo.stack.namespaces import NamespaceCluster, namespaces_unavailable

    reason = namespaces_unavailable()
    if reason:
        print(json.dumps({"benchmark": "multinode", "skipped": reason}))
        return 2
    size = arguments.unit_mib * MIB
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="knittrans-multinode-") as scratch, NamespaceCluster() as cluster:
        layout = Path(scratch) / "layout.json"
        layout.write_text(json.dumps([asdict(node) for node in cluster.nodes]))
        driver = subprocess.run(
            cluster.nodes[0].command([sys.executable, str(Path(__file__).resolve()), "node-drive", str(layout),
                                      str(arguments.units), str(size), str(arguments.rounds), arguments.rates]),
            capture_output=True, text=True,
        )
    if driver.returncode != 0:
        print(driver.stderr[-5000:], file=sys.stderr)
        return 1
    document = {
        "benchmark": "multinode: cross-node batch get from Mooncake, KnitTrans vs raw Mooncake",
        "layout": "master on node0, one segment and the writer on node1, the reader on node2 (network namespaces)",
        "units": arguments.units, "unit_bytes": size, "rounds": arguments.rounds,
        "links": json.loads(driver.stdout.strip().splitlines()[-1]),
        "wall_seconds": round(time.monotonic() - started, 1),
    }
    print(json.dumps(document, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
