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

class FieldAlignment(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FIELD_ALIGNMENT_UNSPECIFIED: _ClassVar[FieldAlignment]
    FIELD_ALIGNMENT_TOKEN: _ClassVar[FieldAlignment]
    FIELD_ALIGNMENT_LABEL: _ClassVar[FieldAlignment]

class TokenCoverage(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TOKEN_COVERAGE_UNSPECIFIED: _ClassVar[TokenCoverage]
    TOKEN_COVERAGE_RESPONSE: _ClassVar[TokenCoverage]
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
FIELD_ALIGNMENT_UNSPECIFIED: FieldAlignment
FIELD_ALIGNMENT_TOKEN: FieldAlignment
FIELD_ALIGNMENT_LABEL: FieldAlignment
TOKEN_COVERAGE_UNSPECIFIED: TokenCoverage
TOKEN_COVERAGE_RESPONSE: TokenCoverage

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
    __slots__ = ("key", "field_name", "kind", "header", "alignment", "coverage")
    KEY_FIELD_NUMBER: _ClassVar[int]
    FIELD_NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    ALIGNMENT_FIELD_NUMBER: _ClassVar[int]
    COVERAGE_FIELD_NUMBER: _ClassVar[int]
    key: str
    field_name: str
    kind: UnitKind
    header: UnitHeader
    alignment: FieldAlignment
    coverage: TokenCoverage
    def __init__(self, key: _Optional[str] = ..., field_name: _Optional[str] = ..., kind: _Optional[_Union[UnitKind, str]] = ..., header: _Optional[_Union[UnitHeader, _Mapping]] = ..., alignment: _Optional[_Union[FieldAlignment, str]] = ..., coverage: _Optional[_Union[TokenCoverage, str]] = ...) -> None: ...

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

class MetadataValue(_message.Message):
    __slots__ = ("text", "data", "json")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    JSON_FIELD_NUMBER: _ClassVar[int]
    text: str
    data: bytes
    json: str
    def __init__(self, text: _Optional[str] = ..., data: _Optional[bytes] = ..., json: _Optional[str] = ...) -> None: ...

class TrajectoryValues(_message.Message):
    __slots__ = ("int_scalars", "bool_scalars", "metadata")
    class IntScalarsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class BoolScalarsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bool
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bool] = ...) -> None: ...
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: MetadataValue
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[MetadataValue, _Mapping]] = ...) -> None: ...
    INT_SCALARS_FIELD_NUMBER: _ClassVar[int]
    BOOL_SCALARS_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    int_scalars: _containers.ScalarMap[str, int]
    bool_scalars: _containers.ScalarMap[str, bool]
    metadata: _containers.MessageMap[str, MetadataValue]
    def __init__(self, int_scalars: _Optional[_Mapping[str, int]] = ..., bool_scalars: _Optional[_Mapping[str, bool]] = ..., metadata: _Optional[_Mapping[str, MetadataValue]] = ...) -> None: ...

class TrajectoryMetadata(_message.Message):
    __slots__ = ("trajectory_id", "sample_id", "source", "rollout_step", "num_tokens", "num_loss_tokens", "segments", "units", "multimodal", "accepted", "scalars", "finished_at", "values", "response_start")
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
    VALUES_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_START_FIELD_NUMBER: _ClassVar[int]
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
    values: TrajectoryValues
    response_start: int
    def __init__(self, trajectory_id: _Optional[str] = ..., sample_id: _Optional[str] = ..., source: _Optional[str] = ..., rollout_step: _Optional[int] = ..., num_tokens: _Optional[int] = ..., num_loss_tokens: _Optional[int] = ..., segments: _Optional[_Iterable[_Union[VersionSegment, _Mapping]]] = ..., units: _Optional[_Iterable[_Union[UnitRef, _Mapping]]] = ..., multimodal: _Optional[_Iterable[_Union[MultimodalRef, _Mapping]]] = ..., accepted: _Optional[bool] = ..., scalars: _Optional[_Mapping[str, float]] = ..., finished_at: _Optional[float] = ..., values: _Optional[_Union[TrajectoryValues, _Mapping]] = ..., response_start: _Optional[int] = ...) -> None: ...

