"""Validation of reported trajectory metadata on the ingest hot path.

A trajectory is valid when its domain object can be built (:func:`knittrans.wire.trajectory_from_proto`, whose
types carry every rule of one trajectory and name the field) and it fits the job (:func:`check_limits`: known
sources and encoders, bounded sizes, no version from the future). :func:`check_trajectory` is that one
validation, for one message. Building the domain object of every trajectory costs far more than the ingest
budget (50k reports/s on two cores), so :func:`check_columns` checks a whole report as columns
(:class:`~knittrans.admission.service.trajectory_columns.TrajectoryColumns`, from either report form): each rule
runs once over a column with numpy (:func:`flag_trajectories`), and only a trajectory it flags (or whose numbers
are too large for exact array arithmetic) goes through :func:`check_trajectory`, which raises the error. So both
forms of a report get the same error, and property tests keep the column rules from passing anything
:func:`check_trajectory` rejects.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from knittrans.admission.service.trajectory_columns import HeaderColumns, TrajectoryColumns
from knittrans.errors import InvalidArgument, within
from knittrans.types import _ID_PATTERN, MAX_ID_LENGTH
from knittrans.v1 import trajectory_pb2
from knittrans.wire import trajectory_from_proto
from knittrans.wire.enums import (
    ALIGNMENT_FROM_PROTO,
    COVERAGE_FROM_PROTO,
    ITEMSIZE_BY_PROTO,
    MEDIA_KINDS,
    TOKEN_FIELD_KIND,
    UNIT_KIND_FROM_PROTO,
)

_HEX = frozenset("0123456789abcdef")


@dataclass(frozen=True, kw_only=True)
class IngestLimits:
    """What the service accepts; everything a client sends is bounded."""

    sources: Collection[str]
    encoders: Collection[str]
    max_units: int = 64
    max_multimodal: int = 256
    max_segments: int = 4096
    max_tokens: int = 4 * 1024 * 1024


def _listed(names: Collection[str], none: str = "none") -> str:
    return ", ".join(repr(name) for name in sorted(names)) if names else none


def _bad_id(value: str) -> bool:
    return not value or len(value) > MAX_ID_LENGTH or not _ID_PATTERN.match(value)


def check_limits(trajectory: Any, field: str, limits: IngestLimits, current_version: int) -> None:
    """The job's bounds on one trajectory (a message or a domain object: they read alike), beyond the rules of
    the domain types. Checked first: they bound the work of building the domain object."""
    source = trajectory.source
    if source not in limits.sources:
        raise InvalidArgument(f"unknown source {source!r}; the job's sources are {_listed(limits.sources)}",
                              field=f"{field}.source")
    if trajectory.num_tokens > limits.max_tokens:
        raise InvalidArgument(f"exceeds the limit of {limits.max_tokens}", field=f"{field}.num_tokens")
    segments = trajectory.segments
    if len(segments) > limits.max_segments:
        raise InvalidArgument(f"more than {limits.max_segments} segments", field=f"{field}.segments")
    for i, segment in enumerate(segments):
        if segment.version > current_version:
            raise InvalidArgument(
                f"version {segment.version} is from the future (current version is {current_version})",
                field=f"{field}.segments[{i}].version",
            )
    if len(trajectory.units) > limits.max_units:
        raise InvalidArgument(f"more than {limits.max_units} units", field=f"{field}.units")
    multimodal = trajectory.multimodal
    if len(multimodal) > limits.max_multimodal:
        raise InvalidArgument(f"more than {limits.max_multimodal} references", field=f"{field}.multimodal")
    for i, ref in enumerate(multimodal):
        if ref.encoder not in limits.encoders:
            raise InvalidArgument(
                f"unknown encoder {ref.encoder!r}; the job's topology has {_listed(limits.encoders, 'no encoders')}",
                field=f"{field}.multimodal[{i}].encoder",
            )


def check_trajectory(
    message: trajectory_pb2.TrajectoryMetadata, field: str, limits: IngestLimits, current_version: int
) -> None:
    """Validate one report: the job's limits, then the domain types' rules; raise :class:`InvalidArgument`
    naming ``field.<sub-field>``."""
    check_limits(message, field, limits, current_version)
    within(field, partial(trajectory_from_proto, message))


def check_batch(
    trajectories: Sequence[trajectory_pb2.TrajectoryMetadata], limits: IngestLimits, current_version: int,
    *, max_batch: int,
) -> None:
    """Validate a whole report; one bad item rejects the batch, naming ``trajectories[i].field``."""
    if len(trajectories) > max_batch:
        raise InvalidArgument(f"{len(trajectories)} trajectories exceed the limit of {max_batch}", field="trajectories")
    seen: set[str] = set()
    for i, message in enumerate(trajectories):
        check_trajectory(message, f"trajectories[{i}]", limits, current_version)
        if message.trajectory_id in seen:
            raise InvalidArgument("appears twice in one report", field=f"trajectories[{i}].trajectory_id")
        seen.add(message.trajectory_id)


# ---- whole reports, as columns -------------------------------------------------------------------------------

_ID_BYTES = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:@/+=-"
_HEX_BYTES = b"0123456789abcdef"
_ITEMSIZE_LUT = np.zeros(max(ITEMSIZE_BY_PROTO) + 1, dtype=np.int64)
for _number, _size in ITEMSIZE_BY_PROTO.items():
    _ITEMSIZE_LUT[_number] = _size
_SMALL_REPORT = 4  # trajectories
_MAX_RANK = 16  # shapes of more dimensions go to the exact check
_EXACT_LIMIT = float(2**62)  # above this, products of shape dimensions could overflow int64
_UNIT_KIND_NUMBERS = np.array(sorted(UNIT_KIND_FROM_PROTO), dtype=np.int64)
_MEDIA_KIND_NUMBERS = np.array(sorted(MEDIA_KINDS), dtype=np.int64)
_ALIGNMENT_NUMBERS = np.array(sorted(ALIGNMENT_FROM_PROTO), dtype=np.int64)
_COVERAGE_NUMBERS = np.array(sorted(COVERAGE_FROM_PROTO), dtype=np.int64)


def _all_match(values: list[str], alphabet: bytes, shortest: int, longest: int) -> bool:
    """Whether every string is ``shortest``..``longest`` characters of ``alphabet``: one pass over them joined."""
    if not values:
        return True
    lengths = list(map(len, values))
    if min(lengths) < shortest or max(lengths) > longest:
        return False
    joined = "\n".join(values).encode("utf-8", "surrogatepass")
    # What is left once the alphabet is deleted must be exactly the separators.
    return len(joined.translate(None, alphabet)) == len(values) - 1


def _bad_ids(values: list[str]) -> np.ndarray | None:
    """None when every value is a valid id; else which are not (by the exact rule)."""
    if _all_match(values, _ID_BYTES, 1, MAX_ID_LENGTH):
        return None
    return np.fromiter(map(_bad_id, values), dtype=bool, count=len(values))


def _bad_hashes(values: list[str]) -> np.ndarray | None:
    if _all_match(values, _HEX_BYTES, 8, 128):
        return None
    return np.fromiter((not (8 <= len(v) <= 128 and _HEX.issuperset(v)) for v in values), dtype=bool, count=len(values))


def _not_in(values: list[str], allowed: Collection[str]) -> np.ndarray | None:
    if set(values).issubset(allowed):
        return None
    return np.fromiter((v not in allowed for v in values), dtype=bool, count=len(values))


def _header_flags(headers: HeaderColumns) -> tuple[np.ndarray, np.ndarray]:
    """Per header: whether a rule of :class:`~knittrans.types.UnitHeader` may fail, and its first dimension (0
    without one)."""
    count = len(headers)
    dtypes = headers.dtypes
    known = (dtypes >= 0) & (dtypes < len(_ITEMSIZE_LUT))
    itemsize = np.where(known, _ITEMSIZE_LUT[np.where(known, dtypes, 0)], 0)
    flagged = itemsize == 0
    ranks = headers.ranks
    shape = headers.shape
    starts = headers.shape_offsets[:-1]
    exact = itemsize.copy()
    approximate = itemsize.astype(np.float64)
    first = np.zeros(count, dtype=np.uint64)
    for axis in range(min(int(ranks.max(initial=0)), _MAX_RANK)):
        present = ranks > axis
        dims = np.where(present, shape[np.where(present, starts + axis, 0)] if len(shape) else 0, 1).astype(np.uint64)
        if axis == 0:
            first = np.where(present, dims, 0).astype(np.uint64)
        exact = exact * dims.astype(np.int64)  # wraps only where `approximate` says so
        approximate = approximate * dims.astype(np.float64)
    flagged |= (ranks > _MAX_RANK) | (approximate > _EXACT_LIMIT)
    flagged |= exact.astype(np.uint64) != headers.byte_lengths
    bad_hashes = _bad_hashes(headers.content_hashes)
    if bad_hashes is not None:
        flagged |= bad_hashes
    has_axis = headers.has_seq_axis
    flagged |= has_axis & ((headers.seq_axes != 0) | (ranks == 0))
    flagged |= ~has_axis & (headers.chunk_tokens != 0)
    return flagged, first


def _row_sums(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Per row, the sum of its slice of ``values`` (rows without elements get 0)."""
    counts = np.diff(offsets)
    sums = np.zeros(len(counts), dtype=values.dtype)
    rows = np.flatnonzero(counts)
    if len(rows):
        sums[rows] = np.add.reduceat(values, offsets[rows])
    return sums


