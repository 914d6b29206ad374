"""``knittrans up --config stack.yaml``: a job's services on this machine, for your own rollout and training loops.

It starts the state backend (the admission service's memory, or a Redis), the unit store (the job's ``/dev/shm``
file store, or a Mooncake master and segment), the admission service, and one reorg sidecar per consumer of the
configured topology (every backbone (dp, cp) rank, every encoder dp rank). Once all are ready it prints their
addresses and writes them to the connection file (:mod:`knittrans.connection_file`), from which
``RolloutClient.from_env()``, ``TrainerClient.from_env(rank)`` and ``AdmissionClient.from_env()`` connect.

It runs until SIGINT or SIGTERM, then stops every process, removes the connection file, the job's store, sockets
and shared memory, and its temporary directory, and exits 0. A server that dies meanwhile stops the stack the
same way; the command then exits non-zero, naming the server with the last lines of its log. Its servers get
SIGTERM if ``knittrans up`` itself is killed (their own clean-up then runs; what ``knittrans up`` removes itself
stays: the connection file, its leases and the file store, which the next stack of the job takes over, and its
temporary directory with the logs).
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

from knittrans.config import config_path_from_env, connection_file_from_env, connection_file_path, load_config
from knittrans.connection_file import SidecarEndpoint, StackConnection, write_connection_file
from knittrans.errors import ConfigError
from knittrans.job import FileLease, job_run_directory
from knittrans.launch.interruptions import raise_stop
from knittrans.launch.mooncake import SHORT_LEASE_TTL_MS
from knittrans.stack.local import LocalStack
from knittrans.stack.progress import Progress
from knittrans.stack.settings import StackSettings
from knittrans.types import BACKBONE_ROLE, ENCODER_ROLE_PREFIX, ConsumerId, Topology

logger = logging.getLogger(__name__)

CHECK_SECONDS = 0.5  # how often a running stack looks for a dead server


def register(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    """Start a job's services on this machine (admission, store, one sidecar per trainer rank) until Ctrl-C."""
    parser.add_argument("--config", help="the stack's YAML config (default: $KNITTRANS_CONFIG); see examples/stack/")
    parser.add_argument("--job", help="the job's name (default: up-<random>)")
    parser.add_argument("--store", choices=["file", "mooncake"], help="the unit store (default: file)")
    parser.add_argument("--state", choices=["memory", "redis"], help="the admission state (default: memory)")
    parser.add_argument("--connection-file", help="where to write the addresses (default: "
                                                  "$KNITTRANS_CONNECTION_FILE, else ./knittrans-connection.json)")
    parser.add_argument("--log-dir", help="keep the servers' logs here (default: a temporary directory)")
    return run


def run(args: argparse.Namespace) -> int:
    path = args.config or config_path_from_env()
    if path is None:
        raise ConfigError("give the stack's config file with --config or KNITTRANS_CONFIG", field="config")
    settings = load_config(StackSettings, path=path, flags={
        "job": args.job, "store": args.store, "state": args.state, "log_dir": args.log_dir,
        # The variable ranks below the flag and above the file, as every other setting does.
        "connection_file": args.connection_file or connection_file_from_env()})
    return serve(settings, stdout=sys.stdout, stderr=sys.stderr)


def consumer_ranks(topology: Topology, consumers: tuple[ConsumerId, ...]) -> dict[ConsumerId, tuple[int, ...]]:
    """The ranks reading each consumer, in TP order: Megatron's numbering (TP fastest, then CP, then DP), so the
    backbone sidecar (d, c) is read by global ranks (d·cp + c)·tp + t and encoder dp rank d by d·tp + t. A trainer
    role's sidecars (docs/roles.md) are numbered the same way within the role's own ranks."""
    ranks = {}
    for consumer in consumers:
        cp, tp = _cp_tp(topology, consumer.role)
        first = (consumer.dp_rank * cp + consumer.cp_rank) * tp
        ranks[consumer] = tuple(range(first, first + tp))
    return ranks


def _cp_tp(topology: Topology, role: str) -> tuple[int, int]:
    if role == BACKBONE_ROLE:
        return topology.backbone.cp, topology.backbone.tp
    if role.startswith(ENCODER_ROLE_PREFIX):
        return 1, topology.encoder(role[len(ENCODER_ROLE_PREFIX):]).tp
    for trainer_role in getattr(topology, "roles", ()):  # trainer roles, where the topology declares them
        if trainer_role.consumer_role == role:
            return trainer_role.backbone.cp, trainer_role.backbone.tp
    raise ConfigError(f"no consumer role {role!r} in the topology", field="admission.topology")


