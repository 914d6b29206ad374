from knittrans.v1 import topology_pb2 as _topology_pb2
from knittrans.v1 import trajectory_pb2 as _trajectory_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class BalanceScheme(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BALANCE_SCHEME_UNSPECIFIED: _ClassVar[BalanceScheme]
    BALANCE_SCHEME_PACK_THEN_DEAL: _ClassVar[BalanceScheme]
    BALANCE_SCHEME_DEAL_THEN_PACK: _ClassVar[BalanceScheme]
BALANCE_SCHEME_UNSPECIFIED: BalanceScheme
BALANCE_SCHEME_PACK_THEN_DEAL: BalanceScheme
BALANCE_SCHEME_DEAL_THEN_PACK: BalanceScheme

class Plan(_message.Message):
    __slots__ = ("topology", "label_fields", "trajectories", "backbone", "encodings", "reference_encodings", "encoders", "route", "quality")
    TOPOLOGY_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELDS_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORIES_FIELD_NUMBER: _ClassVar[int]
    BACKBONE_FIELD_NUMBER: _ClassVar[int]
    ENCODINGS_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_ENCODINGS_FIELD_NUMBER: _ClassVar[int]
    ENCODERS_FIELD_NUMBER: _ClassVar[int]
    ROUTE_FIELD_NUMBER: _ClassVar[int]
    QUALITY_FIELD_NUMBER: _ClassVar[int]
    topology: _topology_pb2.Topology
    label_fields: _containers.RepeatedScalarFieldContainer[str]
    trajectories: _containers.RepeatedCompositeFieldContainer[_trajectory_pb2.TrajectoryMetadata]
    backbone: BackbonePlan
    encodings: _containers.RepeatedCompositeFieldContainer[Encoding]
    reference_encodings: _containers.RepeatedScalarFieldContainer[int]
    encoders: _containers.RepeatedCompositeFieldContainer[EncoderPlan]
    route: RouteMap
    quality: PlanQuality
    def __init__(self, topology: _Optional[_Union[_topology_pb2.Topology, _Mapping]] = ..., label_fields: _Optional[_Iterable[str]] = ..., trajectories: _Optional[_Iterable[_Union[_trajectory_pb2.TrajectoryMetadata, _Mapping]]] = ..., backbone: _Optional[_Union[BackbonePlan, _Mapping]] = ..., encodings: _Optional[_Iterable[_Union[Encoding, _Mapping]]] = ..., reference_encodings: _Optional[_Iterable[int]] = ..., encoders: _Optional[_Iterable[_Union[EncoderPlan, _Mapping]]] = ..., route: _Optional[_Union[RouteMap, _Mapping]] = ..., quality: _Optional[_Union[PlanQuality, _Mapping]] = ...) -> None: ...

class BackbonePlan(_message.Message):
    __slots__ = ("microbatches_per_rank", "microbatch_offsets", "microbatch_items", "padded_tokens", "cp_spans", "microbatch_loss_tokens", "minibatch_loss_tokens")
    MICROBATCHES_PER_RANK_FIELD_NUMBER: _ClassVar[int]
    MICROBATCH_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    MICROBATCH_ITEMS_FIELD_NUMBER: _ClassVar[int]
    PADDED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CP_SPANS_FIELD_NUMBER: _ClassVar[int]
    MICROBATCH_LOSS_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MINIBATCH_LOSS_TOKENS_FIELD_NUMBER: _ClassVar[int]
    microbatches_per_rank: int
    microbatch_offsets: _containers.RepeatedScalarFieldContainer[int]
    microbatch_items: _containers.RepeatedScalarFieldContainer[int]
    padded_tokens: _containers.RepeatedScalarFieldContainer[int]
    cp_spans: _containers.RepeatedScalarFieldContainer[int]
    microbatch_loss_tokens: _containers.RepeatedScalarFieldContainer[int]
    minibatch_loss_tokens: int
    def __init__(self, microbatches_per_rank: _Optional[int] = ..., microbatch_offsets: _Optional[_Iterable[int]] = ..., microbatch_items: _Optional[_Iterable[int]] = ..., padded_tokens: _Optional[_Iterable[int]] = ..., cp_spans: _Optional[_Iterable[int]] = ..., microbatch_loss_tokens: _Optional[_Iterable[int]] = ..., minibatch_loss_tokens: _Optional[int] = ...) -> None: ...

class Encoding(_message.Message):
    __slots__ = ("key", "encoder", "cost", "source_trajectory", "source_reference")
    KEY_FIELD_NUMBER: _ClassVar[int]
    ENCODER_FIELD_NUMBER: _ClassVar[int]
    COST_FIELD_NUMBER: _ClassVar[int]
    SOURCE_TRAJECTORY_FIELD_NUMBER: _ClassVar[int]
    SOURCE_REFERENCE_FIELD_NUMBER: _ClassVar[int]
    key: str
    encoder: str
    cost: float
    source_trajectory: int
    source_reference: int
    def __init__(self, key: _Optional[str] = ..., encoder: _Optional[str] = ..., cost: _Optional[float] = ..., source_trajectory: _Optional[int] = ..., source_reference: _Optional[int] = ...) -> None: ...

class EncoderPlan(_message.Message):
    __slots__ = ("name", "microbatches_per_rank", "microbatch_offsets", "microbatch_encodings")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MICROBATCHES_PER_RANK_FIELD_NUMBER: _ClassVar[int]
    MICROBATCH_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    MICROBATCH_ENCODINGS_FIELD_NUMBER: _ClassVar[int]
    name: str
    microbatches_per_rank: int
    microbatch_offsets: _containers.RepeatedScalarFieldContainer[int]
    microbatch_encodings: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, name: _Optional[str] = ..., microbatches_per_rank: _Optional[int] = ..., microbatch_offsets: _Optional[_Iterable[int]] = ..., microbatch_encodings: _Optional[_Iterable[int]] = ...) -> None: ...

