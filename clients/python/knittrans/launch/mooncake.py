"""A real Mooncake cluster on loopback: ``mooncake_master`` plus a long-lived segment owner.

The owner is ``mooncake_client`` (Mooncake's standalone store client): it mounts the memory segment
that holds the units, so the bytes outlive every writer, whose clients contribute no memory. Metadata
uses P2PHANDSHAKE; the master's HTTP metadata server stays off because it binds 0.0.0.0. The master's
RPC and metrics servers bind 127.0.0.1; Mooncake's TCP transfer engine listens on all interfaces
(Mooncake offers no bind address for it). Everything is stopped by PID.

``python -m knittrans.launch.mooncake`` runs a cluster in the foreground and prints its store URL;
``--lease-ttl-ms`` sets how long a read holds a unit against removal (the master's
``default_kv_lease_ttl``, 10 s by default). A deletion never waits for a lease (the store removes leased
units in the background), but the units stay in memory until it ends, so short-lived clusters (tests,
the demo) use a short lease.
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from knittrans.errors import FailedPrecondition, InvalidArgument
from knittrans.launch.logs import failure_message
from knittrans.launch.ports import accepts_connections, free_port, wait_until

logger = logging.getLogger(__name__)

HOST = "127.0.0.1"
MIB = 1 << 20
DEFAULT_LEASE_TTL_MS = 10_000  # Mooncake's own default
_PR_SET_PDEATHSIG = 1


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
class MooncakeCluster:
    """A running master and segment owner; :meth:`stop` ends both by PID."""

    config: MooncakeClusterConfig
    master_port: int
    owner_port: int
    log_dir: Path
    master: subprocess.Popen
    owner: subprocess.Popen
    _owns_log_dir: bool = field(default=False, repr=False)

    @property
    def master_address(self) -> str:
        return f"{HOST}:{self.master_port}"

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


def _stop(process: subprocess.Popen, timeout: float = 10.0) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _die_with_parent() -> None:
    """Runs in the child before exec: SIGTERM it when the launching process dies, so a crashed test run or
    demo leaves no orphaned master holding memory. (Linux; elsewhere the child simply survives.)"""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def _spawn(command: list[str], log_path: Path, *, die_with_parent: bool) -> subprocess.Popen:
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_die_with_parent if die_with_parent else None,
        )


def _start_listening(
    command_for_port: Callable[[int], list[str]], log_path: Path, what: str, timeout: float, die_with_parent: bool
) -> tuple[subprocess.Popen, int]:
    """Start a server on a free port, retrying with another port if it loses the race for one."""
    log_path = log_path.resolve()  # named in errors, which are read from other directories
    last = ""
    for _ in range(5):
        port = free_port(HOST)
        process = _spawn(command_for_port(port), log_path, die_with_parent=die_with_parent)
        try:
            wait_until(
                lambda p=process, c=port: p.poll() is not None or accepts_connections(HOST, c),
                timeout=timeout,
                what=what,
            )
        except TimeoutError:
            _stop(process)
            last = "timed out"
            continue
        if process.poll() is None:
            return process, port
        last = f"exited with {process.returncode}"
    raise FailedPrecondition(failure_message(what, last, log_path))


def start_mooncake(
    config: MooncakeClusterConfig | None = None, *, log_dir: Path | None = None, die_with_parent: bool = True
) -> MooncakeCluster:
    """Start ``mooncake_master`` and the segment owner on loopback with free ports.

    With ``die_with_parent`` (the default) both are terminated by the kernel if this process dies
    without calling :meth:`MooncakeCluster.stop`; pass False to leave a cluster running on purpose.
    """
    config = config or MooncakeClusterConfig()
    owns_log_dir = log_dir is None
    directory = Path(tempfile.mkdtemp(prefix="knittrans-mooncake-")) if log_dir is None else log_dir.resolve()
    directory.mkdir(parents=True, exist_ok=True)
    master_binary = str(mooncake_binary("mooncake_master"))
    owner_binary = str(mooncake_binary("mooncake_client"))

    def master_command(port: int) -> list[str]:
        return [
            master_binary,
            f"--rpc_port={port}",
            f"--rpc_address={HOST}",
            "--enable_http_metadata_server=false",
            f"--metrics_host={HOST}",
            "--metrics_port=0",
            f"--default_kv_lease_ttl={config.lease_ttl_ms}",
            f"--eviction_high_watermark_ratio={config.eviction_high_watermark}",
            f"--eviction_ratio={config.eviction_ratio}",
            f"--client_ttl={config.client_ttl_s}",
            "--rpc_thread_num=2",
            "--logtostderr",
        ]

    master, master_port = _start_listening(
        master_command, directory / "master.log", "mooncake_master", config.start_timeout_s, die_with_parent
    )
    try:
        def owner_command(port: int) -> list[str]:
            return [
                owner_binary,
                f"--host={HOST}",
                f"--port={port}",
                f"--master_server_address={HOST}:{master_port}",
                "--metadata_server=P2PHANDSHAKE",
                "--protocol=tcp",
                f"--global_segment_size={config.segment_size}",
                "--local_buffer_size=0",
                "--logtostderr",
            ]

        # The owner serves its port only after its segment is mounted, so "accepts connections" means ready.
        owner, owner_port = _start_listening(
            owner_command, directory / "owner.log", "mooncake segment owner", config.start_timeout_s, die_with_parent
        )
    except BaseException:
        _stop(master)
        raise
    logger.info(
        "mooncake master pid %d on %s:%d, segment owner pid %d (%d MiB); logs in %s",
        master.pid, HOST, master_port, owner.pid, config.segment_size // MIB, directory,
    )
    return MooncakeCluster(
        config=config, master_port=master_port, owner_port=owner_port, log_dir=directory,
        master=master, owner=owner, _owns_log_dir=owns_log_dir,
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
