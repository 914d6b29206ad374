"""The report that admits a large mini-batch is acknowledged without waiting for the mini-batch's plan.

The planner is wrapped with a gate that holds every plan until the test opens it, which the test does only once
the admitting report was acknowledged: planning on the event loop (or in the report's call) would hold the
acknowledgement until the gate gave up waiting, after the plan was made. The assignments then arrive, in sequence
order and with every admitted trajectory, from a servicer driven in-process (both journal kinds: one plans while
the admission's record is written, the other when it is applied).
"""

from __future__ import annotations

import asyncio
import threading

import pytest
from prometheus_client import CollectorRegistry

from knittrans.admission.engine import EngineConfig
from knittrans.admission.service import assignments
from knittrans.admission.service.journal import MemoryJournal
from knittrans.admission.service.ledger import AdmissionLedger, LedgerSettings
from knittrans.admission.service.metrics import AdmissionMetrics
from knittrans.admission.service.servicer import INLINE_BUILD_TRAJECTORIES, AdmissionServicer
from knittrans.types import BackboneTopology, Topology
from knittrans.v1 import admission_service_pb2 as pb
from knittrans.v1 import trajectory_pb2
from tests.unit.admission_service.test_attachments import RecordingJournal

MINIBATCH = INLINE_BUILD_TRAJECTORIES + 44  # large enough to be planned off the loop
GATE_GIVES_UP = 10.0  # seconds a plan waits for the gate before it goes on (only reached when the ack waits)
TOPOLOGY = Topology(backbone=BackboneTopology(dp=2, max_tokens_per_microbatch=4096))


def reported(index: int) -> trajectory_pb2.TrajectoryMetadata:
    n = 20 + index % 37
    trajectory_id = f"t{index}"
    return trajectory_pb2.TrajectoryMetadata(
        trajectory_id=trajectory_id, sample_id=f"s{index}", source="A", num_tokens=n, num_loss_tokens=n // 2,
        segments=[trajectory_pb2.VersionSegment(version=0, num_tokens=n)],
        units=[trajectory_pb2.UnitRef(key=f"{trajectory_id}/input_ids", field_name="input_ids",
                                      kind=trajectory_pb2.UNIT_KIND_TOKEN_FIELD, header=trajectory_pb2.UnitHeader(
                                          dtype=trajectory_pb2.D_TYPE_INT32, shape=[n], seq_axis=0,
                                          byte_length=4 * n, content_hash=f"{index:032x}"))],
        accepted=True, finished_at=float(index))


@pytest.mark.parametrize("journal", [MemoryJournal, RecordingJournal])
def test_the_admitting_report_is_acknowledged_before_the_plan_is_made(monkeypatch, journal) -> None:
    events: list[str] = []
    gate = threading.Event()
    plan_columns = assignments.plan_columns

    def gated(*args, **kwargs):
        gate.wait(GATE_GIVES_UP)
        layout = plan_columns(*args, **kwargs)
        events.append("planned")
        return layout

    monkeypatch.setattr(assignments, "plan_columns", gated)

    async def run() -> None:
        ledger = AdmissionLedger(LedgerSettings(
            engine=EngineConfig(train_batch_size=MINIBATCH, num_minibatches=1, sources={"A": 1.0},
                                max_batches_ahead=None),
            topology=TOPOLOGY))
        servicer = AdmissionServicer(ledger=ledger, journal=journal(), job="plan-off-loop",
                                     metrics=AdmissionMetrics(CollectorRegistry(), ("A",)), clock=lambda: 1.0,
                                     delete_keys=lambda keys: None)
        await servicer.recover()
        streams = [servicer.WatchAssignments(pb.WatchAssignmentsRequest(
            consumer={"role": "backbone", "dp_rank": dp}, after_sequence=0), None) for dp in range(2)]
        first = [asyncio.ensure_future(anext(stream)) for stream in streams]
        for _ in range(3):
            await asyncio.sleep(0)  # the streams are waiting for an admission
        assert not any(f.done() for f in first)

        admitted = [[f"t{i}" for i in range(k * MINIBATCH, (k + 1) * MINIBATCH)] for k in range(2)]
        for k in range(2):  # two mini-batches, each admitted by its report while no plan can be made
            response = await servicer.ReportTrajectories(pb.ReportTrajectoriesRequest(
                request_id=f"r{k}", trajectories=[reported(i) for i in range(k * MINIBATCH, (k + 1) * MINIBATCH)]),
                None)
            assert len(response.results) == MINIBATCH
            events.append(f"acknowledged {k + 1}")
        assert ledger.next_sequence == 3
        gate.set()

        received: dict[int, list[str]] = {1: [], 2: []}
        for stream, pending in zip(streams, first, strict=True):
            for expected in (1, 2):  # in sequence order, each once
                item = await asyncio.wait_for(pending if expected == 1 else anext(stream), 60)
                message = pb.WatchAssignmentsResponse.FromString(item) if isinstance(item, bytes) else item
                assert message.sequence == expected
                received[expected].extend(message.rank_assignment.trajectories.trajectory_ids)
            await stream.aclose()
        for k in range(2):
            assert sorted(received[k + 1]) == sorted(admitted[k])
        await servicer.close()

    asyncio.run(run())
    assert events[:2] == ["acknowledged 1", "acknowledged 2"], events
    assert events.count("planned") == 2, events