class RouteMap(_message.Message):
    __slots__ = ("encodings", "references", "dp_ranks", "cp_ranks", "tp_ranks", "microbatches", "starts", "ends")
    ENCODINGS_FIELD_NUMBER: _ClassVar[int]
    REFERENCES_FIELD_NUMBER: _ClassVar[int]
    DP_RANKS_FIELD_NUMBER: _ClassVar[int]
    CP_RANKS_FIELD_NUMBER: _ClassVar[int]
    TP_RANKS_FIELD_NUMBER: _ClassVar[int]
    MICROBATCHES_FIELD_NUMBER: _ClassVar[int]
    STARTS_FIELD_NUMBER: _ClassVar[int]
    ENDS_FIELD_NUMBER: _ClassVar[int]
    encodings: _containers.RepeatedScalarFieldContainer[int]
    references: _containers.RepeatedScalarFieldContainer[int]
    dp_ranks: _containers.RepeatedScalarFieldContainer[int]
    cp_ranks: _containers.RepeatedScalarFieldContainer[int]
    tp_ranks: _containers.RepeatedScalarFieldContainer[int]
    microbatches: _containers.RepeatedScalarFieldContainer[int]
    starts: _containers.RepeatedScalarFieldContainer[int]
    ends: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, encodings: _Optional[_Iterable[int]] = ..., references: _Optional[_Iterable[int]] = ..., dp_ranks: _Optional[_Iterable[int]] = ..., cp_ranks: _Optional[_Iterable[int]] = ..., tp_ranks: _Optional[_Iterable[int]] = ..., microbatches: _Optional[_Iterable[int]] = ..., starts: _Optional[_Iterable[int]] = ..., ends: _Optional[_Iterable[int]] = ...) -> None: ...

