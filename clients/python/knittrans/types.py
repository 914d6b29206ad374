"""Typed domain objects shared by every part of KnitTrans.

Everything here is a keyword-only frozen dataclass validated in ``__post_init__``; invalid values raise
:class:`~knittrans.errors.InvalidArgument` naming the field. Wire conversion lives in
:mod:`knittrans.wire`, so this module stays free of protobuf.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from enum import StrEnum
from typing import NewType

from knittrans.errors import InvalidArgument
from knittrans.int_checks import check_non_negative_int as _check_non_negative_int
from knittrans.int_checks import check_positive_int as _check_positive_int
from knittrans.values import NO_VALUES, TrajectoryValues

TrajectoryId = NewType("TrajectoryId", str)
SampleId = NewType("SampleId", str)
SourceName = NewType("SourceName", str)
UnitKey = NewType("UnitKey", str)
RequestId = NewType("RequestId", str)

MAX_ID_LENGTH = 256
_ID_PATTERN = re.compile(r"^[A-Za-z0-9._:@/+=-]+\Z")  # \Z: "$" would let a trailing newline through


def check_id(value: str, field_name: str) -> None:
    """IDs travel as storage keys and metric-free log fields, so they are bounded and printable."""
    if not isinstance(value, str) or not value:
        raise InvalidArgument("must be a non-empty string", field=field_name)
    if len(value) > MAX_ID_LENGTH:
        raise InvalidArgument(f"longer than {MAX_ID_LENGTH} characters", field=field_name)
    if not _ID_PATTERN.match(value):
        raise InvalidArgument(f"has characters outside [A-Za-z0-9._:@/+=-]: {value!r}", field=field_name)




class DType(StrEnum):
    """Element types of stored units; all are stored little-endian."""

    BOOL = "bool"
    UINT8 = "uint8"
    INT8 = "int8"
    UINT16 = "uint16"
    INT16 = "int16"
    INT32 = "int32"
    UINT32 = "uint32"
    INT64 = "int64"
    FLOAT16 = "float16"
    BFLOAT16 = "bfloat16"
    FLOAT32 = "float32"
    FLOAT64 = "float64"

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self]

    @classmethod
    def parse(cls, value: str, field_name: str = "dtype") -> DType:
        try:
            return cls(value)
        except ValueError:
            raise InvalidArgument(
                f"unknown dtype {value!r}; expected one of {', '.join(d.value for d in cls)}", field=field_name
            ) from None


_ITEMSIZE = {
    DType.BOOL: 1,
    DType.UINT8: 1,
    DType.INT8: 1,
    DType.UINT16: 2,
    DType.INT16: 2,
    DType.INT32: 4,
    DType.UINT32: 4,
    DType.INT64: 8,
    DType.FLOAT16: 2,
    DType.BFLOAT16: 2,
    DType.FLOAT32: 4,
    DType.FLOAT64: 8,
}


class UnitKind(StrEnum):
    """What an atomic unit holds."""

    TOKEN_FIELD = "token_field"  # one per-token field of one trajectory, sliceable along axis 0
    FIELD = "field"  # a non-sequence field of one trajectory (read whole by every CP rank)
    IMAGE = "image"
    VIDEO = "video"  # one group of consecutive frames


class FieldAlignment(StrEnum):
    """What position t of a per-target field (loss mask, log-probs, advantages, ...) describes.

    The packer delivers every such field *label-aligned*, like ``labels``: packed position t carries what
    concerns the prediction of token t+1 from position t. It shifts a token-aligned field left by one inside
    each trajectory to get there. Fields without an alignment (inputs such as MoE routing) are packed as stored.
    """

    TOKEN = "token"  # position t describes token t itself (verl's response_mask, slime's loss_masks)
    LABEL = "label"  # position t describes the prediction of token t+1 (already aligned with ``labels``)

    @classmethod
    def parse(cls, value: str, field_name: str = "alignment") -> FieldAlignment:
        try:
            return cls(value)
        except ValueError:
            raise InvalidArgument(
                f"unknown alignment {value!r}; expected one of {', '.join(a.value for a in cls)}", field=field_name
            ) from None


class Coverage(StrEnum):
    """Which tokens a per-token field covers."""

    SEQUENCE = "sequence"  # every token, prompt included: shape[0] is the trajectory's num_tokens
    RESPONSE = "response"  # only [response_start, num_tokens): row j describes token response_start + j


class AdmissionUnit(StrEnum):
    TRAJECTORY = "trajectory"
    GROUP = "group"


@dataclass(frozen=True, kw_only=True)
class ByteRange:
    """A half-open byte range ``[offset, offset + length)`` inside one unit."""

    offset: int
    length: int

    def __post_init__(self) -> None:
        _check_non_negative_int(self.offset, "offset")
        _check_non_negative_int(self.length, "length")

    @property
    def end(self) -> int:
        return self.offset + self.length


@dataclass(frozen=True, kw_only=True)
class TokenSpan:
    """A half-open token range ``[start, end)`` along a sequence."""

    start: int
    end: int

    def __post_init__(self) -> None:
        _check_non_negative_int(self.start, "start")
        _check_non_negative_int(self.end, "end")
        if self.end < self.start:
            raise InvalidArgument(f"end {self.end} is before start {self.start}", field="end")

    @property
    def length(self) -> int:
        return self.end - self.start


@dataclass(frozen=True, kw_only=True)
class UnitHeader:
    """Describes the raw little-endian bytes of one atomic unit.

    ``seq_axis`` is 0 for per-token fields (the leading axis is the sequence, so a token range is one
    contiguous byte range) and ``None`` for units that are never sliced. ``chunk_tokens`` > 0 means the
    storage layer keeps the unit as fixed-size chunks of that many tokens.
    """

    dtype: DType
    shape: tuple[int, ...]
    byte_length: int
    content_hash: str
    seq_axis: int | None = None
    chunk_tokens: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.dtype, DType):
            object.__setattr__(self, "dtype", DType.parse(str(self.dtype)))
        shape = tuple(self.shape)
        object.__setattr__(self, "shape", shape)
        for i, dim in enumerate(shape):
            _check_non_negative_int(dim, f"shape[{i}]")
        if self.seq_axis not in (None, 0):
            raise InvalidArgument("must be 0 (leading axis) or unset", field="seq_axis")
        if self.seq_axis == 0 and not shape:
            raise InvalidArgument("a sequence unit needs at least one dimension", field="shape")
        _check_non_negative_int(self.byte_length, "byte_length")
        expected = math.prod(shape) * self.dtype.itemsize
        if self.byte_length != expected:
            raise InvalidArgument(
                f"{self.byte_length} bytes do not match shape {shape} of {self.dtype} ({expected} bytes)",
                field="byte_length",
            )
        if not isinstance(self.content_hash, str) or not re.fullmatch(r"[0-9a-f]{8,128}", self.content_hash):
            raise InvalidArgument("must be a lower-case hex digest", field="content_hash")
        _check_non_negative_int(self.chunk_tokens, "chunk_tokens")
        if self.chunk_tokens and self.seq_axis is None:
            raise InvalidArgument("chunking needs a sequence axis", field="chunk_tokens")

    @property
    def num_tokens(self) -> int:
        """Length along the sequence axis (0 for non-sequence units)."""
        return self.shape[0] if self.seq_axis == 0 else 0

    @property
    def token_bytes(self) -> int:
        """Bytes per token: the size of one row along the sequence axis."""
        if self.seq_axis is None:
            raise InvalidArgument("unit has no sequence axis", field="seq_axis")
        return math.prod(self.shape[1:]) * self.dtype.itemsize

    def byte_range(self, span: TokenSpan) -> ByteRange:
        """The bytes that hold tokens ``[span.start, span.end)``."""
        if span.end > self.num_tokens:
            raise InvalidArgument(
                f"token range [{span.start}, {span.end}) is outside the unit's {self.num_tokens} tokens",
                field="range",
            )
        row = self.token_bytes
        return ByteRange(offset=span.start * row, length=span.length * row)


@dataclass(frozen=True, kw_only=True)
class UnitRef:
    """One stored unit of a trajectory: its key, the field it holds and its header.

    ``alignment`` is set only on per-target token fields (see :class:`FieldAlignment`); the packer shifts a
    token-aligned one so that it reaches the trainer label-aligned. A token field's ``coverage`` says whether
    its rows start at token 0 or at the trajectory's ``response_start``."""

    key: UnitKey
    field_name: str
    kind: UnitKind
    header: UnitHeader
    alignment: FieldAlignment | None = None
    coverage: Coverage = Coverage.SEQUENCE

    def __post_init__(self) -> None:
        check_id(self.key, "key")
        check_id(self.field_name, "field_name")
        if not isinstance(self.kind, UnitKind):
            raise InvalidArgument(f"unknown unit kind {self.kind!r}", field="kind")
        if self.kind is UnitKind.TOKEN_FIELD and self.header.seq_axis != 0:
            raise InvalidArgument("a token field must have seq_axis 0", field="header.seq_axis")
        if self.alignment is not None:
            if not isinstance(self.alignment, FieldAlignment):
                object.__setattr__(self, "alignment", FieldAlignment.parse(self.alignment))
            if self.kind is not UnitKind.TOKEN_FIELD:
                raise InvalidArgument("only per-token fields have an alignment", field="alignment")
        if not isinstance(self.coverage, Coverage):
            raise InvalidArgument(f"must be a Coverage, got {self.coverage!r}", field="coverage")
        if self.coverage is Coverage.RESPONSE and self.kind is not UnitKind.TOKEN_FIELD:
            raise InvalidArgument("only per-token fields can cover only the response", field="coverage")


