"""``AttachFields`` against a naive reference (docs/roles.md), through the real servicer with an in-memory journal.

Random attachment attempts, each either valid or with exactly one defect (a trajectory outside the mini-batch, an
undeclared field, another role's field, the wrong dtype, coverage or number of rows, a key another trajectory
owns), some repeated identically and some with other content. The reference model says for each what must
happen: recorded, unchanged, or the error class and the field it names. Afterwards the ledger replayed from the
journal and one restored from a snapshot hold exactly the model's attachments, and the actor's gating opens
exactly when the model has every field on every trajectory of the mini-batch.
"""

from __future__ import annotations

import asyncio
import hashlib

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from knittrans.admission.engine import EngineConfig
from knittrans.admission.service.attachments import ready_for
from knittrans.admission.service.journal import AppendOutcome
from knittrans.admission.service.ledger import AdmissionLedger, LedgerSettings
from knittrans.admission.service.metrics import AdmissionMetrics
from knittrans.admission.service.servicer import AdmissionServicer
from knittrans.admission.service.snapshot import StoredFingerprints, restore_ledger, snapshot_of
from knittrans.errors import Conflict, FailedPrecondition, InvalidArgument, KnitTransError
from knittrans.trajectory_schema import Coverage, TokenFieldSchema, TrajectorySchema
from knittrans.types import BackboneTopology, DType, Topology, TrainerRole
from knittrans.v1 import admission_service_pb2 as pb
from knittrans.v1 import journal_pb2, trajectory_pb2

TOPOLOGY = Topology(
    backbone=BackboneTopology(dp=1, max_tokens_per_microbatch=4096), consumes=("ref_logprobs", "values"),
    roles=(TrainerRole(name="reference", backbone=BackboneTopology(dp=2, max_tokens_per_microbatch=4096),
                       produces=("ref_logprobs",)),
           TrainerRole(name="critic", backbone=BackboneTopology(dp=1, max_tokens_per_microbatch=4096),
                       produces=("values",))))
SCHEMA = TrajectorySchema(token_fields={
    "input_ids": TokenFieldSchema(dtype=DType.INT32),
    "ref_logprobs": TokenFieldSchema(dtype=DType.FLOAT32, attached_by="reference"),
    "values": TokenFieldSchema(dtype=DType.FLOAT32, coverage=Coverage.RESPONSE, attached_by="critic"),
})
PRODUCER = {"ref_logprobs": "reference", "values": "critic"}
LENGTHS = {f"t{i}": 5 + 3 * i for i in range(6)}  # t0..t3 are admitted (mini-batch 1), t4, t5 wait
RESPONSE_START = 2
DEFECTS = ("none", "outside", "undeclared", "other_role", "dtype", "coverage", "rows", "key_taken")


def digest(content: int) -> str:
    return hashlib.blake2b(bytes([content]), digest_size=16).hexdigest()


class RecordingJournal:
    keeps_records = True

    def __init__(self) -> None:
        self.records: list[bytes] = []

    async def append(self, record: journal_pb2.JournalRecord) -> AppendOutcome:
        self.records.append(record.SerializeToString(deterministic=True))
        return AppendOutcome.APPENDED

    async def replay(self, after: int = 0):
        for raw in self.records[after:]:
            yield journal_pb2.JournalRecord.FromString(raw)

    async def read_snapshot(self):
        return None

    async def close(self) -> None:
        return None


def reported(trajectory_id: str) -> trajectory_pb2.TrajectoryMetadata:
    n = LENGTHS[trajectory_id]
    return trajectory_pb2.TrajectoryMetadata(
        trajectory_id=trajectory_id, sample_id=f"s{trajectory_id}", source="A", num_tokens=n, num_loss_tokens=1,
        segments=[trajectory_pb2.VersionSegment(version=0, num_tokens=n)], response_start=RESPONSE_START,
        units=[trajectory_pb2.UnitRef(key=f"{trajectory_id}/input_ids", field_name="input_ids",
                                      kind=trajectory_pb2.UNIT_KIND_TOKEN_FIELD, header=trajectory_pb2.UnitHeader(
                                          dtype=trajectory_pb2.D_TYPE_INT32, shape=[n], seq_axis=0,
                                          byte_length=4 * n, content_hash=digest(0)))],
        accepted=True, finished_at=1.0)