def _row_minimums(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    counts = np.diff(offsets)
    minimums = np.zeros(len(counts), dtype=values.dtype)
    rows = np.flatnonzero(counts)
    if len(rows):
        minimums[rows] = np.minimum.reduceat(values, offsets[rows])
    return minimums


def _repeated_field_rows(columns: TrajectoryColumns) -> np.ndarray | None:
    """Which trajectories name a field twice (None: none does)."""
    names = columns.field_names
    first: dict[str, int] = {}
    canonical = np.array([first.setdefault(name, i) for i, name in enumerate(names)], dtype=np.int64)
    codes = canonical[columns.unit_fields] if len(names) else columns.unit_fields
    counts = np.diff(columns.unit_offsets)
    if not len(codes):
        return None
    width = int(counts[0])
    # Reports usually carry the same fields in the same order for every trajectory: check that pattern once.
    if width and (counts == width).all():
        table = codes.reshape(len(counts), width)
        if (table == table[0]).all() and len(set(table[0].tolist())) == width:
            return None
    pairs = np.sort(columns.unit_rows * len(names) + codes)
    repeated = pairs[1:][pairs[1:] == pairs[:-1]] // len(names)
    if not len(repeated):
        return None
    rows = np.zeros(len(counts), dtype=bool)
    rows[repeated] = True
    return rows


def _flag_by_index(bad_names: np.ndarray | None, indices: np.ndarray) -> np.ndarray | None:
    """Per element naming a dictionary entry: whether that entry is bad."""
    return None if bad_names is None else bad_names[indices]


def flag_trajectories(columns: TrajectoryColumns, limits: IngestLimits, current_version: int) -> np.ndarray:
    """Per trajectory: whether :func:`check_trajectory` might reject it. False means it certainly accepts it."""
    n = len(columns)
    flagged = np.zeros(n, dtype=bool)

    def flag_parts(rows: np.ndarray, bad: np.ndarray | None) -> None:
        if bad is not None and bad.any():
            flagged[rows[bad]] = True

    for values in (columns.trajectory_ids, columns.sample_ids):
        bad = _bad_ids(values)
        if bad is not None:
            flagged |= bad
    bad = _not_in(columns.sources, limits.sources)
    if bad is not None:
        flagged |= bad
    num_tokens = columns.num_tokens
    flagged |= (num_tokens < 1) | (num_tokens > limits.max_tokens) | (columns.num_loss_tokens > num_tokens)
    response_starts = columns.response_starts
    flagged |= response_starts > num_tokens
    flagged |= ~np.isfinite(columns.finished_at)
    # Segments. One longer than max_tokens is invalid either way, and keeps the sums below from overflowing.
    segment_counts = np.diff(columns.segment_offsets)
    flagged |= (segment_counts == 0) | (segment_counts > limits.max_segments)
    lengths = columns.segment_tokens
    flag_parts(columns.segment_rows,
               (lengths < 1) | (lengths > limits.max_tokens) | (columns.segment_versions > current_version))
    flagged |= _row_sums(lengths, columns.segment_offsets) > num_tokens
    # Units.
    flagged |= np.diff(columns.unit_offsets) > limits.max_units
    unit_rows = columns.unit_rows
    flag_parts(unit_rows, _bad_ids(columns.unit_keys))
    flag_parts(unit_rows, _flag_by_index(_bad_ids(columns.field_names), columns.unit_fields))
    repeated = _repeated_field_rows(columns)
    if repeated is not None:
        flagged |= repeated
    kinds = columns.unit_kinds
    header_flags, first_dims = _header_flags(columns.unit_headers)
    token_field = kinds == TOKEN_FIELD_KIND
    # A response-only unit covers tokens [response_start, num_tokens); its row count is checked against that.
    coverages = columns.unit_coverages
    covered = num_tokens[unit_rows] - np.where(coverages != 0, response_starts[unit_rows], 0)
    flag_parts(unit_rows, ~np.isin(kinds, _UNIT_KIND_NUMBERS) | ~columns.unit_has_header | header_flags
               | (token_field & (~columns.unit_headers.has_seq_axis | (first_dims != covered))))
    if coverages.any():
        flag_parts(unit_rows, ~np.isin(coverages, _COVERAGE_NUMBERS) | ((coverages != 0) & ~token_field))
    alignments = columns.unit_alignments
    if alignments.any():
        flag_parts(unit_rows, ~np.isin(alignments, _ALIGNMENT_NUMBERS) | ((alignments != 0) & ~token_field))
    # Multimodal references.
    flagged |= np.diff(columns.multimodal_offsets) > limits.max_multimodal
    refs = columns.multimodal_rows
    flag_parts(refs, _bad_ids(columns.multimodal_keys))
    flag_parts(refs, _flag_by_index(_not_in(columns.encoders, limits.encoders), columns.multimodal_encoder_indices))
    costs = columns.multimodal_costs
    starts, ends = columns.placeholder_starts, columns.placeholder_ends
    flag_parts(refs, ~((costs > 0) & np.isfinite(costs)) | ~np.isin(columns.multimodal_kinds, _MEDIA_KIND_NUMBERS)
               | (ends <= starts) | (ends > num_tokens[refs]))
    with_header = columns.multimodal_header_index >= 0
    if with_header.any():
        flag_parts(refs[with_header], _header_flags(columns.multimodal_headers)[0])
    if columns.values is not None:  # typed values: their rules (JSON, sizes, names) run in the exact check
        flagged |= np.fromiter((v is not None for v in columns.values), dtype=bool, count=n)
    return flagged


def oldest_versions(columns: TrajectoryColumns) -> list[int]:
    """Per trajectory: the version of its oldest segment (for valid trajectories, which have segments)."""
    return _row_minimums(columns.segment_versions, columns.segment_offsets).tolist()


def check_columns(
    columns: TrajectoryColumns, limits: IngestLimits, current_version: int, *, max_batch: int
) -> None:
    """Validate a whole report: the same rules and the same first error as :func:`check_batch` on its messages
    (``trajectories[i].field``); nothing but flagged trajectories is looked at one by one."""
    n = len(columns)
    if n > max_batch:
        raise InvalidArgument(f"{n} trajectories exceed the limit of {max_batch}", field="trajectories")
    # Column checks cost a fixed few hundred microseconds; a small report is checked one message at a time.
    if n <= _SMALL_REPORT:
        flagged = np.ones(n, dtype=bool)
    else:
        flagged = flag_trajectories(columns, limits, current_version)
    ids = columns.trajectory_ids
    repeated_at = n
    if len(set(ids)) != n:
        seen: set[str] = set()
        for i, trajectory_id in enumerate(ids):
            if trajectory_id in seen:
                repeated_at = i
                break
            seen.add(trajectory_id)
    for i in np.flatnonzero(flagged).tolist():
        if i > repeated_at:
            break
        check_trajectory(columns.message(i), f"trajectories[{i}]", limits, current_version)
    if repeated_at < n:
        raise InvalidArgument("appears twice in one report", field=f"trajectories[{repeated_at}].trajectory_id")


def fingerprint(message: trajectory_pb2.TrajectoryMetadata) -> bytes:
    """Identity of a report's content, to tell an identical re-send from a conflicting one."""
    return hashlib.blake2b(message.SerializeToString(deterministic=True), digest_size=16).digest()
