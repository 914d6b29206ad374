from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    D_TYPE_UNSPECIFIED: _ClassVar[DType]
    D_TYPE_BOOL: _ClassVar[DType]
    D_TYPE_UINT8: _ClassVar[DType]
    D_TYPE_INT8: _ClassVar[DType]
    D_TYPE_UINT16: _ClassVar[DType]
    D_TYPE_INT16: _ClassVar[DType]
    D_TYPE_INT32: _ClassVar[DType]
    D_TYPE_UINT32: _ClassVar[DType]
    D_TYPE_INT64: _ClassVar[DType]
    D_TYPE_FLOAT16: _ClassVar[DType]
    D_TYPE_BFLOAT16: _ClassVar[DType]
    D_TYPE_FLOAT32: _ClassVar[DType]
    D_TYPE_FLOAT64: _ClassVar[DType]

class UnitKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    UNIT_KIND_UNSPECIFIED: _ClassVar[UnitKind]
    UNIT_KIND_TOKEN_FIELD: _ClassVar[UnitKind]
    UNIT_KIND_FIELD: _ClassVar[UnitKind]
    UNIT_KIND_IMAGE: _ClassVar[UnitKind]
    UNIT_KIND_VIDEO: _ClassVar[UnitKind]
D_TYPE_UNSPECIFIED: DType
D_TYPE_BOOL: DType
D_TYPE_UINT8: DType
D_TYPE_INT8: DType
D_TYPE_UINT16: DType
D_TYPE_INT16: DType
D_TYPE_INT32: DType
D_TYPE_UINT32: DType
D_TYPE_INT64: DType
D_TYPE_FLOAT16: DType
D_TYPE_BFLOAT16: DType
D_TYPE_FLOAT32: DType
D_TYPE_FLOAT64: DType
UNIT_KIND_UNSPECIFIED: UnitKind
UNIT_KIND_TOKEN_FIELD: UnitKind
UNIT_KIND_FIELD: UnitKind
UNIT_KIND_IMAGE: UnitKind
UNIT_KIND_VIDEO: UnitKind

class UnitHeader(_message.Message):
    __slots__ = ("dtype", "shape", "seq_axis", "byte_length", "content_hash", "chunk_tokens")
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    SEQ_AXIS_FIELD_NUMBER: _ClassVar[int]
    BYTE_LENGTH_FIELD_NUMBER: _ClassVar[int]
    CONTENT_HASH_FIELD_NUMBER: _ClassVar[int]
    CHUNK_TOKENS_FIELD_NUMBER: _ClassVar[int]
    dtype: DType
    shape: _containers.RepeatedScalarFieldContainer[int]
    seq_axis: int
    byte_length: int
    content_hash: str
    chunk_tokens: int
    def __init__(self, dtype: _Optional[_Union[DType, str]] = ..., shape: _Optional[_Iterable[int]] = ..., seq_axis: _Optional[int] = ..., byte_length: _Optional[int] = ..., content_hash: _Optional[str] = ..., chunk_tokens: _Optional[int] = ...) -> None: ...

class UnitRef(_message.Message):
    __slots__ = ("key", "field_name", "kind", "header")
    KEY_FIELD_NUMBER: _ClassVar[int]
    FIELD_NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    key: str
    field_name: str
    kind: UnitKind
    header: UnitHeader
    def __init__(self, key: _Optional[str] = ..., field_name: _Optional[str] = ..., kind: _Optional[_Union[UnitKind, str]] = ..., header: _Optional[_Union[UnitHeader, _Mapping]] = ...) -> None: ...

class TokenSpan(_message.Message):
    __slots__ = ("start", "end")
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    start: int
    end: int
    def __init__(self, start: _Optional[int] = ..., end: _Optional[int] = ...) -> None: ...

class MultimodalRef(_message.Message):
    __slots__ = ("key", "encoder", "cost", "placeholder", "kind", "header")
    KEY_FIELD_NUMBER: _ClassVar[int]
    ENCODER_FIELD_NUMBER: _ClassVar[int]
    COST_FIELD_NUMBER: _ClassVar[int]
    PLACEHOLDER_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    key: str
    encoder: str
    cost: float
    placeholder: TokenSpan
    kind: UnitKind
    header: UnitHeader
    def __init__(self, key: _Optional[str] = ..., encoder: _Optional[str] = ..., cost: _Optional[float] = ..., placeholder: _Optional[_Union[TokenSpan, _Mapping]] = ..., kind: _Optional[_Union[UnitKind, str]] = ..., header: _Optional[_Union[UnitHeader, _Mapping]] = ...) -> None: ...

class VersionSegment(_message.Message):
    __slots__ = ("version", "num_tokens")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    version: int
    num_tokens: int
    def __init__(self, version: _Optional[int] = ..., num_tokens: _Optional[int] = ...) -> None: ...

class TrajectoryMetadata(_message.Message):
    __slots__ = ("trajectory_id", "sample_id", "source", "rollout_step", "num_tokens", "num_loss_tokens", "segments", "units", "multimodal", "accepted", "scalars", "finished_at")
    class ScalarsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    TRAJECTORY_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_ID_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_STEP_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_LOSS_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    UNITS_FIELD_NUMBER: _ClassVar[int]
    MULTIMODAL_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    SCALARS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    trajectory_id: str
    sample_id: str
    source: str
    rollout_step: int
    num_tokens: int
    num_loss_tokens: int
    segments: _containers.RepeatedCompositeFieldContainer[VersionSegment]
    units: _containers.RepeatedCompositeFieldContainer[UnitRef]
    multimodal: _containers.RepeatedCompositeFieldContainer[MultimodalRef]
    accepted: bool
    scalars: _containers.ScalarMap[str, float]
    finished_at: float
    def __init__(self, trajectory_id: _Optional[str] = ..., sample_id: _Optional[str] = ..., source: _Optional[str] = ..., rollout_step: _Optional[int] = ..., num_tokens: _Optional[int] = ..., num_loss_tokens: _Optional[int] = ..., segments: _Optional[_Iterable[_Union[VersionSegment, _Mapping]]] = ..., units: _Optional[_Iterable[_Union[UnitRef, _Mapping]]] = ..., multimodal: _Optional[_Iterable[_Union[MultimodalRef, _Mapping]]] = ..., accepted: _Optional[bool] = ..., scalars: _Optional[_Mapping[str, float]] = ..., finished_at: _Optional[float] = ...) -> None: ...