def attempt(trajectory_id: str, field: str, content: int, defect: str) -> tuple[str, pb.FieldAttachment]:
    """An attachment with at most one defect, and the role that sends it."""
    role = PRODUCER.get(field, "reference")
    if defect == "outside":
        trajectory_id = "t5"
    if defect == "undeclared":
        field = "advantages"
    if defect == "other_role":
        role = "critic" if role == "reference" else "reference"
    response = field == "values"
    rows = LENGTHS.get(trajectory_id, 4) - (RESPONSE_START if response else 0) + (1 if defect == "rows" else 0)
    dtype = trajectory_pb2.D_TYPE_INT32 if defect == "dtype" else trajectory_pb2.D_TYPE_FLOAT32
    coverage = response != (defect == "coverage")
    key = "t0/input_ids" if defect == "key_taken" else f"{trajectory_id}/{field}/{content}"
    return role, pb.FieldAttachment(trajectory_id=trajectory_id, unit=trajectory_pb2.UnitRef(
        key=key, field_name=field, kind=trajectory_pb2.UNIT_KIND_TOKEN_FIELD,
        coverage=trajectory_pb2.TOKEN_COVERAGE_RESPONSE if coverage else trajectory_pb2.TOKEN_COVERAGE_UNSPECIFIED,
        header=trajectory_pb2.UnitHeader(dtype=dtype, shape=[rows], seq_axis=0, byte_length=4 * rows,
                                         content_hash=digest(content))))


EXPECTED_ERRORS = {"outside": (InvalidArgument, "trajectory_id"), "undeclared": (InvalidArgument, "field_name"),
                   "other_role": (InvalidArgument, "field_name"), "dtype": (InvalidArgument, "header"),
                   "coverage": (InvalidArgument, "header"), "rows": (InvalidArgument, "header.shape"),
                   "key_taken": (InvalidArgument, "key")}

ATTEMPTS = st.lists(st.tuples(st.sampled_from(["t0", "t1", "t2", "t3"]), st.sampled_from(["ref_logprobs", "values"]),
                              st.integers(1, 2), st.sampled_from(DEFECTS)), max_size=24)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(attempts=ATTEMPTS, complete_at_end=st.booleans())
def test_attach_fields_matches_a_naive_reference(attempts, complete_at_end: bool) -> None:
    asyncio.run(_run(attempts, complete_at_end))


