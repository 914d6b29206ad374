"""The ledger's live path (validated columns applied directly) and recovery (journal records replayed) reach the
same state, whichever form reports came in, and idempotency holds across the two forms."""

from __future__ import annotations

import hashlib

import pytest

from knittrans.admission.engine import EngineConfig, decide
from knittrans.admission.engine.decisions import Wait
from knittrans.admission.service.ingest.report import classify
from knittrans.admission.service.ledger import AdmissionLedger, LedgerSettings
from knittrans.admission.service.records import record_for
from knittrans.errors import InvalidArgument
from knittrans.types import BackboneTopology, EncoderTopology, Topology
from knittrans.v1 import admission_service_pb2 as pb
from knittrans.v1 import journal_pb2, trajectory_pb2
from knittrans.wire import consumer_to_proto
from knittrans.wire.columns import batch_from_messages

HASH = hashlib.blake2b(b"x", digest_size=16).hexdigest()
TOPOLOGY = Topology(backbone=BackboneTopology(dp=2, cp=2, max_tokens_per_microbatch=4096),
                    encoders=(EncoderTopology(name="vision", dp=1, max_cost_per_microbatch=64),))
ACCEPTED, DUPLICATE, CONFLICT = pb.REPORT_OUTCOME_ACCEPTED, pb.REPORT_OUTCOME_DUPLICATE, pb.REPORT_OUTCOME_CONFLICT


def message(index: int, tokens: int = 40, *, accepted: bool = True) -> trajectory_pb2.TrajectoryMetadata:
    trajectory_id, sample_id = f"t{index}", f"s{index // 2}"
    m = trajectory_pb2.TrajectoryMetadata(
        trajectory_id=trajectory_id, sample_id=sample_id, source="AB"[index % 2], num_tokens=tokens,
        num_loss_tokens=tokens // 2, segments=[trajectory_pb2.VersionSegment(version=0, num_tokens=tokens // 2)],
        units=[trajectory_pb2.UnitRef(
            key=f"{trajectory_id}/input_ids", field_name="input_ids", kind=trajectory_pb2.UNIT_KIND_TOKEN_FIELD,
            header=trajectory_pb2.UnitHeader(dtype=trajectory_pb2.D_TYPE_INT32, shape=[tokens], seq_axis=0,
                                             byte_length=4 * tokens, content_hash=HASH))],
        multimodal=[trajectory_pb2.MultimodalRef(
            key=f"{sample_id}/img", encoder="vision", cost=8.0, kind=trajectory_pb2.UNIT_KIND_IMAGE,
            placeholder=trajectory_pb2.TokenSpan(start=2, end=6))],
        accepted=accepted, finished_at=float(index),
    )
    m.scalars["reward"] = index / 7
    return m


def request(messages: list[trajectory_pb2.TrajectoryMetadata], form: str, request_id: str = "r"):
    if form == "batch":
        return pb.ReportTrajectoriesRequest(request_id=request_id, batch=batch_from_messages(messages))
    return pb.ReportTrajectoriesRequest(request_id=request_id, trajectories=messages)


def new_ledger() -> AdmissionLedger:
    engine = EngineConfig(train_batch_size=8, num_minibatches=2, sources={"A": 0.25, "B": 0.25},
                          max_batches_ahead=None)
    return AdmissionLedger(LedgerSettings(engine=engine, topology=TOPOLOGY))


class Journaled:
    """Drives a ledger the way the servicer does, keeping the records a durable journal would hold."""

    def __init__(self, *, keep_records: bool = True) -> None:
        self.ledger = new_ledger()
        self.records: list[journal_pb2.JournalRecord] = []
        self.keep_records = keep_records
        self.now = 100.0

    def commit(self, record: journal_pb2.JournalRecord) -> None:
        self.records.append(record)
        self.ledger.apply(record)

    def report(self, messages, form: str) -> list[int]:
        self.now += 1
        classified = classify(request(messages, form), self.ledger)
        if classified.accepted_rows:
            record = classified.record(self.now)
            self.records.append(record)
            if self.keep_records:
                self.ledger.apply(record, classified)
            else:
                self.ledger.apply_report(self.now, classified)
        self.admit_until_wait()
        return classified.outcomes

    def admit_until_wait(self) -> None:
        while True:
            decision = decide(self.ledger.engine, self.now, self.ledger.version)
            record = record_for(decision, self.now, self.ledger.last_wait)
            if record is not None:
                self.commit(record)
            if isinstance(decision, Wait):
                return

    def finish(self, sequence: int) -> None:
        for consumer in self.ledger.consumers:
            self.commit(journal_pb2.JournalRecord(at=self.now, progress=pb.ReportProgressRequest(
                consumer=consumer_to_proto(consumer), sequence=sequence, stage=pb.PROGRESS_STAGE_OPTIMIZER_STEP)))


