"""Small reports' blocks are merged after the report that made the merge due is answered and after the assignment
it made is sent, never inside it, and never while a mutating call holds the lock (between its journal write and
its apply); a servicer driven in-process with both journal kinds."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from knittrans.admission.engine import EngineConfig
from knittrans.admission.service import block_merge
from knittrans.admission.service.block_merge import COALESCE_AT
from knittrans.admission.service.journal import MemoryJournal
from knittrans.admission.service.ledger import AdmissionLedger, LedgerSettings
from knittrans.admission.service.metrics import AdmissionMetrics
from knittrans.admission.service.servicer import AdmissionServicer
from knittrans.types import BackboneTopology, Topology
from knittrans.v1 import admission_service_pb2 as pb
from knittrans.wire.columns import batch_from_messages
from tests.unit.admission_service.test_attachments import RecordingJournal
from tests.unit.admission_service.test_plan_off_loop import reported


@pytest.mark.parametrize("journal", [MemoryJournal, RecordingJournal])
def test_small_blocks_are_merged_after_the_report_and_outside_the_lock(journal) -> None:
    async def run() -> None:
        ledger = AdmissionLedger(LedgerSettings(
            engine=EngineConfig(train_batch_size=10_000, num_minibatches=1, sources={"A": 1.0}),
            topology=Topology(backbone=BackboneTopology(dp=1, max_tokens_per_microbatch=4096))))
        servicer = AdmissionServicer(ledger=ledger, journal=journal(), job="merge-timing",
                                     metrics=AdmissionMetrics(CollectorRegistry(), ("A",)), clock=lambda: 1.0,
                                     delete_keys=lambda keys: None)
        await servicer.recover()

        async def report(index: int) -> None:
            await servicer.ReportTrajectories(pb.ReportTrajectoriesRequest(
                request_id=f"r{index}", batch=batch_from_messages([reported(index)])), None)

        for index in range(COALESCE_AT):
            await report(index)
        blocks_when_answered = len(ledger._blocks)
        await asyncio.sleep(0)
        assert blocks_when_answered == COALESCE_AT  # the report that made the merge due did not merge
        assert len(ledger._blocks) == 1

        for index in range(COALESCE_AT, 2 * COALESCE_AT - 1):
            await report(index)
        async with servicer._commits.mutating():  # a mutating call under way
            await report_without_lock(servicer, 2 * COALESCE_AT - 1)
            for _ in range(5):
                await asyncio.sleep(0)
            assert len(ledger._blocks) == COALESCE_AT + 1  # due, but the call holds the lock
        await asyncio.sleep(0)
        assert len(ledger._blocks) == 1  # the first merged block (still small) is merged again with the rest
        for index in range(2 * COALESCE_AT):  # every trajectory still reads back as reported
            assert ledger.is_reported(f"t{index}")
            assert ledger.row_summary(f"t{index}")[0] == "A"

    asyncio.run(run())


async def report_without_lock(servicer: AdmissionServicer, index: int) -> None:
    """A report applied as the call holding the lock would apply it (the test holds the lock)."""
    from knittrans.admission.service.ingest.report import classify

    request = pb.ReportTrajectoriesRequest(request_id=f"r{index}", batch=batch_from_messages([reported(index)]))
    report = classify(request, servicer._ledger)
    await servicer._commit_report(report)


@pytest.mark.parametrize("journal", [MemoryJournal, RecordingJournal])
def test_the_merge_waits_for_the_assignment_the_same_report_made(monkeypatch, journal) -> None:
    events: list[str] = []
    merge_blocks = block_merge.merge_blocks

    def recorded_merge(*args, **kwargs):
        events.append("merged")
        return merge_blocks(*args, **kwargs)

    monkeypatch.setattr(block_merge, "merge_blocks", recorded_merge)

    async def run() -> None:
        ledger = AdmissionLedger(LedgerSettings(
            engine=EngineConfig(train_batch_size=COALESCE_AT, num_minibatches=1, sources={"A": 1.0},
                                max_batches_ahead=None),
            topology=Topology(backbone=BackboneTopology(dp=1, max_tokens_per_microbatch=4096))))
        servicer = AdmissionServicer(ledger=ledger, journal=journal(), job="merge-order",
                                     metrics=AdmissionMetrics(CollectorRegistry(), ("A",)), clock=lambda: 1.0,
                                     delete_keys=lambda keys: None)
        await servicer.recover()
        respond = servicer._messages.response

        async def recorded_response(*args, **kwargs):
            events.append("assigned")
            return await respond(*args, **kwargs)

        servicer._messages.response = recorded_response
        stream = servicer.WatchAssignments(pb.WatchAssignmentsRequest(
            consumer={"role": "backbone", "dp_rank": 0}, after_sequence=0), None)
        assignment = asyncio.ensure_future(anext(stream))
        for _ in range(3):
            await asyncio.sleep(0)
        for index in range(COALESCE_AT):  # the last report admits the mini-batch and makes the merge due
            await servicer.ReportTrajectories(pb.ReportTrajectoriesRequest(
                request_id=f"r{index}", batch=batch_from_messages([reported(index)])), None)
        events.append("answered")
        await assignment
        for _ in range(3):
            await asyncio.sleep(0)
        assert events == ["answered", "assigned", "merged"]

    asyncio.run(run())


def test_a_merge_that_fails_leaves_every_acknowledged_trajectory_in_place(monkeypatch) -> None:
    def failing(parts):
        raise MemoryError("no room for the merged block")

    async def run() -> None:
        ledger = AdmissionLedger(LedgerSettings(
            engine=EngineConfig(train_batch_size=10_000, num_minibatches=1, sources={"A": 1.0}),
            topology=Topology(backbone=BackboneTopology(dp=1, max_tokens_per_microbatch=4096))))
        servicer = AdmissionServicer(ledger=ledger, journal=MemoryJournal(), job="merge-fails",
                                     metrics=AdmissionMetrics(CollectorRegistry(), ("A",)), clock=lambda: 1.0,
                                     delete_keys=lambda keys: None)
        await servicer.recover()
        for index in range(COALESCE_AT - 1):
            await servicer.ReportTrajectories(pb.ReportTrajectoriesRequest(
                request_id=f"r{index}", batch=batch_from_messages([reported(index)])), None)
        monkeypatch.setattr(block_merge, "merge_rows", failing)
        blocks = dict(ledger._blocks)
        await report_without_lock(servicer, COALESCE_AT - 1)
        blocks.update(ledger._blocks)
        with pytest.raises(MemoryError):
            block_merge.merge_small_blocks(ledger)
        assert ledger._blocks == blocks  # nothing dropped
        for index in range(COALESCE_AT):
            assert ledger.row_summary(f"t{index}")[0] == "A"
        monkeypatch.undo()
        block_merge.merge_small_blocks(ledger)  # noted again by the next apply; merging works once it can
        assert all(ledger.row_summary(f"t{index}")[0] == "A" for index in range(COALESCE_AT))

    asyncio.run(run())
