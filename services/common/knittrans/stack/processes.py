"""A supervised group of local processes: started with their own log files, stopped together.

Every process a local stack (``knittrans demo``, ``knittrans up``) starts is registered here. If one exits while
the group still needs it, the group reports it by name with the last lines of its log, and everything is stopped:
on normal exit, on Ctrl-C and on failure alike.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from knittrans.errors import FailedPrecondition
from knittrans.launch.interruptions import stop_deferred
from knittrans.launch.lifetime import tied_to_this_process

logger = logging.getLogger(__name__)

STOP_GRACE_SECONDS = 10.0

@dataclass
class ManagedProcess:
    name: str
    process: subprocess.Popen
    log_path: Path
    must_outlive_run: bool  # a service: its exit is a failure; a worker may finish
    _log_file: object = field(default=None, repr=False)
    argv: tuple[str, ...] = ()
    env: Mapping[str, str] | None = None
    restarts: int = 0

    def alive(self) -> bool:
        return self.process.poll() is None

    def last_log_lines(self, count: int = 20) -> list[str]:
        try:
            with open(self.log_path, errors="replace") as handle:
                return list(deque(handle, maxlen=count))
        except OSError:
            return []


class ProcessFailed(FailedPrecondition):
    """A process of the stack died; the message names it and carries its last log lines."""


class ProcessGroup:
    def __init__(self, log_dir: Path, *, stop_with_parent: bool = False) -> None:
        self.log_dir = log_dir
        self.stop_with_parent = stop_with_parent  # children get SIGTERM when this process dies
        log_dir.mkdir(parents=True, exist_ok=True)
        self.processes: list[ManagedProcess] = []
        # Given (the chaos run), it is asked first about a process that died when it must not have; True: it took
        # care of it (restarted it), so that is no failure.
        self.supervisor: Callable[[ManagedProcess], bool] | None = None

    def start(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        service: bool = True,
    ) -> ManagedProcess:
        log_path = self.log_dir / f"{name}.log"
        log_file = open(log_path, "wb")
        with stop_deferred():  # a stop between the fork and the append would leave the child out of stop_all
            process = subprocess.Popen(
                self._command(argv), stdout=log_file, stderr=subprocess.STDOUT,
                env=dict(env) if env is not None else None, start_new_session=True,
            )
            managed = ManagedProcess(name=name, process=process, log_path=log_path, must_outlive_run=service,
                                     _log_file=log_file, argv=tuple(argv), env=env)
            self.processes.append(managed)
        logger.debug("started %s (pid %d)", name, process.pid)
        return managed

    def wait_ready(self, managed: ManagedProcess, ready_file: Path, *, timeout: float = 120.0) -> dict:
        """Wait for a service to write its ready file (JSON); fail fast if it dies first."""
        deadline = time.monotonic() + timeout
        while not ready_file.exists():
            self.check()
            if time.monotonic() > deadline:
                raise ProcessFailed(self._describe(managed, f"not ready after {timeout:.0f}s"))
            time.sleep(0.05)
        return json.loads(ready_file.read_text())

    def check(self) -> None:
        """Raise :class:`ProcessFailed` for the first process that died when it must not have."""
        for managed in self.processes:
            code = managed.process.poll()
            if code is None:
                continue
            if managed.must_outlive_run or code != 0:
                if self.supervisor is not None and self.supervisor(managed):
                    continue
                raise ProcessFailed(self._describe(managed, f"exited with status {code}"))

    def wait_all(self, names: Callable[[ManagedProcess], bool], *, poll: Callable[[], None] | None = None) -> None:
        """Wait until every selected process exited successfully, checking the others meanwhile."""
        selected = [m for m in self.processes if names(m)]
        while any(m.alive() for m in selected):
            self.check()
            if poll is not None:
                poll()
            time.sleep(0.2)
        self.check_finished(selected)

    def check_finished(self, selected: Sequence[ManagedProcess]) -> None:
        for managed in selected:
            if managed.process.returncode != 0:
                raise ProcessFailed(self._describe(managed, f"exited with status {managed.process.returncode}"))

    def restart(self, managed: ManagedProcess) -> None:
        """Start a process that ended again, as it was started; its log continues."""
        if managed._log_file is not None:
            managed._log_file.close()
        managed._log_file = log_file = open(managed.log_path, "ab")
        with stop_deferred():
            managed.process = subprocess.Popen(
                self._command(managed.argv), stdout=log_file, stderr=subprocess.STDOUT,
                env=dict(managed.env) if managed.env is not None else None, start_new_session=True,
            )
        managed.restarts += 1
        logger.info("restarted %s (pid %d)", managed.name, managed.process.pid)

    def stop_all(self) -> None:
        """SIGTERM everything (newest first), then SIGKILL what is left after the grace period."""
        for managed in reversed(self.processes):
            if managed.alive():
                self._signal(managed, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        for managed in reversed(self.processes):
            remaining = max(0.0, deadline - time.monotonic())
            try:
                managed.process.wait(timeout=remaining)
            except subprocess.TimeoutExpired:
                logger.warning("%s did not stop in %.0fs; killing it", managed.name, STOP_GRACE_SECONDS)
                self._signal(managed, signal.SIGKILL)
                managed.process.wait()
            if managed._log_file is not None:
                managed._log_file.close()
                managed._log_file = None

    def _command(self, argv: Sequence[str]) -> list[str]:
        return tied_to_this_process(argv) if self.stop_with_parent else list(argv)

    @staticmethod
    def _signal(managed: ManagedProcess, signum: int) -> None:
        try:
            os.killpg(managed.process.pid, signum)  # the process and anything it started
        except ProcessLookupError:
            pass

    @staticmethod
    def _describe(managed: ManagedProcess, what: str) -> str:
        tail = "".join(managed.last_log_lines()).rstrip()
        return f"{managed.name} {what}; last lines of {managed.log_path}:\n{tail}"
