from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CostModel(_message.Message):
    __slots__ = ("linear", "quadratic")
    LINEAR_FIELD_NUMBER: _ClassVar[int]
    QUADRATIC_FIELD_NUMBER: _ClassVar[int]
    linear: float
    quadratic: float
    def __init__(self, linear: _Optional[float] = ..., quadratic: _Optional[float] = ...) -> None: ...

class BackboneTopology(_message.Message):
    __slots__ = ("dp", "cp", "tp", "max_tokens_per_microbatch", "cost", "microbatch_multiple", "sequence_parallel", "pad_multiple")
    DP_FIELD_NUMBER: _ClassVar[int]
    CP_FIELD_NUMBER: _ClassVar[int]
    TP_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_PER_MICROBATCH_FIELD_NUMBER: _ClassVar[int]
    COST_FIELD_NUMBER: _ClassVar[int]
    MICROBATCH_MULTIPLE_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_PARALLEL_FIELD_NUMBER: _ClassVar[int]
    PAD_MULTIPLE_FIELD_NUMBER: _ClassVar[int]
    dp: int
    cp: int
    tp: int
    max_tokens_per_microbatch: int
    cost: CostModel
    microbatch_multiple: int
    sequence_parallel: bool
    pad_multiple: int
    def __init__(self, dp: _Optional[int] = ..., cp: _Optional[int] = ..., tp: _Optional[int] = ..., max_tokens_per_microbatch: _Optional[int] = ..., cost: _Optional[_Union[CostModel, _Mapping]] = ..., microbatch_multiple: _Optional[int] = ..., sequence_parallel: _Optional[bool] = ..., pad_multiple: _Optional[int] = ...) -> None: ...

class EncoderTopology(_message.Message):
    __slots__ = ("name", "dp", "tp", "max_cost_per_microbatch")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DP_FIELD_NUMBER: _ClassVar[int]
    TP_FIELD_NUMBER: _ClassVar[int]
    MAX_COST_PER_MICROBATCH_FIELD_NUMBER: _ClassVar[int]
    name: str
    dp: int
    tp: int
    max_cost_per_microbatch: float
    def __init__(self, name: _Optional[str] = ..., dp: _Optional[int] = ..., tp: _Optional[int] = ..., max_cost_per_microbatch: _Optional[float] = ...) -> None: ...

class TrainerRole(_message.Message):
    __slots__ = ("name", "backbone", "produces", "consumes")
    NAME_FIELD_NUMBER: _ClassVar[int]
    BACKBONE_FIELD_NUMBER: _ClassVar[int]
    PRODUCES_FIELD_NUMBER: _ClassVar[int]
    CONSUMES_FIELD_NUMBER: _ClassVar[int]
    name: str
    backbone: BackboneTopology
    produces: _containers.RepeatedScalarFieldContainer[str]
    consumes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., backbone: _Optional[_Union[BackboneTopology, _Mapping]] = ..., produces: _Optional[_Iterable[str]] = ..., consumes: _Optional[_Iterable[str]] = ...) -> None: ...

class Topology(_message.Message):
    __slots__ = ("backbone", "encoders", "roles", "consumes")
    BACKBONE_FIELD_NUMBER: _ClassVar[int]
    ENCODERS_FIELD_NUMBER: _ClassVar[int]
    ROLES_FIELD_NUMBER: _ClassVar[int]
    CONSUMES_FIELD_NUMBER: _ClassVar[int]
    backbone: BackboneTopology
    encoders: _containers.RepeatedCompositeFieldContainer[EncoderTopology]
    roles: _containers.RepeatedCompositeFieldContainer[TrainerRole]
    consumes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, backbone: _Optional[_Union[BackboneTopology, _Mapping]] = ..., encoders: _Optional[_Iterable[_Union[EncoderTopology, _Mapping]]] = ..., roles: _Optional[_Iterable[_Union[TrainerRole, _Mapping]]] = ..., consumes: _Optional[_Iterable[str]] = ...) -> None: ...

class ConsumerId(_message.Message):
    __slots__ = ("role", "dp_rank", "cp_rank")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    DP_RANK_FIELD_NUMBER: _ClassVar[int]
    CP_RANK_FIELD_NUMBER: _ClassVar[int]
    role: str
    dp_rank: int
    cp_rank: int
    def __init__(self, role: _Optional[str] = ..., dp_rank: _Optional[int] = ..., cp_rank: _Optional[int] = ...) -> None: ...
