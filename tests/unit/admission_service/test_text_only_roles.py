"""A trainer role in a multimodal job reads text only (docs/roles.md): through the real servicer, the reference
role's assignments carry the trajectories without their images or encodings, the backbone's carry both the images
(with their encodings) and the attached field, and the encoder consumer gets its images as in a job without roles.
"""

from __future__ import annotations

import asyncio
import hashlib

from prometheus_client import CollectorRegistry

from knittrans.admission.engine import EngineConfig
from knittrans.admission.service.ledger import AdmissionLedger, LedgerSettings
from knittrans.admission.service.metrics import AdmissionMetrics
from knittrans.admission.service.servicer import AdmissionServicer
from knittrans.trajectory_schema import TokenFieldSchema, TrajectorySchema
from knittrans.types import BackboneTopology, DType, EncoderTopology, Topology, TrainerRole
from knittrans.v1 import admission_service_pb2 as pb
from knittrans.v1 import trajectory_pb2
from tests.unit.admission_service.test_attachments import RecordingJournal

TOPOLOGY = Topology(
    backbone=BackboneTopology(dp=2, max_tokens_per_microbatch=64), consumes=("ref_logprobs",),
    encoders=(EncoderTopology(name="vision", dp=1, max_cost_per_microbatch=100.0),),
    roles=(TrainerRole(name="reference", backbone=BackboneTopology(dp=1, max_tokens_per_microbatch=64),
                       produces=("ref_logprobs",)),))
SCHEMA = TrajectorySchema(token_fields={
    "input_ids": TokenFieldSchema(dtype=DType.INT32),
    "ref_logprobs": TokenFieldSchema(dtype=DType.FLOAT32, attached_by="reference"),
})
LENGTHS = {"t0": 9, "t1": 14, "t2": 11, "t3": 20}


def digest(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def unit(trajectory_id: str, field: str, dtype: int, rows: int) -> trajectory_pb2.UnitRef:
    return trajectory_pb2.UnitRef(key=f"{trajectory_id}/{field}", field_name=field,
                                  kind=trajectory_pb2.UNIT_KIND_TOKEN_FIELD,
                                  header=trajectory_pb2.UnitHeader(dtype=dtype, shape=[rows], seq_axis=0,
                                                                   byte_length=4 * rows,
                                                                   content_hash=digest(trajectory_id + field)))


def reported(trajectory_id: str) -> trajectory_pb2.TrajectoryMetadata:
    n = LENGTHS[trajectory_id]
    sample = "s0" if trajectory_id in ("t0", "t1") else "s1"  # two trajectories share each image
    return trajectory_pb2.TrajectoryMetadata(
        trajectory_id=trajectory_id, sample_id=sample, source="A", num_tokens=n, num_loss_tokens=2,
        segments=[trajectory_pb2.VersionSegment(version=0, num_tokens=n)],
        units=[unit(trajectory_id, "input_ids", trajectory_pb2.D_TYPE_INT32, n)],
        multimodal=[trajectory_pb2.MultimodalRef(key=f"{sample}/img", encoder="vision", cost=4.0,
                                                 kind=trajectory_pb2.UNIT_KIND_IMAGE,
                                                 placeholder=trajectory_pb2.TokenSpan(start=1, end=5))],
        accepted=True, finished_at=1.0)


async def first_assignment(servicer: AdmissionServicer, role: str, dp_rank: int) -> pb.WatchAssignmentsResponse:
    stream = servicer.WatchAssignments(pb.WatchAssignmentsRequest(
        consumer={"role": role, "dp_rank": dp_rank}, after_sequence=0), None)
    try:
        item = await asyncio.wait_for(anext(stream), 10)
    finally:
        await stream.aclose()
    return item if isinstance(item, pb.WatchAssignmentsResponse) else pb.WatchAssignmentsResponse.FromString(item)


def items(response: pb.WatchAssignmentsResponse) -> list:
    return [item for micro in response.rank_assignment.microbatches for item in micro.items]


def test_a_role_of_a_multimodal_job_gets_text_only_parts_and_the_backbone_gets_images_and_attachments() -> None:
    async def run() -> None:
        ledger = AdmissionLedger(LedgerSettings(
            engine=EngineConfig(train_batch_size=4, num_minibatches=1, sources={"A": 1.0}, max_batches_ahead=None),
            topology=TOPOLOGY, schema=SCHEMA))
        servicer = AdmissionServicer(ledger=ledger, journal=RecordingJournal(), job="mm",
                                     metrics=AdmissionMetrics(CollectorRegistry(), ("A",)), clock=lambda: 1.0,
                                     delete_keys=lambda keys: None)
        await servicer.recover()
        await servicer.ReportTrajectories(pb.ReportTrajectoriesRequest(
            request_id="r", trajectories=[reported(t) for t in LENGTHS]), None)

        reference = await first_assignment(servicer, "role:reference", 0)
        seen = items(reference)
        assert sorted(item.trajectory.trajectory_id for item in seen) == sorted(LENGTHS)
        for item in seen:
            assert not item.trajectory.multimodal and not item.reference_encodings, item.trajectory.trajectory_id
            assert item.trajectory.num_tokens == LENGTHS[item.trajectory.trajectory_id]

        attachments = [pb.FieldAttachment(trajectory_id=t, unit=unit(t, "ref_logprobs", trajectory_pb2.D_TYPE_FLOAT32,
                                                                      n)) for t, n in LENGTHS.items()]
        await servicer.AttachFields(pb.AttachFieldsRequest(role="reference", sequence=1, attachments=attachments),
                                    None)
        backbone_items = [item for dp in range(2) for item in items(await first_assignment(servicer, "backbone", dp))]
        assert sorted(item.trajectory.trajectory_id for item in backbone_items) == sorted(LENGTHS)
        for item in backbone_items:
            t = item.trajectory.trajectory_id
            assert [ref.key for ref in item.trajectory.multimodal] == [reported(t).multimodal[0].key]
            assert len(item.reference_encodings) == 1
            assert {u.field_name for u in item.trajectory.units} == {"input_ids", "ref_logprobs"}
        encoder = await first_assignment(servicer, "encoder:vision", 0)
        keys = {encoding.key for micro in encoder.assignment.encoder_microbatches
            for encoding in micro.encodings}
        assert keys == {"s0/img", "s1/img"}  # each image once
        await servicer.close()

    asyncio.run(run())
