"""Free loopback ports, and waiting for a server to accept connections."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable


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