def serve(settings: StackSettings, *, stdout: TextIO, stderr: TextIO) -> int:
    """Start the stack, write the connection file, run until a signal; see the module docstring."""
    from knittrans.admission.service.roles import all_consumers

    job = settings.job or f"up-{uuid.uuid4().hex[:8]}"
    topology = settings.topology
    consumers = all_consumers(topology)
    connection_path = connection_file_path(settings.connection_file or None).resolve()
    progress = Progress(stderr)
    # Held before anything starts, so that a second stack of the job (or on the file) stops here, before its
    # clean-up could remove what the first one's servers use.
    try:
        with FileLease.claim(connection_path.with_name(f"{connection_path.name}.lock"),
                             what=f"the connection file {connection_path}"), \
                FileLease.claim(job_run_directory(job) / "up.lease", what=f"job {job!r}"), \
                _work_dir(settings.log_dir, job) as work_dir, _stop_on_signals() as stopped:
            return _run_stack(settings, job, consumers, connection_path, work_dir, stopped, progress, stdout, stderr)
    finally:
        _remove_if_empty(job_run_directory(job))


def _run_stack(settings: StackSettings, job: str, consumers: tuple[ConsumerId, ...], connection_path: Path,
               work_dir: Path, stopped: Callable[[], bool], progress: Progress, stdout: TextIO, stderr: TextIO) -> int:
    topology = settings.topology
    stack = LocalStack(job=job, work_dir=work_dir, stop_with_parent=True)
    written = False
    try:
        progress.show(f"knittrans up: job {job}: starting the {settings.state.value} state and "
                      f"the {settings.store.value} store")
        stack.start_state(settings.state)
        stack.start_store(settings.store, lease_ttl_ms=SHORT_LEASE_TTL_MS)
        progress.show(f"knittrans up: job {job}: starting the admission service")
        stack.start_admission(settings.admission)
        progress.show(f"knittrans up: job {job}: starting {len(consumers)} reorg sidecars")
        stack.start_sidecars(consumers, on_ready=lambda done, total: progress.show(
            f"knittrans up: job {job}: reorg sidecars ready: {done}/{total}"))
        progress.end_line()
        ranks = consumer_ranks(topology, consumers)
        backbone = topology.backbone
        connection = StackConnection(
            job=job, pid=os.getpid(), admission=stack.admission_address, store=stack.store_url,
            world_size=backbone.dp * backbone.cp * backbone.tp,
            sidecars=tuple(SidecarEndpoint(role=c.role, dp_rank=c.dp_rank, cp_rank=c.cp_rank,
                                           socket=stack.sidecar_sockets[c], global_ranks=ranks[c])
                           for c in consumers))
        write_connection_file(connection_path, connection)
        written = True
        print(describe(connection, connection_path, stack.metrics_urls), file=stdout, flush=True)
        while not stopped():
            stack.group.check()  # a dead server raises ProcessFailed: the stack stops, the command fails
            time.sleep(CHECK_SECONDS)
        print(f"knittrans up: job {job}: stopping", file=stderr, flush=True)
        return 0
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):  # a second Ctrl-C must not cut the clean-up short
            signal.signal(signum, signal.SIG_IGN)
        progress.end_line()
        if written:
            connection_path.unlink(missing_ok=True)
        stack.stop()


def describe(connection: StackConnection, path: Path, metrics_urls: list[str]) -> str:
    lines = [f"knittrans up: job {connection.job} is ready",
             f"  admission   {connection.admission}",
             f"  store       {connection.store}"]
    for sidecar in connection.sidecars:
        ranks = ",".join(map(str, sidecar.global_ranks))
        lines.append(f"  rank {ranks:<6} {sidecar.role} dp{sidecar.dp_rank} cp{sidecar.cp_rank}  {sidecar.socket}")
    lines += [f"  metrics     {url}" for url in metrics_urls]
    lines += [f"connection file: {path}",
              f"  (clients elsewhere: export KNITTRANS_CONNECTION_FILE={path})",
              "Ctrl-C stops the stack."]
    return "\n".join(lines)


def _remove_if_empty(directory: Path) -> None:
    try:
        directory.rmdir()
    except OSError:
        pass  # not empty (another process of the job uses it) or already gone


@contextmanager
def _work_dir(log_dir: str, job: str) -> Iterator[Path]:
    """The servers' configs, ready files and logs: ``log_dir`` (kept), or a temporary directory (removed)."""
    if log_dir:
        path = Path(log_dir).resolve()
        path.mkdir(parents=True, exist_ok=True)
        yield path
        return
    path = Path(tempfile.mkdtemp(prefix=f"knittrans-up-{job}-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextmanager
def _stop_on_signals() -> Iterator[Callable[[], bool]]:
    """SIGINT and SIGTERM stop a running stack (checked between health checks); while it starts, they interrupt
    the start (KeyboardInterrupt), and the clean-up runs either way."""
    requested: list[int] = []
    running = [False]

    def handle(signum: int, _frame: object) -> None:
        requested.append(signum)
        if not running[0]:
            raise_stop(KeyboardInterrupt())  # held back while a child's start is half done

    previous = {signum: signal.signal(signum, handle) for signum in (signal.SIGINT, signal.SIGTERM)}

    def stopped() -> bool:
        running[0] = True
        return bool(requested)

    try:
        yield stopped
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
