"""The admission service through a real gRPC server on port 0: reports, admission, assignment streams,
progress and release, version, status, bad input, auth and metrics."""

from __future__ import annotations

import asyncio
import logging
import time
import urllib.request
from dataclasses import replace

import grpc
import pytest

from knittrans.admission.service.app import start_admission_service
from knittrans.client.admission import AdmissionClient, ProgressStage, ReportOutcome
from knittrans.client.connection import ConnectionSettings, open_channel
from knittrans.errors import FailedPrecondition, InvalidArgument, Unauthenticated
from knittrans.plan.rank_proto import rank_assignment_from_proto
from knittrans.types import ConsumerId
from knittrans.v1 import admission_service_pb2 as pb
from knittrans.v1 import admission_service_pb2_grpc
from knittrans.wire import consumer_to_proto, trajectory_to_proto
from knittrans.wire.columns import batch_from_messages

from .builders import make_meta, service_settings

CONSUMERS = [ConsumerId(role="backbone", dp_rank=d, cp_rank=c) for d in range(2) for c in range(2)] + [
    ConsumerId(role="encoder:vision", dp_rank=0)
]


@pytest.fixture
async def service():
    running = await start_admission_service(service_settings())
    yield running
    await running.stop(0)


def run(function):
    return asyncio.to_thread(function)