class EncoderQuality(_message.Message):
    __slots__ = ("name", "imbalance", "rank_costs", "microbatches_per_rank", "empty_microbatches", "oversize_microbatches", "unique_encodings")
    NAME_FIELD_NUMBER: _ClassVar[int]
    IMBALANCE_FIELD_NUMBER: _ClassVar[int]
    RANK_COSTS_FIELD_NUMBER: _ClassVar[int]
    MICROBATCHES_PER_RANK_FIELD_NUMBER: _ClassVar[int]
    EMPTY_MICROBATCHES_FIELD_NUMBER: _ClassVar[int]
    OVERSIZE_MICROBATCHES_FIELD_NUMBER: _ClassVar[int]
    UNIQUE_ENCODINGS_FIELD_NUMBER: _ClassVar[int]
    name: str
    imbalance: float
    rank_costs: _containers.RepeatedScalarFieldContainer[float]
    microbatches_per_rank: int
    empty_microbatches: int
    oversize_microbatches: int
    unique_encodings: int
    def __init__(self, name: _Optional[str] = ..., imbalance: _Optional[float] = ..., rank_costs: _Optional[_Iterable[float]] = ..., microbatches_per_rank: _Optional[int] = ..., empty_microbatches: _Optional[int] = ..., oversize_microbatches: _Optional[int] = ..., unique_encodings: _Optional[int] = ...) -> None: ...

class PlanQuality(_message.Message):
    __slots__ = ("imbalance", "rank_workloads", "lockstep_imbalance", "microbatches_per_rank", "padding_tokens", "empty_microbatches", "oversize_microbatches", "references", "unique_encodings", "dedup_factor", "encoders", "scheme")
    IMBALANCE_FIELD_NUMBER: _ClassVar[int]
    RANK_WORKLOADS_FIELD_NUMBER: _ClassVar[int]
    LOCKSTEP_IMBALANCE_FIELD_NUMBER: _ClassVar[int]
    MICROBATCHES_PER_RANK_FIELD_NUMBER: _ClassVar[int]
    PADDING_TOKENS_FIELD_NUMBER: _ClassVar[int]
    EMPTY_MICROBATCHES_FIELD_NUMBER: _ClassVar[int]
    OVERSIZE_MICROBATCHES_FIELD_NUMBER: _ClassVar[int]
    REFERENCES_FIELD_NUMBER: _ClassVar[int]
    UNIQUE_ENCODINGS_FIELD_NUMBER: _ClassVar[int]
    DEDUP_FACTOR_FIELD_NUMBER: _ClassVar[int]
    ENCODERS_FIELD_NUMBER: _ClassVar[int]
    SCHEME_FIELD_NUMBER: _ClassVar[int]
    imbalance: float
    rank_workloads: _containers.RepeatedScalarFieldContainer[float]
    lockstep_imbalance: float
    microbatches_per_rank: int
    padding_tokens: int
    empty_microbatches: int
    oversize_microbatches: int
    references: int
    unique_encodings: int
    dedup_factor: float
    encoders: _containers.RepeatedCompositeFieldContainer[EncoderQuality]
    scheme: BalanceScheme
    def __init__(self, imbalance: _Optional[float] = ..., rank_workloads: _Optional[_Iterable[float]] = ..., lockstep_imbalance: _Optional[float] = ..., microbatches_per_rank: _Optional[int] = ..., padding_tokens: _Optional[int] = ..., empty_microbatches: _Optional[int] = ..., oversize_microbatches: _Optional[int] = ..., references: _Optional[int] = ..., unique_encodings: _Optional[int] = ..., dedup_factor: _Optional[float] = ..., encoders: _Optional[_Iterable[_Union[EncoderQuality, _Mapping]]] = ..., scheme: _Optional[_Union[BalanceScheme, str]] = ...) -> None: ...

class ByteRange(_message.Message):
    __slots__ = ("offset", "length")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    offset: int
    length: int
    def __init__(self, offset: _Optional[int] = ..., length: _Optional[int] = ...) -> None: ...

