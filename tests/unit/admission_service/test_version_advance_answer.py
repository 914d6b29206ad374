"""AdvanceVersion is answered once the new version is journaled, before the admission that the version allows.

Its caller is global rank 0's training loop at every train batch's end; the next train batch waits for that
version (``max_batches_ahead`` 0 here), so answering after its admission made the loop wait for the journal write
and planning of a mini-batch it has nothing to do with yet. The journal below holds every admission record until
the test opens it: the answer has to come while the admission is held, and the admission must then still happen,
with the trajectories reported for it. Driven in-process against both journal kinds' record paths.
"""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry

from knittrans.admission.engine import EngineConfig
from knittrans.admission.service.journal import AppendOutcome
from knittrans.admission.service.ledger import AdmissionLedger, LedgerSettings
from knittrans.admission.service.metrics import AdmissionMetrics
from knittrans.admission.service.servicer import AdmissionServicer
from knittrans.types import BackboneTopology, Topology
from knittrans.v1 import admission_service_pb2 as pb
from knittrans.v1 import journal_pb2
from tests.unit.admission_service.test_attachments import RecordingJournal
from tests.unit.admission_service.test_plan_off_loop import reported

TRAIN_BATCH = 4
ANSWER_WITHIN = 10.0  # seconds; only reached when the answer waits for the held admission


class AdmissionHoldingJournal(RecordingJournal):
    def __init__(self) -> None:
        super().__init__()
        self.open = asyncio.Event()

    async def append(self, record: journal_pb2.JournalRecord) -> AppendOutcome:
        if record.HasField("admission"):
            await self.open.wait()
        return await super().append(record)


def test_the_version_is_answered_before_the_admission_it_allows() -> None:
    async def run() -> None:
        journal = AdmissionHoldingJournal()
        ledger = AdmissionLedger(LedgerSettings(
            engine=EngineConfig(train_batch_size=TRAIN_BATCH, num_minibatches=1, sources={"A": 1.0},
                                max_batches_ahead=0),
            topology=Topology(backbone=BackboneTopology(dp=1, max_tokens_per_microbatch=4096))))
        servicer = AdmissionServicer(ledger=ledger, journal=journal, job="version-answer",
                                     metrics=AdmissionMetrics(CollectorRegistry(), ("A",)), clock=lambda: 1.0,
                                     delete_keys=lambda keys: None)
        await servicer.recover()
        journal.open.set()  # train batch 0, admitted by the report, goes through
        await servicer.ReportTrajectories(pb.ReportTrajectoriesRequest(
            request_id="r", trajectories=[reported(i) for i in range(2 * TRAIN_BATCH)]), None)
        assert ledger.next_sequence == 2  # train batch 0 admitted; batch 1 waits for version 1
        journal.open.clear()

        answer = await asyncio.wait_for(servicer.AdvanceVersion(
            pb.AdvanceVersionRequest(request_id="v1", train_batch_index=0, new_version=1), None), ANSWER_WITHIN)
        assert answer.version == 1 and ledger.version == 1
        assert ledger.next_sequence == 2  # answered while batch 1's admission is still held

        journal.open.set()
        for _ in range(1000):
            if ledger.next_sequence == 3:
                break
            await asyncio.sleep(0.01)
        assert ledger.next_sequence == 3
        admitted = ledger.minibatches[2].admission
        assert admitted.train_version == 1
        first = set(ledger.minibatches[1].admission.trajectory_ids)
        assert sorted(admitted.trajectory_ids) == sorted({f"t{i}" for i in range(2 * TRAIN_BATCH)} - first)
        await servicer.close()

    asyncio.run(run())
