"""Real processes for the reorg integration tests: the admission service, reorg sidecars and trainer ranks.
Each is started with ``start_new_session`` and stopped by its PID."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

KNITTRANS = str(Path(sys.executable).with_name("knittrans"))
WORKER = str(Path(__file__).with_name("trainer_worker.py"))
REPO = Path(__file__).resolve().parents[3]


@dataclass
class Process:
    name: str
    popen: subprocess.Popen
    log: Path
    ready: dict = field(default_factory=dict)

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, signum: int) -> None:
        if self.alive():
            os.kill(self.popen.pid, signum)

    def stop(self, timeout: float = 15.0) -> int:
        self.signal(signal.SIGTERM)
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            return self.popen.wait()

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        self.popen.wait()

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text().splitlines()[-lines:])
        except OSError:
            return ""


def spawn(name: str, command: list[str], directory: Path) -> Process:
    log = directory / f"{name}.log"
    handle = open(log, "ab")
    popen = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             start_new_session=True, cwd=REPO)
    handle.close()
    return Process(name=name, popen=popen, log=log)


def wait_ready(process: Process, ready_file: Path, timeout: float = 30.0) -> Process:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready_file.exists():
            process.ready = json.loads(ready_file.read_text())
            return process
        if not process.alive():
            raise RuntimeError(f"{process.name} exited with {process.popen.returncode}:\n{process.tail()}")
        time.sleep(0.05)
    process.stop()
    raise RuntimeError(f"{process.name} did not become ready in {timeout}s:\n{process.tail()}")


def start_admission(directory: Path, *, job: str, store: str, topology: dict, train_batch_size: int,
                    num_minibatches: int, settings: dict | None = None, schema: dict | None = None) -> Process:
    """``settings``: more admission config keys (they win over the defaults here)."""
    config = directory / "admission.yaml"
    config.write_text(yaml.safe_dump({
        **({"schema": schema} if schema is not None else {}),
        "job": job,
        "store": store,
        "engine": {"train_batch_size": train_batch_size, "num_minibatches": num_minibatches, "sources": {"A": 0.5}},
        "topology": topology,
        "server": {"host": "127.0.0.1", "port": 0, "metrics": {"port": -1}},
        **(settings or {}),
    }))
    ready = directory / "admission.ready"
    process = spawn("admission", [KNITTRANS, "admission", "serve", "--config", str(config), "--ready-file",
                                  str(ready)], directory)
    return wait_ready(process, ready)


def start_sidecar(directory: Path, *, job: str, store: str, admission: str, dp_rank: int, cp_rank: int,
                  slots: int = 3, generation: int = 0, role: str = "backbone", settings: dict | None = None
                  ) -> Process:
    config = directory / "reorg.yaml"
    config.write_text(yaml.safe_dump({"job": job, "store": store, "server": {"metrics": {"port": -1}},
                                      **(settings or {})}))
    name = f"reorg-{role.replace(':', '-')}-dp{dp_rank}-cp{cp_rank}-g{generation}"
    ready = directory / f"{name}.ready"
    process = spawn(name, [KNITTRANS, "reorg", "serve", "--config", str(config), "--role", role,
                           "--dp-rank", str(dp_rank), "--cp-rank", str(cp_rank), "--admission", admission,
                           "--slots", str(slots),
                           "--ready-file", str(ready)], directory)
    return wait_ready(process, ready)


def start_node_sidecar(directory: Path, *, job: str, store: str, admission: str, consumers: list[str],
                       slots: int = 3, generation: int = 0, settings: dict | None = None) -> Process:
    """One ``knittrans reorg serve --consumers ...`` process hosting these consumers (role:dp:cp each); its
    ``ready["sidecars"]`` names each consumer's socket."""
    config = directory / "reorg.yaml"
    config.write_text(yaml.safe_dump({"job": job, "store": store, "server": {"metrics": {"port": -1}},
                                      **(settings or {})}))
    name = f"reorg-node-{consumers[0].replace(':', '-')}-g{generation}"
    ready = directory / f"{name}.ready"
    process = spawn(name, [KNITTRANS, "reorg", "serve", "--config", str(config), "--consumers", *consumers,
                           "--admission", admission, "--slots", str(slots), "--ready-file", str(ready)], directory)
    return wait_ready(process, ready)


def start_trainer(directory: Path, *, socket: str, tp_rank: int, global_rank: int, admission: str,
                  minibatches: int, sleep: float = 0.0, use_asyncio: bool = False, name: str = "",
                  extra: tuple[str, ...] = ()) -> tuple[Process, Path]:
    name = name or f"trainer-{global_rank}"
    output = directory / f"{name}.json"
    process = spawn(name, [sys.executable, WORKER, "--socket", socket, "--tp-rank", str(tp_rank),
                           "--global-rank", str(global_rank), "--admission", admission,
                           "--minibatches", str(minibatches), "--output", str(output),
                           "--sleep", str(sleep), *(["--asyncio"] if use_asyncio else []), *extra], directory)
    return process, output
