"""Real KnitTrans processes started from the manifests' own config, for the live metric and Prometheus tests.

The admission service runs `knittrans admission serve` with the dev overlay's ConfigMap and token; a reorg
sidecar runs `knittrans reorg serve` with the trainer-job example's ConfigMap and args. Only what points
into a cluster is replaced: addresses and ports by loopback ones on port 0, the unit store by a temporary
directory, the sidecar's mTLS by plaintext and its token by the dev token. Every process is started in
its own session and stopped by its PID.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from knittrans.client.admission import AdmissionClient, ProgressStage, ReportOutcome
from knittrans.client.connection import ConnectionSettings
from knittrans.config import ENV_PREFIX, environment
from knittrans.errors import InvalidArgument
from knittrans.types import ConsumerId
from tests.deploy.container_config import CONFIG_FLAG, ContainerConfig, resolve
from tests.deploy.k8s_objects import pod_templates
from tests.deploy.tools import render
from tests.integration.admission.builders import make_meta

KNITTRANS = Path(sys.executable).with_name("knittrans")
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0
# The dev config bounds staleness at 1 version; starting at version 3 makes a version-0 trajectory stale.
INITIAL_VERSION = 3


@dataclass
class Process:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> int:
        """SIGTERM by PID, then SIGKILL if it does not exit in time."""
        if self.alive():
            os.kill(self.popen.pid, signal.SIGTERM)
        try:
            return self.popen.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.kill(self.popen.pid, signal.SIGKILL)
            return self.popen.wait()


def clean_environment(extra: Mapping[str, str]) -> dict[str, str]:
    """This process's environment without any KNITTRANS_* variable, plus ``extra``."""
    base = {name: value for name, value in environment().items() if not name.startswith(ENV_PREFIX)}
    return {**base, **extra}


def spawn(name: str, command: Sequence[str | Path], *, env: Mapping[str, str], directory: Path) -> Process:
    log = directory / f"{name}.log"
    with open(log, "wb") as handle:
        popen = subprocess.Popen(
            [str(c) for c in command], stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=dict(env), cwd=directory, start_new_session=True,
        )
    return Process(name=name, popen=popen, log=log)


def wait_for_ready_file(process: Process, ready_file: Path) -> dict[str, object]:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if ready_file.exists():
            return json.loads(ready_file.read_text())
        if not process.alive():
            raise AssertionError(f"{process.name} exited with {process.popen.returncode}:\n{process.tail()}")
        time.sleep(0.05)
    process.stop()
    raise AssertionError(f"{process.name} wrote no ready file in {READY_TIMEOUT_S:.0f} s:\n{process.tail()}")


def command_line(config: ContainerConfig, config_file: Path) -> list[str]:
    """The container's args, with its --config pointing at a local copy of the ConfigMap file."""
    args = list(config.args)
    index = args.index(CONFIG_FLAG)
    args[index + 1] = str(config_file)
    return args


def container_config(kustomization: str, workload: str, container: str) -> ContainerConfig:
    objects = render(kustomization)
    template = next(t for t in pod_templates(objects) if t.name == workload)
    return resolve(objects, template, container)


