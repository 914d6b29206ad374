"""Redis failing under a running admission service (a subprocess): stalled (SIGSTOP) past the service's Redis
time-out, and killed (kill -9) and restarted from its AOF. Changes wait or fail UNAVAILABLE, then resume;
nothing is admitted twice; and the journal left behind recovers after a kill -9 of the service. Everything is
checked from outside: the status, the assignment stream, and the journal read straight from Redis."""

from __future__ import annotations

import signal
import threading
import time
from collections import Counter
from pathlib import Path

import grpc
import redis
import yaml

from knittrans.client.admission import AdmissionClient, ReportOutcome
from knittrans.client.connection import ConnectionSettings, open_channel
from knittrans.launch.redis import RedisServer, start_redis
from knittrans.v1 import admission_service_pb2 as pb
from knittrans.v1 import admission_service_pb2_grpc, journal_pb2
from knittrans.wire import trajectory_to_proto

from .builders import SOURCES, make_meta
from .test_crash_recovery import ServiceProcess, admitted_ids

JOB = "outage"
REDIS_TIMEOUT = 1.0  # the service's Redis time-out, kept short so that a stall past it is quick
RELAX_AFTER = 2.0


def write_config(path: Path, redis_url: str, *, train_batch_size: int, num_minibatches: int,
                 sources: dict[str, float] = SOURCES, on_starvation: str = "wait",
                 lease_ttl_seconds: float = 20.0) -> Path:
    path.write_text(yaml.safe_dump({
        "job": JOB,
        "state": redis_url,
        "lease_ttl_seconds": lease_ttl_seconds,
        "redis_timeout_seconds": REDIS_TIMEOUT,
        "mutation_wait_seconds": 2.0,
        "engine": {"train_batch_size": train_batch_size, "num_minibatches": num_minibatches, "sources": sources,
                   "on_starvation": on_starvation},
        "topology": {"backbone": {"dp": 1, "cp": 1, "max_tokens_per_microbatch": 4096}},
        "server": {"port": 0, "metrics": {"port": -1}},
    }))
    return path


def journal_admissions(redis_url: str, job: str = JOB) -> list[journal_pb2.JournalRecord]:
    """The admission records of the job's journal, read straight from Redis."""
    client = redis.Redis.from_url(redis_url)
    try:
        raw = client.lrange(f"knittrans:{job}:journal", 0, -1)
    finally:
        client.close()
    records = [journal_pb2.JournalRecord.FromString(r) for r in raw]
    return [r for r in records if r.WhichOneof("change") == "admission"]


def assert_nothing_admitted_twice(redis_url: str, client: AdmissionClient, reported: int) -> list[str]:
    admissions = journal_admissions(redis_url)
    positions = Counter((a.admission.train_batch_index, a.admission.minibatch_index) for a in admissions)
    assert max(positions.values(), default=1) == 1, positions
    journaled = [t for a in admissions for t in a.admission.trajectory_ids]
    assert len(journaled) == len(set(journaled))
    streamed = admitted_ids(client)
    assert sorted(streamed) == sorted(journaled)  # the service admitted what its journal holds, once
    assert client.status().pool_size + len(streamed) == reported  # every trajectory in the pool or admitted once
    return streamed


def wait_for(condition, what: str, *, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.1)


