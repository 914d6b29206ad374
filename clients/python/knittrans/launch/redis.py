"""A real ``redis-server`` on a free port (loopback by default), with AOF on, stopped by PID.

``bind_host`` and ``advertise_host`` follow :mod:`knittrans.addresses`: the URL names the advertised host."""

from __future__ import annotations

import logging
import secrets
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from knittrans.addresses import advertised_host, host_port, is_loopback
from knittrans.errors import FailedPrecondition
from knittrans.launch import lifetime
from knittrans.launch.logs import failure_message
from knittrans.launch.ports import free_port, kill_and_reap, start_listening

logger = logging.getLogger(__name__)


@dataclass
class RedisServer:
    port: int
    data_dir: Path
    process: subprocess.Popen[bytes]
    _owns_dir: bool = field(default=False, repr=False)
    host: str = "127.0.0.1"  # the advertised host
    password: str = field(default="", repr=False)

    @property
    def url(self) -> str:
        credentials = f":{self.password}@" if self.password else ""
        return f"redis://{credentials}{host_port(self.host, self.port)}/0"

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



def _spawn(argv: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def start_redis(
    data_dir: Path | None = None,
    *,
    port: int | None = None,
    timeout: float = 15.0,
    bind_host: str = "127.0.0.1",
    advertise_host: str = "",
    die_with_parent: bool = True,
) -> RedisServer:
    """Start redis-server with ``appendonly yes`` and ``appendfsync always``, so acknowledged writes survive.

    It listens on ``bind_host``; :attr:`RedisServer.url` names the advertised host. Protected mode stays on, and
    it refuses clients from other addresses while there is no password: so a server bound beyond loopback gets
    a random password, which its URL carries. With ``die_with_parent`` (the default) the kernel stops it when this
    process dies without calling :meth:`RedisServer.stop` (:mod:`knittrans.launch.lifetime`)."""
    host = advertised_host(bind_host, advertise_host)
    password = "" if is_loopback(bind_host) else secrets.token_hex(16)
    binary = shutil.which("redis-server")
    if binary is None:
        raise FailedPrecondition("redis-server is not installed; `make test` installs it with apt-get")
    owns_dir = data_dir is None
    # Absolute: redis-server changes into --dir before it opens --logfile.
    directory = Path(tempfile.mkdtemp(prefix="knittrans-redis-")) if data_dir is None else data_dir.resolve()
    directory.mkdir(parents=True, exist_ok=True)
    log_path = directory / "redis.log"
    config_file: list[str] = []
    if password:  # in a file only this user reads, not on the command line that `ps` shows
        secret = directory / "redis-auth.conf"
        secret.touch(mode=0o600)
        secret.write_text(f"requirepass {password}\n")
        config_file = [str(secret)]
    last_error = ""
    for _ in range(5):  # a free port can be taken between probing and binding
        chosen = port or free_port(bind_host)
        command = [binary, *config_file, "--bind", bind_host, "--port", str(chosen), "--dir", str(directory),
                   "--appendonly", "yes", "--appendfsync", "always", "--save", "", "--protected-mode", "yes",
                   "--daemonize", "no", "--logfile", str(log_path)]
        argv = lifetime.tied_to_this_process(command) if die_with_parent else command
        try:
            process = start_listening(partial(_spawn, argv), host=host, port=chosen, stop=kill_and_reap,
                                      timeout=timeout, what="redis-server")
        except TimeoutError:
            last_error = f"not listening after {timeout:.0f}s"
            continue
        if process.poll() is None:
            logger.info("redis-server pid %d on %s (dir %s)", process.pid, host_port(host, chosen), directory)
            return RedisServer(port=chosen, data_dir=directory, process=process, _owns_dir=owns_dir, host=host,
                               password=password)
        last_error = f"exited with {process.returncode}"
        if port:
            break  # the port was given: another try would meet the same fate
    raise FailedPrecondition(failure_message("redis-server", last_error, log_path))