class UnitHeaderColumns(_message.Message):
    __slots__ = ("dtypes", "ranks", "shape", "has_seq_axis", "seq_axes", "byte_lengths", "content_hashes", "chunk_tokens")
    DTYPES_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    HAS_SEQ_AXIS_FIELD_NUMBER: _ClassVar[int]
    SEQ_AXES_FIELD_NUMBER: _ClassVar[int]
    BYTE_LENGTHS_FIELD_NUMBER: _ClassVar[int]
    CONTENT_HASHES_FIELD_NUMBER: _ClassVar[int]
    CHUNK_TOKENS_FIELD_NUMBER: _ClassVar[int]
    dtypes: _containers.RepeatedScalarFieldContainer[DType]
    ranks: _containers.RepeatedScalarFieldContainer[int]
    shape: _containers.RepeatedScalarFieldContainer[int]
    has_seq_axis: _containers.RepeatedScalarFieldContainer[bool]
    seq_axes: _containers.RepeatedScalarFieldContainer[int]
    byte_lengths: _containers.RepeatedScalarFieldContainer[int]
    content_hashes: _containers.RepeatedScalarFieldContainer[str]
    chunk_tokens: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, dtypes: _Optional[_Iterable[_Union[DType, str]]] = ..., ranks: _Optional[_Iterable[int]] = ..., shape: _Optional[_Iterable[int]] = ..., has_seq_axis: _Optional[_Iterable[bool]] = ..., seq_axes: _Optional[_Iterable[int]] = ..., byte_lengths: _Optional[_Iterable[int]] = ..., content_hashes: _Optional[_Iterable[str]] = ..., chunk_tokens: _Optional[_Iterable[int]] = ...) -> None: ...