def test_redis_stalled_past_the_timeout_during_a_timed_admission_admits_nothing_twice(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """The issue's repro: admission waits on a quota (four trajectories of one source) until ``relax_after``;
    Redis is stopped across that moment, past the service's Redis time-out, so the timed admission's write has
    no known outcome. Later reports must not admit that mini-batch again, and a kill -9 must restart cleanly."""
    # Train batches of four, half from each source: four trajectories of A wait for two of B.
    config = write_config(tmp_path / "admission.yaml", redis_server.url, train_batch_size=4, num_minibatches=1,
                          sources={"A": 0.5, "B": 0.5}, on_starvation=f"relax_after={RELAX_AFTER:g}s")
    service = ServiceProcess(config, tmp_path)
    try:
        with AdmissionClient(service.address) as client:
            client.report([make_meta(i, source="A") for i in range(4)])
            waiting = client.status()
            assert (waiting.admitted_total, waiting.blocking_reason) == (0, "source_quota"), waiting
            redis_server.process.send_signal(signal.SIGSTOP)
            try:
                # Across the relax_after timer, and past the Redis time-out after it.
                time.sleep(RELAX_AFTER + 3 * REDIS_TIMEOUT)
            finally:
                redis_server.process.send_signal(signal.SIGCONT)
            client.report([make_meta(i, source="A") for i in range(4, 8)])
            client.report([make_meta(i, source="B") for i in range(8, 10)])
            wait_for(lambda: client.status().admitted_total >= 4, "the relaxed admission")
            first = assert_nothing_admitted_twice(redis_server.url, client, reported=10)
            assert set(first[:4]) == {f"t{i}" for i in range(4)}  # the timed admission, once
        service.kill()
        log = (tmp_path / "service.log").read_text()
        assert "Task exception was never retrieved" not in log
        service = ServiceProcess(config, tmp_path)  # raises if the restart fails
        with AdmissionClient(service.address) as client:
            assert assert_nothing_admitted_twice(redis_server.url, client, reported=10) == first
            client.advance_version(1, 1)  # train batch 2 waits for policy version 1
            client.report([make_meta(i, source=s, version=1) for i, s in zip(range(10, 14), "AABB", strict=True)])
            wait_for(lambda: client.status().admitted_total > len(first), "an admission after the restart")
            assert_nothing_admitted_twice(redis_server.url, client, reported=14)
    finally:
        service.kill()


def test_redis_killed_and_restarted_mid_run_changes_fail_unavailable_then_resume(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """kill -9 of Redis while reports (each completing a mini-batch) stream in, then a restart on the same port
    from its AOF: reports fail UNAVAILABLE (or wait) and then succeed again, and nothing is admitted twice."""
    config = write_config(tmp_path / "admission.yaml", redis_server.url, train_batch_size=2000, num_minibatches=1000)
    service = ServiceProcess(config, tmp_path)
    codes: Counter[str] = Counter()
    successes_after_restart = Counter()
    restarted = threading.Event()
    stop = threading.Event()
    reported: list[int] = [0, 0]
    acknowledged: set[str] = set()
    failures: list[BaseException] = []

    def report_loop(worker: int) -> None:
        channel = open_channel(ConnectionSettings(target=service.address))
        stub = admission_service_pb2_grpc.AdmissionServiceStub(channel)
        try:
            for round_ in range(10_000):
                if stop.is_set():
                    return
                first = 2 * (2 * round_ + worker)
                request = pb.ReportTrajectoriesRequest(
                    request_id=f"w{worker}r{round_}",
                    trajectories=[trajectory_to_proto(make_meta(first + k, source="AB"[k])) for k in range(2)])
                after_restart = restarted.is_set()
                while True:  # the same request until it is taken
                    try:
                        response = stub.ReportTrajectories(request, timeout=60)
                        break
                    except grpc.RpcError as error:
                        codes[error.code().name] += 1
                        time.sleep(0.1)
                acknowledged.update(r.trajectory_id for r in response.results)
                reported[worker] = round_ + 1
                if after_restart:
                    successes_after_restart[worker] += 1
        except BaseException as exc:  # surfaced by the main thread
            failures.append(exc)
        finally:
            channel.close()

    workers = [threading.Thread(target=report_loop, args=(w,)) for w in range(2)]
    for thread in workers:
        thread.start()
    new_redis: RedisServer | None = None
    try:
        wait_for(lambda: min(reported) >= 3, "reports before the Redis kill")
        redis_server.stop(kill=True)
        time.sleep(2 * REDIS_TIMEOUT)  # changes meanwhile wait or fail UNAVAILABLE
        new_redis = start_redis(redis_server.data_dir, port=redis_server.port)
        restarted.set()
        wait_for(lambda: min(successes_after_restart[w] for w in range(2)) >= 3 or failures,
                 "reports after the Redis restart")
    finally:
        stop.set()
        for thread in workers:
            thread.join(timeout=120)
    try:
        assert not failures, failures
        assert set(codes) <= {"UNAVAILABLE"}, codes  # never another error, never a crash
        sent = 4 * max(reported)
        with AdmissionClient(service.address) as client:
            resent = client.report([make_meta(i, source="AB"[i % 2]) for i in range(sent)])
            outcomes = {r.trajectory_id: r.outcome for r in resent}
            assert all(outcomes[t] is ReportOutcome.DUPLICATE for t in acknowledged)
            before = assert_nothing_admitted_twice(new_redis.url, client, reported=sent)
        service.kill()
        service = ServiceProcess(config, tmp_path)
        with AdmissionClient(service.address) as client:
            assert assert_nothing_admitted_twice(new_redis.url, client, reported=sent) == before
    finally:
        service.kill()
        if new_redis is not None:
            new_redis.stop()


def test_a_service_whose_journal_moved_on_applies_the_tail_and_never_writes_over_it(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """A second service process on the same journal (what a lost reply looks like to the first: records it did
    not apply). The first one's next change is refused by the fence: it applies the other's records, the call
    fails UNAVAILABLE, and the retry is decided over the whole journal, so no mini-batch is admitted twice."""
    # A lease that the first service renews only long after this test: it must not find out it lost the job.
    config = write_config(tmp_path / "admission.yaml", redis_server.url, train_batch_size=2000, num_minibatches=1000,
                          lease_ttl_seconds=3600)
    (tmp_path / "first").mkdir()
    (tmp_path / "second").mkdir()
    first = ServiceProcess(config, tmp_path / "first")
    second = None
    try:
        with AdmissionClient(first.address) as client:
            client.report([make_meta(i, source="AB"[i % 2]) for i in range(2)])
        # The job's lease keeps a second service off a live job; remove it, as if the first had stalled past its
        # expiry, to see what keeps the journal whole when the lease cannot: the fence.
        redis.Redis.from_url(redis_server.url).delete(f"knittrans:{JOB}:lease")
        second = ServiceProcess(config, tmp_path / "second")
        with AdmissionClient(second.address) as client:
            client.report([make_meta(i, source="AB"[i % 2]) for i in range(2, 4)])
        channel = open_channel(ConnectionSettings(target=first.address))
        try:
            stub = admission_service_pb2_grpc.AdmissionServiceStub(channel)
            request = pb.ReportTrajectoriesRequest(
                request_id="late", trajectories=[trajectory_to_proto(make_meta(i, source="AB"[i % 2]))
                                                 for i in range(4, 6)])
            try:
                stub.ReportTrajectories(request, timeout=30)
                raise AssertionError("the first service wrote past records it had not applied")
            except grpc.RpcError as error:
                assert error.code() is grpc.StatusCode.UNAVAILABLE, error
            response = stub.ReportTrajectories(request, timeout=30)
            assert [r.outcome for r in response.results] == [pb.REPORT_OUTCOME_ACCEPTED] * 2
        finally:
            channel.close()
        with AdmissionClient(first.address) as client:
            admitted = assert_nothing_admitted_twice(redis_server.url, client, reported=6)
            assert sorted(admitted) == [f"t{i}" for i in range(6)]
        first.kill()
        second.kill()  # the job's holder now: gone, so the restarted first service gets the job at once
        second = None
        first = ServiceProcess(config, tmp_path / "first")
        with AdmissionClient(first.address) as client:
            assert assert_nothing_admitted_twice(redis_server.url, client, reported=6) == admitted
    finally:
        first.kill()
        if second is not None:
            second.kill()
