"""Snapshots in a real Redis journal: fenced like appends, and invisible from outside.

The journal refuses a snapshot unless it ends exactly where the writer's state does (a write the writer is unsure
of, or another writer's record, lies beyond it) and holds the fingerprint chunks the writer knows. A service that
snapshots every few records and is killed with SIGKILL at random points, around its snapshots and truncations
included, ends in the same state, seen from outside (GetStatus, the assignment stream, re-sends, the units left in
its store), as a service fed the same calls that keeps its whole journal and is never killed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import random
import signal
import threading
import time
from pathlib import Path

import grpc
import pytest
import redis
import yaml

from knittrans.admission.service.journal import FenceViolation, JournalFenced, RedisJournal
from knittrans.client.admission import AdmissionClient, ReportOutcome
from knittrans.client.connection import ConnectionSettings, open_channel
from knittrans.errors import KnitTransError
from knittrans.store.factory import open_store
from knittrans.store.hashing import content_hash
from knittrans.store.protocol import UnitWrite
from knittrans.types import ConsumerId
from knittrans.v1 import admission_service_pb2 as pb
from knittrans.v1 import admission_service_pb2_grpc, journal_pb2
from knittrans.wire import consumer_to_proto, trajectory_to_proto
from knittrans.wire.columns import batch_from_messages

from .builders import SOURCES, make_meta
from .test_crash_recovery import ServiceProcess

_jobs = itertools.count()
CONSUMER = ConsumerId(role="backbone", dp_rank=0, cp_rank=0)


def version_record(sequence: int) -> journal_pb2.JournalRecord:
    return journal_pb2.JournalRecord(at=1.0, sequence=sequence,
                                     version=pb.AdvanceVersionRequest(new_version=sequence))


def test_a_snapshot_is_refused_unless_the_journal_ends_at_it(redis_server) -> None:
    async def main() -> None:
        journal = RedisJournal(redis_server.url, job=f"snapfence{next(_jobs)}")
        client = redis.Redis.from_url(redis_server.url)
        try:
            for sequence in (1, 2, 3):
                await journal.append(version_record(sequence))
            # The writer's state is at 2, but record 3 is in the journal (a write whose reply it lost, or another
            # writer's): a snapshot of 2 would hide record 3 from recovery, so nothing is written.
            with pytest.raises(JournalFenced) as refused:
                await journal.write_snapshot(2, b"state at 2", 0, b"")
            assert refused.value.violation is FenceViolation.ENDS_ELSEWHERE
            assert await journal.read_snapshot() is None
            assert [r.sequence async for r in journal.replay()] == [1, 2, 3]
            # At the journal's end it is taken, and the records it includes are dropped.
            await journal.write_snapshot(3, b"state at 3", 0, b"chunk 1")
            stored = await journal.read_snapshot()
            assert (stored.state, stored.chunks) == (b"state at 3", [b"chunk 1"])
            assert client.llen(journal.key) == 0 and [r async for r in journal.replay(after=3)] == []
            # Appends go on at 4, fenced as before; a stale writer still at 3 cannot snapshot any more.
            await journal.append(version_record(4))
            with pytest.raises(JournalFenced):
                await journal.append(journal_pb2.JournalRecord(at=2.0, sequence=4, version=pb.AdvanceVersionRequest(
                    new_version=99)))
            with pytest.raises(JournalFenced):
                await journal.write_snapshot(3, b"stale", 1, b"")
            # A writer that lost track of the chunks (its last snapshot's reply was lost) is refused too.
            with pytest.raises(JournalFenced) as refused:
                await journal.write_snapshot(4, b"state at 4", 0, b"chunk again")
            assert refused.value.violation is FenceViolation.OTHER_CHUNKS
            stored = await journal.read_snapshot()
            assert (stored.state, stored.chunks) == (b"state at 3", [b"chunk 1"])
            assert [r.sequence async for r in journal.replay(after=3)] == [4]
        finally:
            await journal.close()
            client.close()

    asyncio.run(main())


def write_config(path: Path, redis_url: str, job: str, store: Path, snapshot_every: int) -> Path:
    path.write_text(yaml.safe_dump({
        "job": job, "state": redis_url, "store": f"file://{store}", "snapshot_every_records": snapshot_every,
        "engine": {"train_batch_size": 4, "num_minibatches": 2, "sources": SOURCES, "max_batches_ahead": None},
        "topology": {"backbone": {"dp": 1, "cp": 1, "max_tokens_per_microbatch": 4096}},
        "server": {"port": 0, "metrics": {"port": -1}},
    }))
    return path


def unit_write(key: str, header) -> UnitWrite:
    data = bytes(header.byte_length)  # the bytes do not matter here, only that the unit exists until released
    return UnitWrite.of(key, dataclasses.replace(header, content_hash=content_hash(data)), data)


class Calls:
    """The calls both services get, in order: reports of two trajectories, and the optimizer step of every
    mini-batch but the newest (so released data, pending data and an open stream all exist)."""

    def __init__(self, stores: list[Path]) -> None:
        self.stores = [open_store(f"file://{s}") for s in stores]
        self.next_index = 0

    def report(self, index: int) -> pb.ReportTrajectoriesRequest:
        metas = [make_meta(index + k, source="AB"[k % 2]) for k in range(2)]
        if index >= self.next_index:  # the rollout writes the units before it reports them
            for store in self.stores:
                store.put_many([unit_write(u.key, u.header) for m in metas for u in m.units])
            self.next_index = index + 2
        return pb.ReportTrajectoriesRequest(request_id=f"r{index}",
                                            batch=batch_from_messages([trajectory_to_proto(m) for m in metas]))


def drive(stub, calls: Calls, index: int) -> None:
    """One round: report, then step every admitted mini-batch but the newest; raises if the service died."""
    stub.ReportTrajectories(calls.report(index), timeout=5)
    status = stub.GetStatus(pb.GetStatusRequest(), timeout=5)
    admitted = status.train_batch_index * status.num_minibatches + status.minibatch_index
    for sequence in range(1, admitted):
        stub.ReportProgress(pb.ReportProgressRequest(consumer=consumer_to_proto(CONSUMER), sequence=sequence,
                                                     stage=pb.PROGRESS_STAGE_OPTIMIZER_STEP), timeout=5)


def seen_from_outside(address: str, sent: int, store: Path) -> tuple:
    with AdmissionClient(address) as client:
        status = client.status()
        position = client.register_consumer(CONSUMER).acknowledged_sequence
        admitted = status.train_batch_index * status.num_minibatches + status.minibatch_index
        pending = []
        if admitted > position:
            for assignment in client.watch_assignments(CONSUMER, after_sequence=position):
                pending.append((assignment.sequence, tuple(assignment.trajectory_ids)))
                if assignment.sequence == admitted:
                    break
        outcomes = [r.outcome for r in client.report([make_meta(i, source="AB"[i % 2]) for i in range(sent)])]
        changed = client.report([make_meta(0, source="A", tokens=7)])[0].outcome
    units = sorted(p.relative_to(store).as_posix() for p in store.rglob("*") if p.is_file())
    return (status.admitted_total, status.pool_size, status.released_minibatches, status.train_batch_index,
            status.minibatch_index, position, pending, outcomes, changed, units)


def settled(address: str, sent: int, store: Path) -> tuple:
    """What the service shows once its background deletions are done (they run after restarts, too)."""
    last = None
    for _ in range(100):
        current = seen_from_outside(address, sent, store)
        if current == last:
            return current
        last = current
        time.sleep(0.2)
    return last


def test_kill_9_around_snapshots_matches_a_run_without_snapshots(tmp_path: Path, redis_server) -> None:
    rng = random.Random(11)
    job = f"snapkill{next(_jobs)}"
    snap_store, full_store = tmp_path / "snap-units", tmp_path / "full-units"
    (tmp_path / "snap").mkdir()
    (tmp_path / "full").mkdir()
    # Snapshots every 3 records: nearly every round takes one, so the kills land before, during and after them.
    snap_config = write_config(tmp_path / "snap.yaml", redis_server.url, f"{job}s", snap_store, 3)
    full_config = write_config(tmp_path / "full.yaml", redis_server.url, f"{job}f", full_store, 0)
    calls = Calls([snap_store, full_store])
    reference = ServiceProcess(full_config, tmp_path / "full")
    reference_channel = open_channel(ConnectionSettings(target=reference.address))
    reference_stub = admission_service_pb2_grpc.AdmissionServiceStub(reference_channel)
    index = 0
    kills = 0
    try:
        for _ in range(6):
            service = ServiceProcess(snap_config, tmp_path / "snap")
            channel = open_channel(ConnectionSettings(target=service.address))
            stub = admission_service_pb2_grpc.AdmissionServiceStub(channel)
            killer = threading.Timer(rng.uniform(0.1, 0.6), service.kill)
            killer.start()
            try:
                while True:
                    drive(stub, calls, index)  # the killed service's call may or may not have been journaled:
                    drive(reference_stub, calls, index)  # the round is repeated after the restart (idempotent)
                    index += 2
            except grpc.RpcError:
                kills += 1
            finally:
                killer.join()
                channel.close()
        service = ServiceProcess(snap_config, tmp_path / "snap")
        try:
            drive(admission_service_pb2_grpc.AdmissionServiceStub(open_channel(
                ConnectionSettings(target=service.address))), calls, index)  # the interrupted round, completed
            drive(reference_stub, calls, index)
            index += 2
            snapshots = redis.Redis.from_url(redis_server.url)
            assert snapshots.exists(f"knittrans:{job}s:journal:snapshot")
            assert snapshots.llen(f"knittrans:{job}s:journal") < snapshots.llen(f"knittrans:{job}f:journal")
            snapshots.close()
            got = settled(service.address, index, snap_store)
            expected = settled(reference.address, index, full_store)
            assert got == expected
            assert kills == 6 and got[0] > 8 and got[2] > 2  # admitted, released
            assert set(got[7]) == {ReportOutcome.DUPLICATE} and got[8] is ReportOutcome.CONFLICT
        finally:
            service.kill()
    finally:
        reference_channel.close()
        reference.kill()


def test_redis_stalled_around_snapshots_loses_and_duplicates_nothing(tmp_path: Path, redis_server) -> None:
    """Snapshots every two records while Redis stalls past the service's time-out: writes (snapshots included)
    whose outcome is unknown are found out before anything else changes, and a kill -9 afterwards restarts on a
    snapshot and tail that hold every acknowledged trajectory, each admitted at most once."""
    job = f"snapstall{next(_jobs)}"
    config = tmp_path / "admission.yaml"
    config.write_text(yaml.safe_dump({
        "job": job, "state": redis_server.url, "snapshot_every_records": 2, "redis_timeout_seconds": 1.0,
        "mutation_wait_seconds": 2.0,
        "engine": {"train_batch_size": 4, "num_minibatches": 2, "sources": SOURCES, "max_batches_ahead": None},
        "topology": {"backbone": {"dp": 1, "cp": 1, "max_tokens_per_microbatch": 4096}},
        "server": {"port": 0, "metrics": {"port": -1}},
    }))
    acknowledged: list[str] = []
    sent = 0
    service = ServiceProcess(config, tmp_path)
    with AdmissionClient(service.address) as client:
        for round_index in range(12):
            if round_index == 4:
                redis_server.process.send_signal(signal.SIGSTOP)
                threading.Timer(2.5, redis_server.process.send_signal, (signal.SIGCONT,)).start()
            metas = [make_meta(sent + k, source="AB"[k % 2]) for k in range(2)]
            sent += 2
            try:
                client.report(metas)
                acknowledged.extend(m.trajectory_id for m in metas)
            except KnitTransError:  # UNAVAILABLE while Redis stalls: not acknowledged, retried below
                pass
    time.sleep(3.0)  # Redis resumed
    service.kill()
    service = ServiceProcess(config, tmp_path)
    try:
        with AdmissionClient(service.address) as client:
            outcomes = {r.trajectory_id: r.outcome for r in client.report(
                [make_meta(i, source="AB"[i % 2]) for i in range(sent)])}
            assert all(outcomes[t] is ReportOutcome.DUPLICATE for t in acknowledged)
            status = client.status()
            admitted = status.train_batch_index * status.num_minibatches + status.minibatch_index
            ids: list[str] = []
            for assignment in client.watch_assignments(CONSUMER):
                ids.extend(assignment.trajectory_ids)
                if assignment.sequence == admitted:
                    break
            assert len(ids) == len(set(ids)) == status.admitted_total
            assert status.pool_size + status.admitted_total == sent
        assert "restored the snapshot" in (tmp_path / "service.log").read_text()
        assert len(acknowledged) > 8
    finally:
        service.kill()


def typed_report(indices: range, turns_kind: str) -> pb.ReportTrajectoriesRequest:
    messages = []
    for i in indices:
        message = trajectory_to_proto(make_meta(i, source="AB"[i % 2]))
        if turns_kind == "int":
            message.values.int_scalars["turns"] = i
        else:
            message.values.bool_scalars["turns"] = True
        message.values.metadata["uid"].text = f"u{i}"
        messages.append(message)
    return pb.ReportTrajectoriesRequest(trajectories=messages)


def wait_for(condition, what: str, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting: {what}")
        time.sleep(0.1)


def test_a_restart_on_a_snapshot_keeps_the_checkpoint_the_expiring_reservations_and_the_schema(
        tmp_path: Path, redis_server) -> None:
    """State the journal's dropped records made: the latest checkpoint (and the stepped mini-batches it does not
    cover yet), a reservation that expires unreported, and the value kinds the first trajectory fixed. After a
    kill -9 once a snapshot includes every record, the restarted service answers as if it had replayed them."""
    job = f"snapstate{next(_jobs)}"
    store_path = tmp_path / "units"
    config = tmp_path / "admission.yaml"
    config.write_text(yaml.safe_dump({
        "job": job, "state": redis_server.url, "store": f"file://{store_path}", "snapshot_every_records": 1,
        "retain_until_checkpoint": True, "unreported_unit_ttl_seconds": 8.0,
        "engine": {"train_batch_size": 8, "num_minibatches": 4, "sources": SOURCES},
        "topology": {"backbone": {"dp": 1, "cp": 1, "max_tokens_per_microbatch": 4096}},
        "server": {"port": 0, "metrics": {"port": -1}},
    }))
    store = open_store(f"file://{store_path}")
    first = typed_report(range(8), "int")  # four mini-batches of two; fixes turns: int, uid: str
    store.put_many([unit_write(u.key, u.header) for m in first.trajectories
                    for u in (make_meta(int(m.trajectory_id[1:])).units)])
    orphan = make_meta(900).units[0]  # written by a rollout that dies before reporting it
    store.put_many([unit_write(orphan.key, orphan.header)])
    journal = redis.Redis.from_url(redis_server.url)
    service = ServiceProcess(config, tmp_path)
    try:
        stub = admission_service_pb2_grpc.AdmissionServiceStub(open_channel(
            ConnectionSettings(target=service.address)))
        stub.ReportTrajectories(first, timeout=5)
        for sequence in (1, 2, 3):
            stub.ReportProgress(pb.ReportProgressRequest(consumer=consumer_to_proto(CONSUMER), sequence=sequence,
                                                         stage=pb.PROGRESS_STAGE_OPTIMIZER_STEP), timeout=5)
        checkpoint = stub.ReportCheckpoint(pb.ReportCheckpointRequest(train_batch_index=0, minibatch_index=1),
                                           timeout=5)
        assert checkpoint.released_minibatches == 2
        stub.ReserveUnits(pb.ReserveUnitsRequest(reservations=[pb.UnitReservation(
            trajectory_id="t900", sample_id="s900", unit_keys=[orphan.key])]), timeout=5)
        # Every record is in the snapshot (the journal's list is empty): recovery replays nothing.
        wait_for(lambda: journal.exists(f"knittrans:{job}:journal:snapshot")
                 and journal.llen(f"knittrans:{job}:journal") == 0, "a snapshot of every record")
        assert store.exists([orphan.key]) == [True]  # its reservation is held (the TTL is far off)
    finally:
        service.kill()
    service = ServiceProcess(config, tmp_path)
    try:
        stub = admission_service_pb2_grpc.AdmissionServiceStub(open_channel(
            ConnectionSettings(target=service.address)))
        assert "restored the snapshot" in (tmp_path / "service.log").read_text()
        earlier = stub.ReportCheckpoint(pb.ReportCheckpointRequest(train_batch_index=0, minibatch_index=0), timeout=5)
        assert (earlier.checkpoint_train_batch_index, earlier.checkpoint_minibatch_index) == (0, 1)
        retained = next(stub.WatchAssignments(pb.WatchAssignmentsRequest(
            consumer=consumer_to_proto(CONSUMER), after_sequence=2, include_trajectory_ids=True), timeout=5))
        assert retained.sequence == 3  # stepped on, not covered by the checkpoint: still held
        with pytest.raises(grpc.RpcError) as refused:
            stub.ReportTrajectories(typed_report(range(8, 10), "bool"), timeout=5)
        assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "values.bool_scalars.turns" in refused.value.details()
        accepted = stub.ReportTrajectories(typed_report(range(10, 12), "int"), timeout=5)
        assert [r.outcome for r in accepted.results] == [pb.REPORT_OUTCOME_ACCEPTED] * 2
        # The reservation expires after the restart, and its unit is deleted.
        wait_for(lambda: store.exists([orphan.key]) == [False], "the unreported unit's deletion")
    finally:
        service.kill()
        journal.close()