class TrajectoryBatch(_message.Message):
    __slots__ = ("trajectory_ids", "sample_ids", "sources", "rollout_steps", "num_tokens", "num_loss_tokens", "accepted", "finished_at", "segment_counts", "segment_versions", "segment_tokens", "unit_counts", "unit_keys", "unit_fields", "unit_kinds", "unit_headers", "multimodal_counts", "multimodal_keys", "multimodal_encoders", "multimodal_costs", "placeholder_starts", "placeholder_ends", "multimodal_kinds", "multimodal_has_header", "multimodal_headers", "scalar_counts", "scalar_names", "scalar_values", "field_names", "encoders", "unit_alignments", "values", "response_starts", "unit_coverages")
    TRAJECTORY_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_IDS_FIELD_NUMBER: _ClassVar[int]
    SOURCES_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_STEPS_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_LOSS_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_COUNTS_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    UNIT_COUNTS_FIELD_NUMBER: _ClassVar[int]
    UNIT_KEYS_FIELD_NUMBER: _ClassVar[int]
    UNIT_FIELDS_FIELD_NUMBER: _ClassVar[int]
    UNIT_KINDS_FIELD_NUMBER: _ClassVar[int]
    UNIT_HEADERS_FIELD_NUMBER: _ClassVar[int]
    MULTIMODAL_COUNTS_FIELD_NUMBER: _ClassVar[int]
    MULTIMODAL_KEYS_FIELD_NUMBER: _ClassVar[int]
    MULTIMODAL_ENCODERS_FIELD_NUMBER: _ClassVar[int]
    MULTIMODAL_COSTS_FIELD_NUMBER: _ClassVar[int]
    PLACEHOLDER_STARTS_FIELD_NUMBER: _ClassVar[int]
    PLACEHOLDER_ENDS_FIELD_NUMBER: _ClassVar[int]
    MULTIMODAL_KINDS_FIELD_NUMBER: _ClassVar[int]
    MULTIMODAL_HAS_HEADER_FIELD_NUMBER: _ClassVar[int]
    MULTIMODAL_HEADERS_FIELD_NUMBER: _ClassVar[int]
    SCALAR_COUNTS_FIELD_NUMBER: _ClassVar[int]
    SCALAR_NAMES_FIELD_NUMBER: _ClassVar[int]
    SCALAR_VALUES_FIELD_NUMBER: _ClassVar[int]
    FIELD_NAMES_FIELD_NUMBER: _ClassVar[int]
    ENCODERS_FIELD_NUMBER: _ClassVar[int]
    UNIT_ALIGNMENTS_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_STARTS_FIELD_NUMBER: _ClassVar[int]
    UNIT_COVERAGES_FIELD_NUMBER: _ClassVar[int]
    trajectory_ids: _containers.RepeatedScalarFieldContainer[str]
    sample_ids: _containers.RepeatedScalarFieldContainer[str]
    sources: _containers.RepeatedScalarFieldContainer[str]
    rollout_steps: _containers.RepeatedScalarFieldContainer[int]
    num_tokens: _containers.RepeatedScalarFieldContainer[int]
    num_loss_tokens: _containers.RepeatedScalarFieldContainer[int]
    accepted: _containers.RepeatedScalarFieldContainer[bool]
    finished_at: _containers.RepeatedScalarFieldContainer[float]
    segment_counts: _containers.RepeatedScalarFieldContainer[int]
    segment_versions: _containers.RepeatedScalarFieldContainer[int]
    segment_tokens: _containers.RepeatedScalarFieldContainer[int]
    unit_counts: _containers.RepeatedScalarFieldContainer[int]
    unit_keys: _containers.RepeatedScalarFieldContainer[str]
    unit_fields: _containers.RepeatedScalarFieldContainer[int]
    unit_kinds: _containers.RepeatedScalarFieldContainer[UnitKind]
    unit_headers: UnitHeaderColumns
    multimodal_counts: _containers.RepeatedScalarFieldContainer[int]
    multimodal_keys: _containers.RepeatedScalarFieldContainer[str]
    multimodal_encoders: _containers.RepeatedScalarFieldContainer[int]
    multimodal_costs: _containers.RepeatedScalarFieldContainer[float]
    placeholder_starts: _containers.RepeatedScalarFieldContainer[int]
    placeholder_ends: _containers.RepeatedScalarFieldContainer[int]
    multimodal_kinds: _containers.RepeatedScalarFieldContainer[UnitKind]
    multimodal_has_header: _containers.RepeatedScalarFieldContainer[bool]
    multimodal_headers: UnitHeaderColumns
    scalar_counts: _containers.RepeatedScalarFieldContainer[int]
    scalar_names: _containers.RepeatedScalarFieldContainer[str]
    scalar_values: _containers.RepeatedScalarFieldContainer[float]
    field_names: _containers.RepeatedScalarFieldContainer[str]
    encoders: _containers.RepeatedScalarFieldContainer[str]
    unit_alignments: _containers.RepeatedScalarFieldContainer[FieldAlignment]
    values: _containers.RepeatedCompositeFieldContainer[TrajectoryValues]
    response_starts: _containers.RepeatedScalarFieldContainer[int]
    unit_coverages: _containers.RepeatedScalarFieldContainer[TokenCoverage]
    def __init__(self, trajectory_ids: _Optional[_Iterable[str]] = ..., sample_ids: _Optional[_Iterable[str]] = ..., sources: _Optional[_Iterable[str]] = ..., rollout_steps: _Optional[_Iterable[int]] = ..., num_tokens: _Optional[_Iterable[int]] = ..., num_loss_tokens: _Optional[_Iterable[int]] = ..., accepted: _Optional[_Iterable[bool]] = ..., finished_at: _Optional[_Iterable[float]] = ..., segment_counts: _Optional[_Iterable[int]] = ..., segment_versions: _Optional[_Iterable[int]] = ..., segment_tokens: _Optional[_Iterable[int]] = ..., unit_counts: _Optional[_Iterable[int]] = ..., unit_keys: _Optional[_Iterable[str]] = ..., unit_fields: _Optional[_Iterable[int]] = ..., unit_kinds: _Optional[_Iterable[_Union[UnitKind, str]]] = ..., unit_headers: _Optional[_Union[UnitHeaderColumns, _Mapping]] = ..., multimodal_counts: _Optional[_Iterable[int]] = ..., multimodal_keys: _Optional[_Iterable[str]] = ..., multimodal_encoders: _Optional[_Iterable[int]] = ..., multimodal_costs: _Optional[_Iterable[float]] = ..., placeholder_starts: _Optional[_Iterable[int]] = ..., placeholder_ends: _Optional[_Iterable[int]] = ..., multimodal_kinds: _Optional[_Iterable[_Union[UnitKind, str]]] = ..., multimodal_has_header: _Optional[_Iterable[bool]] = ..., multimodal_headers: _Optional[_Union[UnitHeaderColumns, _Mapping]] = ..., scalar_counts: _Optional[_Iterable[int]] = ..., scalar_names: _Optional[_Iterable[str]] = ..., scalar_values: _Optional[_Iterable[float]] = ..., field_names: _Optional[_Iterable[str]] = ..., encoders: _Optional[_Iterable[str]] = ..., unit_alignments: _Optional[_Iterable[_Union[FieldAlignment, str]]] = ..., values: _Optional[_Iterable[_Union[TrajectoryValues, _Mapping]]] = ..., response_starts: _Optional[_Iterable[int]] = ..., unit_coverages: _Optional[_Iterable[_Union[TokenCoverage, str]]] = ...) -> None: ...
