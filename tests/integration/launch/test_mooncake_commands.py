"""`knittrans mooncake master` and `knittrans mooncake store --master HOST:PORT`, run as a user runs them (real
processes on loopback): a client of the store URL writes and reads a unit through the owner's segment, the master
counts it, and SIGTERM leaves nothing running."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from knittrans.launch.mooncake import master_key_count
from knittrans.store.factory import open_store
from knittrans.store.protocol import UnitWrite
from knittrans.types import DType, UnitKey
from tests.live_processes import running_with


def start(args: list[str], ready: Path, log: Path) -> tuple[subprocess.Popen, dict]:
    with open(log, "wb") as output:
        process = subprocess.Popen([sys.executable, "-m", "knittrans.cli", *args, "--ready-file", str(ready)],
                                   stdout=output, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert process.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.1)
    return process, json.loads(ready.read_text())




@pytest.mark.parametrize("bind", ["127.0.0.1", "0.0.0.0"])
def test_master_and_store_commands_serve_a_client(tmp_path: Path, bind: str) -> None:
    advertise = ["--advertise-host", "127.0.0.1"] if bind == "0.0.0.0" else []
    processes = []
    try:
        master, master_ready = start(["mooncake", "master", "--host", bind, *advertise, "--port", "0",
                                      "--lease-ttl-ms", "2000", "--log-dir", str(tmp_path / "master")],
                                     tmp_path / "master.json", tmp_path / "master.out")
        processes.append(master)
        assert master_ready["address"].startswith("127.0.0.1:")
        owner, owner_ready = start(["mooncake", "store", "--master", master_ready["address"], "--host", bind,
                                    *advertise, "--segment-size", "16MiB", "--log-dir", str(tmp_path / "owner")],
                                   tmp_path / "owner.json", tmp_path / "owner.out")
        processes.append(owner)
        assert "0.0.0.0" not in json.dumps([master_ready, owner_ready])
        assert owner_ready["store_url"] == f"mooncake://{master_ready['address']}?max_unit_size={16 << 20}"

        data = np.arange(1 << 16, dtype=np.int32)
        store = open_store(owner_ready["store_url"])
        try:
            store.put_many([UnitWrite.of_array("cli/unit", data, DType.INT32, sequence=True)])
            assert master_key_count(master_ready["metrics_url"]) == 1
            back = np.empty_like(data)
            assert store.get_into(UnitKey("cli/unit"), back) == data.nbytes
            np.testing.assert_array_equal(back, data)
            store.delete_many([UnitKey("cli/unit")])
            store.wait_removed([UnitKey("cli/unit")])
            assert master_key_count(master_ready["metrics_url"]) == 0
        finally:
            store.close()
    finally:
        for process in reversed(processes):
            process.send_signal(signal.SIGTERM)
        codes = [process.wait(timeout=30) for process in processes]
    assert codes == [0] * len(processes)
    assert running_with(str(tmp_path)) == []
    # mooncake_master and mooncake_client stopped with their commands
    assert running_with(f"--rpc_port={master_ready['address'].rpartition(':')[2]}") == []
    assert running_with(f"--master_server_address={master_ready['address']}") == []


def test_store_command_without_a_reachable_master_says_so(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "knittrans.cli", "mooncake", "store", "--master", "not-a-host-port"],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2
    assert "master" in result.stderr and "host:port" in result.stderr
