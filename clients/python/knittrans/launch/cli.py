"""``knittrans mooncake master`` and ``knittrans mooncake store``: the data plane's parts, each on its own node.

A master on one node, a segment owner ("store") on every node that lends memory to the pool::

    node0$ knittrans mooncake master --host 0.0.0.0 --advertise-host 10.0.0.1 --port 50052
    node1$ knittrans mooncake store --master 10.0.0.1:50052 --host 10.0.0.2 --segment-size 4GiB

Each runs until SIGTERM or SIGINT (then stops its server) and exits 1 when its server dies. ``--ready-file``
receives ``{"address", "store_url"}`` once it serves: the advertised address (never a wildcard) and a store URL
for clients (for a store, one that carries its segment size as ``max_unit_size``); a master adds ``metrics_url``,
whose ``master_key_count`` says how many units it holds.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from knittrans.config import config_path_from_env, load_config
from knittrans.errors import InvalidArgument

logger = logging.getLogger(__name__)

MIB = 1 << 20


@dataclass(frozen=True, kw_only=True)
class MooncakeMasterSettings:
    """``knittrans mooncake master``: where the master listens and how it keeps units."""

    host: str = "127.0.0.1"  # bind address
    advertise_host: str = ""  # what clients dial; default: host (see knittrans.addresses)
    port: int = 0  # 0: a free port
    lease_ttl_ms: int = 10_000  # how long a read holds a unit against removal (knittrans.launch.mooncake)
    client_ttl_s: int = 10  # how long the master keeps the segment of an owner it no longer hears from
    eviction_high_watermark: float = 0.9
    eviction_ratio: float = 0.05
    log_dir: str = ""  # default: a temporary directory

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise InvalidArgument("must be a port number or 0", field="port")


@dataclass(frozen=True, kw_only=True)
class MooncakeStoreSettings:
    """``knittrans mooncake store``: one segment owner that lends ``segment_size`` bytes to a master's pool."""

    master: str  # host:port of the master
    host: str = "127.0.0.1"  # bind address (Mooncake's transfer engine itself listens on every interface)
    advertise_host: str = ""  # where other nodes reach this segment; default: host (see knittrans.addresses)
    port: int = 0  # 0: a free port
    segment_size: int = 1024 * MIB
    log_dir: str = ""

    def __post_init__(self) -> None:
        host, _, port = self.master.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise InvalidArgument(f"must be host:port, got {self.master!r}", field="master")
        if not 0 <= self.port <= 65535:
            raise InvalidArgument("must be a port number or 0", field="port")
        if self.segment_size < MIB:
            raise InvalidArgument("must be at least 1 MiB", field="segment_size")


def _common_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="YAML config file (default: $KNITTRANS_CONFIG)")
    parser.add_argument("--host", help="address to bind, e.g. 0.0.0.0 or this node's address (host)")
    parser.add_argument("--advertise-host", help="address other nodes dial (default: --host unless it is a wildcard)")
    parser.add_argument("--port", type=int, help="port, 0 for any free one (port)")
    parser.add_argument("--log-dir", help="directory of the server's log (default: a temporary one)")
    parser.add_argument("--ready-file", type=Path, help="write {address, store_url} as JSON here once serving")


def register_master(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    """Run a Mooncake master (the data plane's metadata server) until SIGTERM or SIGINT."""
    _common_arguments(parser)
    parser.add_argument("--lease-ttl-ms", type=int, help="how long a read holds a unit against removal "
                                                         "(default 10000; see docs/deploy.md)")
    parser.add_argument("--client-ttl-s", type=int, help="how long a silent owner's segment is kept (default 10)")
    return _run_master


def register_store(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    """Run a Mooncake segment owner that lends this node's memory to a master's pool."""
    _common_arguments(parser)
    parser.add_argument("--master", help="the master's advertised address, host:port (master)")
    parser.add_argument("--segment-size", help="bytes lent to the pool: 1073741824, 256MiB, 4GiB (default 1GiB)")
    return _run_store


def _flags(args: argparse.Namespace, **extra: Any) -> dict[str, Any]:
    return {"host": args.host, "advertise_host": args.advertise_host, "port": args.port, "log_dir": args.log_dir,
            **extra}


def _run_master(args: argparse.Namespace) -> int:
    from knittrans.launch.mooncake import MooncakeClusterConfig, start_master

    settings = load_config(MooncakeMasterSettings, path=args.config or config_path_from_env(), flags=_flags(
        args, lease_ttl_ms=args.lease_ttl_ms, client_ttl_s=args.client_ttl_s))
    config = MooncakeClusterConfig(
        lease_ttl_ms=settings.lease_ttl_ms, client_ttl_s=settings.client_ttl_s,
        eviction_high_watermark=settings.eviction_high_watermark, eviction_ratio=settings.eviction_ratio,
    )
    master = start_master(config, bind_host=settings.host, advertise_host=settings.advertise_host,
                          port=settings.port, log_dir=Path(settings.log_dir) if settings.log_dir else None)
    ready = {"address": master.address, "store_url": f"mooncake://{master.address}", "metrics_url": master.metrics_url}
    return _serve(master.process, master.stop, ready, args.ready_file, "mooncake master")


def _run_store(args: argparse.Namespace) -> int:
    from knittrans.launch.mooncake import start_segment_owner
    from knittrans.store.factory import parse_size

    size = parse_size(args.segment_size, field="segment_size") if args.segment_size is not None else None
    settings = load_config(MooncakeStoreSettings, path=args.config or config_path_from_env(), flags=_flags(
        args, master=args.master, segment_size=size))
    owner = start_segment_owner(
        settings.master, segment_size=settings.segment_size, bind_host=settings.host,
        advertise_host=settings.advertise_host, port=settings.port,
        log_dir=Path(settings.log_dir) if settings.log_dir else None,
    )
    ready = {"address": f"{owner.host}:{owner.port}", "store_url": owner.store_url}
    return _serve(owner.process, owner.stop, ready, args.ready_file, "mooncake segment owner")


def _serve(process: Any, stop: Callable[[], None], ready: dict[str, str], ready_file: Path | None, what: str) -> int:
    """Write the ready file, then wait for a signal (exit 0, stopping the server) or the server's death (exit 1)."""
    stopping = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopping.set())
    try:
        logger.info("%s ready: %s", what, ready)
        if ready_file is not None:
            temporary = ready_file.with_suffix(".tmp")
            temporary.write_text(json.dumps(ready))
            temporary.replace(ready_file)
        while not stopping.wait(0.5):
            if process.poll() is not None:
                logger.error("%s exited with status %s", what, process.returncode)
                return 1
        return 0
    finally:
        stop()
