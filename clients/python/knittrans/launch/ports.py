"""Free loopback ports, and waiting for a server to accept connections."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable
from typing import Any, TypeVar

from knittrans.launch.interruptions import stop_deferred

Server = TypeVar("Server", bound="subprocess.Popen[Any]")


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago; servers that can bind port 0 themselves should do that instead."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def wait_until(ready: Callable[[], bool], *, timeout: float, interval: float = 0.05, what: str = "server") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return
        time.sleep(interval)
    raise TimeoutError(f"{what} not ready after {timeout:.1f}s")


def accepts_connections(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


def kill_and_reap(process: subprocess.Popen[Any]) -> None:
    process.kill()
    process.wait()


def start_listening(start: Callable[[], Server], *, host: str, port: int, stop: Callable[[Server], None],
                    timeout: float, what: str) -> Server:
    """``start()`` a server and wait until it accepts connections on ``host:port`` or has exited (the caller reads
    which from its status). Until this returns nobody else holds the process, so on any failure it is stopped
    (``stop``) first: the wait's TimeoutError, and a stop signal, also one held back through the start
    (:func:`~knittrans.launch.interruptions.stop_deferred`, under which ``start`` runs)."""
    process: Server | None = None
    try:
        with stop_deferred():
            process = start()
        started = process
        wait_until(lambda: started.poll() is not None or accepts_connections(host, port), timeout=timeout, what=what)
    except BaseException:
        if process is not None:
            stop(process)
        raise
    return started