async def _run(attempts, complete_at_end: bool) -> None:
    ledger_settings = LedgerSettings(engine=EngineConfig(train_batch_size=4, num_minibatches=1, sources={"A": 1.0},
                                                         max_batches_ahead=None), topology=TOPOLOGY, schema=SCHEMA)
    ledger, journal = AdmissionLedger(ledger_settings), RecordingJournal()
    servicer = AdmissionServicer(ledger=ledger, journal=journal, job="att",
                                 metrics=AdmissionMetrics(CollectorRegistry(), ("A",)), clock=lambda: 1.0)
    await servicer.recover()
    await servicer.ReportTrajectories(pb.ReportTrajectoriesRequest(
        request_id="r", trajectories=[reported(f"t{i}") for i in range(6)]), None)
    minibatch = ledger.minibatches[1]
    assert sorted(minibatch.trajectory_ids) == ["t0", "t1", "t2", "t3"]
    model: dict[tuple[str, str], trajectory_pb2.UnitRef] = {}
    if complete_at_end:
        attempts = [*attempts, *((t, f, 1, "none") for t in ("t0", "t1", "t2", "t3")
                                 for f in ("ref_logprobs", "values"))]
    for i, (trajectory_id, field, content, defect) in enumerate(attempts):
        role, attachment = attempt(trajectory_id, field, content, defect)
        request = pb.AttachFieldsRequest(request_id=f"a{i}", role=role, sequence=1, attachments=[attachment])
        slot = (attachment.trajectory_id, attachment.unit.field_name)
        expected = EXPECTED_ERRORS.get(defect)
        if defect in ("none", "key_taken") and slot in model and model[slot] != attachment.unit:
            # The same (trajectory, field) with another unit: a conflict, whichever key it names.
            expected = (Conflict, "unit")
        try:
            response = await servicer.AttachFields(request, None)
        except KnitTransError as error:
            assert expected is not None, (defect, error)
            assert isinstance(error, expected[0]), (defect, error)
            assert error.field.startswith("attachments[0]") and error.field.endswith(expected[1]), (defect, error)
            continue
        assert expected is None, defect
        assert (response.attached, response.unchanged) == ((0, 1) if slot in model else (1, 0))
        model[slot] = attachment.unit
        assert response.complete == (len(model) == 8)
    # Gating: the actor (which consumes both fields) only once every trajectory has both; the producers at once.
    assert ready_for(ledger, minibatch, "backbone") == (len(model) == 8)
    assert ready_for(ledger, minibatch, "role:reference") and ready_for(ledger, minibatch, "role:critic")
    # A released mini-batch takes no attachment.
    live = {(t, unit.field_name): unit for t, unit in ledger.attachments.items()}
    assert live == model
    # The journal replayed, and a snapshot restored, hold the same attachments, indexed as their trajectories'.
    replayed = AdmissionLedger(ledger_settings)
    async for record in journal.replay():
        replayed.apply(record)
    restored = AdmissionLedger(ledger_settings)
    restore_ledger(restored, snapshot_of(ledger, len(journal.records), StoredFingerprints()).state, [])
    for other in (replayed, restored):
        assert {(t, unit.field_name): unit for t, unit in other.attachments.items()} == model
        for (trajectory_id, _), unit in model.items():
            assert other.index.owner(unit.key) == trajectory_id
    await servicer.close()


def test_nothing_attaches_to_a_released_mini_batch_and_the_release_deletes_the_attached_units() -> None:
    async def run() -> None:
        ledger_settings = LedgerSettings(engine=EngineConfig(train_batch_size=4, num_minibatches=1,
                                                             sources={"A": 1.0}, max_batches_ahead=None),
                                         topology=TOPOLOGY, schema=SCHEMA)
        ledger = AdmissionLedger(ledger_settings)
        deleted: list[str] = []
        servicer = AdmissionServicer(ledger=ledger, journal=RecordingJournal(), job="att",
                                     metrics=AdmissionMetrics(CollectorRegistry(), ("A",)), clock=lambda: 1.0,
                                     delete_keys=deleted.extend)
        await servicer.recover()
        await servicer.ReportTrajectories(pb.ReportTrajectoriesRequest(
            request_id="r", trajectories=[reported(f"t{i}") for i in range(4)]), None)
        for t in ("t0", "t1", "t2", "t3"):
            for field in ("ref_logprobs", "values"):
                role, attachment = attempt(t, field, 1, "none")
                await servicer.AttachFields(pb.AttachFieldsRequest(role=role, sequence=1, attachments=[attachment]),
                                            None)
        for consumer in ledger.consumers:
            assert not ledger.minibatches[1].released
            await servicer.ReportProgress(pb.ReportProgressRequest(
                consumer={"role": consumer.role, "dp_rank": consumer.dp_rank, "cp_rank": consumer.cp_rank},
                sequence=1, stage=pb.PROGRESS_STAGE_OPTIMIZER_STEP), None)
        # Released (and forgotten: every consumer is past it) only after every consumer of every role stepped.
        assert 1 not in ledger.minibatches or ledger.minibatches[1].released
        assert set(ledger.pending_deletes) | set(deleted) >= {f"{t}/{f}/1" for t in ("t0", "t1", "t2", "t3")
                                                              for f in ("ref_logprobs", "values")}
        role, attachment = attempt("t0", "ref_logprobs", 2, "none")
        try:
            await servicer.AttachFields(pb.AttachFieldsRequest(role=role, sequence=1, attachments=[attachment]), None)
        except FailedPrecondition as error:
            assert error.field == "sequence"
        else:
            raise AssertionError("attached to a released mini-batch")
        await servicer.close()

    asyncio.run(run())
