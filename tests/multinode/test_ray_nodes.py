"""A Ray cluster across two network hosts (Linux network namespaces, see conftest.py): the head on node0, a worker on
node1, both with token authentication (``RAY_AUTH_MODE=token``) and each with its own ``--temp-dir``, since the
namespaces share /tmp. Units written on node1 through the ``ray://`` store are read on node0 over the bridge.

Marked ``multinode_ray``; skipped with the reason where namespaces cannot be built or Ray is not installed.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from knittrans.demo.stack.namespaces import NamespaceCluster, Node, leftovers
from tests.multinode.conftest import UNAVAILABLE, session_tag
from tests.multinode.test_three_nodes import NODE_CLIENT, running_with

RAY = shutil.which("ray", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")

pytestmark = [
    pytest.mark.multinode_ray,
    pytest.mark.skipif(bool(UNAVAILABLE), reason=f"multinode tests need Linux network namespaces: {UNAVAILABLE}"),
    pytest.mark.skipif(RAY is None, reason="the `ray` command is not installed (pip install -e '.[ray]')"),
]

UNITS = 16
UNIT_BYTES = 1 << 20
OBJECT_STORE_BYTES = 128 << 20


def start_ray(node: Node, args: list[str], temp_dir: Path, environment: dict[str, str]) -> None:
    """``ray start`` on ``node``: its processes stay in the node's namespaces, where the cluster's teardown kills
    them (never ``ray stop``, which stops every Ray on the machine)."""
    assert RAY is not None
    started = node.run([RAY, "start", *args, f"--node-ip-address={node.address}", "--num-cpus=1",
                        f"--temp-dir={temp_dir}", f"--object-store-memory={OBJECT_STORE_BYTES}",
                        "--disable-usage-stats"], env=environment, capture_output=True, text=True, timeout=180)
    assert started.returncode == 0, started.stdout[-2000:] + started.stderr[-3000:]


def run_client(node: Node, environment: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return node.run([sys.executable, str(NODE_CLIENT), *args], env=environment, capture_output=True, text=True,
                    timeout=180)


def test_units_written_on_one_ray_node_are_read_on_another_and_nothing_is_left(tmp_path: Path) -> None:
    """node1 writes through ``ray://`` (the registry actor it creates is pinned to node1, so its objects live
    there); node0 reads them intact over the link; a client with another token is refused; teardown leaves no
    namespace, no Ray process and no temp dir."""
    token = secrets.token_hex(32)
    environment = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}
    tag = session_tag("r")
    with tempfile.TemporaryDirectory(prefix="kt-ray-node0-") as head_dir, \
            tempfile.TemporaryDirectory(prefix="kt-ray-node1-") as worker_dir, \
            NamespaceCluster(nodes_wanted=2, tag=tag) as cluster:
        temp_dirs = [head_dir, worker_dir]
        node0, node1 = cluster.nodes
        start_ray(node0, ["--head", "--port=0", "--include-dashboard=false"], Path(head_dir), environment)
        head = (Path(head_dir) / "ray_current_cluster").read_text().strip()
        assert head.startswith(f"{node0.address}:"), head
        start_ray(node1, [f"--address={head}"], Path(worker_dir), environment)

        # Each client names its own node's Raylet: the namespaces share one process table, where Ray would pick
        # the head's.
        url = f"ray://knittrans-multinode?namespace=knittrans-tests&address={head}&node_ip_address="
        written, read = tmp_path / "written.json", tmp_path / "read.json"
        wrote = run_client(node1, environment, "write", url + node1.address, "ray", str(UNITS), str(UNIT_BYTES),
                           str(written))
        assert wrote.returncode == 0, wrote.stderr[-3000:]
        units = json.loads(written.read_text())
        assert len(units) == UNITS
        assert {tuple(unit["nodes"]) for unit in units.values()} == {(node1.address,)}  # the read crosses the link

        got = run_client(node0, environment, "read", url + node0.address, str(written), str(read))
        assert got.returncode == 0, got.stderr[-3000:]
        assert json.loads(read.read_text()) == {key: {"intact": True} for key in units}

        # The same read with another token is refused (Ray's connect retries cut to two seconds).
        refused = run_client(node0, {**environment, "RAY_AUTH_TOKEN": secrets.token_hex(32),
                                     "RAY_gcs_server_port_wait_time_s": "2"},
                             "read", url + node0.address, str(written), str(tmp_path / "refused.json"))
        assert refused.returncode != 0
        assert "FailedPrecondition: store.address" in refused.stderr, refused.stderr[-3000:]
        assert not (tmp_path / "refused.json").exists()
    assert leftovers(tag) == {"namespaces": [], "mounts": []}
    assert cluster.pids_inside() == []
    for marker in (*temp_dirs, head):
        assert running_with(marker) == []
    assert not any(Path(directory).exists() for directory in temp_dirs)
