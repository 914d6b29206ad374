"""A ``ReportTrajectories`` request checked against the ledger, before anything is journaled.

:func:`classify` validates a report whole (the rules of :mod:`.rules`, the job's schema, group admission, the
unit keys against the index, the multimodal inputs against those already held) and sorts its trajectories into
accepted, duplicate (the same content re-sent) and conflicting (a different trajectory under a known id). It reads
the ledger and changes nothing; what it checked travels in :class:`Classified` to the ledger's apply, which does
not check again. Recovery replays records that were checked when they were journaled, through
:func:`replayed_report`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from knittrans.admission.service.index import CheckedEntries, UnitIndex
from knittrans.admission.service.ingest.rules import check_columns, fingerprint, oldest_versions
from knittrans.admission.service.schema import check_schema
from knittrans.admission.service.trajectory_columns import TrajectoryColumns
from knittrans.errors import InvalidArgument
from knittrans.types import TrajectoryId, UnitKey
from knittrans.v1 import admission_service_pb2, journal_pb2, trajectory_pb2

if TYPE_CHECKING:
    from knittrans.admission.service.ledger import AdmissionLedger

_ANY_VERSION = 2**63
ACCEPTED = admission_service_pb2.REPORT_OUTCOME_ACCEPTED
DUPLICATE = admission_service_pb2.REPORT_OUTCOME_DUPLICATE
CONFLICT = admission_service_pb2.REPORT_OUTCOME_CONFLICT


@dataclass
class Classified:
    """A validated report: each trajectory's outcome, and the new trajectories that applying it adds."""

    request_id: str
    columns: TrajectoryColumns
    batch: trajectory_pb2.TrajectoryBatch | None  # the batch as received (None for a report of messages)
    outcomes: list[int]
    accepted_rows: list[int]
    oldest: list[int]
    index_entries: CheckedEntries | None  # the accepted trajectories' keys, checked against the index
    media: dict[str, tuple] | None = None  # signatures of multimodal inputs first seen in this report

    def record(self, at: float) -> journal_pb2.JournalRecord | None:
        """The journal record of the new trajectories, in the form they came in; None if there are none."""
        rows = self.accepted_rows
        if not rows:
            return None
        columns = self.columns
        record = journal_pb2.JournalRecord(at=at)
        report = record.report
        report.request_id = self.request_id
        # Serialising and parsing the trajectories is several times faster than copying their messages.
        if self.batch is None:
            for i in rows:
                report.trajectories.add().MergeFromString(columns.messages[i].SerializeToString())
        else:
            batch = self.batch if len(rows) == len(columns) else columns.take(rows)
            report.batch.MergeFromString(batch.SerializeToString())
        return record


def classify(request: admission_service_pb2.ReportTrajectoriesRequest, ledger: AdmissionLedger) -> Classified:
    """Validate a report whole and sort its trajectories into accepted, duplicate and conflict."""
    batch_form = request.HasField("batch")
    if batch_form and len(request.trajectories):
        raise InvalidArgument("set either trajectories or batch, not both", field="batch")
    count = len(request.batch.trajectory_ids) if batch_form else len(request.trajectories)
    limit = ledger.settings.max_report_batch
    if count > limit:
        raise InvalidArgument(f"{count} trajectories exceed the limit of {limit}", field="trajectories")
    if batch_form:
        columns = TrajectoryColumns.from_proto(request.batch)
    else:
        columns = TrajectoryColumns.from_messages(request.trajectories)
    check_columns(columns, ledger.limits, ledger.version, max_batch=limit)
    check_schema(columns, ledger.schema, ledger.settings.label_fields)
    ids = columns.trajectory_ids
    outcomes = [ACCEPTED] * count
    if ledger.knows_none_of(ids):
        accepted = list(range(count))
    else:
        accepted = []
        for i, trajectory_id in enumerate(ids):
            if ledger.is_reported(trajectory_id):
                same = ledger.fingerprint_of(TrajectoryId(trajectory_id)) == fingerprint(columns.canonical_message(i))
                outcomes[i] = DUPLICATE if same else CONFLICT
            else:
                accepted.append(i)
    _check_groups(columns, accepted, ledger)
    if ledger.index.has_reservations:
        _check_reservations_kept(columns, accepted, ledger.index)
    checked = check_keys(columns, accepted, ledger.index)
    media = check_media(columns, accepted, ledger.media)
    return Classified(
        request_id=request.request_id,
        columns=columns,
        batch=request.batch if batch_form else None,
        outcomes=outcomes,
        accepted_rows=accepted,
        oldest=oldest_versions(columns),
        index_entries=checked,
        media=media,
    )


def replayed_report(record: journal_pb2.JournalRecord, ledger: AdmissionLedger) -> Classified:
    """A journaled report read back for recovery: it was validated when it was journaled, so the version check no
    longer applies, and its keys are checked against the index as it is now. Replaying a report that was journaled
    twice is harmless: its known trajectories are left out."""
    report = record.report
    batch_form = report.HasField("batch")
    if batch_form:
        columns = TrajectoryColumns.from_proto(report.batch)
    else:
        columns = TrajectoryColumns.from_messages(report.trajectories)
    check_columns(columns, ledger.limits, _ANY_VERSION, max_batch=len(columns))
    known = [ledger.is_reported(t) for t in columns.trajectory_ids]
    return Classified(
        request_id=report.request_id,
        columns=columns,
        batch=report.batch if batch_form else None,
        outcomes=[DUPLICATE if seen else ACCEPTED for seen in known],
        accepted_rows=[i for i, seen in enumerate(known) if not seen],
        oldest=oldest_versions(columns),
        index_entries=None,
        media=None,
    )


