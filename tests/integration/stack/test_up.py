"""`knittrans up` as a user runs it: a real subprocess, real servers on free ports, clients from the connection file.

The oracles are independent of the stack's code: the trajectory ids and token bytes the test itself submitted,
the machine's process table (/proc), and the paths a job's processes may leave (its file store, sockets, shared
memory segments, the connection file, the temporary directory).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import yaml

from knittrans.client.admission import AdmissionClient
from knittrans.connection_file import StackConnection, read_connection_file
from knittrans.rollout import RolloutClient
from knittrans.steps import BEFORE_FIRST_STEP
from knittrans.trainer import TrainerClient
from knittrans.types import VersionSegment
from tests.live_processes import running_with

TRAIN_BATCH = 8
MINIBATCHES = 2  # per train batch
TRAIN_BATCHES = 2
STOP_SECONDS = 60  # what the stack may take to stop (its grace period for each server is 10 s)


def stack_config(job: str, **top: object) -> dict:
    return {"job": job, **top, "admission": {
        "engine": {"train_batch_size": TRAIN_BATCH, "num_minibatches": MINIBATCHES,
                   "sources": {"math": 0.5, "code": 0.5}},
        "topology": {"backbone": {"dp": 2, "cp": 1, "max_tokens_per_microbatch": 128}},
    }}


@dataclass
class RunningStack:
    job: str
    process: subprocess.Popen[str]
    connection_file: Path
    connection: StackConnection
    stderr_path: Path

    def children(self) -> list[str]:
        """Live processes of this job: its servers name the job (or its temporary directory) in their argv."""
        return running_with(self.job)

    def leftovers(self) -> list[str]:
        paths = [Path(f"/tmp/knittrans-{self.job}"), Path(f"/dev/shm/knittrans-{self.job}"), self.connection_file,
                 self.connection_file.with_name(f"{self.connection_file.name}.lock")]
        found = [str(p) for p in paths if p.exists()]
        found += [f"/dev/shm/{name}" for name in os.listdir("/dev/shm") if name.startswith(f"knittrans-{self.job}@")]
        found += [f"/tmp/{name}" for name in os.listdir("/tmp") if name.startswith(f"knittrans-up-{self.job}-")]
        return found

    def wait_exit(self) -> int:
        return self.process.wait(timeout=STOP_SECONDS)

    def stderr(self) -> str:
        return self.stderr_path.read_text()


def start_up(tmp_path: Path, config: dict, *extra: str) -> subprocess.Popen[str]:
    path = tmp_path / "stack.yaml"
    path.write_text(yaml.safe_dump(config))
    return subprocess.Popen(
        [sys.executable, "-m", "knittrans.cli", "up", "--config", str(path), *extra], cwd=tmp_path,
        stdout=open(tmp_path / "up.out", "w"), stderr=open(tmp_path / "up.err", "w"), text=True,
        start_new_session=True)


@pytest.fixture
def stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[RunningStack]:
    job = f"up{uuid.uuid4().hex[:8]}"
    connection_file = tmp_path / "conn" / "stack.json"
    # The clients find the file by the variable, as a user's processes started in another directory would.
    monkeypatch.setenv("KNITTRANS_CONNECTION_FILE", str(connection_file))
    process = start_up(tmp_path, stack_config(job), "--connection-file", str(connection_file))
    try:
        try:
            connection = read_connection_file(connection_file, wait_seconds=120)
        except Exception:
            process.kill()
            raise AssertionError((tmp_path / "up.err").read_text()) from None
        yield RunningStack(job=job, process=process, connection_file=connection_file, connection=connection,
                           stderr_path=tmp_path / "up.err")
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=STOP_SECONDS)
        for pid in pids_with(job):  # what a failed test left: this job's servers, never another test's
            os.kill(pid, signal.SIGKILL)
        # What a SIGKILLed `knittrans up` leaves (its servers clean up after themselves): this job's only.
        for path in [Path(f"/tmp/knittrans-{job}"), Path(f"/dev/shm/knittrans-{job}"),
                     *Path("/tmp").glob(f"knittrans-up-{job}-*")]:
            shutil.rmtree(path, ignore_errors=True)


def submit_trajectories(count: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Submit ``count`` trajectories (groups of 4, sources alternating by group) through the connection file."""
    submitted = {}
    with AdmissionClient.from_env() as admission, RolloutClient.from_env(namespace="uptest") as rollout:
        version = admission.status().policy_version
        for i in range(count):
            tokens = int(rng.integers(8, 40))
            ids = rng.integers(0, 1000, tokens, dtype=np.int64)
            trajectory_id = f"t{i}"
            rollout.submit({"input_ids": ids, "loss_mask": (np.arange(tokens) >= 4).astype(np.uint8)},
                           field_alignment={"loss_mask": "token"}, trajectory_id=trajectory_id,
                           sample_id=f"s{i // 4}", source=("math", "code")[(i // 4) % 2], rollout_step=version,
                           segments=(VersionSegment(version=version, num_tokens=tokens - 4),))
            submitted[trajectory_id] = ids
    return submitted


def train_rank(rank: int, minibatches: int, received: dict[int, list[tuple[str, np.ndarray]]],
               errors: list[BaseException]) -> None:
    try:
        client = TrainerClient.from_env(rank, device="cpu")
        try:
            for step, mini in enumerate(client.mini_batches()):
                for micro in mini:
                    cu = micro["cu_seqlens"].numpy()
                    ids = micro["input_ids"].numpy()
                    for index, trajectory_id in enumerate(micro.trajectory_ids):
                        received[rank].append((trajectory_id, ids[cu[index]:cu[index + 1]].astype(np.int64)))
                mini.complete()
                if step + 1 == minibatches:
                    break
        finally:
            client.close()
    except BaseException as exc:
        errors.append(exc)


def test_up_serves_rollout_and_every_rank_then_sigint_leaves_nothing(stack: RunningStack) -> None:
    assert stack.connection.job == stack.job and stack.connection.world_size == 2
    assert [s.global_ranks for s in stack.connection.sidecars] == [(0,), (1,)]
    submitted = submit_trajectories(TRAIN_BATCH * TRAIN_BATCHES, np.random.default_rng(7))
    received: dict[int, list[tuple[str, np.ndarray]]] = {0: [], 1: []}
    errors: list[BaseException] = []
    ranks = [threading.Thread(target=train_rank, args=(rank, MINIBATCHES * TRAIN_BATCHES, received, errors))
             for rank in (0, 1)]
    for thread in ranks:
        thread.start()
    for thread in ranks:
        thread.join(timeout=240)
    assert not errors, errors
    assert received[0] and received[1]  # both ranks trained on data
    pieces = received[0] + received[1]
    ids = [trajectory_id for trajectory_id, _ in pieces]
    assert sorted(ids) == sorted(submitted)  # every trajectory exactly once, over both ranks
    for trajectory_id, tokens in pieces:  # and its own bytes (a sequence may be padded at its end)
        assert np.array_equal(tokens[: len(submitted[trajectory_id])], submitted[trajectory_id])
    assert stack.children()  # the servers ran as this job's processes until now

    stack.process.send_signal(signal.SIGINT)
    assert stack.wait_exit() == 0, stack.stderr()
    assert stack.children() == []
    assert stack.leftovers() == []


def test_a_killed_server_stops_the_stack_and_names_it(stack: RunningStack) -> None:
    [pid] = [pid for pid in pids_with(stack.job) if "reorg serve" in _cmdline(pid) and "--dp-rank 1" in _cmdline(pid)]
    os.kill(pid, signal.SIGKILL)
    assert stack.wait_exit() != 0
    assert "reorg-backbone-dp1-cp0 exited with status -9" in stack.stderr()
    assert stack.children() == []
    assert stack.leftovers() == []


def test_sigterm_stops_the_stack_like_ctrl_c(stack: RunningStack) -> None:
    stack.process.send_signal(signal.SIGTERM)
    assert stack.wait_exit() == 0, stack.stderr()
    assert stack.children() == []
    assert stack.leftovers() == []


def test_killing_up_itself_stops_its_servers(stack: RunningStack) -> None:
    """SIGKILL leaves up no clean-up of its own, but its servers are told (SIGTERM) and run theirs."""
    stack.process.kill()
    stack.wait_exit()
    deadline = time.monotonic() + STOP_SECONDS
    while stack.children() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert stack.children() == []
    assert not Path(f"/tmp/knittrans-{stack.job}", "reorg-backbone-dp0-cp0.sock").exists()
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"knittrans-{stack.job}@")]
    logs = [p for p in stack.leftovers() if p.startswith(f"/tmp/knittrans-up-{stack.job}-")]  # its temporary dir
    # A new stack of the job, on the same file, takes over what the killed one left, and cleans up after itself.
    second = start_up(stack.connection_file.parent.parent, stack_config(stack.job),
                      "--connection-file", str(stack.connection_file))
    try:
        fresh = read_connection_file(stack.connection_file, wait_seconds=120)
        deadline = time.monotonic() + 120
        while fresh.pid != second.pid and time.monotonic() < deadline:
            time.sleep(0.2)
            fresh = read_connection_file(stack.connection_file)
        assert fresh.pid == second.pid
    finally:
        second.send_signal(signal.SIGINT)
        assert second.wait(timeout=STOP_SECONDS) == 0
    assert stack.children() == []
    assert stack.leftovers() == logs  # the killed stack's logs, for a look at what happened


