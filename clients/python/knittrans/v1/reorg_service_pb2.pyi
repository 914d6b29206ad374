from knittrans.v1 import admission_pb2 as _admission_pb2
from knittrans.v1 import plan_pb2 as _plan_pb2
from knittrans.v1 import trajectory_pb2 as _trajectory_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TensorDescriptor(_message.Message):
    __slots__ = ("name", "dtype", "shape", "offset", "byte_length")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    BYTE_LENGTH_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: _trajectory_pb2.DType
    shape: _containers.RepeatedScalarFieldContainer[int]
    offset: int
    byte_length: int
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[_Union[_trajectory_pb2.DType, str]] = ..., shape: _Optional[_Iterable[int]] = ..., offset: _Optional[int] = ..., byte_length: _Optional[int] = ...) -> None: ...

class PackedEncodingUse(_message.Message):
    __slots__ = ("encoding_id", "key", "packed_start", "packed_end", "row_start", "trajectory_id", "reference")
    ENCODING_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    PACKED_START_FIELD_NUMBER: _ClassVar[int]
    PACKED_END_FIELD_NUMBER: _ClassVar[int]
    ROW_START_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORY_ID_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_FIELD_NUMBER: _ClassVar[int]
    encoding_id: int
    key: str
    packed_start: int
    packed_end: int
    row_start: int
    trajectory_id: str
    reference: int
    def __init__(self, encoding_id: _Optional[int] = ..., key: _Optional[str] = ..., packed_start: _Optional[int] = ..., packed_end: _Optional[int] = ..., row_start: _Optional[int] = ..., trajectory_id: _Optional[str] = ..., reference: _Optional[int] = ...) -> None: ...

class MicroBatchDescriptor(_message.Message):
    __slots__ = ("ticket", "sequence", "train_batch_index", "minibatch_index", "num_minibatches", "train_version", "microbatch_index", "num_microbatches", "last_in_minibatch", "minibatch_loss_tokens", "microbatch_loss_tokens", "segment", "slot", "tensors", "encodings", "encoder_inputs", "trajectory_ids", "role", "dp_rank", "cp_rank", "cp", "incarnation", "used_bytes", "trajectory_indices", "tp", "assigned_at", "published_at", "failure", "item_metadata", "delivery_round")
    TICKET_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    TRAIN_BATCH_INDEX_FIELD_NUMBER: _ClassVar[int]
    MINIBATCH_INDEX_FIELD_NUMBER: _ClassVar[int]
    NUM_MINIBATCHES_FIELD_NUMBER: _ClassVar[int]
    TRAIN_VERSION_FIELD_NUMBER: _ClassVar[int]
    MICROBATCH_INDEX_FIELD_NUMBER: _ClassVar[int]
    NUM_MICROBATCHES_FIELD_NUMBER: _ClassVar[int]
    LAST_IN_MINIBATCH_FIELD_NUMBER: _ClassVar[int]
    MINIBATCH_LOSS_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MICROBATCH_LOSS_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    SLOT_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    ENCODINGS_FIELD_NUMBER: _ClassVar[int]
    ENCODER_INPUTS_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORY_IDS_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    DP_RANK_FIELD_NUMBER: _ClassVar[int]
    CP_RANK_FIELD_NUMBER: _ClassVar[int]
    CP_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORY_INDICES_FIELD_NUMBER: _ClassVar[int]
    TP_FIELD_NUMBER: _ClassVar[int]
    ASSIGNED_AT_FIELD_NUMBER: _ClassVar[int]
    PUBLISHED_AT_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    ITEM_METADATA_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_ROUND_FIELD_NUMBER: _ClassVar[int]
    ticket: int
    sequence: int
    train_batch_index: int
    minibatch_index: int
    num_minibatches: int
    train_version: int
    microbatch_index: int
    num_microbatches: int
    last_in_minibatch: bool
    minibatch_loss_tokens: int
    microbatch_loss_tokens: int
    segment: str
    slot: int
    tensors: _containers.RepeatedCompositeFieldContainer[TensorDescriptor]
    encodings: _containers.RepeatedCompositeFieldContainer[PackedEncodingUse]
    encoder_inputs: _containers.RepeatedCompositeFieldContainer[_plan_pb2.EncodingAssignment]
    trajectory_ids: _containers.RepeatedScalarFieldContainer[str]
    role: str
    dp_rank: int
    cp_rank: int
    cp: int
    incarnation: str
    used_bytes: int
    trajectory_indices: _containers.RepeatedScalarFieldContainer[int]
    tp: int
    assigned_at: float
    published_at: float
    failure: MiniBatchFailure
    item_metadata: _containers.RepeatedCompositeFieldContainer[_trajectory_pb2.TrajectoryValues]
    delivery_round: int
    def __init__(self, ticket: _Optional[int] = ..., sequence: _Optional[int] = ..., train_batch_index: _Optional[int] = ..., minibatch_index: _Optional[int] = ..., num_minibatches: _Optional[int] = ..., train_version: _Optional[int] = ..., microbatch_index: _Optional[int] = ..., num_microbatches: _Optional[int] = ..., last_in_minibatch: _Optional[bool] = ..., minibatch_loss_tokens: _Optional[int] = ..., microbatch_loss_tokens: _Optional[int] = ..., segment: _Optional[str] = ..., slot: _Optional[int] = ..., tensors: _Optional[_Iterable[_Union[TensorDescriptor, _Mapping]]] = ..., encodings: _Optional[_Iterable[_Union[PackedEncodingUse, _Mapping]]] = ..., encoder_inputs: _Optional[_Iterable[_Union[_plan_pb2.EncodingAssignment, _Mapping]]] = ..., trajectory_ids: _Optional[_Iterable[str]] = ..., role: _Optional[str] = ..., dp_rank: _Optional[int] = ..., cp_rank: _Optional[int] = ..., cp: _Optional[int] = ..., incarnation: _Optional[str] = ..., used_bytes: _Optional[int] = ..., trajectory_indices: _Optional[_Iterable[int]] = ..., tp: _Optional[int] = ..., assigned_at: _Optional[float] = ..., published_at: _Optional[float] = ..., failure: _Optional[_Union[MiniBatchFailure, _Mapping]] = ..., item_metadata: _Optional[_Iterable[_Union[_trajectory_pb2.TrajectoryValues, _Mapping]]] = ..., delivery_round: _Optional[int] = ...) -> None: ...

