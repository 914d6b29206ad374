"""Validation of reported trajectory metadata on the ingest hot path.

Building the full domain object (:func:`knittrans.wire.trajectory_from_proto`) for every report costs far
more than the ingest budget (50k reports/s on two cores), so reports are checked directly on the protobuf
message with the same rules, and converted to :class:`~knittrans.types.TrajectoryMeta` only when admitted.
A property test keeps the two checks equivalent.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import NamedTuple

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
        raise InvalidArgument(f"unknown source {source!r}", field=f"{field}.source")
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
            raise InvalidArgument(f"unknown encoder {ref.encoder!r}", field=f"{field}.multimodal[{i}].encoder")
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


def fingerprint(message: trajectory_pb2.TrajectoryMetadata) -> bytes:
    """Identity of a report's content, to tell an identical re-send from a conflicting one."""
    return hashlib.blake2b(message.SerializeToString(deterministic=True), digest_size=16).digest()
