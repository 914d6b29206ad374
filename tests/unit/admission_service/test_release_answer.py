"""The optimizer-step report that releases a mini-batch is answered before the released trajectories are
fingerprinted (the training loop of the last consumer to step waits for that answer); the service takes the
fingerprints afterwards, one slice per turn of its event loop however many calls end meanwhile, and then holds
no row of them. A re-send of a
released trajectory is told apart from a changed one before and after, as the journal's replay tells it.
Driven in-process, with the reference being a ledger that took the fingerprints at once."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry

from knittrans.admission.engine import EngineConfig
from knittrans.admission.service.ingest.report import CONFLICT, DUPLICATE, classify
from knittrans.admission.service.journal import MemoryJournal
from knittrans.admission.service.journaled import FORGET_SLICE
from knittrans.admission.service.ledger import AdmissionLedger, LedgerSettings
from knittrans.admission.service.metrics import AdmissionMetrics
from knittrans.admission.service.servicer import AdmissionServicer
from knittrans.types import BackboneTopology, Topology, TrajectoryId
from knittrans.v1 import admission_service_pb2 as pb
from tests.unit.admission_service.test_plan_off_loop import reported

TRAIN_BATCH = 3 * FORGET_SLICE + 5  # several slices


def test_the_releasing_report_is_answered_before_the_fingerprints_are_taken() -> None:
    async def run() -> None:
        ledger = AdmissionLedger(LedgerSettings(
            engine=EngineConfig(train_batch_size=TRAIN_BATCH, num_minibatches=1, sources={"A": 1.0},
                                max_batches_ahead=None),
            topology=Topology(backbone=BackboneTopology(dp=1, max_tokens_per_microbatch=1 << 20))))
        servicer = AdmissionServicer(ledger=ledger, journal=MemoryJournal(), job="release-answer",
                                     metrics=AdmissionMetrics(CollectorRegistry(), ("A",)), clock=lambda: 1.0,
                                     delete_keys=lambda keys: None)
        await servicer.recover()
        await servicer.ReportTrajectories(pb.ReportTrajectoriesRequest(
            request_id="r", trajectories=[reported(i) for i in range(TRAIN_BATCH)]), None)
        assert ledger.next_sequence == 2
        answer = await servicer.ReportProgress(pb.ReportProgressRequest(
            request_id="p", consumer={"role": "backbone", "dp_rank": 0}, sequence=1,
            stage=pb.PROGRESS_STAGE_OPTIMIZER_STEP), None)
        assert answer.released
        assert ledger.released_rows_held and ledger._digests == {}  # answered with no fingerprint taken
        for _ in range(3):  # more calls let go of the lock: still one slice per turn of the loop
            async with servicer._commits.mutating():
                pass
        await asyncio.sleep(0)
        assert len(ledger._releasing) == TRAIN_BATCH - FORGET_SLICE

        resend = [reported(0), reported(1)]
        resend[1].num_loss_tokens += 1  # changed: a conflict
        held = classify(pb.ReportTrajectoriesRequest(request_id="again", trajectories=resend), ledger).outcomes
        for _ in range(100):
            if not ledger.released_rows_held:
                break
            await asyncio.sleep(0)
        assert not ledger.released_rows_held and not ledger._blocks  # every row gone, fingerprints kept
        assert len(ledger._digests) == TRAIN_BATCH
        forgotten = classify(pb.ReportTrajectoriesRequest(request_id="again", trajectories=resend), ledger).outcomes
        assert list(held) == list(forgotten) == [DUPLICATE, CONFLICT]
        assert all(ledger.is_reported(TrajectoryId(f"t{i}")) for i in range(TRAIN_BATCH))
        await servicer.close()

    asyncio.run(run())
