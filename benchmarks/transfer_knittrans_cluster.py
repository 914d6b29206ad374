"""The KnitTrans cluster the transfer benchmark's KnitTrans arms run against: the admission service and the reorg
sidecars, each a real ``knittrans ... serve`` process that announces its address in a ready file. The sidecars
run one process per consumer, or (``node_sidecars``) one process hosting every consumer, as one node's sidecar
process does (``knittrans reorg serve --consumers ...``, one assignment stream for all of them)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import yaml
from transfer_workload import WorkloadConfig

from knittrans.shm import list_segments
from knittrans.stack_dump import STACK_DUMP_SIGNAL
from knittrans.types import ConsumerId
from knittrans.v1 import reorg_service_pb2, reorg_service_pb2_grpc

logger = logging.getLogger("transfer_knittrans_cluster")

KNITTRANS = str(Path(sys.executable).with_name("knittrans"))
ENCODER = "vision"
PATCH = 14


@dataclass
class Process:
    name: str
    popen: subprocess.Popen
    log: Path
    ready: dict = field(default_factory=dict)

    def stop(self, timeout: float = 20.0) -> int:
        if self.popen.poll() is None:
            os.kill(self.popen.pid, signal.SIGTERM)
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.kill(self.popen.pid, signal.SIGKILL)
            return self.popen.wait()


def _spawn(name: str, command: list[str], directory: Path, ready: Path) -> Process:
    log = directory / f"{name}.log"
    with open(log, "ab") as handle:
        popen = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 start_new_session=True)
    return Process(name=name, popen=popen, log=log, ready={"file": str(ready)})


def _wait_ready(processes: Sequence[Process], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    for process in processes:
        ready = Path(process.ready["file"])
        while not ready.exists():
            if process.popen.poll() is not None or time.monotonic() > deadline:
                tail = process.log.read_text()[-3000:] if process.log.exists() else ""
                raise RuntimeError(f"{process.name} did not start:\n{tail}")
            time.sleep(0.05)
        process.ready.update(json.loads(ready.read_text()))


@dataclass(frozen=True, kw_only=True)
class Consumer:
    role: str
    dp_rank: int
    cp_rank: int = 0

    @property
    def name(self) -> str:
        return f"{self.role.replace(':', '_')}-dp{self.dp_rank}-cp{self.cp_rank}"

    @property
    def label(self) -> str:
        """As the sidecar names it."""
        return str(ConsumerId(role=self.role, dp_rank=self.dp_rank, cp_rank=self.cp_rank))

    @property
    def flag(self) -> str:
        """As ``--consumers`` takes it."""
        return f"{self.role}:{self.dp_rank}:{self.cp_rank}"


@dataclass
class Cluster:
    directory: Path
    job: str
    store_url: str
    admission: Process
    sidecars: dict[Consumer, Process]
    mooncake: Any = None

    @property
    def address(self) -> str:
        return self.admission.ready["address"]

    def socket(self, consumer: Consumer) -> str:
        ready = self.sidecars[consumer].ready
        if "sidecars" in ready:  # a process hosting several consumers names each one's socket
            return next(entry["address"] for entry in ready["sidecars"] if entry["consumer"] == consumer.label)
        return ready["address"]

    def statuses(self) -> dict[Consumer, reorg_service_pb2.GetReorgStatusResponse]:
        result = {}
        for consumer in self.sidecars:
            with grpc.insecure_channel(self.socket(consumer)) as channel:
                result[consumer] = reorg_service_pb2_grpc.ReorgServiceStub(channel).GetReorgStatus(
                    reorg_service_pb2.GetReorgStatusRequest(), timeout=10)
        return result

    def _sidecar_processes(self) -> list[Process]:
        """Each sidecar process once (one process may host several consumers)."""
        return list({id(p): p for p in self.sidecars.values()}.values())

    def dump_stacks(self) -> None:
        """Have the admission service and every sidecar write their threads' stacks to their logs (see
        docs/failures.md, "A step that never ends"), for a step that never ended."""
        for process in [self.admission, *self._sidecar_processes()]:
            if process.popen.poll() is None:
                os.kill(process.popen.pid, STACK_DUMP_SIGNAL)

    def stop(self, *, keep_logs: bool = True) -> list[str]:
        """Stop everything; returns the shared-memory segments the sidecars left (should be none). Without
        ``keep_logs`` the run directory (configs, ready files, logs) goes too."""
        for process in self._sidecar_processes():
            process.stop()
        self.admission.stop()
        left = list_segments(f"knittrans-{self.job}-")
        if self.mooncake is not None:
            self.mooncake.stop()
        elif self.store_url.startswith("file://"):
            shutil.rmtree(self.store_url.removeprefix("file://"), ignore_errors=True)
        if keep_logs:
            logger.info("the cluster's logs are kept in %s", self.directory)
        else:
            shutil.rmtree(self.directory, ignore_errors=True)
        return left


def image_cost(config: WorkloadConfig) -> float:
    """Encoder cost of one image: its patch count."""
    return float(max(1, (config.image_height // PATCH) * (config.image_width // PATCH)))


@dataclass(frozen=True, kw_only=True)
class Placement:
    """The admission service on another network host (``benchmarks/multinode_transfer.py``): the command prefix
    that runs it there, the address it binds there, and the store URL each side opens (a Mooncake client names
    its own node). The sidecars run on this host."""

    admission_prefix: tuple[str, ...]
    admission_host: str
    admission_store_url: str
    sidecar_store_url: str


def start_store(store: str, *, job: str, directory: Path) -> tuple[str, Any]:
    """The unit store of a benchmark cluster: a Mooncake master and segment started here (returned, to be
    stopped), or the job's file store on /dev/shm."""
    if store == "mooncake":
        from knittrans.launch.mooncake import MooncakeClusterConfig, start_mooncake

        mooncake = start_mooncake(MooncakeClusterConfig(segment_size=2048 << 20), log_dir=directory / "mooncake")
        return mooncake.store_url, mooncake
    return f"file:///dev/shm/knittrans-{job}", None