class MiniBatchFailure(_message.Message):
    __slots__ = ("trajectory_id", "unit_key", "reason")
    TRAJECTORY_ID_FIELD_NUMBER: _ClassVar[int]
    UNIT_KEY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    trajectory_id: str
    unit_key: str
    reason: str
    def __init__(self, trajectory_id: _Optional[str] = ..., unit_key: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class NextMicroBatchRequest(_message.Message):
    __slots__ = ("tp_rank", "after_ticket", "incarnation", "session", "restored_step")
    TP_RANK_FIELD_NUMBER: _ClassVar[int]
    AFTER_TICKET_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    RESTORED_STEP_FIELD_NUMBER: _ClassVar[int]
    tp_rank: int
    after_ticket: int
    incarnation: str
    session: str
    restored_step: RestoredStep
    def __init__(self, tp_rank: _Optional[int] = ..., after_ticket: _Optional[int] = ..., incarnation: _Optional[str] = ..., session: _Optional[str] = ..., restored_step: _Optional[_Union[RestoredStep, _Mapping]] = ...) -> None: ...

class RestoredStep(_message.Message):
    __slots__ = ("train_batch_index", "minibatch_index", "before_first_step")
    TRAIN_BATCH_INDEX_FIELD_NUMBER: _ClassVar[int]
    MINIBATCH_INDEX_FIELD_NUMBER: _ClassVar[int]
    BEFORE_FIRST_STEP_FIELD_NUMBER: _ClassVar[int]
    train_batch_index: int
    minibatch_index: int
    before_first_step: bool
    def __init__(self, train_batch_index: _Optional[int] = ..., minibatch_index: _Optional[int] = ..., before_first_step: _Optional[bool] = ...) -> None: ...

class NextMicroBatchResponse(_message.Message):
    __slots__ = ("descriptor", "end_of_stream", "incarnation", "delivery_round")
    DESCRIPTOR_FIELD_NUMBER: _ClassVar[int]
    END_OF_STREAM_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_ROUND_FIELD_NUMBER: _ClassVar[int]
    descriptor: MicroBatchDescriptor
    end_of_stream: bool
    incarnation: str
    delivery_round: int
    def __init__(self, descriptor: _Optional[_Union[MicroBatchDescriptor, _Mapping]] = ..., end_of_stream: _Optional[bool] = ..., incarnation: _Optional[str] = ..., delivery_round: _Optional[int] = ...) -> None: ...

class StreamMicroBatchesRequest(_message.Message):
    __slots__ = ("tp_rank", "after_ticket", "incarnation", "session", "restored_step")
    TP_RANK_FIELD_NUMBER: _ClassVar[int]
    AFTER_TICKET_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    RESTORED_STEP_FIELD_NUMBER: _ClassVar[int]
    tp_rank: int
    after_ticket: int
    incarnation: str
    session: str
    restored_step: RestoredStep
    def __init__(self, tp_rank: _Optional[int] = ..., after_ticket: _Optional[int] = ..., incarnation: _Optional[str] = ..., session: _Optional[str] = ..., restored_step: _Optional[_Union[RestoredStep, _Mapping]] = ...) -> None: ...

class StreamMicroBatchesResponse(_message.Message):
    __slots__ = ("descriptor",)
    DESCRIPTOR_FIELD_NUMBER: _ClassVar[int]
    descriptor: MicroBatchDescriptor
    def __init__(self, descriptor: _Optional[_Union[MicroBatchDescriptor, _Mapping]] = ...) -> None: ...

class ReleaseMicroBatchRequest(_message.Message):
    __slots__ = ("request_id", "tp_rank", "ticket", "waited_seconds", "incarnation")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TP_RANK_FIELD_NUMBER: _ClassVar[int]
    TICKET_FIELD_NUMBER: _ClassVar[int]
    WAITED_SECONDS_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    tp_rank: int
    ticket: int
    waited_seconds: float
    incarnation: str
    def __init__(self, request_id: _Optional[str] = ..., tp_rank: _Optional[int] = ..., ticket: _Optional[int] = ..., waited_seconds: _Optional[float] = ..., incarnation: _Optional[str] = ...) -> None: ...

class ReleaseMicroBatchResponse(_message.Message):
    __slots__ = ("slot_freed",)
    SLOT_FREED_FIELD_NUMBER: _ClassVar[int]
    slot_freed: bool
    def __init__(self, slot_freed: _Optional[bool] = ...) -> None: ...

class GetMiniBatchRequest(_message.Message):
    __slots__ = ("sequence",)
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    def __init__(self, sequence: _Optional[int] = ...) -> None: ...

class GetMiniBatchResponse(_message.Message):
    __slots__ = ("sequence", "admission", "global_loss_tokens", "assignment", "plan")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    ADMISSION_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_LOSS_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENT_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    admission: _admission_pb2.MiniBatchAdmission
    global_loss_tokens: int
    assignment: _plan_pb2.ConsumerAssignment
    plan: _plan_pb2.Plan
    def __init__(self, sequence: _Optional[int] = ..., admission: _Optional[_Union[_admission_pb2.MiniBatchAdmission, _Mapping]] = ..., global_loss_tokens: _Optional[int] = ..., assignment: _Optional[_Union[_plan_pb2.ConsumerAssignment, _Mapping]] = ..., plan: _Optional[_Union[_plan_pb2.Plan, _Mapping]] = ...) -> None: ...

class GetReorgStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetReorgStatusResponse(_message.Message):
    __slots__ = ("role", "dp_rank", "cp_rank", "tp", "slots", "slots_occupied", "published", "bytes_read", "bytes_needed", "job", "incarnation", "read_calls", "acknowledged_sequence", "drained", "delivery_round")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    DP_RANK_FIELD_NUMBER: _ClassVar[int]
    CP_RANK_FIELD_NUMBER: _ClassVar[int]
    TP_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    SLOTS_OCCUPIED_FIELD_NUMBER: _ClassVar[int]
    PUBLISHED_FIELD_NUMBER: _ClassVar[int]
    BYTES_READ_FIELD_NUMBER: _ClassVar[int]
    BYTES_NEEDED_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    READ_CALLS_FIELD_NUMBER: _ClassVar[int]
    ACKNOWLEDGED_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    DRAINED_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_ROUND_FIELD_NUMBER: _ClassVar[int]
    role: str
    dp_rank: int
    cp_rank: int
    tp: int
    slots: int
    slots_occupied: int
    published: int
    bytes_read: int
    bytes_needed: int
    job: str
    incarnation: str
    read_calls: int
    acknowledged_sequence: int
    drained: bool
    delivery_round: int
    def __init__(self, role: _Optional[str] = ..., dp_rank: _Optional[int] = ..., cp_rank: _Optional[int] = ..., tp: _Optional[int] = ..., slots: _Optional[int] = ..., slots_occupied: _Optional[int] = ..., published: _Optional[int] = ..., bytes_read: _Optional[int] = ..., bytes_needed: _Optional[int] = ..., job: _Optional[str] = ..., incarnation: _Optional[str] = ..., read_calls: _Optional[int] = ..., acknowledged_sequence: _Optional[int] = ..., drained: _Optional[bool] = ..., delivery_round: _Optional[int] = ...) -> None: ...
