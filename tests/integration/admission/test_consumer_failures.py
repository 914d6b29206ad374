"""Through a real admission server on port 0: consumer failures (``ReportConsumerFailure``) are recorded once,
shown by GetStatus and the failed-mini-batch metric, survive a journal replay, and bad input is named; the rules
the job's first trajectory must meet for the packer to lay it out at all are enforced at ingest."""

from __future__ import annotations

import asyncio
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import grpc
import pytest

from knittrans.admission.engine import decide
from knittrans.admission.service.app import start_admission_service
from knittrans.admission.service.ingest.report import classify
from knittrans.admission.service.ledger import AdmissionLedger, LedgerSettings, all_consumers
from knittrans.admission.service.records import record_for
from knittrans.client.admission import AdmissionClient
from knittrans.client.connection import error_from_rpc
from knittrans.errors import InvalidArgument
from knittrans.types import ConsumerId, DType, UnitKind
from knittrans.v1 import admission_service_pb2 as pb
from knittrans.v1 import admission_service_pb2_grpc, journal_pb2
from knittrans.wire import consumer_to_proto, trajectory_to_proto
from tests.builders import token_unit

from .builders import make_meta, service_settings

BACKBONE = [ConsumerId(role="backbone", dp_rank=d, cp_rank=c) for d in range(2) for c in range(2)]


@pytest.fixture
async def service():
    running = await start_admission_service(service_settings())
    yield running
    await running.stop(0)


def run(function):
    return asyncio.to_thread(function)


def failure(consumer: ConsumerId, at_sequence: int, **changes) -> pb.ReportConsumerFailureRequest:
    message = pb.ConsumerFailure(consumer=consumer_to_proto(consumer), sequence=at_sequence, microbatch_index=1,
                                 trajectory_id="t2", unit_key="t2/input_ids", reason="UnitNotFound: no such unit")
    for name, value in changes.items():
        setattr(message, name, value)
    return pb.ReportConsumerFailureRequest(request_id=f"{consumer}/{at_sequence}", failure=message)


def report_failure(address: str, request: pb.ReportConsumerFailureRequest) -> bool:
    with grpc.insecure_channel(address) as channel:
        try:
            return admission_service_pb2_grpc.AdmissionServiceStub(channel).ReportConsumerFailure(
                request, timeout=5).recorded
        except grpc.RpcError as error:
            raise error_from_rpc(error) from None


async def test_a_failure_is_recorded_once_shown_in_status_and_counted_per_minibatch(service) -> None:
    def scenario() -> str:
        with AdmissionClient(service.address) as client:
            client.report([make_meta(i, source="AB"[i % 2]) for i in range(4)])  # admits sequence 1
            assert report_failure(service.address, failure(BACKBONE[0], 1))
            assert not report_failure(service.address, failure(BACKBONE[0], 1))  # a repeat changes nothing
            assert report_failure(service.address, failure(BACKBONE[1], 1))  # another consumer, same mini-batch
            status = client.status()
            assert status.failed_minibatches == 1
            assert [(f.consumer, f.sequence, f.trajectory_id, f.unit_key) for f in status.recent_failures] == [
                (BACKBONE[0], 1, "t2", "t2/input_ids"), (BACKBONE[1], 1, "t2", "t2/input_ids")]
            assert status.recent_failures[0].train_batch_index == 0
        url = f"http://127.0.0.1:{service.server.metrics_port}/metrics"
        return urllib.request.urlopen(url, timeout=5).read().decode()

    text = await run(scenario)
    assert "knittrans_admission_failed_minibatches_total 1.0" in text


@pytest.mark.parametrize(("change", "field"), [
    ({"sequence": 7}, "failure.sequence"),
    ({"sequence": 0}, "failure.sequence"),
    ({"reason": "x" * 2000}, "failure.reason"),
    ({"unit_key": "k" * 300}, "failure.unit_key"),
])
async def test_a_bad_failure_report_is_invalid_naming_the_field(service, change: dict, field: str) -> None:
    def scenario() -> None:
        with AdmissionClient(service.address) as client:
            client.report([make_meta(i, source="AB"[i % 2]) for i in range(4)])
        with pytest.raises(InvalidArgument) as info:
            report_failure(service.address, failure(BACKBONE[0], 1, **change))
        assert info.value.field == field

    await run(scenario)


def test_failures_and_the_schema_are_rebuilt_by_replaying_the_journal() -> None:
    settings = service_settings()
    ledger_settings = LedgerSettings(engine=settings.engine, topology=settings.topology)
    live = AdmissionLedger(ledger_settings)
    records = [journal_pb2.JournalRecord(at=1.0, report=pb.ReportTrajectoriesRequest(
        request_id="r", trajectories=[trajectory_to_proto(make_meta(i, source="AB"[i % 2])) for i in range(4)]))]
    live.apply(records[0])
    records.append(record_for(decide(live.engine, 2.0, live.version), 2.0, live.last_wait))
    live.apply(records[1])
    records.append(journal_pb2.JournalRecord(at=3.0, consumer_failure=failure(BACKBONE[0], 1)))
    records.append(records[-1])  # journaled twice: replaying it twice changes nothing
    for record in records[2:]:
        live.apply(record)
    replayed = AdmissionLedger(ledger_settings)
    for record in records:
        replayed.apply(record)
    for ledger in (live, replayed):
        assert ledger.failed_sequences == {1}
        assert len(ledger.recent_failures) == 1
        assert ledger.schema == live.schema and ledger.schema is not None
        with pytest.raises(InvalidArgument) as info:  # the replayed schema still holds the job to its fields
            bad = make_meta(9)
            classify(pb.ReportTrajectoriesRequest(trajectories=[trajectory_to_proto(
                replace(bad, units=bad.units[:1]))]), ledger)
        assert info.value.field == "trajectories[0].units"