def scrape(metrics_port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as response:
        return response.read().decode()


def free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def live_job() -> str:
    """The examples' job name, made this test process's own: its lease and run directory are per job, and another
    test session on this machine (a parallel worker) may run the same stack at the same time."""
    return f"example-{os.getpid()}"


@dataclass
class RunningService:
    process: Process
    address: str
    metrics_port: int
    config: ContainerConfig


def start_admission(directory: Path, *, initial_version: int) -> RunningService:
    """The dev overlay's admission service on loopback, port 0, with its units in ``directory``."""
    config = container_config("overlays/dev", "Deployment/knittrans-admission", "admission")
    config_file = directory / "admission.yaml"
    config_file.write_text(config.config_text)
    ready_file = directory / "admission.ready.json"
    store = directory / "units"
    store.mkdir()
    command = [
        KNITTRANS, *command_line(config, config_file),
        "--host", "127.0.0.1", "--port", "0", "--metrics-port", "0", "--store", f"file://{store}",
        "--ready-file", ready_file,
    ]
    env = clean_environment(
        {
            **config.knittrans_env,
            f"{ENV_PREFIX}SERVER__METRICS__HOST": "127.0.0.1",
            f"{ENV_PREFIX}INITIAL_VERSION": str(initial_version),
            f"{ENV_PREFIX}JOB": live_job(),
        }
    )
    process = spawn("admission", command, env=env, directory=directory)
    ready = wait_for_ready_file(process, ready_file)
    return RunningService(
        process=process, address=str(ready["address"]), metrics_port=int(ready["metrics_port"]), config=config
    )


def start_reorg_sidecar(directory: Path, *, admission: RunningService, token: str) -> RunningService:
    """The trainer-job example's sidecar (its ConfigMap and args), pointed at the live admission service."""
    config = container_config("examples/trainer-job", "Job/grpo-trainer", "knittrans-reorg")
    config_file = directory / "reorg.yaml"
    config_file.write_text(config.config_text)
    ready_file = directory / "reorg.ready.json"
    overrides = {
        "ADMISSION__TARGET": admission.address,
        "ADMISSION__TOKEN": token,
        "ADMISSION__TLS__CA_FILE": "",
        "ADMISSION__TLS__CERT_FILE": "",
        "ADMISSION__TLS__KEY_FILE": "",
        "STORE": f"file://{directory / 'units'}",
        "SERVER__UNIX_SOCKET": str(directory / "reorg.sock"),
        "SERVER__METRICS__HOST": "127.0.0.1",
        "SERVER__METRICS__PORT": "0",
        "JOB": live_job(),
    }
    env = clean_environment({**config.knittrans_env, **{ENV_PREFIX + k: v for k, v in overrides.items()}})
    command = [KNITTRANS, *command_line(config, config_file), "--ready-file", ready_file]
    process = spawn("reorg", command, env=env, directory=directory)
    ready = wait_for_ready_file(process, ready_file)
    return RunningService(
        process=process, address=str(ready["address"]), metrics_port=int(ready["metrics_port"]), config=config
    )


@dataclass(frozen=True, kw_only=True)
class Traffic:
    accepted: int
    dropped_stale: int
    admitted_trajectories: int
    released_minibatches: int


@dataclass(frozen=True, kw_only=True)
class LiveStack:
    admission: RunningService
    token: str
    traffic: Traffic
    reorg_metrics: str  # scraped from a live sidecar registered with this admission service

    def admission_metrics(self) -> str:
        return scrape(self.admission.metrics_port)


def drive_traffic(address: str, token: str) -> Traffic:
    """Reports that fill the first mini-batch of the dev job, a stale one, a bad batch, and its release."""
    with AdmissionClient(ConnectionSettings(target=address, token=token)) as client:
        registration = client.register_consumer(ConsumerId(role="backbone", dp_rank=0, cp_rank=0))
        backbone = registration.topology.backbone
        sources = ("math", "code")
        # Staleness 0 and 1, from both sources: enough for the first mini-batch of 64.
        fresh = [make_meta(i, source=sources[i % 2], version=INITIAL_VERSION - i % 2) for i in range(1, 65)]
        stale = [make_meta(1000, source="math", version=0)]  # accepted, then dropped: staleness 3 > bound 1
        results = client.report(fresh) + client.report(stale)
        accepted = sum(r.outcome is ReportOutcome.ACCEPTED for r in results)
        try:
            client.report([make_meta(2000, source="not-a-source", version=INITIAL_VERSION)])
        except InvalidArgument:
            pass
        else:
            raise AssertionError("a report from an unknown source was accepted")
        status = client.status()
        assert status.admitted_total > 0, f"the traffic admitted nothing: {status}"
        consumers = [
            ConsumerId(role="backbone", dp_rank=d, cp_rank=c) for d in range(backbone.dp) for c in range(backbone.cp)
        ]
        for consumer in consumers:
            client.report_progress(consumer, 1, ProgressStage.OPTIMIZER_STEP)
        status = client.status()
        return Traffic(
            accepted=accepted,
            dropped_stale=status.dropped_stale,
            admitted_trajectories=status.admitted_total,
            released_minibatches=status.released_minibatches,
        )