def snapshot(ledger: AdmissionLedger) -> tuple:
    def live(trajectory_id: str) -> bytes:
        block, row = ledger._locate(trajectory_id)
        return block.columns.canonical_message(row).SerializeToString(deterministic=True)

    pool = ledger.engine.decision_view.pool
    return (
        {t: live(t) for t in ledger._rows},
        {t: ledger.fingerprint_of(t)  # released: fingerprinted, or held until then (forget_released_rows)
         for t in sorted((ledger._digests.keys() | ledger._releasing.keys()) - ledger._rows.keys())},
        ledger.index.entries(), ledger.engine.status(), [q.keys[q.head:] for q in pool.queues],
        list(ledger.engine.decision_view.filtered),
        [(s, m.admission, m.trajectory_ids, m.owed_steps) for s, m in sorted(ledger.minibatches.items())],
        dict(ledger.acknowledged), list(ledger.pending_deletes), ledger.version, ledger.admitted_total,
    )


def scenario(driver: Journaled) -> None:
    assert driver.report([message(i) for i in range(5)], "batch") == [ACCEPTED] * 5
    # A re-send in the other form is a duplicate; a changed trajectory conflicts; new ones join in the same report.
    outcomes = driver.report([message(1), message(2, tokens=41), message(5), message(6, accepted=False)], "messages")
    assert outcomes == [DUPLICATE, CONFLICT, ACCEPTED, ACCEPTED]
    outcomes = driver.report([message(0), message(7), message(8), message(3, tokens=99)], "batch")
    assert outcomes == [DUPLICATE, ACCEPTED, ACCEPTED, CONFLICT]  # the journal keeps only the two new ones
    driver.finish(1)  # releases mini-batch 1: its trajectories keep only their fingerprints
    assert driver.report([message(i) for i in range(9, 14)], "messages") == [ACCEPTED] * 5


@pytest.mark.parametrize("keep_records", [True, False])
def test_replaying_the_journal_rebuilds_the_live_state(keep_records: bool) -> None:
    live = Journaled(keep_records=keep_records)
    scenario(live)
    assert live.ledger.released_minibatches == 1 and live.ledger.next_sequence > 2
    replayed = new_ledger()
    for record in live.records:
        replayed.apply(journal_pb2.JournalRecord.FromString(record.SerializeToString()))
    assert snapshot(replayed) == snapshot(live.ledger)
    # Both still tell re-sends apart, released trajectories included, in either form.
    resend = [message(0), message(2), message(2 + 100)]
    for form in ("batch", "messages"):
        assert [c.outcomes for c in (classify(request(resend, form), live.ledger),
                                     classify(request(resend, form), replayed))] == [[DUPLICATE] * 2 + [ACCEPTED]] * 2
        changed = [message(0, tokens=12)]
        assert classify(request(changed, form), replayed).outcomes == [CONFLICT]


def test_a_report_with_both_forms_or_a_taken_key_is_refused_whole() -> None:
    driver = Journaled()
    driver.report([message(0), message(1)], "batch")
    both = request([message(2)], "batch")
    both.trajectories.append(message(3))
    with pytest.raises(InvalidArgument) as info:
        classify(both, driver.ledger)
    assert info.value.field == "batch"
    thief = message(4)
    thief.units[0].key = "t1/input_ids"
    foreign = message(6)
    foreign.multimodal[0].key = "s0/img"
    own = message(8)
    own.multimodal[0].key = own.units[0].key
    for bad, field in ((thief, "trajectories[1].units[0].key"), (foreign, "trajectories[1].multimodal[0].key"),
                       (own, "trajectories[1].multimodal[0].key")):
        for form in ("batch", "messages"):
            with pytest.raises(InvalidArgument) as info:
                classify(request([message(10), bad], form), driver.ledger)
            assert info.value.field == field
    assert len(driver.ledger._rows) == 2