def _with_field(meta, name: str, dtype: DType = DType.INT32, kind: UnitKind = UnitKind.TOKEN_FIELD):
    unit = token_unit(meta.trajectory_id, name, meta.num_tokens, dtype)
    if kind is not UnitKind.TOKEN_FIELD:
        unit = replace(unit, kind=kind, header=replace(unit.header, seq_axis=None))
    return replace(meta, units=(*meta.units, unit))


@pytest.mark.parametrize(("build", "field"), [
    (lambda m: _with_field(m, "labels"), "trajectories[0].units[2].field_name"),
    (lambda m: _with_field(m, "position_ids"), "trajectories[0].units[2].field_name"),
    (lambda m: _with_field(m, "routing.next"), "trajectories[0].units[2].field_name"),
    (lambda m: _with_field(m, "scalar.reward"), "trajectories[0].units[2].field_name"),
    (lambda m: _with_field(m, "stats.0", kind=UnitKind.FIELD), "trajectories[0].units[2].field_name"),
    (lambda m: _with_field(m, "top:p"), "trajectories[0].units[2].field_name"),
    (lambda m: replace(m, units=(token_unit(m.trajectory_id, "input_ids", m.num_tokens, DType.FLOAT32),
                                 *m.units[1:])), "trajectories[0].units[0].header"),
    (lambda m: replace(m, units=(token_unit(m.trajectory_id, "input_ids", m.num_tokens, DType.INT32, width=2),
                                 *m.units[1:])), "trajectories[0].units[0].header"),
])
@pytest.mark.parametrize("columnar", [True, False], ids=["batch", "messages"])
async def test_the_first_trajectory_must_be_packable(service, build, field: str, columnar: bool) -> None:
    def scenario() -> None:
        with AdmissionClient(service.address) as client:
            with pytest.raises(InvalidArgument) as info:
                client.report([build(make_meta(0))], columnar=columnar)
            assert info.value.field == field
            assert client.status().pool_size == 0
            # A trajectory a rollout filter rejected is never packed, so it fixes nothing.
            assert client.report([replace(build(make_meta(1)), accepted=False)])[0].outcome.value == "accepted"
            client.report([make_meta(2)])
            assert client.status().pool_size == 1

    await run(scenario)


def verdict_stub(address: str, call):
    with grpc.insecure_channel(address) as channel:
        try:
            return call(admission_service_pb2_grpc.AdmissionServiceStub(channel))
        except grpc.RpcError as error:
            raise error_from_rpc(error) from None


async def test_a_verdict_waits_for_every_consumer_and_answers_the_waiting_calls(service) -> None:
    consumers = all_consumers(service_settings().topology)

    def wait(sequence: int, seconds: float) -> pb.WaitMiniBatchVerdictResponse:
        return verdict_stub(service.address, lambda stub: stub.WaitMiniBatchVerdict(
            pb.WaitMiniBatchVerdictRequest(sequence=sequence, timeout_seconds=seconds), timeout=seconds + 10))

    def verify(consumer: ConsumerId, sequence: int) -> None:
        verdict_stub(service.address, lambda stub: stub.ReportProgress(pb.ReportProgressRequest(
            request_id=f"v/{consumer}", consumer=consumer_to_proto(consumer), sequence=sequence,
            stage=pb.PROGRESS_STAGE_VERIFIED), timeout=5))

    def scenario() -> None:
        with AdmissionClient(service.address) as client:
            client.report([make_meta(i, source="AB"[i % 2]) for i in range(8)])  # admits sequences 1 and 2
        for consumer in consumers[:-1]:
            verify(consumer, 1)
            verify(consumer, 1)  # a repeat changes nothing
        pending = wait(1, 0)  # one consumer still owes its check
        assert pending.verdict == pb.MINI_BATCH_VERDICT_PENDING
        assert list(pending.waiting_for) == [consumer_to_proto(consumers[-1])]
        with ThreadPoolExecutor(2) as pool:
            waiting = [pool.submit(wait, 1, 50), pool.submit(wait, 2, 50)]
            verify(consumers[-1], 1)
            assert report_failure(service.address, failure(consumers[0], 2))
            ok, failed = (f.result() for f in waiting)
        assert ok.verdict == pb.MINI_BATCH_VERDICT_OK and not ok.HasField("failure")
        assert failed.verdict == pb.MINI_BATCH_VERDICT_FAILED
        assert (failed.failure.sequence, failed.failure.unit_key) == (2, "t2/input_ids")
        for consumer in consumers:  # verifying after the verdict changes it no more
            verify(consumer, 2)
        assert wait(2, 0).verdict == pb.MINI_BATCH_VERDICT_FAILED
        for bad, field in (({"sequence": 9, "timeout_seconds": 1}, "sequence"),
                           ({"sequence": 1, "timeout_seconds": -1}, "timeout_seconds"),
                           ({"sequence": 1, "timeout_seconds": 61}, "timeout_seconds")):
            with pytest.raises(InvalidArgument) as info:
                verdict_stub(service.address, lambda stub, bad=bad: stub.WaitMiniBatchVerdict(
                    pb.WaitMiniBatchVerdictRequest(**bad), timeout=5))
            assert info.value.field == field

    await run(scenario)
