"""A job's identity and the leases that keep two processes from owning the same names (DESIGN.md §9).

A job name is part of every name the job owns: its store keys (``<job>/t/...``, ``<job>/s/...``), its
shared-memory segments (``knittrans-<job>@<owner>@...``), its run directory (``/tmp/knittrans-<job>``, where the
sidecars' sockets are) and its Redis journal (``knittrans:<job>:journal``). Job names are simple names (letters,
digits, ``_``, ``.``, ``-``), so each of these is the job's alone: no two job names give the same name, and no
job's segment prefix is a prefix of another job's segments.

A name is held by a lease that names its holder (:class:`Holder`). On one machine the lease is a lock file
(:class:`FileLease`, ``flock``): the kernel frees it when the holder process ends, however it ends, so a free lock
is proof that the holder is gone, and only then may its leftovers be removed. The admission service's lease in
Redis (``knittrans.admission.service.job_lease``) expires unless renewed, and names the same holder.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from knittrans.errors import FailedPrecondition
from knittrans.store.keys import check_simple_name

logger = logging.getLogger(__name__)

RUN_ROOT = Path("/tmp")
LEASE_MODE = 0o600


def check_job(value: str, field: str = "job") -> None:
    """Job names go into store keys, file names and Redis keys unchanged, so they are simple names."""
    check_simple_name(value, field)


def job_run_directory(job: str) -> Path:
    """``/tmp/knittrans-<job>``: the job's node-local directory (sidecar sockets, the embedded service's lease)."""
    return RUN_ROOT / f"knittrans-{job}"


def _machine() -> str:
    """Where a pid means this process: the boot and the pid namespace (containers on one host differ)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""
    return f"{boot}/{namespace}"


def _process_start(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (tells a reused pid apart), None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])  # field 22; the command name may hold spaces and ")"


@dataclass(frozen=True, kw_only=True)
class Holder:
    """The process that holds a lease, as its refusals name it."""

    host: str
    pid: int
    started_at: float  # wall clock, seconds since the epoch
    machine: str = ""  # see _machine: where ``pid`` identifies the process
    process_start: int = 0  # see _process_start

    @classmethod
    def this_process(cls) -> Holder:
        pid = os.getpid()
        return cls(host=socket.gethostname(), pid=pid, started_at=time.time(), machine=_machine(),
                   process_start=_process_start(pid) or 0)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> Holder | None:
        """The holder a lease names, or None if it names none readable (a lock file being written)."""
        try:
            data = json.loads(text)
            return cls(host=str(data["host"]), pid=int(data["pid"]), started_at=float(data["started_at"]),
                       machine=str(data.get("machine", "")), process_start=int(data.get("process_start", 0)))
        except (ValueError, TypeError, KeyError):
            return None

    def describe(self) -> str:
        started = datetime.fromtimestamp(self.started_at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        return f"pid {self.pid} on host {self.host}, started {started}"

    def provably_gone(self) -> bool:
        """True only if this holder ran on this machine and its process no longer runs."""
        if not self.machine or self.machine != _machine():
            return False
        start = _process_start(self.pid)
        return start is None or (self.process_start != 0 and start != self.process_start)


class JobLeaseHeld(FailedPrecondition):
    """Another live process holds the lease on a job's names."""

    def __init__(self, what: str, holder: Holder | None, *, where: str) -> None:
        by = holder.describe() if holder is not None else "a process that has not yet written its name"
        super().__init__(f"{what} is held by {by} ({where}); stop that process or choose another job name")
        self.holder = holder


class FileLease:
    """An exclusive ``flock`` on a file that names its holder; released by :meth:`release` or by the holder's
    death. The file is removed on release; a claim checks that the file it locked is still the one at the path,
    so a claim racing a release never holds a lock on a removed file."""

    def __init__(self, path: Path, fd: int, holder: Holder) -> None:
        self.path = path
        self.holder = holder
        self._fd = fd

    @classmethod
    def claim(cls, path: Path, *, what: str) -> FileLease:
        """Hold ``path``, or raise :class:`JobLeaseHeld` naming the live holder."""
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, LEASE_MODE)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                try:
                    holder = Holder.from_json(os.pread(fd, 4096, 0))
                finally:
                    os.close(fd)
                raise JobLeaseHeld(what, holder, where=str(path)) from None
            try:
                same_file = os.stat(path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same_file = False
            if same_file:
                break
            os.close(fd)  # the previous holder removed the file as we locked it: lock the new one
        holder = Holder.this_process()
        os.ftruncate(fd, 0)
        os.pwrite(fd, holder.to_json().encode(), 0)
        return cls(path, fd, holder)

    def release(self) -> None:
        if self._fd < 0:
            return
        try:
            self.path.unlink()  # while locked: nobody holds the file between its removal and the unlock
        except FileNotFoundError:
            pass
        os.close(self._fd)
        self._fd = -1

    def __enter__(self) -> FileLease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

