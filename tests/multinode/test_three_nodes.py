"""KnitTrans across three network hosts (Linux network namespaces on this machine, see conftest.py).

node0: the admission service, Redis and the Mooncake master; node1: rollout and a Mooncake segment; node2: a
Mooncake segment, the reorg sidecars and the trainer ranks. Traffic stays in the namespaces' private subnet.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from knittrans.demo.stack.namespaces import NamespaceCluster, leftovers
from tests.doc_blocks import ROOT
from tests.live_processes import running_with
from tests.multinode.conftest import UNAVAILABLE, DataPlane

pytestmark = [
    pytest.mark.multinode,
    pytest.mark.skipif(bool(UNAVAILABLE), reason=f"multinode tests need Linux network namespaces: {UNAVAILABLE}"),
]

NODE_CLIENT = Path(__file__).with_name("node_client.py")
DEPLOY_DOC = ROOT / "docs" / "deploy.md"


def reaches(cluster: NamespaceCluster, node: int, host: str, port: int) -> bool:
    probe = f"import socket; socket.create_connection(({host!r}, {port}), timeout=2)"
    return cluster.nodes[node].run([sys.executable, "-c", probe], capture_output=True).returncode == 0


def node_client(cluster: NamespaceCluster, node: int, *args: str) -> None:
    result = cluster.nodes[node].run([sys.executable, str(NODE_CLIENT), *args], capture_output=True, text=True,
                                     timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]




def test_nodes_are_isolated(cluster: NamespaceCluster, data_plane: DataPlane, tmp_path: Path) -> None:
    master_port = int(data_plane.master.ready["address"].rpartition(":")[2])
    node0 = cluster.nodes[0]
    assert reaches(cluster, 1, node0.address, master_port)  # over the bridge
    assert not reaches(cluster, 1, "127.0.0.1", master_port)  # node1's loopback is node1's own
    assert not reaches(cluster, 0, "127.0.0.1", master_port)  # the master listens on node0's address only

    unit_dir = f"/dev/shm/knittrans-isolation-{os.getpid()}"
    write = ("from knittrans.store.file import FileUnitStore; import numpy as np; "
             "from knittrans.store.protocol import UnitWrite; from knittrans.types import DType; "
             f"FileUnitStore({unit_dir!r}).put_many([UnitWrite.of_array('k', np.arange(8, dtype=np.int32), "
             "DType.INT32, sequence=True)])")
    assert cluster.nodes[1].run([sys.executable, "-c", write]).returncode == 0
    count = [sys.executable, "-c", f"import pathlib; print(sum(1 for p in pathlib.Path({unit_dir!r}).rglob('*') "
             "if p.is_file()))"]
    assert cluster.nodes[1].run(count, capture_output=True, text=True).stdout.strip() == "1"
    assert cluster.nodes[2].run(count, capture_output=True, text=True).stdout.strip() == "0"
    assert not Path(unit_dir).exists()  # nor on this machine's own /dev/shm


def test_a_unit_written_on_one_node_is_read_on_another(cluster: NamespaceCluster, data_plane: DataPlane,
                                                       tmp_path: Path) -> None:
    node1, node2 = cluster.nodes[1], cluster.nodes[2]
    written, read = tmp_path / "written.json", tmp_path / "read.json"
    node_client(cluster, 1, "write", data_plane.store_url_on(node1), "across", "24", str(1 << 20), str(written))
    placed = {unit["endpoint"].rpartition(":")[0] for unit in json.loads(written.read_text()).values()}
    assert placed <= {node1.address, node2.address}
    node_client(cluster, 2, "read", data_plane.store_url_on(node2), str(written), str(read))
    assert all(result.get("intact") for result in json.loads(read.read_text()).values())
    assert master_key_count_on(cluster, data_plane) == 24


def master_key_count_on(cluster: NamespaceCluster, data_plane: DataPlane) -> int:
    url = data_plane.master.ready["metrics_url"]
    script = f"from knittrans.launch.mooncake import master_key_count as c; print(c({url!r}))"
    result = cluster.nodes[0].run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr[-2000:]
    return int(result.stdout.strip())


def test_losing_a_nodes_segment_fails_reads_of_its_units_by_name(cluster: NamespaceCluster, data_plane: DataPlane,
                                                                 tmp_path: Path) -> None:
    """The documented outcome (docs/deploy.md, "Losing a node"): units are not replicated, so the units of the lost
    segment fail their reads with a typed error naming each unit; every other unit still reads intact."""
    node1, node2 = cluster.nodes[1], cluster.nodes[2]
    written, read = tmp_path / "written.json", tmp_path / "read.json"
    node_client(cluster, 1, "write", data_plane.store_url_on(node1), "lost", "24", str(64 << 10), str(written))
    units = json.loads(written.read_text())
    on_node1 = {key for key, unit in units.items() if unit["endpoint"].startswith(f"{node1.address}:")}
    assert on_node1 and on_node1 != set(units), "the master placed every unit in one segment; nothing to compare"

    owner = data_plane.segments[1]
    (segment_pid,) = (int(pid) for pid in
                      Path(f"/proc/{owner.process.pid}/task/{owner.process.pid}/children").read_text().split())
    os.kill(segment_pid, signal.SIGKILL)  # node1's segment dies mid-run; its command notices and exits 1
    assert owner.process.wait(timeout=30) == 1

    node_client(cluster, 2, "read", data_plane.store_url_on(node2), str(written), str(read))
    results = json.loads(read.read_text())
    failed = {key for key, result in results.items() if "error" in result}
    assert failed == on_node1
    for key in failed:
        assert results[key]["error"] in ("StoreError", "UnitNotFound"), results[key]
        assert results[key]["field"] == key, results[key]
    assert all(results[key].get("intact") for key in set(units) - failed)


def deploy_doc_command(program: str) -> list[str]:
    """The first command of docs/deploy.md that starts with ``program``, as a reader copies it."""
    for line in DEPLOY_DOC.read_text().splitlines():
        if line.strip().startswith(program):
            return shlex.split(line.strip(), comments=True)
    raise AssertionError(f"docs/deploy.md shows no `{program}` command")


def test_the_demo_runs_across_three_nodes(tmp_path: Path) -> None:
    """`knittrans demo --nodes 3` as docs/deploy.md shows it (with Redis, shortened to two train batches): quotas
    held, every trajectory trained exactly once, the bytes trained are the bytes written, the master's key count
    returns to 0 after the last step, and nothing of the cluster is left behind."""
    command = deploy_doc_command("knittrans demo --nodes 3")
    out = tmp_path / "demo-out"
    environment = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    demo = subprocess.Popen([*command, "--train-batches", "2", "--out", str(out)], cwd=tmp_path, env=environment,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stdout, stderr = demo.communicate(timeout=500)
    assert demo.returncode == 0, stdout[-3000:] + stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    checks = report["checks"]
    assert checks["trained_exactly_once"] and checks["quotas_held"] and checks["bytes_match"], checks
    assert checks["details"]["trained"] == checks["details"]["admitted"] == 64
    assert checks["details"]["store_keys_after_release"] == 0
    assert report["bytes_read"] == report["bytes_needed"] > 0
    assert "mooncake" in report["settings"]["store"] and report["settings"]["nodes"] == "3"
    logs = out / "logs"
    assert "10.201.0.2" in (logs / "segment-node1.log").read_text()  # the segments joined by their nodes' addresses
    assert "10.201.0.3" in (logs / "segment-node2.log").read_text()
    assert leftovers(f"{demo.pid % 10**8}") == {"namespaces": [], "mounts": []}
    assert running_with(str(out)) == []


def test_teardown_leaves_no_namespace_mount_or_process() -> None:
    cluster = NamespaceCluster(nodes_wanted=3, tag=f"d{os.getpid() % 10**6}")
    with cluster:
        sleepers = [subprocess.Popen(node.command(["sleep", "300"]), start_new_session=True) for node in cluster.nodes]
        deadline = time.monotonic() + 30  # each sleeper joins its node once nsenter has entered it
        while len(cluster.pids_inside()) < 6 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(cluster.pids_inside()) == 6  # three holders and three sleepers
        assert len(leftovers(cluster.tag)["namespaces"]) == 4
    assert [sleeper.wait(timeout=10) for sleeper in sleepers] == [-signal.SIGKILL] * 3
    assert leftovers(cluster.tag) == {"namespaces": [], "mounts": []}
    assert cluster.pids_inside() == []