@dataclass(frozen=True, kw_only=True)
class MultimodalRef:
    """A multimodal input consumed by a trajectory.

    The key is sample-scoped and content-addressed, so every trajectory of a sample references the same
    stored unit. ``placeholder`` is where the encoder's output rows replace placeholder tokens.
    """

    key: UnitKey
    encoder: str
    cost: float
    placeholder: TokenSpan
    kind: UnitKind = UnitKind.IMAGE
    header: UnitHeader | None = None  # the stored bytes (pixels or frames); encoder sidecars read them

    def __post_init__(self) -> None:
        check_id(self.key, "key")
        check_id(self.encoder, "encoder")
        if not (isinstance(self.cost, (int, float)) and math.isfinite(self.cost) and self.cost > 0):
            raise InvalidArgument("must be a positive finite number", field="cost")
        if self.kind not in (UnitKind.IMAGE, UnitKind.VIDEO):
            raise InvalidArgument("must be image or video", field="kind")
        if not self.placeholder.length:
            raise InvalidArgument("must hold at least one placeholder token", field="placeholder")


@dataclass(frozen=True, kw_only=True)
class VersionSegment:
    """``num_tokens`` consecutive generated tokens produced under one policy version."""

    version: int
    num_tokens: int

    def __post_init__(self) -> None:
        _check_non_negative_int(self.version, "version")
        _check_positive_int(self.num_tokens, "num_tokens")


