"""Journaled state in a real Redis: restarts recover exactly, including after `kill -9` mid-report and
mid-admission, with the service running as a subprocess."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest
import yaml

from knittrans.client.admission import AdmissionClient, ProgressStage, ReportOutcome
from knittrans.client.connection import ConnectionSettings, open_channel
from knittrans.types import ConsumerId
from knittrans.v1 import admission_service_pb2 as pb
from knittrans.v1 import admission_service_pb2_grpc
from knittrans.wire import trajectory_to_proto
from knittrans.wire.columns import batch_from_messages

from .builders import SOURCES, make_meta

CONSUMER = ConsumerId(role="backbone", dp_rank=0, cp_rank=0)


def write_config(path: Path, redis_url: str, *, train_batch_size: int = 8, num_minibatches: int = 4,
                 vision_encoder: bool = False) -> Path:
    topology: dict = {"backbone": {"dp": 1, "cp": 1, "max_tokens_per_microbatch": 4096}}
    if vision_encoder:
        topology["encoders"] = [{"name": "vision", "dp": 1, "max_cost_per_microbatch": 64}]
    path.write_text(
        yaml.safe_dump(
            {
                "job": "crash",
                "state": redis_url,
                "engine": {"train_batch_size": train_batch_size, "num_minibatches": num_minibatches,
                           "sources": SOURCES},
                "topology": topology,
                "server": {"port": 0, "metrics": {"port": -1}},
            }
        )
    )
    return path


class ServiceProcess:
    def __init__(self, config: Path, workdir: Path) -> None:
        self.ready_file = workdir / "ready.json"
        self.ready_file.unlink(missing_ok=True)
        self.log = open(workdir / "service.log", "ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "knittrans.cli", "admission", "serve", "--config", str(config),
             "--ready-file", str(self.ready_file)],
            stdout=self.log, stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while not self.ready_file.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"service did not start; see {workdir / 'service.log'}")
            time.sleep(0.05)
        self.address = json.loads(self.ready_file.read_text())["address"]

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()
        self.log.close()

    def terminate(self) -> int:
        self.process.terminate()
        code = self.process.wait(timeout=30)
        self.log.close()
        return code


def admitted_ids(client: AdmissionClient) -> list[str]:
    """Every admitted trajectory, read from the assignment stream of one consumer from the start."""
    total = client.status()
    expected_sequences = total.train_batch_index * total.num_minibatches + total.minibatch_index
    ids: list[str] = []
    if expected_sequences == 0:
        return ids
    for assignment in client.watch_assignments(CONSUMER):
        ids.extend(assignment.trajectory_ids)
        if assignment.sequence == expected_sequences:
            break
    return ids


def test_restart_recovers_reports_admissions_versions_and_stream_positions(tmp_path: Path, redis_server) -> None:
    config = write_config(tmp_path / "admission.yaml", redis_server.url)
    service = ServiceProcess(config, tmp_path)
    with AdmissionClient(service.address) as client:
        client.report([make_meta(i, source="AB"[i % 2]) for i in range(10)])
        client.report_progress(CONSUMER, 2, ProgressStage.DELIVERED)
        before = client.status()
    assert service.terminate() == 0  # SIGTERM is a graceful shutdown
    service = ServiceProcess(config, tmp_path)
    try:
        with AdmissionClient(service.address) as client:
            after = client.status()
            assert (after.pool_size, after.admitted_total, after.minibatch_index, after.train_batch_index) == (
                before.pool_size, before.admitted_total, before.minibatch_index, before.train_batch_index)
            assert client.register_consumer(CONSUMER).acknowledged_sequence == 2
            nxt = next(client.watch_assignments(CONSUMER, after_sequence=2))
            assert nxt.sequence == 3
            assert [r.outcome for r in client.report([make_meta(i, source="AB"[i % 2]) for i in range(10)])] == [
                ReportOutcome.DUPLICATE] * 10
    finally:
        service.kill()


@pytest.mark.parametrize("form", ["messages", "batch"])
def test_kill_9_mid_report_and_mid_admission_loses_and_duplicates_nothing(
    tmp_path: Path, redis_server, form: str
) -> None:
    # Mini-batches of two: nearly every report of two trajectories completes one, so kills land mid-admission.
    config = write_config(tmp_path / "admission.yaml", redis_server.url, train_batch_size=2000, num_minibatches=1000)
    rng = random.Random(7)
    acknowledged: set[str] = set()
    next_index = 0
    for _ in range(4):
        service = ServiceProcess(config, tmp_path)
        channel = open_channel(ConnectionSettings(target=service.address))
        stub = admission_service_pb2_grpc.AdmissionServiceStub(channel)
        killer = threading.Timer(rng.uniform(0.05, 0.4), service.kill)
        killer.start()
        try:
            # Reports of two trajectories at a time: most of them complete a mini-batch (an admission).
            while True:
                batch = [make_meta(next_index + k, source="AB"[k % 2]) for k in range(2)]
                messages = [trajectory_to_proto(m) for m in batch]
                request = pb.ReportTrajectoriesRequest(request_id=f"r{next_index}")
                if form == "messages":
                    request.trajectories.extend(messages)
                else:
                    request.batch.CopyFrom(batch_from_messages(messages))
                results = stub.ReportTrajectories(request, timeout=5)  # one attempt: the kill must interrupt it
                acknowledged.update(r.trajectory_id for r in results.results)  # a report of messages
                acknowledged.update(request.batch.trajectory_ids[: len(results.outcomes)])  # a columnar one
                next_index += 2
        except grpc.RpcError:  # the kill interrupted the report in flight; it may or may not be journaled
            next_index += 2
        finally:
            killer.join()
            channel.close()
    service = ServiceProcess(config, tmp_path)
    try:
        with AdmissionClient(service.address) as client:
            sent = [make_meta(i, source="AB"[i % 2]) for i in range(next_index)]
            # Re-sent in the other form: a duplicate is a duplicate whichever form either report came in.
            outcomes = {r.trajectory_id: r.outcome for r in client.report(sent, columnar=form == "messages")}
            # Every acknowledged trajectory survived every kill.
            assert all(outcomes[t] is ReportOutcome.DUPLICATE for t in acknowledged)
            ids = admitted_ids(client)
            assert len(ids) == len(set(ids))  # nothing admitted twice
            status = client.status()
            assert status.pool_size + len(ids) == len(sent)  # every trajectory is in the pool or admitted once
            assert len(acknowledged) > 0 and len(ids) > 0
    finally:
        service.kill()


def test_bad_state_url_names_the_key(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "knittrans.cli", "admission", "serve", "--config",
         str(write_config(tmp_path / "a.yaml", "redis://x")), "--state", "postgres://nope"],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2
    assert "state" in result.stderr



def test_reservations_survive_kill_9(tmp_path: Path, redis_server) -> None:
    """A reservation is journaled like a report: after kill -9 the restarted service still holds it."""
    from knittrans.errors import InvalidArgument
    from knittrans.reservations import UnitReservation
    from knittrans.types import TrajectoryId

    config = write_config(tmp_path / "admission.yaml", redis_server.url, vision_encoder=True)
    reservation = UnitReservation(trajectory_id="t9", sample_id="s9", multimodal_keys=("s9/img0",))
    service = ServiceProcess(config, tmp_path)
    with AdmissionClient(service.address) as client:
        assert client.reserve_units([reservation]).reserved == 1
    service.kill()
    service = ServiceProcess(config, tmp_path)
    try:
        with AdmissionClient(service.address) as client:
            assert client.reserve_units([reservation]).reserved == 0  # still held
            other = UnitReservation(trajectory_id="t10", sample_id="s10", multimodal_keys=("s9/img0",))
            with pytest.raises(InvalidArgument):  # s9's image is reserved by s9
                client.reserve_units([other])
            outcome = client.report([make_meta(9, images=1)])[0].outcome
            assert outcome is ReportOutcome.ACCEPTED  # the report takes the reservation over
            assert client.cancel_reservations([TrajectoryId("t9")]) == 0
    finally:
        service.kill()
