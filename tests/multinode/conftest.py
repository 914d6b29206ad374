"""Three network hosts on this machine (Linux network namespaces; root only), for the tests marked `multinode`.

Every test here is skipped, with the reason, where namespaces cannot be built (not root, no `ip`, no mount
namespaces). The namespaces are named after this test session's process id, so parallel runs cannot collide, and
are torn down whatever happens.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from knittrans.demo.stack.namespaces import NamespaceCluster, Node, namespaces_unavailable
from knittrans.launch.mooncake import SHORT_LEASE_TTL_MS

UNAVAILABLE = namespaces_unavailable()


def session_tag(suffix: str) -> str:
    return f"{suffix}{os.getpid() % 10**6}"


@pytest.fixture(scope="module")
def cluster() -> Iterator[NamespaceCluster]:
    with NamespaceCluster(nodes_wanted=3, tag=session_tag("t")) as built:
        yield built


@dataclass
class Server:
    name: str
    process: subprocess.Popen
    ready: dict
    log: Path

    def stop(self, signum: int = signal.SIGTERM) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signum)
        return self.process.wait(timeout=30)


def start_command(node: Node, name: str, args: list[str], directory: Path, timeout: float = 60.0) -> Server:
    """``knittrans ARGS --ready-file ...`` on ``node``; returns once it wrote its ready file."""
    ready = directory / f"{name}.json"
    log = directory / f"{name}.log"
    with open(log, "wb") as output:
        process = subprocess.Popen(
            node.command([sys.executable, "-m", "knittrans.cli", *args, "--ready-file", str(ready)]),
            stdout=output, stderr=subprocess.STDOUT, start_new_session=True,
        )
    deadline = time.monotonic() + timeout
    while not ready.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"{name} did not start: {log.read_text()[-3000:]}")
        time.sleep(0.05)
    return Server(name=name, process=process, ready=json.loads(ready.read_text()), log=log)


@dataclass
class DataPlane:
    master: Server
    segments: dict[int, Server]  # node index -> its segment owner

    def store_url_on(self, node: Node) -> str:
        """What a client on ``node`` opens: the master, the segments' size, and its own node's address."""
        return f"{self.segments[1].ready['store_url']}&local_hostname={node.address}"


@pytest.fixture
def data_plane(cluster: NamespaceCluster, tmp_path: Path) -> Iterator[DataPlane]:
    """A Mooncake master on node0 and a segment on node1 and on node2, each started by its own command."""
    node0, node1, node2 = cluster.nodes
    servers: list[Server] = []
    try:
        master = start_command(node0, "master", ["mooncake", "master", "--host", node0.address,
                                                 "--lease-ttl-ms", str(SHORT_LEASE_TTL_MS),
                                                 "--log-dir", str(tmp_path / "logs")], tmp_path)
        servers.append(master)
        segments = {}
        for node in (node1, node2):
            segments[node.index] = start_command(
                node, f"segment-{node.name}",
                ["mooncake", "store", "--master", master.ready["address"], "--host", node.address,
                 "--segment-size", "64MiB", "--log-dir", str(tmp_path / "logs")], tmp_path)
            servers.append(segments[node.index])
        yield DataPlane(master=master, segments=segments)
    finally:
        for server in reversed(servers):
            server.stop()
