"""The chaos run's two actors: the injector sends the schedule's signals, the supervisor restarts what died.

The injector resolves each fault's target to the live instances of that kind when the fault fires and hits
``pick`` modulo their number: kill -9, or SIGSTOP for ``stop_seconds`` then SIGCONT. A fault whose target kind
has no live instance (the rollout workers have finished, say) is logged as skipped. Every fault is appended to
``chaos-faults.jsonl``.

The supervisor restarts each process that died as it was started: the admission service (on its fixed port, from
its Redis journal), a sidecar, a rollout worker (which submits only what was never acknowledged), Redis (on its
port, from its append-only file) and the Mooncake store (an empty segment: what it held is lost). A trainer rank
cannot rejoin a running process group, so the death of one restarts all of them, as torchrun does; each restores
the newest checkpoint all ranks hold.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from knittrans.demo.chaos.schedule import ChaosSettings, FaultAction, FaultTarget, faults_of
from knittrans.launch.ports import free_port, kill_and_reap, start_listening
from knittrans.stack.processes import ManagedProcess, ProcessGroup

logger = logging.getLogger(__name__)

Instances = Callable[[FaultTarget], list[tuple[str, int]]]
RESTART_TIMEOUT_SECONDS = 30.0


def _signal(pid: int, signum: int) -> bool:
    try:
        os.kill(pid, signum)
        return True
    except ProcessLookupError:
        return False


class Injector:
    """Plays the schedule against the live processes in a thread, until :meth:`stop`."""

    def __init__(self, settings: ChaosSettings, instances: Instances, log: Path) -> None:
        self._settings = settings
        self._instances = instances
        self._log = log
        self._stop = threading.Event()
        self.faults: list[dict[str, Any]] = []
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="chaos-injector", daemon=True)

    def start(self) -> None:
        self._started = time.monotonic()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def injected(self) -> list[dict[str, Any]]:
        return [f for f in self.faults if not f["skipped"]]

    def _run(self) -> None:
        with open(self._log, "a") as log:
            for fault in faults_of(self._settings):
                if self._stop.wait(fault.delay_seconds):
                    return
                live = self._instances(fault.target)
                record: dict[str, Any] = {"index": fault.index, "at": round(time.monotonic() - self._started, 3),
                                          "target": fault.target.value, "action": fault.action.value,
                                          "skipped": not live}
                if live:
                    name, pid = live[fault.pick % len(live)]
                    record.update(name=name, pid=pid)
                    if fault.action is FaultAction.KILL:
                        record["skipped"] = not _signal(pid, signal.SIGKILL)
                    else:
                        record["stop_seconds"] = round(fault.stop_seconds, 3)
                        record["skipped"] = not _signal(pid, signal.SIGSTOP)
                        self._stop.wait(fault.stop_seconds)  # a stop ends early with the run, never stays
                        _signal(pid, signal.SIGCONT)
                self.faults.append(record)
                log.write(json.dumps(record) + "\n")
                log.flush()
                logger.info("chaos fault %d: %s", fault.index, record)


class Supervisor:
    """Restarts what died (see the module docstring); :meth:`handle` is the process group's supervisor."""

    def __init__(self, group: ProcessGroup, run_file: Path, *, redis: Any, store_owner: Any) -> None:
        self._group = group
        self._run_file = run_file
        self._redis = redis
        self._owner = store_owner
        self.restarts: Counter[str] = Counter()

    def handle(self, managed: ManagedProcess) -> bool:
        if managed.name.startswith("trainer-rank"):
            self._restart_trainers()
        else:
            self._group.restart(managed)
            self.restarts[kind_of(managed.name)] += 1
        return True

    def poll(self) -> None:
        """Restart Redis or the Mooncake store if it died (they run outside the process group)."""
        if self._redis.process.poll() is not None:
            self._redis.process = self._respawn(self._redis.process, self._redis.port, None)
            self.restarts[FaultTarget.REDIS.value] += 1
        if self._owner is not None and self._owner.process.poll() is not None:
            self._owner.process = self._respawn(self._owner.process, self._owner.port, self._owner.log_path)
            self.restarts[FaultTarget.MOONCAKE_STORE.value] += 1

    def _restart_trainers(self) -> None:
        ranks = [m for m in self._group.processes if m.name.startswith("trainer-rank")]
        for rank in ranks:
            if rank.alive():
                _signal(rank.process.pid, signal.SIGKILL)
                rank.process.wait()
        run = json.loads(self._run_file.read_text())
        run["master_port"] = free_port()  # the old rendezvous port may linger in TIME_WAIT
        self._run_file.write_text(json.dumps(run, indent=2))
        for rank in ranks:
            self._group.restart(rank)
        self.restarts[FaultTarget.TRAINER.value] += 1

    @staticmethod
    def _respawn(old: subprocess.Popen, port: int, log_path: Path | None) -> subprocess.Popen:
        log = open(log_path, "ab") if log_path is not None else subprocess.DEVNULL
        try:
            # The same command, so tied to this driver's life as the first was (knittrans.launch.lifetime).
            started = start_listening(
                partial(subprocess.Popen, old.args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                        start_new_session=True),
                host="127.0.0.1", port=port, stop=kill_and_reap, timeout=RESTART_TIMEOUT_SECONDS,
                what=str(old.args[0]))
        finally:
            if log_path is not None:
                log.close()  # type: ignore[union-attr]
        logger.info("restarted %s (pid %d)", old.args[0], started.pid)
        return started


def kind_of(name: str) -> str:
    """The fault target kind of a process by its name in the group."""
    if name.startswith("reorg-"):
        return FaultTarget.SIDECAR.value
    if name.startswith("trainer-"):
        return FaultTarget.TRAINER.value
    if name.startswith("rollout-"):
        return FaultTarget.ROLLOUT.value
    return name
