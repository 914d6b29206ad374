"""A real ``redis-server`` on a free loopback port, with AOF on, stopped by PID."""

from __future__ import annotations

import logging
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from knittrans.errors import FailedPrecondition
from knittrans.launch.ports import accepts_connections, free_port, wait_until

logger = logging.getLogger(__name__)


@dataclass
class RedisServer:
    port: int
    data_dir: Path
    process: subprocess.Popen
    _owns_dir: bool = field(default=False, repr=False)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self, *, kill: bool = False) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._owns_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)


def start_redis(data_dir: Path | None = None, *, port: int | None = None, timeout: float = 15.0) -> RedisServer:
    """Start redis-server with ``appendonly yes`` and ``appendfsync always``, so acknowledged writes survive."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise FailedPrecondition("redis-server is not installed; `make test` installs it with apt-get")
    owns_dir = data_dir is None
    directory = Path(tempfile.mkdtemp(prefix="knittrans-redis-")) if data_dir is None else data_dir
    directory.mkdir(parents=True, exist_ok=True)
    last_error: Exception | None = None
    for _ in range(5):  # a free port can be taken between probing and binding
        chosen = port or free_port()
        process = subprocess.Popen(
            [binary, "--bind", "127.0.0.1", "--port", str(chosen), "--dir", str(directory), "--appendonly", "yes",
             "--appendfsync", "always", "--save", "", "--protected-mode", "yes", "--daemonize", "no",
             "--logfile", str(directory / "redis.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )
        try:
            wait_until(lambda p=process, c=chosen: p.poll() is not None or accepts_connections("127.0.0.1", c),
                       timeout=timeout, what="redis-server")
        except TimeoutError as exc:
            process.kill()
            last_error = exc
            continue
        if process.poll() is None:
            logger.info("redis-server pid %d on port %d (dir %s)", process.pid, chosen, directory)
            return RedisServer(port=chosen, data_dir=directory, process=process, _owns_dir=owns_dir)
        last_error = FailedPrecondition(f"redis-server exited with {process.returncode}")
    raise FailedPrecondition(f"could not start redis-server: {last_error}")