def start_cluster(config: WorkloadConfig, *, store: str, directory: Path, slots: int,
                  encoder_microbatch_images: int, placement: Placement | None = None,
                  node_sidecars: bool = False) -> Cluster:
    job = f"bench{uuid.uuid4().hex[:6]}"
    mooncake = None
    admission_store_url = ""
    if placement is not None:  # the data plane runs elsewhere, started by the caller
        store_url, admission_store_url = placement.sidecar_store_url, placement.admission_store_url
    else:
        store_url, mooncake = start_store(store, job=job, directory=directory)
    started: list[Process] = []

    def spawn(name: str, command: list[str], directory: Path, ready: Path) -> Process:
        started.append(_spawn(name, command, directory, ready))
        return started[-1]

    try:
        return _start_services(config, job=job, store_url=store_url, admission_store_url=admission_store_url,
                               directory=directory, slots=slots, encoder_microbatch_images=encoder_microbatch_images,
                               placement=placement, node_sidecars=node_sidecars, mooncake=mooncake, spawn=spawn)
    except BaseException:
        # The services run in sessions of their own, so nothing else stops them when a start fails half-way (a
        # sidecar that cannot start, an interrupt): stop what did start, and the store with it.
        for process in reversed(started):
            process.stop()
        if mooncake is not None:
            mooncake.stop()
        elif placement is None and store_url.startswith("file://"):
            shutil.rmtree(store_url.removeprefix("file://"), ignore_errors=True)
        raise


def _start_services(config: WorkloadConfig, *, job: str, store_url: str, admission_store_url: str,
                    directory: Path, slots: int, encoder_microbatch_images: int, placement: Placement | None,
                    node_sidecars: bool, mooncake: Any, spawn: Callable[[str, list[str], Path, Path], Process]
                    ) -> Cluster:
    """The admission service, then the sidecars, each through ``spawn``, on a store already started."""
    topology = {
        "backbone": {"dp": config.dp, "cp": config.cp, "tp": config.tp,
                     "max_tokens_per_microbatch": config.max_tokens_per_micro_batch},
        "encoders": [{"name": ENCODER, "dp": config.dp,
                      "max_cost_per_microbatch": encoder_microbatch_images * image_cost(config)}],
    }
    admission_config = directory / "admission.yaml"
    admission_config.write_text(yaml.safe_dump({
        "job": job, "store": admission_store_url or store_url, "topology": topology,
        "engine": {"train_batch_size": config.num_trajectories, "num_minibatches": 1, "sources": {"bench": 1.0}},
        "server": {"host": placement.admission_host if placement else "127.0.0.1", "port": 0,
                   "metrics": {"port": -1}},
    }))
    ready = directory / "admission.ready"
    prefix = list(placement.admission_prefix) if placement else []
    admission = spawn("admission", [*prefix, KNITTRANS, "admission", "serve", "--config", str(admission_config),
                                    "--ready-file", str(ready)], directory, ready)
    _wait_ready([admission])
    reorg_config = directory / "reorg.yaml"
    reorg_config.write_text(yaml.safe_dump({"job": job, "store": store_url, "ring": {"slots": slots},
                                            "server": {"metrics": {"port": -1}}}))
    consumers = [Consumer(role="backbone", dp_rank=d, cp_rank=c) for d in range(config.dp) for c in range(config.cp)]
    consumers += [Consumer(role=f"encoder:{ENCODER}", dp_rank=d) for d in range(config.dp)]
    sidecars = {}
    if node_sidecars:
        ready = directory / "node-sidecars.ready"
        node = spawn("node-sidecars", [KNITTRANS, "--log-level", "WARNING", "reorg", "serve", "--config",
                                       str(reorg_config), "--consumers", *(c.flag for c in consumers),
                                       "--admission", admission.ready["address"], "--ready-file", str(ready)],
                     directory, ready)
        _wait_ready([node])
        return Cluster(directory=directory, job=job, store_url=store_url, admission=admission,
                       sidecars=dict.fromkeys(consumers, node), mooncake=mooncake)
    for consumer in consumers:
        ready = directory / f"{consumer.name}.ready"
        sidecars[consumer] = spawn(
            consumer.name,
            [KNITTRANS, "--log-level", "WARNING", "reorg", "serve", "--config", str(reorg_config), "--role",
             consumer.role, "--dp-rank", str(consumer.dp_rank), "--cp-rank", str(consumer.cp_rank), "--admission",
             admission.ready["address"], "--ready-file", str(ready)],
            directory, ready,
        )
    _wait_ready(list(sidecars.values()))
    return Cluster(directory=directory, job=job, store_url=store_url, admission=admission, sidecars=sidecars,
                   mooncake=mooncake)
