"""One admission service holds a job (issue 15 §5), with ``knittrans admission serve`` as real processes.

- a second service of a live job is refused, and the refusal names the holder (its pid and host);
- with Redis state, a holder that stops renewing (SIGSTOP) keeps the job until its lease expires, then the next
  claim gets it, and the stopped holder, resumed, finds the job taken and exits;
- a holder killed with kill -9 is provably gone, so its successor on the same machine takes the job at once;
- with in-memory state, the same holds through a lock file in the job's run directory.
"""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import yaml

from knittrans.client.admission import AdmissionClient

from .builders import SOURCES, make_meta

KNITTRANS = [sys.executable, "-m", "knittrans.cli"]


def write_config(path: Path, *, job: str, state: str, lease_ttl_seconds: float = 20.0) -> Path:
    path.write_text(yaml.safe_dump({
        "job": job,
        "state": state,
        "lease_ttl_seconds": lease_ttl_seconds,
        "engine": {"train_batch_size": 8, "num_minibatches": 2, "sources": SOURCES},
        "topology": {"backbone": {"dp": 1, "cp": 1, "max_tokens_per_microbatch": 4096}},
        "server": {"host": "127.0.0.1", "port": 0, "metrics": {"port": -1}},
    }))
    return path


class Service:
    """``knittrans admission serve`` as a child process; ``address`` once it serves, ``None`` if it exited."""

    def __init__(self, config: Path, directory: Path, name: str) -> None:
        self.ready = directory / f"{name}.ready"
        self.log_path = directory / f"{name}.log"
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen([*KNITTRANS, "admission", "serve", "--config", str(config),
                                             "--ready-file", str(self.ready)], stdout=log, stderr=subprocess.STDOUT)
        self.address: str | None = None
        deadline = time.monotonic() + 60
        while not self.ready.exists() and self.process.poll() is None:
            assert time.monotonic() < deadline, f"{name} neither served nor exited:\n{self.log()}"
            time.sleep(0.05)
        if self.ready.exists():
            self.address = json.loads(self.ready.read_text())["address"]

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


def held(client: AdmissionClient) -> int:
    """Trajectories the job holds: pooled or admitted."""
    status = client.status()
    return status.pool_size + status.admitted_total


def assert_refused_naming(service: Service, holder: Service) -> None:
    assert service.address is None, f"a second service of the job started:\n{service.log()}"
    assert service.process.wait() != 0
    log = service.log()
    assert f"is held by pid {holder.pid} on host {socket.gethostname()}, started " in log, log


def test_a_second_service_of_a_live_job_is_refused_naming_the_holder(tmp_path: Path, redis_server) -> None:
    config = write_config(tmp_path / "admission.yaml", job=f"lease-{uuid.uuid4().hex[:8]}", state=redis_server.url)
    holder = Service(config, tmp_path, "holder")
    try:
        assert holder.address is not None, holder.log()
        second = Service(config, tmp_path, "second")
        assert_refused_naming(second, holder)
        with AdmissionClient(holder.address) as client:  # the holder serves on, untouched
            client.report([make_meta(i, source="AB"[i % 2]) for i in range(4)])
            assert held(client) == 4
    finally:
        holder.kill()


def test_a_stalled_holder_keeps_the_job_until_its_lease_expires(tmp_path: Path, redis_server) -> None:
    config = write_config(tmp_path / "admission.yaml", job=f"lease-{uuid.uuid4().hex[:8]}", state=redis_server.url,
                          lease_ttl_seconds=10.0)
    holder = Service(config, tmp_path, "holder")
    services = [holder]
    try:
        assert holder.address is not None, holder.log()
        holder.process.send_signal(signal.SIGSTOP)  # alive, but no longer renewing its lease
        refused = Service(config, tmp_path, "while-stopped")
        services.append(refused)
        assert_refused_naming(refused, holder)
        successor = None
        for attempt in range(200):  # the lease expires: a later claim gets the job
            successor = Service(config, tmp_path, f"attempt{attempt}")
            services.append(successor)
            if successor.address is not None:
                break
            assert_refused_naming(successor, holder)
            time.sleep(0.1)
        assert successor is not None and successor.address is not None
        holder.process.send_signal(signal.SIGCONT)
        assert holder.process.wait(timeout=60) == 1  # it finds the job taken, and stops
        assert "lost the job lease knittrans:" in holder.log() and f"pid {successor.pid}" in holder.log()
        with AdmissionClient(successor.address) as client:
            client.report([make_meta(i, source="AB"[i % 2]) for i in range(4)])
            assert held(client) == 4
    finally:
        for service in services:
            if service.process.poll() is None:
                service.process.send_signal(signal.SIGCONT)
            service.kill()


def test_a_killed_holder_is_replaced_at_once(tmp_path: Path, redis_server) -> None:
    # A lease that would outlive the whole test: only the proof that the holder is gone lets the successor in.
    config = write_config(tmp_path / "admission.yaml", job=f"lease-{uuid.uuid4().hex[:8]}", state=redis_server.url,
                          lease_ttl_seconds=3600)
    holder = Service(config, tmp_path, "holder")
    try:
        assert holder.address is not None, holder.log()
        with AdmissionClient(holder.address) as client:
            client.report([make_meta(i, source="AB"[i % 2]) for i in range(4)])
        holder.kill()
        successor = Service(config, tmp_path, "successor")
        try:
            assert successor.address is not None, successor.log()
            with AdmissionClient(successor.address) as client:
                assert held(client) == 4  # the same job's journal, recovered
        finally:
            successor.kill()
    finally:
        holder.kill()


def test_in_memory_state_holds_the_job_with_a_lock_file(tmp_path: Path) -> None:
    job = f"lease-{uuid.uuid4().hex[:8]}"
    config = write_config(tmp_path / "admission.yaml", job=job, state="memory")
    holder = Service(config, tmp_path, "holder")
    try:
        assert holder.address is not None, holder.log()
        assert_refused_naming(Service(config, tmp_path, "second"), holder)
        holder.kill()
        successor = Service(config, tmp_path, "successor")  # the kernel freed the dead holder's lock
        try:
            assert successor.address is not None, successor.log()
        finally:
            successor.kill()
    finally:
        holder.kill()
        shutil.rmtree(f"/tmp/knittrans-{job}", ignore_errors=True)  # the killed services' lock file