def check_keys(columns: TrajectoryColumns, rows: list[int], index: UnitIndex) -> CheckedEntries | None:
    """A unit key belongs to one trajectory, a multimodal key to one sample (within and across reports).

    The index checks the new trajectories' keys a set operation at a time and keeps the result for applying
    them; when it finds (or might find) a broken rule, the trajectories are checked in order, to name the
    first key that breaks one (including a reference to one of the trajectory's own units)."""
    if not rows:
        return None
    whole = len(rows) == len(columns)
    units = columns.unit_offsets.tolist()
    refs = columns.multimodal_offsets.tolist()

    def pick(values: list) -> list:
        return values if whole else [values[i] for i in rows]

    # Slices of the flat key columns, one per trajectory, without a Python loop.
    unit_keys = list(map(tuple, map(columns.unit_keys.__getitem__, map(slice, pick(units[:-1]), pick(units[1:])))))
    media = map(columns.multimodal_keys.__getitem__, map(slice, pick(refs[:-1]), pick(refs[1:])))
    try:
        checked = index.check_many(
            pick(columns.trajectory_ids), pick(columns.sample_ids), unit_keys,
            list(map(tuple, map(dict.fromkeys, media))),
        )
    except InvalidArgument:
        _check_keys_in_order(columns, rows, index)
        raise
    if not checked.in_bulk:
        _check_keys_in_order(columns, rows, index)
    return checked


def _check_keys_in_order(columns: TrajectoryColumns, rows: list[int], index: UnitIndex) -> None:
    owner_of = index.owner
    claimed: dict[UnitKey, str] = {}
    unit_offsets, mm_offsets = columns.unit_offsets.tolist(), columns.multimodal_offsets.tolist()
    for i in rows:
        trajectory_id, sample_id = columns.trajectory_ids[i], columns.sample_ids[i]
        own = columns.unit_keys[unit_offsets[i] : unit_offsets[i + 1]]
        for j, key in enumerate(own):
            if owner_of(key) is not None or key in claimed:
                raise InvalidArgument(
                    "is already referenced by another trajectory", field=f"trajectories[{i}].units[{j}].key"
                )
            claimed[key] = trajectory_id
        for j, key in enumerate(columns.multimodal_keys[mm_offsets[i] : mm_offsets[i + 1]]):
            if key in own:
                raise InvalidArgument(
                    "is also one of the trajectory's own units", field=f"trajectories[{i}].multimodal[{j}].key"
                )
            owner = owner_of(key) or claimed.get(key)
            if owner is not None and owner != sample_id:
                raise InvalidArgument(
                    f"belongs to {owner!r}, not to sample {sample_id!r}",
                    field=f"trajectories[{i}].multimodal[{j}].key",
                )
            claimed[key] = sample_id


def _check_reservations_kept(columns: TrajectoryColumns, rows: list[int], index: UnitIndex) -> None:
    """A trajectory that reserved multimodal units must report exactly those: the report takes its
    reservation over, and a reserved unit it did not name would otherwise be held by nobody."""
    offsets = columns.multimodal_offsets.tolist()
    for i in rows:
        reserved = index.reservation(TrajectoryId(columns.trajectory_ids[i]))
        if reserved is None:
            continue
        reported = columns.multimodal_keys[offsets[i] : offsets[i + 1]]
        if set(reported) != set(reserved):
            raise InvalidArgument(
                f"lists {sorted(set(reported))}, but the trajectory reserved {sorted(reserved)}; cancel the "
                "reservation to report other units", field=f"trajectories[{i}].multimodal",
            )


def _check_groups(columns: TrajectoryColumns, rows: list[int], ledger: AdmissionLedger) -> None:
    """With group admission, refuse a trajectory its group cannot take before anything is journaled."""
    rejected = ledger.engine.first_rejected_addition(
        [columns.sample_ids[i] for i in rows], [columns.sources[i] for i in rows]
    )
    if rejected is not None:
        index, field, reason = rejected
        raise InvalidArgument(reason, field=f"trajectories[{rows[index]}].{field}")


def check_media(columns: TrajectoryColumns, rows: list[int], held: Mapping[str, tuple]) -> dict[str, tuple]:
    """Every reference to one multimodal input must describe it the same way (encoder, cost, placeholder
    length, kind, content hash), within the report and against the inputs already ``held``; otherwise the
    mini-batch could never be planned. Returns the signatures of inputs this report adds."""
    offsets = columns.multimodal_offsets.tolist()
    if not rows or offsets[-1] == 0:
        return {}
    hashes = columns.multimodal_headers.content_hashes
    header_index = columns.multimodal_header_index.tolist()
    signatures = list(zip(
        (columns.encoders[e] for e in columns.multimodal_encoder_indices.tolist()),
        columns.multimodal_costs.tolist(),
        (columns.placeholder_ends - columns.placeholder_starts).tolist(),
        columns.multimodal_kinds.tolist(),
        (hashes[h] if h >= 0 else None for h in header_index),
        strict=True,
    ))
    keys = columns.multimodal_keys
    added: dict[str, tuple] = {}
    for i in rows:
        for r in range(offsets[i], offsets[i + 1]):
            key, signature = keys[r], signatures[r]
            known = held.get(key) or added.setdefault(key, signature)
            if known != signature:
                raise InvalidArgument(
                    "describes a multimodal input differently from an earlier reference to the same key "
                    f"(encoder, cost, placeholder length, kind, content hash): {signature} != {known}",
                    field=f"trajectories[{i}].multimodal[{r - offsets[i]}]",
                )
    return {key: signature for key, signature in added.items() if key not in held}
