"""The admission ledger as an :class:`~knittrans.v1.snapshot_pb2.AdmissionSnapshot`, and back.

A snapshot is the ledger after journal record ``sequence``: :func:`snapshot_of` writes it, :func:`restore_ledger`
reads it into a fresh ledger, and applying records ``sequence + 1`` onwards then gives the state a replay of the
whole journal gives. Released data is not in it (only released trajectories' fingerprints, which tell a re-send
from a conflict), so recovery no longer replays it.

Live trajectories are kept per applied report, in the form they came in, and restored through the same column
and index code as a replayed report; what the ledger only derives (row handles, the unit index's entries and
counts, each report's oldest versions) is rebuilt, not stored. A schema the config declares is the config's (as
on replay); one the first trajectory fixed, the checkpoint and the expiring reservations come from the snapshot.
This module reads and sets the ledger's private fields: it is the ledger's other half, kept apart so that
ledger.py stays readable.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import islice

from knittrans.admission.engine.decisions import Wait
from knittrans.admission.engine.image import (
    CompletionImage,
    EngineImage,
    PendingGroupImage,
    engine_image,
    restore_engine,
)
from knittrans.admission.service.block_merge import SMALL_BLOCK, merge_blocks
from knittrans.admission.service.ingest.report import check_keys
from knittrans.admission.service.ingest.rules import oldest_versions
from knittrans.admission.service.ledger import _BLOCK_SHIFT, RECENT_FAILURES, AdmissionLedger, _Block
from knittrans.admission.service.records import blocking_from_proto, blocking_to_proto
from knittrans.admission.service.retention import AdmittedMiniBatch, Verdict
from knittrans.admission.service.snapshot_schema import read_schema, write_schema
from knittrans.admission.service.trajectory_columns import TrajectoryColumns
from knittrans.errors import FailedPrecondition
from knittrans.types import SampleId, TrajectoryId, UnitKey
from knittrans.v1 import admission_pb2, admission_service_pb2, snapshot_pb2
from knittrans.wire import consumer_to_proto
from knittrans.wire.topology import consumer_from_proto

FINGERPRINT_SIZE = 16  # bytes of ingest.rules.fingerprint
_VERDICT_TO_PROTO = {Verdict.PENDING: admission_service_pb2.MINI_BATCH_VERDICT_PENDING,
                     Verdict.OK: admission_service_pb2.MINI_BATCH_VERDICT_OK,
                     Verdict.FAILED: admission_service_pb2.MINI_BATCH_VERDICT_FAILED}
_VERDICT_FROM_PROTO = {number: verdict for verdict, number in _VERDICT_TO_PROTO.items()}


@dataclass(frozen=True, kw_only=True)
class StoredFingerprints:
    """How many fingerprint chunks, holding how many of the ledger's fingerprints (its first ones, in order),
    the stored snapshot includes."""

    chunks: int = 0
    count: int = 0


@dataclass(frozen=True, kw_only=True)
class Snapshot:
    """A snapshot to store: the state, and the fingerprint chunk it adds (None: no new fingerprints)."""

    state: snapshot_pb2.AdmissionSnapshot
    new_chunk: snapshot_pb2.FingerprintChunk | None

    @property
    def stored(self) -> StoredFingerprints:
        return StoredFingerprints(chunks=self.state.fingerprint_chunks, count=self.state.fingerprint_count)


def snapshot_of(ledger: AdmissionLedger, sequence: int, stored: StoredFingerprints) -> Snapshot:
    """The ledger as it is after journal record ``sequence`` (the caller holds the journal's lock), with the
    fingerprints added since the ``stored`` snapshot as a new chunk."""
    ledger.forget_released_rows()  # a released trajectory is stored by its fingerprint only
    digests = ledger._digests
    new_chunk = None
    if len(digests) > stored.count:
        added = list(islice(digests.items(), stored.count, None))
        new_chunk = snapshot_pb2.FingerprintChunk(trajectory_ids=[trajectory_id for trajectory_id, _ in added],
                                                  fingerprints=b"".join(digest for _, digest in added))
    snapshot = snapshot_pb2.AdmissionSnapshot(
        fingerprint_chunks=stored.chunks + (new_chunk is not None), fingerprint_count=len(digests),
        sequence=sequence, version=ledger.version, next_sequence=ledger.next_sequence,
        admitted_total=ledger.admitted_total, dropped_stale=ledger.dropped_stale,
        released_minibatches=ledger.released_minibatches, quota_violations=ledger.quota_violations,
        consumers=[consumer_to_proto(c) for c in ledger.consumers], sources=list(ledger.settings.engine.sources),
        scheduled_requests=sorted(ledger.scheduled_requests), scheduled=ledger.scheduled,
        pending_deletes=list(ledger.pending_deletes), fingerprint_size=FINGERPRINT_SIZE,
    )
    _write_engine(snapshot.engine, engine_image(ledger.engine))
    live: dict[int, list[int]] = {}
    for handle in ledger._rows.values():
        live.setdefault(handle >> _BLOCK_SHIFT, []).append(handle & ((1 << _BLOCK_SHIFT) - 1))
    for number, block in ledger._blocks.items():
        rows = sorted(live[number])
        report = snapshot.live_reports.add()
        columns = block.columns
        if columns.messages is not None:
            report.trajectories.extend(columns.messages[i] for i in rows)
        else:
            report.batch.CopyFrom(columns.take(rows))
    for key, (encoder, cost, length, kind, content_hash) in ledger._media.items():
        snapshot.media.add(key=key, encoder=encoder, cost=cost, placeholder_length=length, kind=kind,
                           content_hash=content_hash)
    for trajectory_id, (sample_id, keys) in ledger.index._reservations.items():
        snapshot.reservations.add(trajectory_id=trajectory_id, sample_id=sample_id, multimodal_keys=keys)
    for minibatch in ledger.minibatches.values():
        snapshot.minibatches.add(
            sequence=minibatch.sequence, admission=minibatch.admission,
            owed_steps=[consumer_to_proto(c) for c in ledger.consumers if c in minibatch.owed_steps],
            verified=[consumer_to_proto(c) for c in ledger.consumers if c in minibatch.verified],
            verdict=_VERDICT_TO_PROTO[minibatch.verdict], released=minibatch.released,
            role_verdicts={group: _VERDICT_TO_PROTO[v] for group, v in minibatch.role_verdicts.items()},
            first_step_at=minibatch.first_step_at,
        )
    for trajectory_id, unit in ledger.attachments.items():
        snapshot.attached.add(trajectory_id=trajectory_id, unit=unit)
    for (_, _), failure in sorted(ledger.role_failed_verdicts.items()):
        snapshot.role_failed_verdicts.append(failure)
    for consumer, position in ledger.acknowledged.items():
        snapshot.acknowledged.add(consumer=consumer_to_proto(consumer), sequence=position)
    if ledger.last_wait is not None:
        _write_wait(snapshot.last_wait, ledger.last_wait)
    if ledger.schema is not None:
        write_schema(snapshot.schema, ledger.schema)
    if ledger.checkpoint is not None:  # present even at step (0, 0)
        train_batch_index, minibatch_index = ledger.checkpoint
        snapshot.checkpoint.CopyFrom(snapshot_pb2.StepIndex(train_batch_index=train_batch_index,
                                                            minibatch_index=minibatch_index))
    for trajectory_id, (expires_at, unit_keys) in ledger.expiry.held():
        snapshot.expiring_reservations.add(trajectory_id=trajectory_id, expires_at=expires_at, unit_keys=unit_keys)
    for consumer, failed in sorted(ledger.failure_keys, key=lambda key: (key[1], str(key[0]))):
        snapshot.failure_keys.add(consumer=consumer_to_proto(consumer), sequence=failed)
    snapshot.recent_failures.extend(ledger.recent_failures)
    for failed, failure in ledger.failed_verdicts.items():
        snapshot.failed_verdicts[failed].CopyFrom(failure)
    return Snapshot(state=snapshot, new_chunk=new_chunk)


def restore_ledger(ledger: AdmissionLedger, snapshot: snapshot_pb2.AdmissionSnapshot,
                   chunks: Sequence[bytes]) -> StoredFingerprints:
    """Set a fresh ledger (nothing applied yet) to the state ``snapshot`` holds, with the fingerprints of its
    ``chunks`` (the stored chunks, at least as many as it includes). Nothing of ``snapshot`` is kept (the ledger
    copies what it holds), so the parsed snapshot is freed afterwards."""
    if ledger.next_sequence != 1 or ledger._rows or ledger._digests:
        raise FailedPrecondition("a snapshot is restored into a fresh ledger only")
    consumers = tuple(consumer_from_proto(c) for c in snapshot.consumers)
    if consumers != ledger.consumers:
        raise FailedPrecondition(f"the snapshot's consumers {consumers} are not the topology's {ledger.consumers}")
    if tuple(snapshot.sources) != tuple(ledger.settings.engine.sources):
        raise FailedPrecondition(f"the snapshot's sources {list(snapshot.sources)} are not the configured ones")
    ledger.engine = restore_engine(ledger.settings.engine, _read_engine(snapshot.engine))
    ledger.version = snapshot.version
    for report in snapshot.live_reports:
        _restore_block(ledger, report)
    small = [n for n, b in ledger._blocks.items() if b.columns.messages is None and len(b.columns) < SMALL_BLOCK]
    if len(small) > 1:
        merge_blocks(ledger, small)
    index = ledger.index
    for reservation in snapshot.reservations:
        index.reserve(TrajectoryId(reservation.trajectory_id), SampleId(reservation.sample_id),
                      [UnitKey(key) for key in reservation.multimodal_keys])
    if len(chunks) < snapshot.fingerprint_chunks:
        raise FailedPrecondition(f"the snapshot includes {snapshot.fingerprint_chunks} fingerprint chunks, "
                                 f"{len(chunks)} are stored")
    size = snapshot.fingerprint_size
    digests = ledger._digests
    for raw in chunks[: snapshot.fingerprint_chunks]:
        chunk = snapshot_pb2.FingerprintChunk.FromString(raw)
        blob = chunk.fingerprints
        digests.update(zip(chunk.trajectory_ids, (blob[i : i + size] for i in range(0, len(blob), size)),
                           strict=True))
    if len(digests) != snapshot.fingerprint_count:
        raise FailedPrecondition(f"the snapshot's fingerprint chunks hold {len(digests)} fingerprints, "
                                 f"{snapshot.fingerprint_count} expected")
    ledger._media = {
        m.key: (m.encoder, m.cost, m.placeholder_length, m.kind, m.content_hash if m.HasField("content_hash") else None)
        for m in snapshot.media
    }
    for kept in snapshot.minibatches:
        admission = admission_pb2.MiniBatchAdmission()
        admission.CopyFrom(kept.admission)
        ledger.minibatches[kept.sequence] = AdmittedMiniBatch(
            sequence=kept.sequence, admission=admission,
            trajectory_ids=tuple(TrajectoryId(t) for t in admission.trajectory_ids),
            owed_steps={consumer_from_proto(c) for c in kept.owed_steps},
            verified={consumer_from_proto(c) for c in kept.verified},
            verdict=_VERDICT_FROM_PROTO[kept.verdict], released=kept.released,
            role_verdicts={group: _VERDICT_FROM_PROTO[v] for group, v in sorted(kept.role_verdicts.items())},
            first_step_at=kept.first_step_at if kept.HasField("first_step_at") else None,
        )
    for attachment in snapshot.attached:  # after the live reports: the index counts the keys as their own
        ledger.attachments.record(TrajectoryId(attachment.trajectory_id), attachment.unit)
        ledger.index.attach_unit(TrajectoryId(attachment.trajectory_id), UnitKey(attachment.unit.key))
    ledger.next_sequence = snapshot.next_sequence
    for position in snapshot.acknowledged:
        ledger.acknowledged[consumer_from_proto(position.consumer)] = position.sequence
    ledger.scheduled_requests = set(snapshot.scheduled_requests)
    ledger.scheduled = dict(sorted(snapshot.scheduled.items()))
    ledger.pending_deletes = dict.fromkeys(UnitKey(key) for key in snapshot.pending_deletes)
    ledger.last_wait = _read_wait(snapshot.last_wait)
    ledger.admitted_total = snapshot.admitted_total
    ledger.dropped_stale = snapshot.dropped_stale
    ledger.released_minibatches = snapshot.released_minibatches
    ledger.quota_violations = snapshot.quota_violations
    if ledger.settings.schema is None:  # a declared schema is the config's, as on replay
        ledger.schema = read_schema(snapshot.schema) if snapshot.HasField("schema") else None
    if snapshot.HasField("checkpoint"):
        ledger.checkpoint = (snapshot.checkpoint.train_batch_index, snapshot.checkpoint.minibatch_index)
    for held in snapshot.expiring_reservations:
        ledger.expiry.hold(TrajectoryId(held.trajectory_id), held.expires_at, [UnitKey(k) for k in held.unit_keys])
    ledger.failure_keys = {(consumer_from_proto(key.consumer), key.sequence) for key in snapshot.failure_keys}
    ledger.failed_sequences = {key.sequence for key in snapshot.failure_keys}
    ledger.recent_failures = deque((_copy_failure(f) for f in snapshot.recent_failures), maxlen=RECENT_FAILURES)
    ledger.failed_verdicts = {failed: _copy_failure(f) for failed, f in sorted(snapshot.failed_verdicts.items())}
    ledger.role_failed_verdicts = {(f.sequence, f.consumer.role): _copy_failure(f)
                                   for f in snapshot.role_failed_verdicts}
    return StoredFingerprints(chunks=snapshot.fingerprint_chunks, count=snapshot.fingerprint_count)


def _restore_block(ledger: AdmissionLedger, report: admission_service_pb2.ReportTrajectoriesRequest) -> None:
    """The live rows of one report, as applying it added them (its pool entries are in the engine's image)."""
    report = admission_service_pb2.ReportTrajectoriesRequest.FromString(report.SerializeToString())  # own arena
    if report.HasField("batch"):
        columns = TrajectoryColumns.from_proto(report.batch)
    else:
        columns = TrajectoryColumns.from_messages(report.trajectories)
    rows = list(range(len(columns)))
    if not rows:
        return
    checked = check_keys(columns, rows, ledger.index)
    number = ledger._next_block
    ledger._next_block += 1
    ledger._blocks[number] = _Block(columns, len(rows), oldest_versions(columns))
    base = number << _BLOCK_SHIFT
    ledger._rows.update(zip(columns.trajectory_ids, range(base, base + len(rows)), strict=True))
    if checked is not None:
        ledger.index.add_checked(checked)


def _copy_failure(failure: admission_service_pb2.ConsumerFailure) -> admission_service_pb2.ConsumerFailure:
    kept = admission_service_pb2.ConsumerFailure()
    kept.CopyFrom(failure)
    return kept


def _write_wait(message: snapshot_pb2.TimedWait, wait: Wait) -> None:
    message.wait.reason = blocking_to_proto(wait.reason)
    message.wait.detail = wait.detail
    message.since = wait.since


def _read_wait(message: snapshot_pb2.TimedWait) -> Wait | None:
    if not message.HasField("wait"):
        return None
    return Wait(reason=blocking_from_proto(message.wait.reason), detail=message.wait.detail, since=message.since)


def _write_engine(message: snapshot_pb2.EngineSnapshot, image: EngineImage) -> None:
    message.version_base = image.version_base
    message.train_batch_index = image.train_batch_index
    message.minibatch_index = image.minibatch_index
    message.admitted.extend(image.admitted)
    message.admitted_total = image.admitted_total
    message.relaxed = image.relaxed
    message.blocking = blocking_to_proto(image.blocking)
    if image.blocked_since is not None:
        message.blocked_since = image.blocked_since
    if image.starving_since is not None:
        message.starving_since = image.starving_since
    if image.last_wait is not None:
        _write_wait(message.last_wait, image.last_wait)
    message.filtered.extend(image.filtered)
    message.unit_versions.extend(image.unit_versions)
    message.unit_ready_at.extend(image.unit_ready_at)
    message.unit_ids.extend(image.unit_ids)
    message.unit_sources.extend(image.unit_sources)
    message.unit_seqs.extend(image.unit_seqs)
    if image.unit_members is not None:
        message.unit_member_counts.extend(map(len, image.unit_members))
        for members in image.unit_members:
            message.unit_members.extend(members)
    for group in image.pending_groups:
        message.pending_groups.add(sample_id=group.sample_id, source=group.source, size=group.size,
                                   reported=group.reported, accepted=group.accepted,
                                   oldest_version=group.oldest_version, ready_at=group.ready_at)
    for sample_id, size in image.group_sizes.items():
        message.group_sizes[sample_id] = size
    message.closed_samples.extend(image.closed_samples)
    message.next_seq = image.next_seq
    message.carry.extend(image.carry)
    message.carry_total = image.carry_total
    message.carry_seq = image.carry_seq
    if image.completion is not None:
        completion = message.completion
        completion.SetInParent()  # present even while every count is empty
        for target, counts in ((completion.declared, image.completion.declared),
                               (completion.completed, image.completion.completed),
                               (completion.completed_at_start, image.completion.completed_at_start)):
            for step, count in counts.items():
                target[step] = count


def _read_engine(message: snapshot_pb2.EngineSnapshot) -> EngineImage:
    unit_members = None
    if message.unit_member_counts:
        flat = list(message.unit_members)
        unit_members, start = [], 0
        for count in message.unit_member_counts:
            unit_members.append(tuple(flat[start : start + count]))
            start += count
    completion = None
    if message.HasField("completion"):
        c = message.completion
        completion = CompletionImage(declared=dict(c.declared), completed=dict(c.completed),
                                     completed_at_start=dict(c.completed_at_start))
    return EngineImage(
        version_base=message.version_base,
        train_batch_index=message.train_batch_index,
        minibatch_index=message.minibatch_index,
        admitted=tuple(message.admitted),
        admitted_total=message.admitted_total,
        relaxed=message.relaxed,
        blocking=blocking_from_proto(message.blocking),
        blocked_since=message.blocked_since if message.HasField("blocked_since") else None,
        starving_since=message.starving_since if message.HasField("starving_since") else None,
        last_wait=_read_wait(message.last_wait),
        filtered=tuple(message.filtered),
        unit_versions=list(message.unit_versions),
        unit_ready_at=list(message.unit_ready_at),
        unit_ids=list(message.unit_ids),
        unit_sources=list(message.unit_sources),
        unit_seqs=list(message.unit_seqs),
        unit_members=unit_members,
        pending_groups=tuple(
            PendingGroupImage(sample_id=g.sample_id, source=g.source, size=g.size, reported=g.reported,
                              accepted=tuple(g.accepted), oldest_version=g.oldest_version, ready_at=g.ready_at)
            for g in message.pending_groups
        ),
        group_sizes=dict(message.group_sizes),
        closed_samples=tuple(message.closed_samples),
        next_seq=message.next_seq,
        carry=tuple(message.carry),
        carry_total=message.carry_total,
        carry_seq=message.carry_seq,
        completion=completion,
    )
