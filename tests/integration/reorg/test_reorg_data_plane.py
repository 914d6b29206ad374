"""The data plane with real processes: the admission service, a unit store (file or Mooncake), reorg sidecars
for dp=2 x cp=2 (``knittrans reorg serve``) and eight trainer ranks (tp=2 share each sidecar). The sidecars run
one process each, or one process per DP rank hosting its CP ranks' sidecars over one node assignment stream
(``--consumers``).

Checks that every admitted trajectory's bytes arrive intact at the right (dp, cp) ranks in plan order, that the
TP ranks of a sidecar cause one read per micro-batch, that nothing is read that the plan did not need, that
progress reaches the admission service (release, version), and that shared memory is empty after shutdown,
also after a sidecar was killed with SIGKILL and restarted mid-stream.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
import zlib
from datetime import timedelta
from pathlib import Path

import grpc
import numpy as np
import pytest

from knittrans.client.admission import AdmissionClient
from knittrans.client.reporter import BatchingReporter
from knittrans.plan import zigzag_spans
from knittrans.reorg.settings import ReorgSettings
from knittrans.rollout import RolloutClient
from knittrans.shm import list_segments
from knittrans.store.factory import open_store
from knittrans.types import ConsumerId, VersionSegment
from knittrans.v1 import reorg_service_pb2, reorg_service_pb2_grpc

from .processes import Process, start_admission, start_node_sidecar, start_sidecar, start_trainer

DP, CP, TP = 2, 2, 2
TRAIN_BATCH, MINIBATCHES_PER_BATCH, TRAIN_BATCHES = 8, 2, 2
SEQUENCES = MINIBATCHES_PER_BATCH * TRAIN_BATCHES
ROUTING = 8


def write_trajectories(store_url: str, admission: str, job: str) -> dict[str, dict[str, np.ndarray]]:
    rng = np.random.default_rng(7)
    arrays: dict[str, dict[str, np.ndarray]] = {}
    store = open_store(store_url)
    try:
        with AdmissionClient(admission) as client:
            reporter = BatchingReporter(client)
            rollout = RolloutClient(store, namespace=job, reporter=reporter)
            for i in range(TRAIN_BATCH * TRAIN_BATCHES):
                length = int(rng.integers(20, 400))
                fields = {
                    "input_ids": rng.integers(1, 150_000, length, dtype=np.int32),
                    "routing": rng.integers(0, 256, (length, ROUTING), dtype=np.uint8),
                    "loss_mask": (rng.random(length) < 0.6).astype(np.uint8),
                }
                arrays[f"t{i}"] = fields
                rollout.submit(fields, trajectory_id=f"t{i}", sample_id=f"s{i // 4}", source="A", rollout_step=0,
                               segments=(VersionSegment(version=0, num_tokens=length),))
            reporter.close()
    finally:
        store.close()
    return arrays


def crc(array: np.ndarray) -> int:
    return zlib.crc32(np.ascontiguousarray(array).tobytes())


def sidecar_status(socket: str) -> reorg_service_pb2.GetReorgStatusResponse:
    with grpc.insecure_channel(socket) as channel:
        return reorg_service_pb2_grpc.ReorgServiceStub(channel).GetReorgStatus(
            reorg_service_pb2.GetReorgStatusRequest(), timeout=5)


class AssignmentWatcher:
    """Records what the service plans for every consumer, as it is admitted (read-only: it acknowledges
    nothing). It must start before the trainers finish: the service forgets consumed mini-batches."""

    def __init__(self, admission: str) -> None:
        self.planned: dict[ConsumerId, dict[int, object]] = {}
        self._client = AdmissionClient(admission)
        self._threads = []
        for d in range(DP):
            for c in range(CP):
                consumer = ConsumerId(role="backbone", dp_rank=d, cp_rank=c)
                self.planned[consumer] = {}
                thread = threading.Thread(target=self._watch, args=(consumer,), daemon=True)
                thread.start()
                self._threads.append(thread)

    def _watch(self, consumer: ConsumerId) -> None:
        for assignment in self._client.watch_assignments(consumer):
            self.planned[consumer][assignment.sequence] = assignment
            if len(self.planned[consumer]) == SEQUENCES:
                return

    def result(self, timeout: float = 10.0) -> dict[ConsumerId, dict[int, object]]:
        for thread in self._threads:
            thread.join(timeout=timeout)
            assert not thread.is_alive(), "not every assignment was seen"
        self._client.close()
        return self.planned


def check_delivery(results: dict, arrays: dict, planned: dict) -> None:
    covered: dict[str, list[int]] = {t: [] for t in arrays}
    for d in range(DP):
        for c in range(CP):
            replicas = [results[(d, c, t)] for t in range(TP)]
            for replica in replicas:
                assert "error" not in replica, replica["error"]
                assert len(replica["minibatches"]) == SEQUENCES
            # TP ranks sharing the sidecar see identical micro-batches.
            assert replicas[0]["minibatches"] == replicas[1]["minibatches"]
            consumer = ConsumerId(role="backbone", dp_rank=d, cp_rank=c)
            for mini in replicas[0]["minibatches"]:
                plan = planned[consumer][mini["sequence"]]
                assert mini["consumer"] == str(consumer)
                assert mini["global_loss_tokens"] == plan.global_loss_tokens
                # Plan order: the same micro-batches, with the same trajectories, in the same order.
                expected = [[item.trajectory.trajectory_id for item in mb.items] for mb in plan.assignment.microbatches]
                assert [m["trajectory_ids"] for m in mini["microbatches"]] == expected
                assert [m["last"] for m in mini["microbatches"]] == [i == len(expected) - 1 for i in
                                                                     range(len(expected))]
                for micro in mini["microbatches"]:
                    for item in micro["items"]:
                        check_item(item, arrays[item["trajectory_id"]], c)
                        covered[item["trajectory_id"]].extend(item["positions"])
    for trajectory_id, positions in covered.items():
        # Every token of every admitted trajectory arrives exactly once over the CP ranks.
        assert sorted(positions) == list(range(len(arrays[trajectory_id]["input_ids"]))), trajectory_id


def check_item(item: dict, fields: dict[str, np.ndarray], cp_rank: int) -> None:
    length = len(fields["input_ids"])
    positions = np.array(item["positions"], dtype=np.int64)
    spans = zigzag_spans(np.array([length]), -(-np.array([length]) // (2 * CP)) * 2 * CP, CP)[0, cp_rank]
    expected = np.concatenate([np.arange(s, e) for s, e in spans])
    np.testing.assert_array_equal(positions, expected)  # this CP rank's zigzag chunks, in chunk order
    assert item["input_ids"] == crc(fields["input_ids"][positions])
    assert item["routing"] == crc(fields["routing"][positions])
    following = np.minimum(positions + 1, length - 1)
    # Submitted token-aligned (the default): delivered label-aligned, the next token's value, 0 at the end.
    assert item["loss_mask"] == crc(np.where(positions + 1 < length, fields["loss_mask"][following], 0))
    labels = np.where(positions + 1 < length, fields["input_ids"][following].astype(np.int64), -100)
    assert item["labels"] == crc(labels)
    assert item["padding_is_clean"]


class Sidecars:
    """The sidecar processes of the scenario: one per consumer, or one per DP rank hosting its CP ranks."""

    def __init__(self, directory: Path, *, job: str, store: str, admission: str, per_node: bool, slots: int) -> None:
        self._start = dict(directory=directory, job=job, store=store, admission=admission, slots=slots)
        self.per_node = per_node
        self.processes: dict[tuple[int, int], Process] = {}  # the process serving (dp, cp)
        self.sockets: dict[tuple[int, int], str] = {}
        for d in range(DP):
            self.start_dp(d)

    def start_dp(self, d: int, generation: int = 0) -> list[tuple[int, int]]:
        """Start (again) the sidecars of DP rank d; returns the (dp, cp) pairs they serve."""
        pairs = [(d, c) for c in range(CP)]
        if self.per_node:
            process = start_node_sidecar(**self._start, consumers=[f"backbone:{d}:{c}" for c in range(CP)],
                                         generation=generation)
            by_consumer = {entry["consumer"]: entry["address"] for entry in process.ready["sidecars"]}
            for pair in pairs:
                self.processes[pair] = process
                self.sockets[pair] = by_consumer[str(ConsumerId(role="backbone", dp_rank=pair[0], cp_rank=pair[1]))]
            return pairs
        for pair in pairs if generation == 0 else pairs[:1]:
            process = start_sidecar(**self._start, dp_rank=pair[0], cp_rank=pair[1], generation=generation)
            self.processes[pair], self.sockets[pair] = process, process.ready["address"]
        return pairs if generation == 0 else pairs[:1]

    def distinct(self) -> list[Process]:
        return list({id(p): p for p in self.processes.values()}.values())


def run_scenario(tmp_path: Path, store_url: str, job: str, *, kill_one: bool, per_node: bool = False) -> None:
    topology = {"backbone": {"dp": DP, "cp": CP, "tp": TP, "max_tokens_per_microbatch": 512}}
    admission = start_admission(tmp_path, job=job, store=store_url, topology=topology,
                                train_batch_size=TRAIN_BATCH, num_minibatches=MINIBATCHES_PER_BATCH)
    address = admission.ready["address"]
    watcher = AssignmentWatcher(address)
    trainers = []
    sidecars = None
    prefixes = {(d, c): ReorgSettings(job=job, dp_rank=d, cp_rank=c, store=store_url).segment_prefix
                for d in range(DP) for c in range(CP)}
    restarted: list[tuple[int, int]] = []
    try:
        # One slot when a sidecar gets killed, so the trainers cannot have everything staged already.
        sidecars = Sidecars(tmp_path, job=job, store=store_url, admission=address, per_node=per_node,
                            slots=1 if kill_one else 3)
        outputs = {}
        for d in range(DP):
            for c in range(CP):
                for t in range(TP):
                    rank = (d * CP + c) * TP + t
                    process, output = start_trainer(tmp_path, socket=sidecars.sockets[(d, c)], tp_rank=t,
                                                    global_rank=rank, admission=address, minibatches=SEQUENCES,
                                                    sleep=0.2 if kill_one else 0.0)
                    trainers.append(process)
                    outputs[(d, c, t)] = output
        arrays = write_trajectories(store_url, address, job)

        if kill_one:
            victim = sidecars.processes[(0, 0)]
            deadline = time.monotonic() + 30
            while sidecar_status(sidecars.sockets[(0, 0)]).acknowledged_sequence < 1:  # the trainers are mid-stream
                assert time.monotonic() < deadline, victim.tail()
                time.sleep(0.02)
            victim.kill()  # with per_node, every CP rank of DP rank 0 at once
            left_behind = set(list_segments(prefixes[(0, 0)]))
            assert left_behind, "a SIGKILLed sidecar leaves its segments behind"
            restarted = sidecars.start_dp(0, generation=1)
            # The restarted sidecar removed its predecessor's segments (and never reuses their names).
            assert not left_behind & set(list_segments(prefixes[(0, 0)]))

        for process in trainers:
            try:
                process.popen.wait(timeout=90)
            except Exception:
                pytest.fail(f"{process.name} did not finish:\n{process.tail()}")
        results = {key: json.loads(path.read_text()) for key, path in outputs.items()}
        for process in trainers:
            assert process.popen.returncode == 0, process.tail()
        planned = watcher.result()
        check_delivery(results, arrays, planned)
        if kill_one:
            assert any(results[(0, 0, t)]["stats"]["restarts_seen"] for t in range(TP))

        # One read per micro-batch for both TP ranks, and bytes read == bytes the plan needed.
        for (d, c), socket in sidecars.sockets.items():
            status = sidecar_status(socket)
            assert status.bytes_read == status.bytes_needed
            assert status.read_calls == status.published
            assert status.acknowledged_sequence == SEQUENCES
            assert status.slots_occupied == 0
            if (d, c) not in restarted:
                consumer = ConsumerId(role="backbone", dp_rank=d, cp_rank=c)
                needed = sum(a.assignment.needed_bytes for a in planned[consumer].values())
                assert status.bytes_needed == needed
                assert status.published == sum(len(a.assignment.microbatches) for a in planned[consumer].values())

        with AdmissionClient(address, deadline=timedelta(seconds=5)) as client:
            deadline = time.monotonic() + 10
            while client.status().released_minibatches < SEQUENCES:
                assert time.monotonic() < deadline, "optimizer steps did not release every mini-batch"
                time.sleep(0.05)
            assert client.status().policy_version == TRAIN_BATCHES  # global rank 0 advanced it per train batch
    finally:
        for process in trainers:
            process.stop(timeout=5)
        for sidecar in sidecars.distinct() if sidecars is not None else []:
            assert sidecar.stop() == 0 or not sidecar.alive(), sidecar.tail()
        admission.stop()
    for (d, c), prefix in prefixes.items():
        assert list_segments(prefix) == [], f"segments left by sidecar {(d, c)}"
        assert not Path(sidecars.sockets[(d, c)].removeprefix("unix:")).exists()


def test_file_store_with_a_sidecar_killed_and_restarted(tmp_path) -> None:
    job = f"rt{uuid.uuid4().hex[:8]}"
    run_scenario(tmp_path, f"file://{tmp_path / 'units'}", job, kill_one=True)


def test_node_sidecars_over_one_stream_killed_and_restarted(tmp_path) -> None:
    """One process per DP rank hosts its CP ranks' sidecars; DP rank 0's is killed with SIGKILL mid-stream and
    started again: every trainer still gets every mini-batch whole, as planned, with every byte intact."""
    job = f"rn{uuid.uuid4().hex[:8]}"
    run_scenario(tmp_path, f"file://{tmp_path / 'units'}", job, kill_one=True, per_node=True)


def test_mooncake_store(tmp_path, mooncake_cluster) -> None:
    job = f"rm{uuid.uuid4().hex[:8]}"
    run_scenario(tmp_path, mooncake_cluster.store_url, job, kill_one=False)
