"""A real Mooncake cluster: ``mooncake_master`` plus long-lived segment owners, on one machine or several.

The owner is ``mooncake_client`` (Mooncake's standalone store client): it mounts the memory segment
that holds the units, so the bytes outlive every writer, whose clients contribute no memory. Metadata
uses P2PHANDSHAKE; the master's HTTP metadata server stays off because it binds 0.0.0.0. The master's
RPC and metrics servers bind ``bind_host`` (127.0.0.1 by default); an owner registers its segment under its
advertised host (see :mod:`knittrans.addresses`); Mooncake's TCP transfer engine listens on all interfaces
(Mooncake offers no bind address for it). Everything is stopped by PID.

:func:`start_mooncake` starts a master and one owner together (tests, the one-machine demo);
:func:`start_master` and :func:`start_segment_owner` start them apart, on different nodes, as
``knittrans mooncake master`` and ``knittrans mooncake store --master HOST:PORT`` do.

Leases: every read holds its unit against removal for ``lease_ttl_ms`` (the master's ``default_kv_lease_ttl``).
A deletion never waits for a lease (the store removes leased units in the background), but the units stay in
memory until it ends, so short-lived clusters use a short lease. It must still outlast the slowest single get,
or the get fails with -707 LEASE_EXPIRED: across nodes a 64 MiB get took 0.26 s on a veth link and takes 0.54 s
at 1 Gbit/s, so the 200 ms leases of the loopback tests fail there. :data:`SHORT_LEASE_TTL_MS` (2 s) is the
shortest lease used where reads cross a network (the demo, the multi-node test); :data:`DEFAULT_LEASE_TTL_MS`
(Mooncake's 10 s) is the default of the commands.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from knittrans.addresses import advertised_host, host_port
from knittrans.errors import FailedPrecondition, InvalidArgument
from knittrans.launch import lifetime
from knittrans.launch.logs import failure_message
from knittrans.launch.ports import free_port, start_listening

logger = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
MIB = 1 << 20
DEFAULT_LEASE_TTL_MS = 10_000  # Mooncake's own default
# Outlasts a 64 MiB get at 1 Gbit/s almost four times over (module docstring); still releases memory promptly.
SHORT_LEASE_TTL_MS = 2_000


@dataclass(frozen=True, kw_only=True)
class MooncakeClusterConfig:
    segment_size: int = 1024 * MIB  # bytes of the owner's segment: the capacity of the store
    lease_ttl_ms: int = DEFAULT_LEASE_TTL_MS  # how long a read holds a unit against removal
    eviction_high_watermark: float = 0.9
    eviction_ratio: float = 0.05
    client_ttl_s: int = 10  # how long the master keeps a silent client's segment
    start_timeout_s: float = 20.0

    def __post_init__(self) -> None:
        if not isinstance(self.segment_size, int) or self.segment_size < MIB:
            raise InvalidArgument("must be at least 1 MiB", field="segment_size")
        if not isinstance(self.lease_ttl_ms, int) or self.lease_ttl_ms < 1:
            raise InvalidArgument("must be a positive integer", field="lease_ttl_ms")
        if not 0 < self.eviction_high_watermark <= 1:
            raise InvalidArgument("must be in (0, 1]", field="eviction_high_watermark")
        if not 0 < self.eviction_ratio <= 1:
            raise InvalidArgument("must be in (0, 1]", field="eviction_ratio")
        if not isinstance(self.client_ttl_s, int) or self.client_ttl_s < 1:
            raise InvalidArgument("must be a positive integer", field="client_ttl_s")



def mooncake_binary(name: str) -> Path:
    """The native ``mooncake_master`` / ``mooncake_client`` shipped inside the mooncake wheel."""
    try:
        import mooncake
    except ImportError as exc:
        raise FailedPrecondition("mooncake is not installed (pip extra: knittrans[mooncake])") from exc
    binary = Path(mooncake.__file__).parent / name
    if not binary.is_file():
        found = shutil.which(name)
        if found is None:
            raise FailedPrecondition(f"{name} not found next to the mooncake package or on PATH")
        binary = Path(found)
    return binary


@dataclass
class MooncakeMaster:
    """A running ``mooncake_master``; :meth:`stop` ends it by PID."""

    config: MooncakeClusterConfig
    host: str  # the advertised host: what clients and segment owners dial
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path
    metrics_port: int = 0

    @property
    def address(self) -> str:
        return host_port(self.host, self.port)

    @property
    def metrics_url(self) -> str:
        return f"http://{host_port(self.host, self.metrics_port)}/metrics"

    def key_count(self) -> int:
        """How many units the master holds now (its ``master_key_count`` gauge)."""
        return master_key_count(self.metrics_url)

    def stop(self) -> None:
        _stop(self.process)


def master_key_count(metrics_url: str, timeout: float = 5.0) -> int:
    """The ``master_key_count`` gauge of the master whose Prometheus endpoint is ``metrics_url``."""
    text = urllib.request.urlopen(metrics_url, timeout=timeout).read().decode()
    for line in text.splitlines():
        if line.startswith("master_key_count "):
            return int(float(line.split()[1]))
    raise FailedPrecondition(f"no master_key_count at {metrics_url}")


@dataclass
class SegmentOwner:
    """A running segment owner (``mooncake_client``) mounted into a master; :meth:`stop` ends it by PID."""

    master_address: str
    segment_size: int
    host: str  # the advertised host: where other nodes' clients read its segment
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def store_url(self) -> str:
        """A store URL for this owner's master that tells clients the largest unit this segment can hold."""
        return f"mooncake://{self.master_address}?max_unit_size={self.segment_size}"

    def stop(self) -> None:
        _stop(self.process)