@pytest.mark.parametrize("clash", ["job", "connection file"])
def test_a_second_stack_on_the_same_job_or_file_is_refused_and_leaves_the_first_alone(
        stack: RunningStack, tmp_path: Path, clash: str) -> None:
    second_dir = tmp_path / "second"
    second_dir.mkdir()
    job = stack.job if clash == "job" else f"{stack.job}b"
    file = second_dir / "own.json" if clash == "job" else stack.connection_file
    second = start_up(second_dir, stack_config(job), "--connection-file", str(file))
    second.wait(timeout=120)
    err = (second_dir / "up.err").read_text()
    assert second.returncode == 2, err
    held = f"job {stack.job!r}" if clash == "job" else f"the connection file {stack.connection_file}"
    assert f"{held} is held by" in err
    assert read_connection_file(stack.connection_file) == stack.connection  # the first still serves
    assert Path(stack.connection.sidecars[0].socket.removeprefix("unix:")).exists()
    assert pids_with(f"{stack.job}b") == []


@pytest.mark.parametrize(("config", "key"), [
    ({"jobs": "x"}, "jobs"),
    ({"store": "s3"}, "store"),
    ({"admission_": {}}, "admission_"),
    ({"engine": {}}, "engine"),
    ({"admission": {"engine": {"train_batch_size": 8, "num_minibatches": 2, "sources": {"a": 1.0}, "bogus": 1},
                    "topology": {"backbone": {"dp": 1, "max_tokens_per_microbatch": 64}}}}, "admission.engine.bogus"),
    ({"admission": {"engine": {"train_batch_size": 8, "num_minibatches": 2, "sources": {"a": 1.0}}}},
     "admission.topology"),
    ({"admission": {"store": "file:///dev/shm/x", "engine": {}, "topology": {}}}, "admission.store"),
])
def test_a_bad_config_is_refused_naming_the_key(tmp_path: Path, config: dict, key: str) -> None:
    base = {} if "admission" in config or "engine" in config else stack_config("upbad")
    process = start_up(tmp_path, {**base, **config})
    process.wait(timeout=60)
    err = (tmp_path / "up.err").read_text()
    assert process.returncode == 2, err
    assert f"{key}:" in err or f"{key!r}" in err, err
    assert not list(tmp_path.glob("*.json"))  # nothing started, nothing written


def pids_with(marker: str) -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid() and marker in _cmdline(int(p))]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def test_a_rank_started_again_from_the_connection_file_passes_its_restore_point(stack: RunningStack) -> None:
    """A job restarted before its first checkpoint (TrainerClient.from_env(..., restored_step=BEFORE_FIRST_STEP))
    gets the mini-batch its earlier process took to the end again; started plainly, it would get the next one."""
    submit_trajectories(TRAIN_BATCH, np.random.default_rng(11))  # one train batch: two mini-batches

    def first_minibatch(client: TrainerClient) -> tuple[int, list[str]]:
        try:
            mini = next(iter(client.mini_batches()))
            return mini.sequence, [i for micro in mini for i in micro.trajectory_ids]  # taken to its last micro-batch
        finally:
            client.close()

    sequence, taken = first_minibatch(TrainerClient.from_env(0, device="cpu"))
    assert sequence == 1 and taken
    again = first_minibatch(TrainerClient.from_env(0, device="cpu", restored_step=BEFORE_FIRST_STEP))
    assert again == (1, taken)
