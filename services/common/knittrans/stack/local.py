"""The service part of a local stack: state backend, unit store, admission service, one sidecar per consumer.

``knittrans demo`` and ``knittrans up`` both start theirs with :class:`LocalStack`. Everything runs on this
machine unless a subclass places processes elsewhere (the demo's three-node layout overrides the placement
hooks). :meth:`LocalStack.stop` stops every process and removes what the job's processes leave in shared places:
its file store, its shared-memory segments and its socket directory.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Mapping, Sequence
from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml

from knittrans.errors import FailedPrecondition
from knittrans.reorg.settings import default_socket_path
from knittrans.shm import remove_segments
from knittrans.stack.processes import ProcessGroup
from knittrans.store.file import remove_store_directory
from knittrans.types import ConsumerId


class StoreKind(StrEnum):
    FILE = "file"
    MOONCAKE = "mooncake"


class StateKind(StrEnum):
    MEMORY = "memory"
    REDIS = "redis"


def sidecar_name(consumer: ConsumerId) -> str:
    return f"reorg-{consumer.role.replace(':', '-')}-dp{consumer.dp_rank}-cp{consumer.cp_rank}"


def file_store_root(job: str) -> Path:
    return Path(f"/dev/shm/knittrans-{job}")


class LocalStack:
    """The processes of one job's services, started in dependency order; ``work_dir`` takes their configs, ready
    files and (under ``logs/``) their logs."""

    def __init__(self, *, job: str, work_dir: Path, stop_with_parent: bool = False) -> None:
        self.job = job  # names the store keys, segments, sockets and journal of this run only
        self.work_dir = work_dir
        self.group = ProcessGroup(work_dir / "logs", stop_with_parent=stop_with_parent)
        self.python = sys.executable
        self.extras: list[Any] = []  # Redis / Mooncake handles, stopped after the processes
        self.state_url = "memory"
        self.store_url = ""
        self.admission_address = ""
        self.admission_port = 0  # 0: any; the chaos run fixes it, so that a restarted service keeps its address
        self.metrics_urls: list[str] = []
        self.sidecar_metrics: list[str] = []
        self.sidecar_sockets: dict[ConsumerId, str] = {}

    # -- placement: which node runs what (nothing to do on one machine) ---------------------------------

    def _on(self, index: int, argv: Sequence[str]) -> list[str]:
        return list(argv)

    def _host(self, index: int) -> str:
        return "127.0.0.1"

    def _store_url_on(self, index: int) -> str:
        return self.store_url

    def _sidecar_env(self) -> Mapping[str, str] | None:
        return None

    # -- starting ----------------------------------------------------------------------------------------

    def start_state(self, state: StateKind) -> str:
        """The admission service's state: in its memory, or journaled in a Redis started here."""
        if state is StateKind.REDIS:
            from knittrans.launch.redis import start_redis

            redis = start_redis(self.work_dir / "redis", bind_host=self._host(0))
            self.extras.append(redis)
            self.state_url = redis.url
        return self.state_url

    def start_store(self, store: StoreKind, *, lease_ttl_ms: int) -> str:
        """A Mooncake master and segment owner started here, or the job's ``/dev/shm`` file store."""
        if store is StoreKind.MOONCAKE:
            from knittrans.launch.mooncake import MooncakeClusterConfig, start_mooncake

            # A short read lease: released units leave memory soon after their last read.
            cluster = start_mooncake(MooncakeClusterConfig(lease_ttl_ms=lease_ttl_ms),
                                     log_dir=self.work_dir / "logs")
            self.extras.append(cluster)
            self.store_url = cluster.store_url
        else:
            self.store_url = f"file://{file_store_root(self.job)}/units"
        return self.store_url

    def start_admission(self, config: Mapping[str, Any]) -> str:
        """The admission service with ``config`` (its own schema) plus this stack's job, state, store and port."""
        declared = config.get("state")
        if declared is not None and declared != self.state_url:  # a state started elsewhere was not handed over
            raise FailedPrecondition(f"the admission config names state {declared!r}, but this stack's state is "
                                     f"{self.state_url!r} (set state_url, or start it with start_state)",
                                     field="state")
        full = {**config, "job": self.job, "state": self.state_url, "store": self.store_url}
        server = dict(full.get("server") or {})
        full["server"] = {**server, "port": self.admission_port,
                          "metrics": {**(server.get("metrics") or {}), "port": 0}}
        path = self.work_dir / "admission.yaml"
        path.write_text(yaml.safe_dump(full, sort_keys=False))
        ready = self.work_dir / "ready-admission.json"
        process = self.group.start("admission", [
            self.python, "-m", "knittrans.cli", "admission", "serve", "--config", str(path),
            "--host", self._host(0), "--ready-file", str(ready)])
        info = self.group.wait_ready(process, ready)
        self.admission_address = str(info["address"])
        self.metrics_urls.append(str(info["metrics_url"]))
        return self.admission_address

    def start_sidecars(self, consumers: Sequence[ConsumerId], *, on_ready: Any = None) -> None:
        """One reorg sidecar per consumer, started together; ``on_ready(done, total)`` after each is ready."""
        pending = []
        for consumer in consumers:
            name = sidecar_name(consumer)
            ready = self.work_dir / f"ready-{name}.json"
            process = self.group.start(name, self._on(2, [
                self.python, "-m", "knittrans.cli", "reorg", "serve", "--job", self.job, "--role", consumer.role,
                "--dp-rank", str(consumer.dp_rank), "--cp-rank", str(consumer.cp_rank), "--store",
                self._store_url_on(2), "--admission", self.admission_address, "--metrics-port", "0",
                "--ready-file", str(ready)]), env=self._sidecar_env())
            pending.append((consumer, process, ready))
        for done, (consumer, process, ready) in enumerate(pending, start=1):
            info = self.group.wait_ready(process, ready)
            url = str(info["metrics_url"])
            self.metrics_urls.append(url)
            self.sidecar_metrics.append(url)
            self.sidecar_sockets[consumer] = str(info["address"])
            if on_ready is not None:
                on_ready(done, len(pending))

    # -- stopping ----------------------------------------------------------------------------------------

    def stop(self) -> None:
        self.group.stop_all()
        for extra in reversed(self.extras):
            extra.stop()
        remove_store_directory(file_store_root(self.job))
        remove_segments(f"knittrans-{self.job}@")  # what a killed sidecar of this run left (all are stopped now)
        shutil.rmtree(Path(default_socket_path(self.job, ConsumerId(role="backbone", dp_rank=0))).parent,
                      ignore_errors=True)
