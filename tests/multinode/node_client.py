"""A store client run on one node of the namespace cluster (a script: it runs inside the node, not in pytest).

``write URL PREFIX COUNT SIZE OUT`` writes COUNT units of SIZE random bytes and records, per key, its content hash
and where the store placed it: the transport endpoint of its Mooncake segment, or the addresses of the Ray nodes
holding its object. ``read URL IN OUT`` reads every recorded unit
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
    if url.startswith("ray://"):
        pin_ray_registry_here(url)
    store = open_store(url)
    try:
        units = {}
        for index in range(count):
            data = np.random.default_rng(index).integers(0, 256, size, dtype=np.uint8)
            key = f"{prefix}/unit{index:03d}"
            store.put_many([UnitWrite.of_array(key, data, DType.UINT8, sequence=True)])
            units[key] = {"sha256": hashlib.sha256(data.tobytes()).hexdigest(), "size": size}
        if store.backend == "mooncake":
            replicas = store.raw_client.batch_get_replica_desc(list(units))
            for key, unit in units.items():
                unit["endpoint"] = replicas[key][0].get_memory_descriptor().buffer_descriptor.transport_endpoint
        elif store.backend == "ray":
            for key, nodes in ray_object_nodes(url, list(units)).items():
                units[key]["nodes"] = nodes
    finally:
        store.close()
    with open(out, "w") as handle:
        json.dump(units, handle)


def pin_ray_registry_here(url: str) -> None:
    """Create the store's registry actor on this node. It owns every unit, so the units' objects live where it
    runs; it asks for no resources, and Ray places such actors on a random node."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from knittrans.store.factory import parse_store_url
    from knittrans.store.ray_store import UnitRegistry, ensure_ray

    spec = parse_store_url(url)
    ensure_ray(spec.address, namespace=spec.namespace, node_ip_address=spec.node_ip_address)
    here = NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=False)
    ray.remote(num_cpus=0, max_restarts=0)(UnitRegistry).options(
        name=spec.registry, namespace=spec.namespace, get_if_exists=True, lifetime="detached",
        scheduling_strategy=here).remote()


def ray_object_nodes(url: str, keys: list[str]) -> dict[str, list[str]]:
    """The addresses of the Ray nodes whose object stores hold each unit."""
    import ray

    from knittrans.store.factory import parse_store_url
    from knittrans.store.ray_store import registry_actor

    spec = parse_store_url(url)
    refs = ray.get(registry_actor(spec.registry, spec.namespace).lookup.remote(keys))
    locations = ray.experimental.get_object_locations(refs)
    addresses = {node["NodeID"]: node["NodeManagerAddress"] for node in ray.nodes()}
    return {key: sorted(addresses[node] for node in locations[ref]["node_ids"])
            for key, ref in zip(keys, refs, strict=True)}


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