@dataclass(frozen=True, kw_only=True)
class TrajectoryMeta:
    """What a rollout worker reports for one finished trajectory (DESIGN.md §2 step 1)."""

    trajectory_id: TrajectoryId
    sample_id: SampleId
    source: SourceName
    rollout_step: int
    num_tokens: int
    num_loss_tokens: int
    segments: tuple[VersionSegment, ...]
    units: tuple[UnitRef, ...] = ()
    multimodal: tuple[MultimodalRef, ...] = ()
    accepted: bool = True
    scalars: tuple[tuple[str, float], ...] = ()
    finished_at: float = 0.0
    values: TrajectoryValues = NO_VALUES  # integer and boolean scalars, metadata
    # The first response token (tokens before it are the prompt); response-only units start there.
    response_start: int = 0

    def __post_init__(self) -> None:
        check_id(self.trajectory_id, "trajectory_id")
        check_id(self.sample_id, "sample_id")
        check_id(self.source, "source")
        _check_non_negative_int(self.rollout_step, "rollout_step")
        _check_positive_int(self.num_tokens, "num_tokens")
        _check_non_negative_int(self.num_loss_tokens, "num_loss_tokens")
        if self.num_loss_tokens > self.num_tokens:
            raise InvalidArgument("exceeds num_tokens", field="num_loss_tokens")
        _check_non_negative_int(self.response_start, "response_start")
        if self.response_start > self.num_tokens:
            raise InvalidArgument(f"{self.response_start} exceeds num_tokens {self.num_tokens}", field="response_start")
        object.__setattr__(self, "segments", tuple(self.segments))
        object.__setattr__(self, "units", tuple(self.units))
        object.__setattr__(self, "multimodal", tuple(self.multimodal))
        object.__setattr__(self, "scalars", tuple((str(k), float(v)) for k, v in self.scalars))
        if not self.segments:
            raise InvalidArgument("needs at least one version segment", field="segments")
        if sum(s.num_tokens for s in self.segments) > self.num_tokens:
            raise InvalidArgument("segments cover more tokens than num_tokens", field="segments")
        seen_fields: set[str] = set()
        for i, unit in enumerate(self.units):
            if unit.field_name in seen_fields:
                raise InvalidArgument(f"field {unit.field_name!r} appears twice", field=f"units[{i}].field_name")
            seen_fields.add(unit.field_name)
            covered = self.num_tokens - self.first_token(unit)
            if unit.kind is UnitKind.TOKEN_FIELD and unit.header.num_tokens != covered:
                what = (f"covers the response, tokens [{self.response_start}, {self.num_tokens})"
                        if unit.coverage is Coverage.RESPONSE else "covers the whole sequence")
                raise InvalidArgument(f"field {unit.field_name!r} has {unit.header.num_tokens} rows; it {what}, so "
                                      f"it needs {covered}", field=f"units[{i}].header.shape")
        for i, ref in enumerate(self.multimodal):
            if ref.placeholder.end > self.num_tokens:
                raise InvalidArgument("placeholder lies outside the sequence", field=f"multimodal[{i}].placeholder")
        if not math.isfinite(self.finished_at):
            raise InvalidArgument("must be finite", field="finished_at")
        for name, _ in (*self.values.int_scalars, *self.values.bool_scalars):
            if name in dict(self.scalars):
                raise InvalidArgument(f"scalar {name!r} has two kinds", field=f"values.{name}")

    def first_token(self, unit: UnitRef) -> int:
        """The token a per-token unit's row 0 describes: ``response_start`` for a response-only unit, else 0."""
        return self.response_start if unit.coverage is Coverage.RESPONSE else 0

    @property
    def oldest_version(self) -> int:
        """The version of the oldest token; a trajectory's staleness is measured from it."""
        return min(s.version for s in self.segments)

    @property
    def newest_version(self) -> int:
        return max(s.version for s in self.segments)


# The training topology lives in its own module; these names stay importable from here.
from knittrans.topology import (  # noqa: E402, I001
    BACKBONE_ROLE as BACKBONE_ROLE,
    ENCODER_ROLE_PREFIX as ENCODER_ROLE_PREFIX,
    ROLE_PREFIX as ROLE_PREFIX,
    BackboneTopology as BackboneTopology,
    ConsumerId as ConsumerId,
    CostModel as CostModel,
    EncoderTopology as EncoderTopology,
    Topology as Topology,
    TrainerRole as TrainerRole,
)
