"""A store client run on one node of the namespace cluster (a script: it runs inside the node, not in pytest).

``write URL PREFIX COUNT SIZE OUT`` writes COUNT units of SIZE random bytes and records, per key, its content hash
and the transport endpoint of the segment the master placed it in. ``read URL IN OUT`` reads every recorded unit
on its own and records, per key, whether its bytes came back intact or the typed error it raised (class, field).
"""

from __future__ import annotations

import hashlib
import json
import sys

import numpy as np

from knittrans.errors import KnitTransError
from knittrans.store.factory import open_store
from knittrans.store.protocol import UnitWrite
from knittrans.types import DType, UnitKey


def write(url: str, prefix: str, count: int, size: int, out: str) -> None:
    store = open_store(url)
    try:
        units = {}
        for index in range(count):
            data = np.random.default_rng(index).integers(0, 256, size, dtype=np.uint8)
            key = f"{prefix}/unit{index:03d}"
            store.put_many([UnitWrite.of_array(key, data, DType.UINT8, sequence=True)])
            units[key] = {"sha256": hashlib.sha256(data.tobytes()).hexdigest(), "size": size}
        replicas = store.raw_client.batch_get_replica_desc(list(units))
        for key, unit in units.items():
            unit["endpoint"] = replicas[key][0].get_memory_descriptor().buffer_descriptor.transport_endpoint
    finally:
        store.close()
    with open(out, "w") as handle:
        json.dump(units, handle)


def read(url: str, written: str, out: str) -> None:
    with open(written) as handle:
        units = json.load(handle)
    store = open_store(url)
    results = {}
    try:
        for key, unit in units.items():
            buffer = np.empty(unit["size"], dtype=np.uint8)
            try:
                count = store.get_into(UnitKey(key), buffer)
            except KnitTransError as exc:
                results[key] = {"error": type(exc).__name__, "field": exc.field, "message": str(exc)}
                continue
            intact = count == unit["size"] and hashlib.sha256(buffer.tobytes()).hexdigest() == unit["sha256"]
            results[key] = {"intact": intact}
    finally:
        store.close()
    with open(out, "w") as handle:
        json.dump(results, handle)


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    if command == "write":
        write(args[0], args[1], int(args[2]), int(args[3]), args[4])
    else:
        read(*args)
