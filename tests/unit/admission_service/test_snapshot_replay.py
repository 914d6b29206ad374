"""A snapshot plus the journal's tail rebuilds what replaying the whole journal rebuilds.

The journal comes from the real servicer driven by random calls (reports in both forms, re-sends, filtered and
multimodal trajectories, typed values under the schema the first trajectory fixes, groups, scheduled counts,
progress of every stage, failures, version advances, checkpoints under each retention policy, reservations that
expire or are cancelled, expiry sweeps, deleted units); the naive reference replays every record into a fresh
ledger. The candidate restores snapshots taken at random points (each one built on the previous one's fingerprint
chunks, as the service stores them) and replays only the records after the last. Both are compared through what
the ledger answers (live metadata, fingerprints, index, engine status and its next decision, mini-batches, positions,
verdicts, failures, pending deletions, checkpoint, expiring reservations, schema), not through the snapshot
encoding alone; and every field of the ledger and the engine is compared generically as well.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import hashlib

import numpy as np
from google.protobuf.message import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from knittrans.admission.engine import EngineConfig, decide
from knittrans.admission.service import reservation_gc
from knittrans.admission.service.block_merge import merge_blocks
from knittrans.admission.service.journal import AppendOutcome
from knittrans.admission.service.ledger import AdmissionLedger, LedgerSettings
from knittrans.admission.service.metrics import AdmissionMetrics
from knittrans.admission.service.retention import RetentionPolicy
from knittrans.admission.service.servicer import AdmissionServicer
from knittrans.admission.service.snapshot import StoredFingerprints, restore_ledger, snapshot_of
from knittrans.errors import KnitTransError
from knittrans.trajectory_schema import Coverage, MetadataSchema, ScalarSchema, TokenFieldSchema, TrajectorySchema
from knittrans.types import AdmissionUnit, BackboneTopology, DType, EncoderTopology, Topology
from knittrans.v1 import admission_service_pb2 as pb
from knittrans.v1 import journal_pb2, snapshot_pb2, trajectory_pb2
from knittrans.values import MetadataKind, ScalarKind
from knittrans.wire import consumer_to_proto
from knittrans.wire.columns import batch_from_messages

HASH = hashlib.blake2b(b"x", digest_size=16).hexdigest()
TOPOLOGY = Topology(backbone=BackboneTopology(dp=1, cp=2, max_tokens_per_microbatch=4096),
                    encoders=(EncoderTopology(name="vision", dp=1, max_cost_per_microbatch=64),))
SOURCES = {"A": 0.25, "B": 0.25}
ENGINES = {
    "plain": EngineConfig(train_batch_size=4, num_minibatches=2, sources=SOURCES, max_batches_ahead=None),
    "bounded": EngineConfig(train_batch_size=4, num_minibatches=2, sources=SOURCES, staleness_bound=1,
                            completion_quota=0.5, max_batches_ahead=1),
    "groups": EngineConfig(train_batch_size=4, num_minibatches=2, sources=SOURCES, group_size=2,
                           admission_unit=AdmissionUnit.GROUP, max_batches_ahead=None),
}
RETENTIONS = {
    "release at once": RetentionPolicy(),
    "retain 2 steps": RetentionPolicy(retain_steps=2),
    "until checkpoint": RetentionPolicy(retain_until_checkpoint=True),
}
UNIT_TTL = 20.0  # seconds an unreported reservation lives
SCHEMAS = {
    "derived": None,  # the first accepted trajectory fixes it: only the ledger (and so the snapshot) knows it
    "declared": TrajectorySchema(
        token_fields={"input_ids": TokenFieldSchema(dtype=DType.INT32),
                      "old_logprobs": TokenFieldSchema(dtype=DType.FLOAT32, coverage=Coverage.RESPONSE)},
        scalars={"reward": ScalarSchema(kind=ScalarKind.FLOAT), "turns": ScalarSchema(kind=ScalarKind.INT,
                                                                                      required=False),
                 "solved": ScalarSchema(kind=ScalarKind.BOOL, required=False)},
        metadata={"uid": MetadataSchema(kind=MetadataKind.STR, max_bytes=16, required=False),
                  "raw": MetadataSchema(kind=MetadataKind.BYTES, max_bytes=2, required=False)}),
}


class RecordingJournal:
    """A journal that keeps its records in a list (the property is about the ledger, not the store)."""

    keeps_records = True

    def __init__(self) -> None:
        self.records: list[bytes] = []

    async def append(self, record: journal_pb2.JournalRecord) -> AppendOutcome:
        assert record.sequence == len(self.records) + 1
        self.records.append(record.SerializeToString(deterministic=True))
        return AppendOutcome.APPENDED

    async def replay(self, after: int = 0):
        for raw in self.records[after:]:
            yield journal_pb2.JournalRecord.FromString(raw)

    async def read_snapshot(self):
        return None

    async def write_snapshot(self, *args) -> None:
        raise AssertionError("not in this test")

    async def close(self) -> None:
        return None


def trajectory(index: int, *, tokens: int, images: int, accepted: bool, sample: int, version: int, step: int,
               source: str, values: str = "none") -> trajectory_pb2.TrajectoryMetadata:
    trajectory_id, sample_id = f"t{index}", f"s{sample}"
    response = tokens - tokens // 4  # a response-only field covers the last tokens
    m = trajectory_pb2.TrajectoryMetadata(
        trajectory_id=trajectory_id, sample_id=sample_id, source=source, num_tokens=tokens, rollout_step=step,
        num_loss_tokens=tokens // 2, segments=[trajectory_pb2.VersionSegment(version=version, num_tokens=tokens)],
        units=[trajectory_pb2.UnitRef(
            key=f"{trajectory_id}/input_ids", field_name="input_ids", kind=trajectory_pb2.UNIT_KIND_TOKEN_FIELD,
            header=trajectory_pb2.UnitHeader(dtype=trajectory_pb2.D_TYPE_INT32, shape=[tokens], seq_axis=0,
                                             byte_length=4 * tokens, content_hash=HASH)),
            trajectory_pb2.UnitRef(
                key=f"{trajectory_id}/old_logprobs", field_name="old_logprobs",
                kind=trajectory_pb2.UNIT_KIND_TOKEN_FIELD, coverage=trajectory_pb2.TOKEN_COVERAGE_RESPONSE,
                header=trajectory_pb2.UnitHeader(dtype=trajectory_pb2.D_TYPE_FLOAT32, shape=[response], seq_axis=0,
                                                 byte_length=4 * response, content_hash=HASH))],
        response_start=tokens // 4,
        multimodal=[trajectory_pb2.MultimodalRef(
            key=f"{sample_id}/img{k}", encoder="vision", cost=8.0, kind=trajectory_pb2.UNIT_KIND_IMAGE,
            placeholder=trajectory_pb2.TokenSpan(start=2 + 8 * k, end=6 + 8 * k)) for k in range(images)],
        accepted=accepted, finished_at=float(index),
    )
    m.scalars["reward"] = index / 7
    if values == "typed":  # the kinds the first trajectory with values fixes
        m.values.int_scalars["turns"] = index % 5 - 2
        m.values.bool_scalars["solved"] = index % 2 == 0
        m.values.metadata["uid"].text = f"u{index}"
        m.values.metadata["raw"].data = bytes([index % 256]) * (index % 3)
    elif values == "other":  # other names and kinds: a schema fixed by "typed" refuses them, and vice versa
        m.values.bool_scalars["turns"] = True
        m.values.metadata["extra"].json = f'{{"i": {index}}}'
    return m


reports = st.tuples(st.just("report"), st.integers(1, 6), st.sampled_from(["batch", "messages"]), st.booleans(),
                    st.integers(0, 2), st.integers(0, 3), st.integers(0, 2),
                    st.sampled_from(["typed", "typed", "typed", "mixed", "none", "other"]))
operations = st.lists(st.one_of(
    reports, reports, reports,
    st.tuples(st.just("resend"), st.integers(0, 40), st.booleans()),
    st.tuples(st.just("progress"), st.integers(0, 2), st.integers(1, 4),
              st.sampled_from([pb.PROGRESS_STAGE_VERIFIED, pb.PROGRESS_STAGE_DELIVERED,
                               pb.PROGRESS_STAGE_OPTIMIZER_STEP])),
    st.tuples(st.just("finish"), st.integers(1, 5)),
    st.tuples(st.just("finish"), st.integers(1, 5)),
    st.tuples(st.just("scheduled"), st.integers(0, 2), st.integers(1, 4), st.sampled_from(["", "r1", "r2"])),
    st.tuples(st.just("version")),
    st.tuples(st.just("failure"), st.integers(0, 2), st.integers(1, 5)),
    st.tuples(st.just("reserve"), st.integers(100, 104), st.sampled_from(["multimodal", "own", "both"])),
    st.tuples(st.just("cancel"), st.integers(100, 104)),
    st.tuples(st.just("tick"), st.floats(0.1, 30.0)),
    st.tuples(st.just("checkpoint"), st.integers(0, 3)),
    st.tuples(st.just("expire"), st.floats(0.0, 30.0)),
), min_size=8, max_size=60)


async def drive(settings: LedgerSettings, ops: list[tuple]) -> list[bytes]:
    clock = [1000.0]
    journal = RecordingJournal()
    ledger = AdmissionLedger(settings)
    servicer = AdmissionServicer(ledger=ledger, journal=journal, metrics=AdmissionMetrics(CollectorRegistry(),
                                 settings.engine.sources), job="snap", clock=lambda: clock[0],
                                 unreported_unit_ttl_seconds=UNIT_TTL)
    await servicer.recover()
    consumers = [consumer_to_proto(c) for c in ledger.consumers]
    sent: dict[int, trajectory_pb2.TrajectoryMetadata] = {}
    for op in ops:
        clock[0] += 1.0
        kind = op[0]
        try:
            if kind == "report":
                _, count, form, accepted, images, step, version_lag, values = op
                start = len(sent)
                messages = [trajectory(start + i, tokens=16 + i, images=images, accepted=accepted or i > 0,
                                       sample=(start + i) // 2, version=max(0, ledger.version - version_lag),
                                       step=step, source="AB"[(start + i) // 2 % 2],
                                       values=("none", "typed")[i % 2] if values == "mixed" else values)
                            for i in range(count)]
                sent.update(enumerate(messages, start))
                request = (pb.ReportTrajectoriesRequest(batch=batch_from_messages(messages)) if form == "batch"
                           else pb.ReportTrajectoriesRequest(trajectories=messages))
                await servicer.ReportTrajectories(request, None)
            elif kind == "resend" and sent:
                _, index, changed = op
                message = trajectory_pb2.TrajectoryMetadata()
                message.CopyFrom(sent[index % len(sent)])
                if changed:
                    message.scalars["reward"] = -1.0
                await servicer.ReportTrajectories(pb.ReportTrajectoriesRequest(trajectories=[message]), None)
            elif kind == "progress":
                _, consumer, sequence, stage = op
                await servicer.ReportProgress(pb.ReportProgressRequest(
                    consumer=consumers[consumer % len(consumers)], sequence=sequence, stage=stage), None)
            elif kind == "finish":  # every consumer steps on a mini-batch that owes steps (or on any sequence)
                owed = [s for s, m in sorted(ledger.minibatches.items()) if m.owed_steps] or [op[1]]
                for consumer in consumers:
                    await servicer.ReportProgress(pb.ReportProgressRequest(
                        consumer=consumer, sequence=owed[op[1] % len(owed)],
                        stage=pb.PROGRESS_STAGE_OPTIMIZER_STEP), None)
            elif kind == "scheduled":
                await servicer.ReportScheduled(pb.ReportScheduledRequest(rollout_step=op[1], count=op[2],
                                                                         request_id=op[3]), None)
            elif kind == "version":
                await servicer.AdvanceVersion(pb.AdvanceVersionRequest(new_version=ledger.engine.train_version), None)
            elif kind == "failure":
                _, consumer, sequence = op
                await servicer.ReportConsumerFailure(pb.ReportConsumerFailureRequest(failure=pb.ConsumerFailure(
                    consumer=consumers[consumer % len(consumers)], sequence=sequence, reason="broken")), None)
            elif kind == "reserve":
                _, number, held = op
                await servicer.ReserveUnits(pb.ReserveUnitsRequest(reservations=[pb.UnitReservation(
                    trajectory_id=f"t{number}", sample_id=f"r{number}",
                    multimodal_keys=[f"r{number}/img0"] if held != "own" else [],
                    unit_keys=[f"t{number}/input_ids"] if held != "multimodal" else [])]), None)
            elif kind == "cancel":
                await asyncio.wait_for(servicer.CancelReservations(
                    pb.CancelReservationsRequest(trajectory_ids=[f"t{op[1]}"]), None), 0.01)
            elif kind == "tick":
                clock[0] += op[1]
                await servicer._timed_admission()
            elif kind == "checkpoint":  # the step of a held mini-batch, counted from the newest
                steps = sorted(m.step for m in ledger.minibatches.values()) or [(0, 0)]
                train_batch, minibatch = steps[-1 - op[1] % len(steps)]
                await servicer.ReportCheckpoint(pb.ReportCheckpointRequest(
                    train_batch_index=train_batch, minibatch_index=minibatch), None)
            elif kind == "expire":  # what the service's sweep does at this time
                clock[0] += op[1]
                async with servicer._commits.mutating():
                    await reservation_gc.expire_due(ledger=ledger, commit=servicer._commit, now=clock[0])
        except (KnitTransError, TimeoutError):
            pass  # refused calls journal nothing
        if ledger.pending_deletes and clock[0] % 3 < 1:  # what the deleter journals once units are gone
            keys = list(ledger.pending_deletes)[:2]
            await servicer._commit(journal_pb2.JournalRecord(at=clock[0], deleted=journal_pb2.UnitsDeleted(keys=keys)))
    await servicer.close()
    return journal.records


def replay(settings: LedgerSettings, records: list[bytes]) -> AdmissionLedger:
    ledger = AdmissionLedger(settings)
    for raw in records:
        ledger.apply(journal_pb2.JournalRecord.FromString(raw))
    return ledger


def restored(settings: LedgerSettings, records: list[bytes], cuts: list[int]) -> AdmissionLedger:
    """Snapshots at each cut in turn (each restored from the previous one, its fingerprint chunks kept), then
    the records after the last cut."""
    ledger = AdmissionLedger(settings)
    applied, stored, chunks = 0, StoredFingerprints(), []
    for cut in cuts:
        for raw in records[applied:cut]:
            ledger.apply(journal_pb2.JournalRecord.FromString(raw))
        snapshot = snapshot_of(ledger, cut, stored)
        if snapshot.new_chunk is not None:
            chunks.append(snapshot.new_chunk.SerializeToString())
        state = snapshot.state.SerializeToString()
        ledger = AdmissionLedger(settings)
        stored = restore_ledger(ledger, snapshot_pb2.AdmissionSnapshot.FromString(state), list(chunks))
        # Every block read from batches merged into one: the rows answer as they did in their own blocks.
        merge_blocks(ledger, [n for n, b in ledger._blocks.items() if b.columns.messages is None])
        applied = cut
    for raw in records[applied:]:
        ledger.apply(journal_pb2.JournalRecord.FromString(raw))
    return ledger


def dump(value: object, skip: frozenset[str] = frozenset()) -> object:
    """Every field of an object graph as plain values, found generically (``__dict__``, ``__slots__``), so that a
    field the snapshot forgets shows up whatever it is."""
    if isinstance(value, (str, bytes, int, float, bool, type(None), enum.Enum)):
        return value
    if isinstance(value, Message):
        return value.SerializeToString(deterministic=True)
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, dict):  # as a map (observed() compares the orders that matter)
        return sorted(((dump(k), dump(v)) for k, v in value.items()), key=repr)
    if isinstance(value, (set, frozenset)):
        return sorted(map(repr, map(dump, value)))
    if isinstance(value, (list, tuple, collections.deque)):
        return [dump(v) for v in value]
    names = list(getattr(value, "__dict__", {})) + [n for c in type(value).__mro__ for n in getattr(c, "__slots__", ())]
    return (type(value).__name__, [(n, dump(getattr(value, n))) for n in names if n not in skip and hasattr(value, n)])


def internals(ledger: AdmissionLedger) -> object:
    """The ledger's and the engine's fields, but for row handles and blocks (internal numbering and layout, and
    released rows held until fingerprinted: compared through fingerprint_of in observed; the
    index's insertion order follows the blocks' and nothing reads it), the fingerprints cached for
    live trajectories (a cache: compared through fingerprint_of in observed) and what the config determines."""
    # The engine's _generation counts the transitions this process applied (a cache key for the replay), not state.
    engine = dump(ledger.engine, frozenset({"config", "targets", "_inputs", "_generation"}))
    inputs = dump(ledger.engine._inputs, frozenset({"targets", "pool", "last_wait"}))
    index = dump(ledger.index, frozenset({"_generation"}))
    rest = dump(ledger, frozenset({"settings", "engine", "index", "_rows", "_releasing", "_blocks", "_next_block",
                                   "_digests", "limits", "minibatches", "_small_blocks", "_examined_block"}))
    minibatches = [dump(m, frozenset({"dispatch"})) for _, m in sorted(ledger.minibatches.items())]
    return engine, inputs, index, rest, minibatches


def observed(ledger: AdmissionLedger, now: float) -> tuple:
    def live(trajectory_id: str) -> bytes:
        block, row = ledger._locate(trajectory_id)
        return block.columns.message(row).SerializeToString(deterministic=True)

    view = ledger.engine.decision_view
    status = ledger.engine.status()
    return (
        {t: live(t) for t in ledger._rows},
        {t: ledger.fingerprint_of(t)
         for t in sorted(ledger._digests.keys() | ledger._rows.keys() | ledger._releasing.keys())},
        sorted(ledger.index.entries(), key=lambda e: e.trajectory_id),
        sorted((k, ledger.index.refcount(k)) for k in ledger.index.live_keys()),
        {t: ledger.index.reservation(t) for t in (f"t{i}" for i in range(100, 105))},
        dict(ledger.media), ledger.schema,
        status, [q.keys[q.head:] for q in view.pool.queues], sorted(view.pool.units.items()), list(view.filtered),
        _decision(ledger, now, 0), _decision(ledger, now + 1000, 1),
        view.units_needed, view.source_targets, view.starving_since, view.last_wait and view.last_wait.detail,
        [(s, m.admission.SerializeToString(), m.trajectory_ids, m.owed_steps, m.verified, m.verdict, m.released)
         for s, m in sorted(ledger.minibatches.items())],
        [ledger.verdict(s) for s in range(1, ledger.next_sequence)], ledger.next_sequence,
        dict(ledger.acknowledged), list(ledger.pending_deletes), ledger.version, ledger.admitted_total,
        ledger.dropped_stale, ledger.released_minibatches, ledger.quota_violations, ledger.blocking(),
        sorted(ledger.scheduled_requests), dict(ledger.scheduled), sorted(map(str, ledger.failure_keys)),
        [f.SerializeToString() for f in ledger.recent_failures], ledger.failed_sequences, ledger.checkpoint,
        ledger.expiry.expired(now, limit=100),
        {t: ledger.expiry.unit_keys(t) for t in (f"t{i}" for i in range(100, 105))},
    )


def _decision(ledger: AdmissionLedger, now: float, versions_ahead: int) -> object:
    try:
        return decide(ledger.engine, now, ledger.version + versions_ahead)
    except KnitTransError as exc:
        return str(exc)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(engine=st.sampled_from(sorted(ENGINES)), retention=st.sampled_from(sorted(RETENTIONS)),
       schema=st.sampled_from(sorted(SCHEMAS)), ops=operations, data=st.data())
def test_snapshot_plus_tail_equals_the_whole_journal(engine: str, retention: str, schema: str, ops: list[tuple],
                                                     data: st.DataObject) -> None:
    config = LedgerSettings(engine=ENGINES[engine], topology=TOPOLOGY, retention=RETENTIONS[retention],
                            schema=SCHEMAS[schema])
    records = asyncio.run(drive(config, ops))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(records)), min_size=1, max_size=3), label="cuts"))
    reference = replay(config, records)
    candidate = restored(config, records, cuts)
    assert observed(candidate, 5000.0) == observed(reference, 5000.0)
    assert internals(candidate) == internals(reference)
    # And they go on the same way: the same next decisions after the same new report.
    for ledger in (reference, candidate):
        for record in _one_more_report(ledger):
            ledger.apply(record)
    assert observed(candidate, 6000.0) == observed(reference, 6000.0)
    assert internals(candidate) == internals(reference)


def _one_more_report(ledger: AdmissionLedger) -> list[journal_pb2.JournalRecord]:
    from knittrans.admission.service.ingest.report import classify

    messages = [trajectory(500 + i, tokens=20, images=1, accepted=True, sample=250 + i // 2, version=ledger.version,
                           step=0, source="AB"[i // 2 % 2]) for i in range(4)]
    report = classify(pb.ReportTrajectoriesRequest(batch=batch_from_messages(messages)), ledger)
    record = report.record(5500.0)
    return [] if record is None else [record]
