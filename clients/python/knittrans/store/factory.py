"""Open a unit store from a URL.

* ``file:///dev/shm/knittrans-job`` — a directory of unit files; ``file://`` alone means
  ``/dev/shm/knittrans-<job>``; ``?durable=true`` fsyncs before publishing (disk backends).
* ``mooncake://127.0.0.1:50051?local_buffer_size=64MiB&protocol=tcp`` — a Mooncake cluster by its
  master address; the query sets any field of :class:`~knittrans.store.mooncake.MooncakeStoreConfig`.
* ``ray://`` or ``ray://<registry>?namespace=<ns>&address=<ray address>`` — the Ray object store. A process that
  has not initialised Ray yet (``knittrans admission serve``, ``knittrans reorg serve``) joins the Ray cluster at
  ``address``: ``auto`` (the default: the cluster this node runs), ``HOST:PORT`` of its head (GCS), or ``local``
  for a private one-process Ray. ``node_ip_address`` names this node's Raylet where the host runs several (Ray
  finds Raylets by listing the host's processes, and otherwise prefers the head's): hosts that share a process
  table, such as network namespaces on one machine.

Unknown query keys and malformed values are :class:`~knittrans.errors.ConfigError`\\ s naming the key.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import yaml

from knittrans.config import build
from knittrans.errors import ConfigError
from knittrans.store.file import default_root
from knittrans.store.mooncake import MooncakeStoreConfig
from knittrans.store.protocol import UnitStore
from knittrans.store.ray_store import DEFAULT_NAMESPACE, DEFAULT_REGISTRY

_SIZE = re.compile(r"^\s*(\d+)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
          "KI": 1 << 10, "MI": 1 << 20, "GI": 1 << 30, "TI": 1 << 40}


@dataclass(frozen=True, kw_only=True)
class FileStoreSpec:
    root: Path
    durable: bool = False


@dataclass(frozen=True, kw_only=True)
class RayStoreSpec:
    registry: str = DEFAULT_REGISTRY
    namespace: str = DEFAULT_NAMESPACE
    address: str = "auto"  # the Ray cluster to join when this process has not initialised Ray
    node_ip_address: str = ""  # this node's Raylet, by its address; "" lets Ray choose


StoreSpec = FileStoreSpec | MooncakeStoreConfig | RayStoreSpec


def parse_size(value: Any, *, field: str) -> int:
    """``67108864``, ``64MiB``, ``64 MB`` (decimal) or ``1GiB`` as a byte count."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    match = _SIZE.match(str(value))
    if not match:
        raise ConfigError(f"not a size: {value!r}", field=field)
    unit = (match.group(2) or "").upper().removesuffix("B")
    return int(match.group(1)) * _UNITS[unit]


def parse_store_url(url: str, *, job: str = "default") -> StoreSpec:
    parts = urlsplit(url)
    query: dict[str, Any] = {}
    for key, raw in parse_qsl(parts.query, keep_blank_values=True, strict_parsing=False):
        if key in query:
            raise ConfigError("given twice", field=f"store.{key}")
        try:
            query[key] = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError as exc:
            raise ConfigError(f"not a valid value: {raw!r}", field=f"store.{key}") from exc
    if parts.scheme == "file":
        location = unquote(parts.netloc + parts.path)
        root = Path(location) if location else default_root(job)
        if not root.is_absolute():
            raise ConfigError("the store directory must be an absolute path", field="store")
        return build(FileStoreSpec, {"root": root, **query}, prefix="store.")
    if parts.scheme == "mooncake":
        if not parts.netloc:
            raise ConfigError("needs the master address: mooncake://host:port", field="store")
        for key in list(query):
            if key.endswith("_size"):
                query[key] = parse_size(query[key], field=f"store.{key}")
        return build(MooncakeStoreConfig, {"master_address": parts.netloc, **query}, prefix="store.")
    if parts.scheme == "ray":
        registry = unquote(parts.netloc + parts.path).strip("/")
        values = {"registry": registry, **query} if registry else query
        return build(RayStoreSpec, values, prefix="store.")
    raise ConfigError(f"unknown store scheme {parts.scheme!r}; expected file, mooncake or ray", field="store")


def open_store(target: str | StoreSpec, *, job: str = "default") -> UnitStore:
    """Open the store a URL (or a parsed spec) names."""
    spec = parse_store_url(target, job=job) if isinstance(target, str) else target
    if isinstance(spec, FileStoreSpec):
        from knittrans.store.file import FileUnitStore

        return FileUnitStore(spec.root, durable=spec.durable)
    if isinstance(spec, MooncakeStoreConfig):
        from knittrans.store.mooncake import MooncakeUnitStore

        return MooncakeUnitStore(spec)
    if isinstance(spec, RayStoreSpec):
        from knittrans.store.ray_store import RayUnitStore, ensure_ray

        ensure_ray(spec.address, namespace=spec.namespace, node_ip_address=spec.node_ip_address)
        return RayUnitStore(registry=spec.registry, namespace=spec.namespace)
    raise ConfigError(f"not a store spec: {spec!r}", field="store")