class ConsumerAssignment(_message.Message):
    __slots__ = ("consumer", "minibatch_loss_tokens", "cp", "microbatches", "encoder_microbatches")
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    MINIBATCH_LOSS_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CP_FIELD_NUMBER: _ClassVar[int]
    MICROBATCHES_FIELD_NUMBER: _ClassVar[int]
    ENCODER_MICROBATCHES_FIELD_NUMBER: _ClassVar[int]
    consumer: _topology_pb2.ConsumerId
    minibatch_loss_tokens: int
    cp: int
    microbatches: _containers.RepeatedCompositeFieldContainer[MicroBatchAssignment]
    encoder_microbatches: _containers.RepeatedCompositeFieldContainer[EncoderMicroBatchAssignment]
    def __init__(self, consumer: _Optional[_Union[_topology_pb2.ConsumerId, _Mapping]] = ..., minibatch_loss_tokens: _Optional[int] = ..., cp: _Optional[int] = ..., microbatches: _Optional[_Iterable[_Union[MicroBatchAssignment, _Mapping]]] = ..., encoder_microbatches: _Optional[_Iterable[_Union[EncoderMicroBatchAssignment, _Mapping]]] = ...) -> None: ...

class RankAssignment(_message.Message):
    __slots__ = ("consumer", "minibatch_loss_tokens", "cp", "label_fields", "microbatches", "trajectories")
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    MINIBATCH_LOSS_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CP_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELDS_FIELD_NUMBER: _ClassVar[int]
    MICROBATCHES_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORIES_FIELD_NUMBER: _ClassVar[int]
    consumer: _topology_pb2.ConsumerId
    minibatch_loss_tokens: int
    cp: int
    label_fields: _containers.RepeatedScalarFieldContainer[str]
    microbatches: _containers.RepeatedCompositeFieldContainer[RankMicroBatch]
    trajectories: _trajectory_pb2.TrajectoryBatch
    def __init__(self, consumer: _Optional[_Union[_topology_pb2.ConsumerId, _Mapping]] = ..., minibatch_loss_tokens: _Optional[int] = ..., cp: _Optional[int] = ..., label_fields: _Optional[_Iterable[str]] = ..., microbatches: _Optional[_Iterable[_Union[RankMicroBatch, _Mapping]]] = ..., trajectories: _Optional[_Union[_trajectory_pb2.TrajectoryBatch, _Mapping]] = ...) -> None: ...

class RankMicroBatch(_message.Message):
    __slots__ = ("index", "last", "num_loss_tokens", "items")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    NUM_LOSS_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    index: int
    last: bool
    num_loss_tokens: int
    items: _containers.RepeatedCompositeFieldContainer[RankItem]
    def __init__(self, index: _Optional[int] = ..., last: _Optional[bool] = ..., num_loss_tokens: _Optional[int] = ..., items: _Optional[_Iterable[_Union[RankItem, _Mapping]]] = ...) -> None: ...

class RankItem(_message.Message):
    __slots__ = ("trajectory_index", "trajectory", "padded_tokens", "first_reference", "reference_encodings")
    TRAJECTORY_INDEX_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORY_FIELD_NUMBER: _ClassVar[int]
    PADDED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FIRST_REFERENCE_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_ENCODINGS_FIELD_NUMBER: _ClassVar[int]
    trajectory_index: int
    trajectory: _trajectory_pb2.TrajectoryMetadata
    padded_tokens: int
    first_reference: int
    reference_encodings: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, trajectory_index: _Optional[int] = ..., trajectory: _Optional[_Union[_trajectory_pb2.TrajectoryMetadata, _Mapping]] = ..., padded_tokens: _Optional[int] = ..., first_reference: _Optional[int] = ..., reference_encodings: _Optional[_Iterable[int]] = ...) -> None: ...

