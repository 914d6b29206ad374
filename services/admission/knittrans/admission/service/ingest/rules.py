"""Validation of reported trajectory metadata on the ingest hot path.

Building the full domain object (:func:`knittrans.wire.trajectory_from_proto`) for every report costs far
more than the ingest budget (50k reports/s on two cores), so reports are checked with the same rules without
building it. :func:`check_trajectory` checks one message and names the first bad field; a property test keeps it
equivalent to the domain types. :func:`check_columns` checks a whole report as columns
(:class:`~knittrans.admission.service.trajectory_columns.TrajectoryColumns`, from either report form): each rule
runs once over a column with numpy, and only a trajectory it flags (or whose numbers are too large for exact
array arithmetic) goes through :func:`check_trajectory`, which raises the error. So both forms of a report get the
same error, and property tests keep the column rules from passing anything :func:`check_trajectory` rejects.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from knittrans.admission.service.trajectory_columns import HeaderColumns, TrajectoryColumns
from knittrans.errors import InvalidArgument
from knittrans.types import _ID_PATTERN, MAX_ID_LENGTH, DType
from knittrans.v1 import trajectory_pb2

_ITEMSIZE_BY_PROTO = {
    trajectory_pb2.DType.Value(f"D_TYPE_{dtype.name}"): dtype.itemsize for dtype in DType
}
_TOKEN_FIELD = trajectory_pb2.UNIT_KIND_TOKEN_FIELD
_MEDIA_KINDS = frozenset((trajectory_pb2.UNIT_KIND_IMAGE, trajectory_pb2.UNIT_KIND_VIDEO))
_UNIT_KINDS = frozenset((_TOKEN_FIELD, trajectory_pb2.UNIT_KIND_FIELD)) | _MEDIA_KINDS
_HEX = frozenset("0123456789abcdef")
_ALIGNMENTS = frozenset(trajectory_pb2.FieldAlignment.values())


@dataclass(frozen=True, kw_only=True)
class IngestLimits:
    """What the service accepts; everything a client sends is bounded."""

    sources: Collection[str]
    encoders: Collection[str]
    max_units: int = 64
    max_multimodal: int = 256
    max_segments: int = 4096
    max_tokens: int = 4 * 1024 * 1024


class Ingested(NamedTuple):
    """What the service keeps of a validated report besides the message itself, read in one pass."""

    trajectory_id: str
    sample_id: str
    source: str
    rollout_step: int
    num_tokens: int
    oldest_version: int
    accepted: bool
    unit_keys: tuple[str, ...]
    multimodal_keys: tuple[str, ...]


def _listed(names: Collection[str], none: str = "none") -> str:
    return ", ".join(repr(name) for name in sorted(names)) if names else none


def _bad_id(value: str) -> bool:
    return not value or len(value) > MAX_ID_LENGTH or not _ID_PATTERN.match(value)


def _id_error(value: str, field: str) -> InvalidArgument:
    if not value:
        return InvalidArgument("is required", field=field)
    return InvalidArgument(f"must be at most {MAX_ID_LENGTH} characters of [A-Za-z0-9._:@/+=-]", field=field)


def _check_header(header: trajectory_pb2.UnitHeader, field: str) -> int:
    """Validate a header; returns its first dimension (0 when it has no shape)."""
    itemsize = _ITEMSIZE_BY_PROTO.get(header.dtype)
    if itemsize is None:
        raise InvalidArgument("unknown or unspecified dtype", field=f"{field}.dtype")
    shape = header.shape
    expected = itemsize
    for dim in shape:
        expected *= dim
    if header.byte_length != expected:
        raise InvalidArgument(
            f"{header.byte_length} bytes do not match shape {list(shape)}", field=f"{field}.byte_length"
        )
    digest = header.content_hash
    if not 8 <= len(digest) <= 128 or not _HEX.issuperset(digest):
        raise InvalidArgument("must be a lower-case hex digest", field=f"{field}.content_hash")
    if header.HasField("seq_axis"):
        if header.seq_axis != 0:
            raise InvalidArgument("must be 0 (leading axis) or unset", field=f"{field}.seq_axis")
        if not shape:
            raise InvalidArgument("a sequence unit needs at least one dimension", field=f"{field}.shape")
    elif header.chunk_tokens:
        raise InvalidArgument("chunking needs a sequence axis", field=f"{field}.chunk_tokens")
    return shape[0] if shape else 0


def check_trajectory(
    message: trajectory_pb2.TrajectoryMetadata, field: str, limits: IngestLimits, current_version: int
) -> Ingested:
    """Validate one report, reading every field once; raise :class:`InvalidArgument` naming
    ``field.<sub-field>``. Field paths are only formatted on error: this is the ingest hot path."""
    trajectory_id = message.trajectory_id
    if _bad_id(trajectory_id):
        raise _id_error(trajectory_id, f"{field}.trajectory_id")
    sample_id = message.sample_id
    if _bad_id(sample_id):
        raise _id_error(sample_id, f"{field}.sample_id")
    source = message.source
    if source not in limits.sources:
        raise InvalidArgument(f"unknown source {source!r}; the job's sources are {_listed(limits.sources)}",
                              field=f"{field}.source")
    num_tokens = message.num_tokens
    if num_tokens < 1:
        raise InvalidArgument("must be a positive integer", field=f"{field}.num_tokens")
    if num_tokens > limits.max_tokens:
        raise InvalidArgument(f"exceeds the limit of {limits.max_tokens}", field=f"{field}.num_tokens")
    if message.num_loss_tokens > num_tokens:
        raise InvalidArgument("exceeds num_tokens", field=f"{field}.num_loss_tokens")
    segments = message.segments
    if not segments:
        raise InvalidArgument("needs at least one version segment", field=f"{field}.segments")
    if len(segments) > limits.max_segments:
        raise InvalidArgument(f"more than {limits.max_segments} segments", field=f"{field}.segments")
    covered = 0
    oldest = None
    for i, segment in enumerate(segments):
        tokens = segment.num_tokens
        version = segment.version
        if tokens < 1:
            raise InvalidArgument("must be a positive integer", field=f"{field}.segments[{i}].num_tokens")
        if version > current_version:
            raise InvalidArgument(
                f"version {version} is from the future (current version is {current_version})",
                field=f"{field}.segments[{i}].version",
            )
        covered += tokens
        if oldest is None or version < oldest:
            oldest = version
    if covered > num_tokens:
        raise InvalidArgument("segments cover more tokens than num_tokens", field=f"{field}.segments")
    units = message.units
    if len(units) > limits.max_units:
        raise InvalidArgument(f"more than {limits.max_units} units", field=f"{field}.units")
    unit_keys = []
    seen_fields: set[str] = set()
    for i, unit in enumerate(units):
        key = unit.key
        if _bad_id(key):
            raise _id_error(key, f"{field}.units[{i}].key")
        field_name = unit.field_name
        if _bad_id(field_name):
            raise _id_error(field_name, f"{field}.units[{i}].field_name")
        if field_name in seen_fields:
            raise InvalidArgument(f"field {field_name!r} appears twice", field=f"{field}.units[{i}].field_name")
        seen_fields.add(field_name)
        kind = unit.kind
        if kind not in _UNIT_KINDS:
            raise InvalidArgument("unknown or unspecified unit kind", field=f"{field}.units[{i}].kind")
        if not unit.HasField("header"):
            raise InvalidArgument("is required", field=f"{field}.units[{i}].header")
        header = unit.header
        first_dim = _check_header(header, f"{field}.units[{i}].header")
        alignment = unit.alignment
        if alignment:
            if alignment not in _ALIGNMENTS:
                raise InvalidArgument(f"unknown field alignment {alignment}", field=f"{field}.units[{i}].alignment")
            if kind != _TOKEN_FIELD:
                raise InvalidArgument("only per-token fields have an alignment", field=f"{field}.units[{i}].alignment")
        if kind == _TOKEN_FIELD:
            if not header.HasField("seq_axis"):
                raise InvalidArgument("a token field must have seq_axis 0", field=f"{field}.units[{i}].header.seq_axis")
            if first_dim != num_tokens:
                raise InvalidArgument(
                    f"has {first_dim} tokens, the trajectory has {num_tokens}", field=f"{field}.units[{i}].header.shape"
                )
        unit_keys.append(key)
    multimodal = message.multimodal
    if len(multimodal) > limits.max_multimodal:
        raise InvalidArgument(f"more than {limits.max_multimodal} references", field=f"{field}.multimodal")
    multimodal_keys = []
    for i, ref in enumerate(multimodal):
        key = ref.key
        if _bad_id(key):
            raise _id_error(key, f"{field}.multimodal[{i}].key")
        if ref.encoder not in limits.encoders:
            raise InvalidArgument(
                f"unknown encoder {ref.encoder!r}; the job's topology has {_listed(limits.encoders, 'no encoders')}",
                field=f"{field}.multimodal[{i}].encoder",
            )
        cost = ref.cost
        if not (cost > 0 and math.isfinite(cost)):
            raise InvalidArgument("must be a positive finite number", field=f"{field}.multimodal[{i}].cost")
        if ref.kind not in _MEDIA_KINDS:
            raise InvalidArgument("must be image or video", field=f"{field}.multimodal[{i}].kind")
        span = ref.placeholder
        start, end = span.start, span.end
        if end < start:
            raise InvalidArgument(
                f"end {end} is before start {start}", field=f"{field}.multimodal[{i}].placeholder.end"
            )
        if end == start:
            raise InvalidArgument(
                "must hold at least one placeholder token", field=f"{field}.multimodal[{i}].placeholder"
            )
        if end > num_tokens:
            raise InvalidArgument("placeholder lies outside the sequence", field=f"{field}.multimodal[{i}].placeholder")
        if ref.HasField("header"):
            _check_header(ref.header, f"{field}.multimodal[{i}].header")
        multimodal_keys.append(key)
    if not math.isfinite(message.finished_at):
        raise InvalidArgument("must be finite", field=f"{field}.finished_at")
    return Ingested(trajectory_id, sample_id, source, message.rollout_step, num_tokens, oldest, message.accepted,
                    tuple(unit_keys), tuple(dict.fromkeys(multimodal_keys)))


def check_batch(
    trajectories: Sequence[trajectory_pb2.TrajectoryMetadata], limits: IngestLimits, current_version: int,
    *, max_batch: int,
) -> list[Ingested]:
    """Validate a whole report; one bad item rejects the batch, naming ``trajectories[i].field``."""
    if len(trajectories) > max_batch:
        raise InvalidArgument(f"{len(trajectories)} trajectories exceed the limit of {max_batch}", field="trajectories")
    seen: set[str] = set()
    ingested = []
    for i, message in enumerate(trajectories):
        item = check_trajectory(message, f"trajectories[{i}]", limits, current_version)
        if item.trajectory_id in seen:
            raise InvalidArgument("appears twice in one report", field=f"trajectories[{i}].trajectory_id")
        seen.add(item.trajectory_id)
        ingested.append(item)
    return ingested


# ---- whole reports, as columns -------------------------------------------------------------------------------

_ID_BYTES = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:@/+=-"
_HEX_BYTES = b"0123456789abcdef"
_ITEMSIZE_LUT = np.zeros(max(_ITEMSIZE_BY_PROTO) + 1, dtype=np.int64)
for _number, _size in _ITEMSIZE_BY_PROTO.items():
    _ITEMSIZE_LUT[_number] = _size
_SMALL_REPORT = 4  # trajectories
_MAX_RANK = 16  # shapes of more dimensions go to the exact check
_EXACT_LIMIT = float(2**62)  # above this, products of shape dimensions could overflow int64
_UNIT_KIND_NUMBERS = np.array(sorted(_UNIT_KINDS), dtype=np.int64)
_MEDIA_KIND_NUMBERS = np.array(sorted(_MEDIA_KINDS), dtype=np.int64)
_ALIGNMENT_NUMBERS = np.array(sorted(_ALIGNMENTS), dtype=np.int64)


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
    """Per header: whether a rule of :func:`_check_header` may fail, and its first dimension (0 without one)."""
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
    token_field = kinds == _TOKEN_FIELD
    flag_parts(unit_rows, ~np.isin(kinds, _UNIT_KIND_NUMBERS) | ~columns.unit_has_header | header_flags
               | (token_field & (~columns.unit_headers.has_seq_axis | (first_dims != num_tokens[unit_rows]))))
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