@dataclass
class MooncakeCluster:
    """A running master and segment owner; :meth:`stop` ends both by PID."""

    config: MooncakeClusterConfig
    master_port: int
    owner_port: int
    log_dir: Path
    master: subprocess.Popen[bytes]
    owner: subprocess.Popen[bytes]
    host: str = LOOPBACK  # the advertised host of both
    _owns_log_dir: bool = field(default=False, repr=False)

    @property
    def master_address(self) -> str:
        return host_port(self.host, self.master_port)

    @property
    def store_url(self) -> str:
        """The store URL of this cluster; it tells clients the largest unit the segment can hold."""
        return f"mooncake://{self.master_address}?max_unit_size={self.config.segment_size}"

    def stop(self) -> None:
        for process in (self.owner, self.master):
            _stop(process)
        if self._owns_log_dir:
            shutil.rmtree(self.log_dir, ignore_errors=True)

    def __enter__(self) -> MooncakeCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _stop(process: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _spawn(command: list[str], log_path: Path, *, die_with_parent: bool) -> subprocess.Popen[bytes]:
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            lifetime.tied_to_this_process(command) if die_with_parent else command,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def _start_listening(
    command_for_port: Callable[[int], list[str]],
    log_path: Path,
    what: str,
    timeout: float,
    die_with_parent: bool,
    *,
    bind_host: str = LOOPBACK,
    probe_host: str = LOOPBACK,
    port: int = 0,
) -> tuple[subprocess.Popen[bytes], int]:
    """Start a server on ``port`` (0: a free port, retrying with another if it loses the race for one) and wait
    until ``probe_host`` (its advertised host) accepts connections on it."""
    log_path = log_path.resolve()  # named in errors, which are read from other directories
    last = ""
    for _ in range(1 if port else 5):
        chosen = port or _free_port_for(bind_host)
        try:
            process = start_listening(partial(_spawn, command_for_port(chosen), log_path,
                                              die_with_parent=die_with_parent),
                                      host=probe_host, port=chosen, stop=_stop, timeout=timeout, what=what)
        except TimeoutError:
            last = "timed out"
            continue
        if process.poll() is None:
            return process, chosen
        last = f"exited with {process.returncode}"
    raise FailedPrecondition(failure_message(what, last, log_path))


def _free_port_for(bind_host: str) -> int:
    """A port free here for a server about to bind ``bind_host``; where that address is not this machine's (a server
    started on another node through a command prefix), any port free here: a lost race is retried anyway."""
    try:
        return free_port(bind_host)
    except OSError:
        return free_port("0.0.0.0")


def _log_directory(log_dir: Path | None) -> tuple[Path, bool]:
    directory = Path(tempfile.mkdtemp(prefix="knittrans-mooncake-")) if log_dir is None else log_dir.resolve()
    directory.mkdir(parents=True, exist_ok=True)
    return directory, log_dir is None


def start_master(
    config: MooncakeClusterConfig | None = None,
    *,
    bind_host: str = LOOPBACK,
    advertise_host: str = "",
    port: int = 0,
    log_dir: Path | None = None,
    command_prefix: Sequence[str] = (),
    die_with_parent: bool = True,
) -> MooncakeMaster:
    """Start ``mooncake_master`` listening on ``bind_host:port`` (0: a free port); clients dial the advertised host
    (:func:`knittrans.addresses.advertised_host`). ``command_prefix`` runs it elsewhere (``nsenter ... --``)."""
    config = config or MooncakeClusterConfig()
    host = advertised_host(bind_host, advertise_host)
    directory, _ = _log_directory(log_dir)
    binary = str(mooncake_binary("mooncake_master"))
    metrics_ports: list[int] = []

    def command(chosen: int) -> list[str]:
        metrics_ports.append(_free_port_for(bind_host))
        return [
            *command_prefix,
            binary,
            f"--rpc_port={chosen}",
            f"--rpc_address={bind_host}",
            "--enable_http_metadata_server=false",
            f"--metrics_host={bind_host}",
            f"--metrics_port={metrics_ports[-1]}",
            f"--default_kv_lease_ttl={config.lease_ttl_ms}",
            f"--eviction_high_watermark_ratio={config.eviction_high_watermark}",
            f"--eviction_ratio={config.eviction_ratio}",
            f"--client_ttl={config.client_ttl_s}",
            "--rpc_thread_num=2",
            "--logtostderr",
        ]

    log_path = directory / "master.log"
    process, chosen = _start_listening(
        command, log_path, "mooncake_master", config.start_timeout_s, die_with_parent,
        bind_host=bind_host, probe_host=host, port=port,
    )
    logger.info("mooncake master pid %d on %s (bound to %s); log %s", process.pid, host_port(host, chosen),
                bind_host, log_path)
    return MooncakeMaster(config=config, host=host, port=chosen, process=process, log_path=log_path.resolve(),
                          metrics_port=metrics_ports[-1])


def start_segment_owner(
    master_address: str,
    *,
    segment_size: int = 1024 * MIB,
    bind_host: str = LOOPBACK,
    advertise_host: str = "",
    port: int = 0,
    log_dir: Path | None = None,
    log_name: str = "owner.log",
    start_timeout_s: float = 20.0,
    command_prefix: Sequence[str] = (),
    die_with_parent: bool = True,
) -> SegmentOwner:
    """Start a segment owner that mounts ``segment_size`` bytes into the master at ``master_address``.

    The owner registers its segment under the advertised host, where every other client reads and writes it:
    an owner advertised as 127.0.0.1 takes writes from its own node but fails other nodes' reads (-800).
    Mooncake's TCP transfer engine listens on every interface whatever ``bind_host`` says; ``bind_host`` picks
    the free port and, with ``advertise_host``, the advertised host.
    """
    if segment_size < MIB:
        raise InvalidArgument("must be at least 1 MiB", field="segment_size")
    host = advertised_host(bind_host, advertise_host)
    directory, _ = _log_directory(log_dir)
    binary = str(mooncake_binary("mooncake_client"))

    def command(chosen: int) -> list[str]:
        return [
            *command_prefix,
            binary,
            f"--host={host}",
            f"--port={chosen}",
            f"--master_server_address={master_address}",
            "--metadata_server=P2PHANDSHAKE",
            "--protocol=tcp",
            f"--global_segment_size={segment_size}",
            "--local_buffer_size=0",
            "--logtostderr",
        ]

    log_path = directory / log_name
    # The owner serves its port only after its segment is mounted, so "accepts connections" means ready.
    process, chosen = _start_listening(
        command, log_path, "mooncake segment owner", start_timeout_s, die_with_parent,
        bind_host=bind_host, probe_host=host, port=port,
    )
    logger.info("mooncake segment owner pid %d on %s (%d MiB) in master %s; log %s", process.pid,
                host_port(host, chosen), segment_size // MIB, master_address, log_path)
    return SegmentOwner(master_address=master_address, segment_size=segment_size, host=host, port=chosen,
                        process=process, log_path=log_path.resolve())


def start_mooncake(
    config: MooncakeClusterConfig | None = None,
    *,
    log_dir: Path | None = None,
    die_with_parent: bool = True,
    bind_host: str = LOOPBACK,
    advertise_host: str = "",
) -> MooncakeCluster:
    """Start ``mooncake_master`` and one segment owner on this machine, with free ports (loopback by default).

    With ``die_with_parent`` (the default) both are terminated by the kernel if this process dies
    without calling :meth:`MooncakeCluster.stop`; pass False to leave a cluster running on purpose.
    """
    config = config or MooncakeClusterConfig()
    directory, owns_log_dir = _log_directory(log_dir)
    master = start_master(config, bind_host=bind_host, advertise_host=advertise_host, log_dir=directory,
                          die_with_parent=die_with_parent)
    try:
        owner = start_segment_owner(
            master.address, segment_size=config.segment_size, bind_host=bind_host, advertise_host=advertise_host,
            log_dir=directory, start_timeout_s=config.start_timeout_s, die_with_parent=die_with_parent,
        )
    except BaseException:
        master.stop()
        raise
    return MooncakeCluster(
        config=config, master_port=master.port, owner_port=owner.port, log_dir=directory,
        master=master.process, owner=owner.process, host=master.host, _owns_log_dir=owns_log_dir,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run a loopback Mooncake cluster until interrupted.")
    parser.add_argument("--segment-size-mib", type=int, default=1024)
    parser.add_argument("--lease-ttl-ms", type=int, default=DEFAULT_LEASE_TTL_MS,
                        help="how long a read holds a unit against removal (default: %(default)s)")
    parser.add_argument("--log-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    config = MooncakeClusterConfig(segment_size=args.segment_size_mib * MIB, lease_ttl_ms=args.lease_ttl_ms)
    cluster = start_mooncake(config, log_dir=args.log_dir)
    print(cluster.store_url, flush=True)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    try:
        while not stopping and cluster.master.poll() is None and cluster.owner.poll() is None:
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
