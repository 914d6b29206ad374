"""The admission service's whole state, changed only by applying journal records.

:class:`AdmissionLedger` holds the engine state, the reported metadata, the unit index with its reference
counts, the admitted mini-batches with the consumers that still owe their optimizer step, and every
consumer's acknowledged stream position. It does no I/O and reads no clock: the servicer builds a
:class:`~knittrans.v1.journal_pb2.JournalRecord` for each change (:mod:`.records` for the engine's decisions),
journals it, then applies it here. Recovery applies the journaled records in order and arrives at the same state.

Reported metadata stays in the columns it was validated in (:class:`~.trajectory_columns.TrajectoryColumns`,
one block per applied report): a trajectory becomes a message only when it is admitted (for its consumers),
released (for its fingerprint) or re-sent. The fingerprint that tells an identical re-send from a conflicting one
is the digest of the trajectory's canonical message (:meth:`TrajectoryColumns.canonical_message`), so it does not
depend on the form either report came in.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from knittrans.admission.engine import AdmissionState, EngineConfig, PoolEntries
from knittrans.admission.engine.decisions import BlockingReason, DropReason, Wait
from knittrans.admission.engine.state import EngineStatus
from knittrans.admission.service.assignments import MiniBatchDispatch, MiniBatchRows, gather_rows
from knittrans.admission.service.attachments import AttachedFields, apply_attached, role_dispatch
from knittrans.admission.service.compact_columns import compact_columns
from knittrans.admission.service.expiry import ReservationExpiry
from knittrans.admission.service.index import UnitIndex
from knittrans.admission.service.ingest.report import Classified, check_keys, check_media, replayed_report
from knittrans.admission.service.ingest.rules import IngestLimits, fingerprint
from knittrans.admission.service.records import admit_of, drop_of, failure_consumer, wait_of
from knittrans.admission.service.reservation_records import apply_cancelled, apply_reserved
from knittrans.admission.service.retention import AdmittedMiniBatch, RetentionPolicy, StepKey, Verdict, due_for_release
from knittrans.admission.service.roles import all_consumers, group_of, group_of_role, verdict_groups
from knittrans.admission.service.schema import JobSchema, declared_schema, schema_of
from knittrans.admission.service.trajectory_columns import TrajectoryColumns
from knittrans.errors import FailedPrecondition, InvalidArgument
from knittrans.trajectory_schema import TrajectorySchema
from knittrans.types import AdmissionUnit, ConsumerId, Topology, TrajectoryId, UnitKey
from knittrans.v1 import admission_service_pb2, journal_pb2

logger = logging.getLogger(__name__)

_BLOCK_SHIFT = 20  # a row handle is (block number << 20) | row; a report holds at most 100,000 trajectories
RECENT_FAILURES = 16  # consumer failures GetStatus lists


@dataclass(frozen=True, kw_only=True)
class LedgerSettings:
    engine: EngineConfig
    topology: Topology
    label_fields: tuple[str, ...] = ("input_ids",)
    initial_version: int = 0
    max_report_batch: int = 10_000
    schema: TrajectorySchema | None = None  # declared in the config; None: the first trajectory fixes it
    retention: RetentionPolicy = field(default_factory=RetentionPolicy)


class _Block:
    """The columns of one applied report; its rows stay until every one of them is released."""

    __slots__ = ("columns", "live", "oldest")

    def __init__(self, columns: TrajectoryColumns, live: int, oldest: Sequence[int]) -> None:
        self.columns = compact_columns(columns)  # kept while any row is pending: the smaller, exact form
        self.live = live
        self.oldest = tuple(oldest)  # kept for as long as the rows: a tuple of ints, which the collector ignores


@dataclass
class Applied:
    """What applying one record changed, for the shell to act on (publish, delete, update metrics)."""

    admitted: AdmittedMiniBatch | None = None
    dropped: tuple[TrajectoryId, ...] = ()
    drop_reason: DropReason | None = None
    released: AdmittedMiniBatch | None = None  # the last mini-batch it released
    released_count: int = 0
    freed_keys: tuple[UnitKey, ...] = ()
    changed_blocking: bool = False
    version_changed: bool = False
    failure: admission_service_pb2.ConsumerFailure | None = None  # a consumer failure newly recorded
    failed_minibatch: bool = False  # ... and it is the first failure of its mini-batch
    decided: int | None = None  # the sequence whose verdict this record decided
    attached: bool = False  # a trainer role attached fields (a consuming role may be dispatched now)


class AdmissionLedger:
    def __init__(self, settings: LedgerSettings) -> None:
        self.settings = settings
        self.consumers = all_consumers(settings.topology)
        self._groups = verdict_groups(self.consumers)
        self.attachments = AttachedFields()  # fields trainer roles attached to live trajectories
        self._consumer_set = frozenset(self.consumers)
        self.engine = AdmissionState(settings.engine, version=settings.initial_version)
        self.version = settings.initial_version
        self.limits = IngestLimits(
            sources=frozenset(settings.engine.sources), encoders=frozenset(e.name for e in settings.topology.encoders)
        )
        # Every acknowledged trajectory is in exactly one of: _rows (live: its row handle); _releasing (released,
        # its row held until its fingerprint is taken: forget_released_rows); or only in _digests (released: its
        # fingerprint; _digests also caches those of live and releasing rows that were re-sent).
        self._rows: dict[TrajectoryId, int] = {}
        self._releasing: dict[TrajectoryId, int] = {}
        self._blocks: dict[int, _Block] = {}
        self._next_block = 0
        self._small_blocks: list[int] = []  # blocks block_merge will merge, and the last block it looked at
        self._examined_block = -1
        self._digests: dict[TrajectoryId, bytes] = {}
        # Multimodal input key -> how its references describe it, while any trajectory holds the input.
        self._media: dict[str, tuple] = {}
        self.index = UnitIndex()
        self.expiry = ReservationExpiry()  # when unreported reservations lapse, and their trajectories' own units
        self.minibatches: dict[int, AdmittedMiniBatch] = {}
        self.next_sequence = 1
        self.acknowledged: dict[ConsumerId, int] = dict.fromkeys(self.consumers, 0)
        self.scheduled_requests: set[str] = set()
        self.scheduled: dict[int, int] = {}  # rollout step -> trajectories declared scheduled
        self.pending_deletes: dict[UnitKey, None] = {}
        self.last_wait: Wait | None = None
        self.admitted_total = 0
        self.dropped_stale = 0
        self.released_minibatches = 0
        self.checkpoint: StepKey | None = None  # the latest reported checkpoint's last step
        self.quota_violations = 0
        # What every accepted trajectory must agree on, so that any of them can be packed together; fixed by the
        # first accepted trajectory applied (the same one on replay), unless the config declares it.
        self.schema: JobSchema | None = None if settings.schema is None else declared_schema(settings.schema)
        # Mini-batches a consumer could not read or pack (rare by construction: ingest keeps poison out).
        self.failure_keys: set[tuple[ConsumerId, int]] = set()
        self.failed_sequences: set[int] = set()
        self.recent_failures: deque[admission_service_pb2.ConsumerFailure] = deque(maxlen=RECENT_FAILURES)
        # Sequence -> the failure that decided its verdict FAILED (kept, like failed_sequences: failures are rare).
        self.failed_verdicts: dict[int, admission_service_pb2.ConsumerFailure] = {}
        self.role_failed_verdicts: dict[tuple[int, str], admission_service_pb2.ConsumerFailure] = {}  # trainer roles'

    # -- checking consumers (no mutation) -------------------------------------------------------------

    def check_consumer(self, consumer: ConsumerId, field_prefix: str = "consumer") -> None:
        if consumer not in self._consumer_set:
            try:
                consumer.check_within(self.settings.topology)
            except InvalidArgument as exc:
                raise InvalidArgument(exc.message, field=f"{field_prefix}.{exc.field}") from exc
            raise InvalidArgument(f"{consumer} is not a planned consumer", field=f"{field_prefix}.role")

    # -- applying records (the only mutation) ----------------------------------------------------------

    def apply(self, record: journal_pb2.JournalRecord, prepared: Classified | None = None) -> Applied:
        """Apply one record. ``prepared`` is the classified report the record was built from, when the caller
        has it (the live path): its validated columns are used instead of reading the record again."""
        kind = record.WhichOneof("change")
        if kind == "report":
            return self._add_rows(record.at, prepared if prepared is not None else replayed_report(record, self))
        handler = getattr(self, f"_apply_{kind}", None)
        if handler is None:
            raise FailedPrecondition(f"unknown journal record {kind!r}")
        return handler(record)

    def apply_report(self, at: float, prepared: Classified) -> Applied:
        """Apply a classified report without building its record: what applying ``prepared.record(at)`` does
        (for a journal that keeps nothing)."""
        return self._add_rows(at, prepared)

    def _add_rows(self, at: float, report: Classified) -> Applied:
        rows = report.accepted_rows
        if not rows:
            return Applied()
        columns = report.columns
        if self.schema is None:
            first = next((i for i in rows if columns.accepted[i]), None)
            if first is not None:
                self.schema = schema_of(columns, first, self.settings.label_fields)
        checked = report.index_entries
        if checked is None:  # recovery: check against the index as it is now
            checked = check_keys(columns, rows, self.index)
        media = report.media
        if media is None:
            media = check_media(columns, rows, self._media)
        self._media.update(media)
        number = self._next_block
        self._next_block += 1
        self._blocks[number] = _Block(columns, len(rows), report.oldest)
        base = number << _BLOCK_SHIFT
        ids, samples, sources = columns.trajectory_ids, columns.sample_ids, columns.sources
        whole = len(rows) == len(columns)

        def pick(values: list) -> list:
            return values if whole else [values[i] for i in rows]

        selected = pick(ids)
        self._rows.update(zip(selected, range(base, base + len(rows)) if whole else [base + i for i in rows],
                              strict=True))
        self.index.add_checked(checked)
        self.expiry.take_over(selected)
        if self.pending_deletes:
            self.revive(checked.flat_media)
        self.engine.add_many(
            PoolEntries(
                trajectory_ids=selected,
                sample_ids=pick(samples),
                sources=pick(sources),
                ready_at=at,
                oldest_versions=pick(report.oldest),
                rollout_steps=pick(columns.rollout_steps.tolist()),
                num_tokens=pick(columns.num_tokens.tolist()),
                accepted=pick(columns.accepted.tolist()),
            )
        )
        return Applied()

    def _apply_scheduled(self, record: journal_pb2.JournalRecord) -> Applied:
        scheduled = record.scheduled
        if scheduled.request_id and scheduled.request_id in self.scheduled_requests:
            return Applied()
        if scheduled.request_id:
            self.scheduled_requests.add(scheduled.request_id)
        self.engine.add_scheduled(scheduled.rollout_step, scheduled.count)
        self.scheduled[scheduled.rollout_step] = self.scheduled.get(scheduled.rollout_step, 0) + scheduled.count
        return Applied()

    def _apply_wait(self, record: journal_pb2.JournalRecord) -> Applied:
        wait = wait_of(record)
        self.engine.apply(wait)
        changed = self.last_wait is None or self.last_wait.reason is not wait.reason
        self.last_wait = wait
        return Applied(changed_blocking=changed)

    def _apply_admission(self, record: journal_pb2.JournalRecord) -> Applied:
        admit = admit_of(record)
        ids = admit.trajectory_ids
        before = self.engine.status() if admit.completes_train_batch else None
        self.engine.apply(admit)
        if before is not None and self._batch_below_quota(before, ids):
            self.quota_violations += 1
        minibatch = AdmittedMiniBatch(
            sequence=self.next_sequence, admission=record.admission, trajectory_ids=ids, owed_steps=set(self.consumers)
        )
        self.minibatches[minibatch.sequence] = minibatch
        self.next_sequence += 1
        self.admitted_total += len(ids)
        self.last_wait = None
        return Applied(admitted=minibatch)

    def _batch_below_quota(self, before: EngineStatus, ids: Sequence[TrajectoryId]) -> bool:
        """Whether the train batch that ``ids`` completes ends below a source quota (counted in units)."""
        grouped = self.settings.engine.admission_unit is AdmissionUnit.GROUP
        units: dict[str, set[str]] = {}
        for trajectory_id in ids:
            source, sample_id, _ = self.row_summary(trajectory_id)
            units.setdefault(source, set()).add(sample_id if grouped else trajectory_id)
        return any(s.admitted + len(units.get(s.source, ())) < s.quota for s in before.sources)

    def _apply_drop(self, record: journal_pb2.JournalRecord) -> Applied:
        drop = drop_of(record)
        ids, reason = drop.trajectory_ids, drop.reason
        self.engine.apply(drop)
        if reason is DropReason.STALE:
            self.dropped_stale += len(ids)
        freed = self._release_trajectories(ids)
        self.last_wait = None
        return Applied(dropped=ids, drop_reason=reason, freed_keys=freed)

    def _apply_version(self, record: journal_pb2.JournalRecord) -> Applied:
        new_version = record.version.new_version
        if new_version <= self.version:
            return Applied()
        self.version = new_version
        return Applied(version_changed=True)

    def _apply_progress(self, record: journal_pb2.JournalRecord) -> Applied:
        progress = record.progress
        consumer = ConsumerId(
            role=progress.consumer.role, dp_rank=progress.consumer.dp_rank, cp_rank=progress.consumer.cp_rank
        )
        if progress.stage == admission_service_pb2.PROGRESS_STAGE_VERIFIED:
            return self._verified(consumer, progress.sequence)  # before delivery: the position does not move
        if progress.sequence > self.acknowledged[consumer]:
            # An optimizer step implies delivery, whichever report arrives first.
            self.acknowledged[consumer] = progress.sequence
        if progress.stage == admission_service_pb2.PROGRESS_STAGE_DELIVERED:
            self._forget_finished()
            return Applied()
        minibatch = self.minibatches.get(progress.sequence)
        if minibatch is None or consumer not in minibatch.owed_steps:
            return Applied()
        minibatch.owed_steps.discard(consumer)
        if minibatch.first_step_at is None:
            minibatch.first_step_at = record.at
        return self._release_due() if minibatch.stepped else Applied()

    def _apply_checkpoint(self, record: journal_pb2.JournalRecord) -> Applied:
        step = (record.checkpoint.train_batch_index, record.checkpoint.minibatch_index)
        if self.checkpoint is not None and step <= self.checkpoint:
            return Applied()
        self.checkpoint = step
        return self._release_due()

    def _release_due(self) -> Applied:
        """Release the stepped mini-batches that retention lets go (:mod:`.retention`)."""
        held = [m for _, m in sorted(self.minibatches.items()) if m.stepped and not m.released]
        due = [held[i] for i in due_for_release([m.step for m in held], self.checkpoint, self.settings.retention)]
        freed: list[UnitKey] = []
        for minibatch in due:
            self.released_minibatches += 1
            freed.extend(self._release_trajectories(minibatch.trajectory_ids))
            minibatch.released = True
            minibatch.dispatch = None
        self._forget_finished()
        return Applied(released=due[-1] if due else None, released_count=len(due), freed_keys=tuple(freed))

    def _verified(self, consumer: ConsumerId, sequence: int) -> Applied:
        minibatch, group = self.minibatches.get(sequence), group_of(consumer)
        if minibatch is None or minibatch.verdict_of(group) is not Verdict.PENDING or consumer in minibatch.verified:
            return Applied()
        minibatch.verified.add(consumer)
        if not self._groups[group] <= minibatch.verified:
            return Applied()
        minibatch.decide(group, Verdict.OK)
        minibatch.verified -= self._groups[group]
        return Applied(decided=sequence)

    def _apply_attached(self, record: journal_pb2.JournalRecord) -> Applied:
        return Applied(attached=apply_attached(self, record.attached))

    def _apply_reserved(self, record: journal_pb2.JournalRecord) -> Applied:
        apply_reserved(self, record)
        return Applied()

    def _apply_reservations_cancelled(self, record: journal_pb2.JournalRecord) -> Applied:
        return Applied(freed_keys=apply_cancelled(self, record))

    def media_forget(self, key: UnitKey) -> None:
        self._media.pop(key, None)

    def revive(self, keys: Iterable[UnitKey]) -> None:
        """Keys referenced again before their deletion began are not deleted: the deleter skips keys that are
        no longer pending. (A reservation of a key whose deletion is under way waits for it to end, so that
        the rollout's write that follows stores the unit again.)"""
        for key in keys:
            self.pending_deletes.pop(key, None)

    def _apply_consumer_failure(self, record: journal_pb2.JournalRecord) -> Applied:
        failure = record.consumer_failure.failure
        key = (failure_consumer(failure), failure.sequence)
        if key in self.failure_keys:
            return Applied()
        self.failure_keys.add(key)
        first = failure.sequence not in self.failed_sequences
        self.failed_sequences.add(failure.sequence)
        kept = admission_service_pb2.ConsumerFailure()
        kept.CopyFrom(failure)
        self.recent_failures.append(kept)
        decided = None
        minibatch = self.minibatches.get(failure.sequence)
        # A failure after an OK verdict (bytes damaged after verification) stays the failing consumer's own: the
        # others may already be delivering the mini-batch.
        group = group_of(key[0])
        if minibatch is not None and minibatch.verdict_of(group) is Verdict.PENDING:
            minibatch.decide(group, Verdict.FAILED)
            minibatch.verified -= self._groups[group]
            if group:
                self.role_failed_verdicts[(failure.sequence, group)] = kept
            else:
                self.failed_verdicts[failure.sequence] = kept
            decided = failure.sequence
        return Applied(failure=kept, failed_minibatch=first, decided=decided)

    def _apply_deleted(self, record: journal_pb2.JournalRecord) -> Applied:
        for key in record.deleted.keys:
            self.pending_deletes.pop(UnitKey(key), None)
        return Applied()

    def _release_trajectories(self, ids: Iterable[TrajectoryId]) -> tuple[UnitKey, ...]:
        """Released trajectories leave the live rows. Their rows are held until :meth:`forget_released_rows`
        keeps only their fingerprints: taking one builds the trajectory's canonical message (tens of microseconds
        each), which the call that released a mini-batch (the last consumer's optimizer step: a training loop
        waits for its answer) need not wait for."""
        ids = tuple(ids)
        rows, releasing = self._rows, self._releasing
        for trajectory_id in ids:
            handle = rows.pop(trajectory_id, None)
            if handle is not None:
                releasing[trajectory_id] = handle
        freed = self.index.release(ids)
        self.attachments.forget(ids)
        self.pending_deletes.update(dict.fromkeys(freed))
        for key in freed:
            self._media.pop(key, None)
        return freed

    @property
    def released_rows_held(self) -> bool:
        """Released trajectories' rows wait for :meth:`forget_released_rows`."""
        return bool(self._releasing)

    def forget_released_rows(self, limit: int | None = None) -> None:
        """Take the fingerprints of up to ``limit`` released trajectories (all by default) and drop their rows.
        What the ledger answers is the same before and after: only memory changes."""
        releasing, digests = self._releasing, self._digests
        for _ in range(len(releasing) if limit is None else min(limit, len(releasing))):
            trajectory_id, handle = releasing.popitem()
            block, row = self._block_row(handle)
            if trajectory_id not in digests:
                digests[trajectory_id] = fingerprint(block.columns.canonical_message(row))
            block.live -= 1
            if not block.live:
                del self._blocks[handle >> _BLOCK_SHIFT]

    def _forget_finished(self) -> None:
        """Drop mini-batches that are released and acknowledged by every consumer: nobody can ask again."""
        oldest_ack = min(self.acknowledged.values(), default=0)
        for sequence in [s for s, m in self.minibatches.items() if m.released and s <= oldest_ack]:
            del self.minibatches[sequence]

    # -- derived views ---------------------------------------------------------------------------------

    def is_reported(self, trajectory_id: TrajectoryId) -> bool:
        return trajectory_id in self._rows or trajectory_id in self._digests or trajectory_id in self._releasing

    @property
    def media(self) -> Mapping[str, tuple]:
        """Multimodal input key -> how its references describe it, while any trajectory holds the input."""
        return self._media

    def _locate(self, trajectory_id: TrajectoryId) -> tuple[_Block, int]:
        return self._block_row(self._rows[trajectory_id])

    def _block_row(self, handle: int) -> tuple[_Block, int]:
        return self._blocks[handle >> _BLOCK_SHIFT], handle & ((1 << _BLOCK_SHIFT) - 1)

    def row_summary(self, trajectory_id: TrajectoryId) -> tuple[str, str, int]:
        """A live trajectory's source, sample id and oldest version."""
        block, row = self._locate(trajectory_id)
        columns = block.columns
        return columns.sources[row], columns.sample_ids[row], block.oldest[row]

    def knows_none_of(self, trajectory_ids: Collection[str]) -> bool:
        """Whether none of these trajectories was reported before (a set operation: the common case)."""
        return (self._rows.keys().isdisjoint(trajectory_ids) and self._digests.keys().isdisjoint(trajectory_ids)
                and self._releasing.keys().isdisjoint(trajectory_ids))

    def fingerprint_of(self, trajectory_id: TrajectoryId) -> bytes:
        """The fingerprint of a reported trajectory's content, to tell an identical re-send from a conflict."""
        digest = self._digests.get(trajectory_id)
        if digest is None:
            handle = self._releasing.get(trajectory_id)
            block, row = self._locate(trajectory_id) if handle is None else self._block_row(handle)
            digest = self._digests[trajectory_id] = fingerprint(block.columns.canonical_message(row))
        return digest

    def dispatch(self, minibatch: AdmittedMiniBatch, role: str = "") -> MiniBatchDispatch:
        """The mini-batch's plan for the consumers of ``role`` (a ConsumerId.role; a trainer role's is its own): a
        pure function of its metadata and the topology, so never journaled. Planned here, when not yet planned."""
        planned = self.planned(minibatch, role)
        if planned is None:
            planned = self.dispatch_planner(minibatch, role)()
            minibatch.keep_dispatch(group_of_role(role), planned)
        return planned

    def planned(self, minibatch: AdmittedMiniBatch, role: str = "") -> MiniBatchDispatch | None:
        """The mini-batch's plan for the consumers of ``role``, if it was planned already."""
        group = group_of_role(role)
        return minibatch.role_dispatches.get(group) if group else minibatch.dispatch

    def dispatch_planner(self, minibatch: AdmittedMiniBatch, role: str = "") -> Callable[[], MiniBatchDispatch]:
        """What planning the mini-batch for the consumers of ``role`` reads, taken from the ledger now: a function
        that plans it and reads nothing the ledger changes, so it may run on another thread (:meth:`planner`)."""
        group = group_of_role(role)
        if any(trajectory_id not in self._rows for trajectory_id in minibatch.trajectory_ids):
            raise FailedPrecondition(f"mini-batch {minibatch.sequence} is already released")
        rows = minibatch.dispatch.rows if minibatch.dispatch is not None else None
        return self.planner(minibatch.trajectory_ids, group, rows=rows)

    def planner(self, trajectory_ids: Sequence[TrajectoryId], role: str = "", *,
                rows: MiniBatchRows | None = None) -> Callable[[], MiniBatchDispatch]:
        """A function that plans a mini-batch of these live trajectories. Where their rows are is looked up now;
        the function then reads only those rows' columns (never changed: a merge or a release replaces or drops a
        block, it does not change its columns) and the settings, so it may run off the event loop, even while
        the admission's journal record is being written."""
        if rows is None:
            located = []
            for trajectory_id in trajectory_ids:
                block, row = self._locate(trajectory_id)
                located.append((block.columns, row))
        settings, attachments = self.settings, self.attachments  # attachments are read when messages are built

        def plan() -> MiniBatchDispatch:
            gathered = rows if rows is not None else gather_rows(located)
            return role_dispatch(gathered, settings.topology, settings.label_fields, role, attachments)

        return plan

    def awaits_verification(self, consumer: ConsumerId, sequence: int) -> bool:
        """Whether ``consumer``'s VERIFIED of ``sequence`` would change anything (otherwise it is not journaled)."""
        minibatch = self.minibatches.get(sequence)
        return minibatch is not None and minibatch.verdict_of(group_of(consumer)) is Verdict.PENDING \
            and consumer not in minibatch.verified

    def unverified(self, sequence: int, role: str = "") -> list[ConsumerId]:
        """The consumers of ``role``'s verdict group that have not verified a PENDING mini-batch yet (empty once
        it is decided)."""
        minibatch, group = self.minibatches.get(sequence), group_of_role(role)
        if minibatch is None or minibatch.verdict_of(group) is not Verdict.PENDING:
            return []
        return [consumer for consumer in self.consumers if consumer in self._groups[group]
                and consumer not in minibatch.verified]

    def verdict(self, sequence: int, role: str = "") -> tuple[Verdict, admission_service_pb2.ConsumerFailure | None]:
        """The verdict on admitted mini-batch ``sequence`` for the consumers of ``role`` (a ConsumerId.role), with
        the failure that decided a FAILED one (:mod:`.roles`)."""
        if not 1 <= sequence < self.next_sequence:
            raise InvalidArgument(f"no assignment {sequence} (last is {self.next_sequence - 1})", field="sequence")
        group = group_of_role(role)
        failure = self.role_failed_verdicts.get((sequence, group)) if group else self.failed_verdicts.get(sequence)
        if failure is not None:
            return Verdict.FAILED, failure
        minibatch = self.minibatches.get(sequence)
        if minibatch is None:  # forgotten: every consumer stepped past it, so it was delivered
            return Verdict.OK, None
        return minibatch.verdict_of(group), None

    def covered_tokens(self, trajectory_id: TrajectoryId, response_only: bool) -> int:
        """How many tokens of a live trajectory a per-token field covers: all, or its response's."""
        block, row = self._locate(trajectory_id)
        start = int(block.columns.response_starts[row]) if response_only else 0
        return int(block.columns.num_tokens[row]) - start

    def unfinished_steps(self) -> list[AdmittedMiniBatch]:
        """Mini-batches some consumer reported its optimizer step on while others still owe theirs, oldest first:
        one that stays so is a rank that never finished its step (see docs/failures.md, "A step that never ends")."""
        return [m for _, m in sorted(self.minibatches.items()) if m.owed_steps and m.first_step_at is not None]

    def pending_after(self, after: int) -> list[AdmittedMiniBatch]:
        """The mini-batches with sequence above ``after``, in order (every consumer gets every one)."""
        return [m for s, m in sorted(self.minibatches.items()) if s > after]

    def blocking(self) -> tuple[BlockingReason, str, float | None]:
        wait = self.last_wait
        if wait is None:
            return BlockingReason.NONE, "", None
        return wait.reason, wait.detail, wait.since