class MicroBatchAssignment(_message.Message):
    __slots__ = ("index", "last", "num_loss_tokens", "items")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    NUM_LOSS_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    index: int
    last: bool
    num_loss_tokens: int
    items: _containers.RepeatedCompositeFieldContainer[ItemAssignment]
    def __init__(self, index: _Optional[int] = ..., last: _Optional[bool] = ..., num_loss_tokens: _Optional[int] = ..., items: _Optional[_Iterable[_Union[ItemAssignment, _Mapping]]] = ...) -> None: ...

class ItemAssignment(_message.Message):
    __slots__ = ("trajectory_index", "trajectory", "padded_tokens", "chunks", "reads", "encodings")
    TRAJECTORY_INDEX_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORY_FIELD_NUMBER: _ClassVar[int]
    PADDED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    READS_FIELD_NUMBER: _ClassVar[int]
    ENCODINGS_FIELD_NUMBER: _ClassVar[int]
    trajectory_index: int
    trajectory: _trajectory_pb2.TrajectoryMetadata
    padded_tokens: int
    chunks: _containers.RepeatedCompositeFieldContainer[ChunkSlice]
    reads: _containers.RepeatedCompositeFieldContainer[FieldRead]
    encodings: _containers.RepeatedCompositeFieldContainer[EncodingUse]
    def __init__(self, trajectory_index: _Optional[int] = ..., trajectory: _Optional[_Union[_trajectory_pb2.TrajectoryMetadata, _Mapping]] = ..., padded_tokens: _Optional[int] = ..., chunks: _Optional[_Iterable[_Union[ChunkSlice, _Mapping]]] = ..., reads: _Optional[_Iterable[_Union[FieldRead, _Mapping]]] = ..., encodings: _Optional[_Iterable[_Union[EncodingUse, _Mapping]]] = ...) -> None: ...

class ChunkSlice(_message.Message):
    __slots__ = ("chunk", "padded", "tokens")
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    PADDED_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    chunk: int
    padded: _trajectory_pb2.TokenSpan
    tokens: _trajectory_pb2.TokenSpan
    def __init__(self, chunk: _Optional[int] = ..., padded: _Optional[_Union[_trajectory_pb2.TokenSpan, _Mapping]] = ..., tokens: _Optional[_Union[_trajectory_pb2.TokenSpan, _Mapping]] = ...) -> None: ...

class FieldRead(_message.Message):
    __slots__ = ("unit", "spans", "byte_ranges", "look_ahead")
    UNIT_FIELD_NUMBER: _ClassVar[int]
    SPANS_FIELD_NUMBER: _ClassVar[int]
    BYTE_RANGES_FIELD_NUMBER: _ClassVar[int]
    LOOK_AHEAD_FIELD_NUMBER: _ClassVar[int]
    unit: _trajectory_pb2.UnitRef
    spans: _containers.RepeatedCompositeFieldContainer[_trajectory_pb2.TokenSpan]
    byte_ranges: _containers.RepeatedCompositeFieldContainer[ByteRange]
    look_ahead: bool
    def __init__(self, unit: _Optional[_Union[_trajectory_pb2.UnitRef, _Mapping]] = ..., spans: _Optional[_Iterable[_Union[_trajectory_pb2.TokenSpan, _Mapping]]] = ..., byte_ranges: _Optional[_Iterable[_Union[ByteRange, _Mapping]]] = ..., look_ahead: _Optional[bool] = ...) -> None: ...

class EncodingUse(_message.Message):
    __slots__ = ("encoding_id", "key", "positions", "row_start", "reference")
    ENCODING_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    ROW_START_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_FIELD_NUMBER: _ClassVar[int]
    encoding_id: int
    key: str
    positions: _trajectory_pb2.TokenSpan
    row_start: int
    reference: int
    def __init__(self, encoding_id: _Optional[int] = ..., key: _Optional[str] = ..., positions: _Optional[_Union[_trajectory_pb2.TokenSpan, _Mapping]] = ..., row_start: _Optional[int] = ..., reference: _Optional[int] = ...) -> None: ...

