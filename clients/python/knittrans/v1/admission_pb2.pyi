from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class BlockingReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BLOCKING_REASON_UNSPECIFIED: _ClassVar[BlockingReason]
    BLOCKING_REASON_NONE: _ClassVar[BlockingReason]
    BLOCKING_REASON_TRAIN_BATCH_SIZE: _ClassVar[BlockingReason]
    BLOCKING_REASON_SOURCE_QUOTA: _ClassVar[BlockingReason]
    BLOCKING_REASON_COMPLETION_QUOTA: _ClassVar[BlockingReason]
    BLOCKING_REASON_FEASIBILITY: _ClassVar[BlockingReason]
    BLOCKING_REASON_TRAIN_BATCH_COMPLETE: _ClassVar[BlockingReason]

class DropReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DROP_REASON_UNSPECIFIED: _ClassVar[DropReason]
    DROP_REASON_STALE: _ClassVar[DropReason]
    DROP_REASON_FILTERED: _ClassVar[DropReason]
BLOCKING_REASON_UNSPECIFIED: BlockingReason
BLOCKING_REASON_NONE: BlockingReason
BLOCKING_REASON_TRAIN_BATCH_SIZE: BlockingReason
BLOCKING_REASON_SOURCE_QUOTA: BlockingReason
BLOCKING_REASON_COMPLETION_QUOTA: BlockingReason
BLOCKING_REASON_FEASIBILITY: BlockingReason
BLOCKING_REASON_TRAIN_BATCH_COMPLETE: BlockingReason
DROP_REASON_UNSPECIFIED: DropReason
DROP_REASON_STALE: DropReason
DROP_REASON_FILTERED: DropReason

class MiniBatchAdmission(_message.Message):
    __slots__ = ("train_batch_index", "minibatch_index", "num_minibatches", "train_version", "trajectory_ids", "admitted_at")
    TRAIN_BATCH_INDEX_FIELD_NUMBER: _ClassVar[int]
    MINIBATCH_INDEX_FIELD_NUMBER: _ClassVar[int]
    NUM_MINIBATCHES_FIELD_NUMBER: _ClassVar[int]
    TRAIN_VERSION_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORY_IDS_FIELD_NUMBER: _ClassVar[int]
    ADMITTED_AT_FIELD_NUMBER: _ClassVar[int]
    train_batch_index: int
    minibatch_index: int
    num_minibatches: int
    train_version: int
    trajectory_ids: _containers.RepeatedScalarFieldContainer[str]
    admitted_at: float
    def __init__(self, train_batch_index: _Optional[int] = ..., minibatch_index: _Optional[int] = ..., num_minibatches: _Optional[int] = ..., train_version: _Optional[int] = ..., trajectory_ids: _Optional[_Iterable[str]] = ..., admitted_at: _Optional[float] = ...) -> None: ...

class TrajectoryDrop(_message.Message):
    __slots__ = ("trajectory_ids", "reason", "detail")
    TRAJECTORY_IDS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    trajectory_ids: _containers.RepeatedScalarFieldContainer[str]
    reason: DropReason
    detail: str
    def __init__(self, trajectory_ids: _Optional[_Iterable[str]] = ..., reason: _Optional[_Union[DropReason, str]] = ..., detail: _Optional[str] = ...) -> None: ...

class AdmissionWait(_message.Message):
    __slots__ = ("reason", "detail")
    REASON_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    reason: BlockingReason
    detail: str
    def __init__(self, reason: _Optional[_Union[BlockingReason, str]] = ..., detail: _Optional[str] = ...) -> None: ...

class AdmissionDecision(_message.Message):
    __slots__ = ("admit", "wait", "drop")
    ADMIT_FIELD_NUMBER: _ClassVar[int]
    WAIT_FIELD_NUMBER: _ClassVar[int]
    DROP_FIELD_NUMBER: _ClassVar[int]
    admit: MiniBatchAdmission
    wait: AdmissionWait
    drop: TrajectoryDrop
    def __init__(self, admit: _Optional[_Union[MiniBatchAdmission, _Mapping]] = ..., wait: _Optional[_Union[AdmissionWait, _Mapping]] = ..., drop: _Optional[_Union[TrajectoryDrop, _Mapping]] = ...) -> None: ...