async def test_reports_admit_and_every_consumer_gets_its_part(service) -> None:
    def scenario() -> None:
        with AdmissionClient(service.address) as client:
            results = client.report([make_meta(i, source="AB"[i % 2], sample=i // 2, images=1) for i in range(4)])
            assert [r.outcome for r in results] == [ReportOutcome.ACCEPTED] * 4
            assert client.status().admitted_total == 4  # mini-batch 0 of a train batch of 8 in 2
            for consumer in CONSUMERS:
                assert client.register_consumer(consumer).acknowledged_sequence == 0
                first = next(client.watch_assignments(consumer))
                assert first.sequence == 1 and first.minibatch_index == 0 and first.num_minibatches == 2
                assert set(first.trajectory_ids) == {"t0", "t1", "t2", "t3"}
                assert first.assignment.consumer == consumer
            backbone = next(client.watch_assignments(CONSUMERS[0])).assignment
            encoder = next(client.watch_assignments(CONSUMERS[-1])).assignment
            assert sum(len(m.items) for m in backbone.microbatches) >= 1
            encoded = {e.encoding.key for m in encoder.encoder_microbatches for e in m.encodings}
            assert encoded == {"s0/img0", "s1/img0"}  # the group's shared images, each encoded once

    await run(scenario)


@pytest.mark.parametrize(("first", "again"), [(True, True), (False, True), (True, False)])
async def test_reports_are_idempotent_and_conflicts_are_named(service, first: bool, again: bool) -> None:
    """Either form (columns or messages) of a re-send is a duplicate of either form of the first report."""
    def scenario() -> None:
        with AdmissionClient(service.address) as client:
            meta, other = make_meta(1, images=1), make_meta(3)
            assert [r.outcome for r in client.report([meta, other], columnar=first)] == [ReportOutcome.ACCEPTED] * 2
            assert client.report([meta], columnar=again)[0].outcome is ReportOutcome.DUPLICATE
            changed = make_meta(1, tokens=120, images=1)
            results = client.report([make_meta(2), changed, other], columnar=again)
            assert [r.outcome for r in results] == [
                ReportOutcome.ACCEPTED, ReportOutcome.CONFLICT, ReportOutcome.DUPLICATE]
            assert "different" in results[1].reason and not results[2].reason
            assert client.status().pool_size == 3

    await run(scenario)


async def test_a_columnar_report_answers_with_outcomes_and_conflicts(service) -> None:
    """What a plain gRPC user who sends a TrajectoryBatch gets back."""
    def scenario() -> None:
        with AdmissionClient(service.address) as client:
            client.report([make_meta(0)], columnar=False)
            stub = admission_service_pb2_grpc.AdmissionServiceStub(open_channel(client.connection))
            batch = batch_from_messages([trajectory_to_proto(m) for m in (make_meta(0), make_meta(1, tokens=50))])
            response = stub.ReportTrajectories(pb.ReportTrajectoriesRequest(request_id="b", batch=batch), timeout=10)
            assert list(response.outcomes) == [pb.REPORT_OUTCOME_DUPLICATE, pb.REPORT_OUTCOME_ACCEPTED]
            assert not response.results and not response.conflicts
            batch.finished_at[0] = 99.0
            response = stub.ReportTrajectories(pb.ReportTrajectoriesRequest(request_id="c", batch=batch), timeout=10)
            assert list(response.outcomes) == [pb.REPORT_OUTCOME_CONFLICT, pb.REPORT_OUTCOME_DUPLICATE]
            assert [c.trajectory_id for c in response.conflicts] == ["t0"]

    await run(scenario)


def _bad_report(kind: str) -> pb.ReportTrajectoriesRequest:
    good = [trajectory_to_proto(make_meta(i)) for i in range(3)]
    bad = good[1]
    if kind == "missing id":
        bad.trajectory_id = ""
    elif kind == "length":
        bad.num_tokens = 0
    elif kind == "source":
        bad.source = "Z"
    elif kind == "future version":
        bad.segments[0].version = 7
    elif kind == "header":
        bad.units[0].header.byte_length += 1
    return pb.ReportTrajectoriesRequest(request_id="r", trajectories=good)


@pytest.mark.parametrize(
    ("kind", "field"),
    [
        ("missing id", "trajectories[1].trajectory_id"),
        ("length", "trajectories[1].num_tokens"),
        ("source", "trajectories[1].source"),
        ("future version", "trajectories[1].segments[0].version"),
        ("header", "trajectories[1].units[0].header.byte_length"),
    ],
)
@pytest.mark.parametrize("columnar", [True, False])
async def test_bad_reports_are_rejected_whole_naming_the_field(service, kind: str, field: str, columnar: bool) -> None:
    def scenario() -> None:
        with AdmissionClient(service.address) as client:
            with pytest.raises(InvalidArgument) as info:
                client.report(list(_bad_report(kind).trajectories), columnar=columnar)
            assert info.value.field == field
            status = client.status()
            assert status.pool_size == 0 and status.admitted_total == 0  # nothing of the batch was applied

    await run(scenario)


async def test_oversized_batch_and_foreign_consumer_are_invalid(service) -> None:
    def scenario() -> None:
        with AdmissionClient(service.address) as client:
            with pytest.raises(InvalidArgument) as info:
                client.report([make_meta(i) for i in range(10_001)])
            assert info.value.field == "trajectories"
            with pytest.raises(InvalidArgument) as info:
                client.register_consumer(ConsumerId(role="backbone", dp_rank=2, cp_rank=0))
            assert info.value.field == "consumer.dp_rank"
            with pytest.raises(InvalidArgument) as info:
                client.register_consumer(ConsumerId(role="encoder:audio", dp_rank=0))
            assert info.value.field == "consumer.encoder"
            with pytest.raises(InvalidArgument) as info:
                client.report_progress(CONSUMERS[0], 1, ProgressStage.DELIVERED)
            assert info.value.field == "sequence"

    await run(scenario)


async def test_progress_releases_after_every_consumer_and_version_advances(service) -> None:
    def scenario() -> None:
        with AdmissionClient(service.address) as client:
            client.report([make_meta(i, source="AB"[i % 2]) for i in range(8)])
            assert client.status().admitted_total == 8  # the whole train batch, in two mini-batches
            with pytest.raises(FailedPrecondition) as info:
                client.advance_version(train_batch_index=1, new_version=2)
            assert info.value.field == "new_version"  # the knittrans-field trailer, as on INVALID_ARGUMENT
            assert str(info.value).startswith("new_version: version 2 is ahead")
            released = [client.report_progress(c, 1, ProgressStage.OPTIMIZER_STEP) for c in CONSUMERS]
            assert released == [False] * (len(CONSUMERS) - 1) + [True]
            assert client.status().released_minibatches == 1
            assert client.advance_version(train_batch_index=0, new_version=1) == 1
            assert client.advance_version(train_batch_index=0, new_version=1) == 1  # idempotent
            assert client.advance_version(train_batch_index=0, new_version=0) == 1  # monotonic
            assert client.status().policy_version == 1

    await run(scenario)


async def test_stream_resumes_without_gap_or_repeat(service) -> None:
    def scenario() -> None:
        consumer = CONSUMERS[1]
        with AdmissionClient(service.address) as client:
            client.report([make_meta(i, source="AB"[i % 2]) for i in range(8)])
            stream = client.watch_assignments(consumer)
            assert next(stream).sequence == 1
            client.report_progress(consumer, 1, ProgressStage.DELIVERED)
            stream.close()  # the sidecar disconnects after acknowledging 1
            registration = client.register_consumer(consumer)
            assert registration.acknowledged_sequence == 1
            resumed = client.watch_assignments(consumer, after_sequence=registration.acknowledged_sequence)
            assert next(resumed).sequence == 2

    await run(scenario)


async def test_token_is_required_except_for_health() -> None:
    running = await start_admission_service(service_settings(token="secret"))
    try:
        def scenario() -> None:
            with AdmissionClient(running.address) as anonymous, pytest.raises(Unauthenticated):
                anonymous.status()
            with AdmissionClient(ConnectionSettings(target=running.address, token="secret")) as client:
                assert client.status().pool_size == 0

        await run(scenario)
    finally:
        await running.stop(0)


async def test_every_rpc_refuses_an_undecodable_body_by_status_not_by_traceback(caplog) -> None:
    """Bytes that are not protobuf: UNAUTHENTICATED without the token, else INVALID_ARGUMENT; counted, one log
    line each, no traceback, nothing changed."""
    caplog.set_level(logging.DEBUG)
    running = await start_admission_service(service_settings(token="secret"))
    methods = pb.DESCRIPTOR.services_by_name["AdmissionService"].methods
    garbage = b"\xff\xff\xff\xff"

    def scenario() -> None:
        with grpc.insecure_channel(running.address) as channel:
            for method in methods:
                path = f"/{method.containing_service.full_name}/{method.name}"
                for metadata, expected in (((), grpc.StatusCode.UNAUTHENTICATED),
                                           ((("authorization", "Bearer secret"),), grpc.StatusCode.INVALID_ARGUMENT)):
                    with pytest.raises(grpc.RpcError) as info:
                        if method.server_streaming:
                            list(channel.unary_stream(path)(garbage, timeout=10, metadata=metadata))
                        else:
                            channel.unary_unary(path)(garbage, timeout=10, metadata=metadata)
                    assert info.value.code() is expected, (path, info.value.details())
        with AdmissionClient(ConnectionSettings(target=running.address, token="secret")) as client:
            assert client.status().pool_size == 0

    try:
        await run(scenario)
        url = f"http://127.0.0.1:{running.server.metrics_port}/metrics"
        text = await run(lambda: urllib.request.urlopen(url, timeout=5).read().decode())
    finally:
        await running.stop(0)
    assert [r.getMessage() for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()] == []
    for method in methods:
        for code in ("UNAUTHENTICATED", "INVALID_ARGUMENT"):
            assert (f'knittrans_rpc_errors_total{{code="{code}",method="{method.name}",'
                    f'service="knittrans.v1.AdmissionService"}} 1.0') in text


async def test_admitted_at_is_unix_seconds(service) -> None:
    """What MiniBatchAdmission.admitted_at documents: the wall clock, which a user correlates with logs."""
    def scenario() -> tuple[float, float, float]:
        with AdmissionClient(service.address) as client:
            before = time.time()
            client.report([make_meta(i, source="AB"[i % 2]) for i in range(4)])
            after = time.time()
            stub = admission_service_pb2_grpc.AdmissionServiceStub(open_channel(client.connection))
            request = pb.WatchAssignmentsRequest(consumer=consumer_to_proto(CONSUMERS[0]))
            stream = stub.WatchAssignments(request, timeout=10)
            first = next(stream)
            stream.cancel()
            return before, first.admission.admitted_at, after

    before, admitted_at, after = await run(scenario)
    assert before <= admitted_at <= after


async def test_metrics_are_exported(service) -> None:
    def scenario() -> str:
        with AdmissionClient(service.address) as client:
            client.report([make_meta(i, source="AB"[i % 2]) for i in range(4)])
            client.report([make_meta(0)])
        url = f"http://127.0.0.1:{service.server.metrics_port}/metrics"
        return urllib.request.urlopen(url, timeout=5).read().decode()

    text = await run(scenario)
    assert 'knittrans_admission_reports_total{outcome="accepted"} 4.0' in text
    assert 'knittrans_admission_reports_total{outcome="duplicate"} 1.0' in text
    assert "knittrans_admission_admitted_minibatches_total 1.0" in text
    assert 'knittrans_admission_blocking{reason="train_batch_size"} 1.0' in text
    assert "knittrans_admission_staleness_versions_count 4.0" in text
    assert 'knittrans_rpc_latency_seconds_count{method="ReportTrajectories"' in text



async def test_references_that_disagree_on_a_shared_input_are_rejected(service) -> None:
    """Siblings must describe their shared image the same way, or the mini-batch could never be planned."""

    def scenario() -> None:
        with AdmissionClient(service.address) as client:
            client.report([make_meta(0, sample=0, images=1)])
            sibling = make_meta(1, sample=0, images=1, tokens=100)
            disagreeing = replace(sibling, multimodal=(replace(sibling.multimodal[0], cost=99.0),))
            for columnar in (True, False):
                with pytest.raises(InvalidArgument) as info:
                    client.report([make_meta(2, sample=5), disagreeing], columnar=columnar)
                assert info.value.field == "trajectories[1].multimodal[0]"
            assert client.report([sibling])[0].outcome is ReportOutcome.ACCEPTED
            assert client.status().pool_size == 2

    await run(scenario)


async def test_a_dp_rank_s_cp_streams_carry_the_same_bytes_and_name_only_their_own_trajectories(service) -> None:
    """Each backbone DP rank's part is serialised once for all its CP ranks: both CP streams of a DP rank receive
    the same bytes, which hold no admitted trajectory id beyond the rank's own items; a stream that asks for the
    ids gets every admitted one, and each CP rank's cut (through the SDK) covers its rank's items."""
    def scenario() -> tuple[dict[ConsumerId, bytes], set[str], dict[ConsumerId, set[str]]]:
        with AdmissionClient(service.address) as client:
            client.report([make_meta(i, source="AB"[i % 2], sample=i // 2, images=1) for i in range(4)])
            watch = open_channel(client.connection).unary_stream(  # the bytes as sent, undecoded
                "/knittrans.v1.AdmissionService/WatchAssignments",
                request_serializer=pb.WatchAssignmentsRequest.SerializeToString, response_deserializer=bytes)
            raw: dict[ConsumerId, bytes] = {}
            for consumer in CONSUMERS:
                stream = watch(pb.WatchAssignmentsRequest(consumer=consumer_to_proto(consumer)), timeout=10)
                raw[consumer] = next(stream)
                stream.cancel()
            cut = {c: {i.trajectory.trajectory_id for m in next(client.watch_assignments(c)).assignment.microbatches
                       for i in m.items} for c in CONSUMERS[:4]}
            admitted = set(next(client.watch_assignments(CONSUMERS[0])).trajectory_ids)
            return raw, admitted, cut

    raw, admitted, cut = await run(scenario)
    assert admitted == {"t0", "t1", "t2", "t3"}
    for dp_rank in range(2):
        first, second = (raw[ConsumerId(role="backbone", dp_rank=dp_rank, cp_rank=c)] for c in range(2))
        assert first == second
        response = pb.WatchAssignmentsResponse.FromString(first)
        assert response.WhichOneof("part") == "rank_assignment" and not response.admission.trajectory_ids
        own = {i.trajectory.trajectory_id  # decoded: the rank's trajectories travel as one batch of columns
               for m in rank_assignment_from_proto(response.rank_assignment).microbatches for i in m.items}
        assert not any(t.encode() in first for t in admitted - own)
        assert cut[ConsumerId(role="backbone", dp_rank=dp_rank, cp_rank=0)] == own
        assert cut[ConsumerId(role="backbone", dp_rank=dp_rank, cp_rank=1)] == own
    assert set().union(*cut.values()) == admitted