class EncoderMicroBatchAssignment(_message.Message):
    __slots__ = ("index", "last", "encodings")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    ENCODINGS_FIELD_NUMBER: _ClassVar[int]
    index: int
    last: bool
    encodings: _containers.RepeatedCompositeFieldContainer[EncodingAssignment]
    def __init__(self, index: _Optional[int] = ..., last: _Optional[bool] = ..., encodings: _Optional[_Iterable[_Union[EncodingAssignment, _Mapping]]] = ...) -> None: ...

class EncodingAssignment(_message.Message):
    __slots__ = ("encoding_id", "key", "encoder", "cost", "kind", "header", "num_rows", "routes")
    ENCODING_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    ENCODER_FIELD_NUMBER: _ClassVar[int]
    COST_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    NUM_ROWS_FIELD_NUMBER: _ClassVar[int]
    ROUTES_FIELD_NUMBER: _ClassVar[int]
    encoding_id: int
    key: str
    encoder: str
    cost: float
    kind: _trajectory_pb2.UnitKind
    header: _trajectory_pb2.UnitHeader
    num_rows: int
    routes: EncodingRoutes
    def __init__(self, encoding_id: _Optional[int] = ..., key: _Optional[str] = ..., encoder: _Optional[str] = ..., cost: _Optional[float] = ..., kind: _Optional[_Union[_trajectory_pb2.UnitKind, str]] = ..., header: _Optional[_Union[_trajectory_pb2.UnitHeader, _Mapping]] = ..., num_rows: _Optional[int] = ..., routes: _Optional[_Union[EncodingRoutes, _Mapping]] = ...) -> None: ...

class EncodingRoutes(_message.Message):
    __slots__ = ("dp_ranks", "cp_ranks", "tp_ranks", "microbatches", "trajectory_indices", "trajectory_ids", "references", "position_starts", "position_ends", "row_starts")
    DP_RANKS_FIELD_NUMBER: _ClassVar[int]
    CP_RANKS_FIELD_NUMBER: _ClassVar[int]
    TP_RANKS_FIELD_NUMBER: _ClassVar[int]
    MICROBATCHES_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORY_INDICES_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORY_IDS_FIELD_NUMBER: _ClassVar[int]
    REFERENCES_FIELD_NUMBER: _ClassVar[int]
    POSITION_STARTS_FIELD_NUMBER: _ClassVar[int]
    POSITION_ENDS_FIELD_NUMBER: _ClassVar[int]
    ROW_STARTS_FIELD_NUMBER: _ClassVar[int]
    dp_ranks: _containers.RepeatedScalarFieldContainer[int]
    cp_ranks: _containers.RepeatedScalarFieldContainer[int]
    tp_ranks: _containers.RepeatedScalarFieldContainer[int]
    microbatches: _containers.RepeatedScalarFieldContainer[int]
    trajectory_indices: _containers.RepeatedScalarFieldContainer[int]
    trajectory_ids: _containers.RepeatedScalarFieldContainer[str]
    references: _containers.RepeatedScalarFieldContainer[int]
    position_starts: _containers.RepeatedScalarFieldContainer[int]
    position_ends: _containers.RepeatedScalarFieldContainer[int]
    row_starts: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, dp_ranks: _Optional[_Iterable[int]] = ..., cp_ranks: _Optional[_Iterable[int]] = ..., tp_ranks: _Optional[_Iterable[int]] = ..., microbatches: _Optional[_Iterable[int]] = ..., trajectory_indices: _Optional[_Iterable[int]] = ..., trajectory_ids: _Optional[_Iterable[str]] = ..., references: _Optional[_Iterable[int]] = ..., position_starts: _Optional[_Iterable[int]] = ..., position_ends: _Optional[_Iterable[int]] = ..., row_starts: _Optional[_Iterable[int]] = ...) -> None: ...
