from knittrans.v1 import admission_pb2 as _admission_pb2
from knittrans.v1 import plan_pb2 as _plan_pb2
from knittrans.v1 import topology_pb2 as _topology_pb2
from knittrans.v1 import trajectory_pb2 as _trajectory_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ReportOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REPORT_OUTCOME_UNSPECIFIED: _ClassVar[ReportOutcome]
    REPORT_OUTCOME_ACCEPTED: _ClassVar[ReportOutcome]
    REPORT_OUTCOME_DUPLICATE: _ClassVar[ReportOutcome]
    REPORT_OUTCOME_CONFLICT: _ClassVar[ReportOutcome]

class ProgressStage(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PROGRESS_STAGE_UNSPECIFIED: _ClassVar[ProgressStage]
    PROGRESS_STAGE_DELIVERED: _ClassVar[ProgressStage]
    PROGRESS_STAGE_OPTIMIZER_STEP: _ClassVar[ProgressStage]
    PROGRESS_STAGE_VERIFIED: _ClassVar[ProgressStage]

class MiniBatchVerdict(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MINI_BATCH_VERDICT_UNSPECIFIED: _ClassVar[MiniBatchVerdict]
    MINI_BATCH_VERDICT_PENDING: _ClassVar[MiniBatchVerdict]
    MINI_BATCH_VERDICT_OK: _ClassVar[MiniBatchVerdict]
    MINI_BATCH_VERDICT_FAILED: _ClassVar[MiniBatchVerdict]
REPORT_OUTCOME_UNSPECIFIED: ReportOutcome
REPORT_OUTCOME_ACCEPTED: ReportOutcome
REPORT_OUTCOME_DUPLICATE: ReportOutcome
REPORT_OUTCOME_CONFLICT: ReportOutcome
PROGRESS_STAGE_UNSPECIFIED: ProgressStage
PROGRESS_STAGE_DELIVERED: ProgressStage
PROGRESS_STAGE_OPTIMIZER_STEP: ProgressStage
PROGRESS_STAGE_VERIFIED: ProgressStage
MINI_BATCH_VERDICT_UNSPECIFIED: MiniBatchVerdict
MINI_BATCH_VERDICT_PENDING: MiniBatchVerdict
MINI_BATCH_VERDICT_OK: MiniBatchVerdict
MINI_BATCH_VERDICT_FAILED: MiniBatchVerdict

class ReportTrajectoriesRequest(_message.Message):
    __slots__ = ("request_id", "trajectories", "batch")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORIES_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    trajectories: _containers.RepeatedCompositeFieldContainer[_trajectory_pb2.TrajectoryMetadata]
    batch: _trajectory_pb2.TrajectoryBatch
    def __init__(self, request_id: _Optional[str] = ..., trajectories: _Optional[_Iterable[_Union[_trajectory_pb2.TrajectoryMetadata, _Mapping]]] = ..., batch: _Optional[_Union[_trajectory_pb2.TrajectoryBatch, _Mapping]] = ...) -> None: ...

class TrajectoryReportResult(_message.Message):
    __slots__ = ("trajectory_id", "outcome", "reason")
    TRAJECTORY_ID_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    trajectory_id: str
    outcome: ReportOutcome
    reason: str
    def __init__(self, trajectory_id: _Optional[str] = ..., outcome: _Optional[_Union[ReportOutcome, str]] = ..., reason: _Optional[str] = ...) -> None: ...

class ReportTrajectoriesResponse(_message.Message):
    __slots__ = ("results", "outcomes", "conflicts")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    CONFLICTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[TrajectoryReportResult]
    outcomes: _containers.RepeatedScalarFieldContainer[ReportOutcome]
    conflicts: _containers.RepeatedCompositeFieldContainer[TrajectoryReportResult]
    def __init__(self, results: _Optional[_Iterable[_Union[TrajectoryReportResult, _Mapping]]] = ..., outcomes: _Optional[_Iterable[_Union[ReportOutcome, str]]] = ..., conflicts: _Optional[_Iterable[_Union[TrajectoryReportResult, _Mapping]]] = ...) -> None: ...

class ReportScheduledRequest(_message.Message):
    __slots__ = ("request_id", "rollout_step", "count")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_STEP_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    rollout_step: int
    count: int
    def __init__(self, request_id: _Optional[str] = ..., rollout_step: _Optional[int] = ..., count: _Optional[int] = ...) -> None: ...

class ReportScheduledResponse(_message.Message):
    __slots__ = ("total_scheduled",)
    TOTAL_SCHEDULED_FIELD_NUMBER: _ClassVar[int]
    total_scheduled: int
    def __init__(self, total_scheduled: _Optional[int] = ...) -> None: ...

class RegisterConsumerRequest(_message.Message):
    __slots__ = ("request_id", "consumer")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    consumer: _topology_pb2.ConsumerId
    def __init__(self, request_id: _Optional[str] = ..., consumer: _Optional[_Union[_topology_pb2.ConsumerId, _Mapping]] = ...) -> None: ...

class RegisterConsumerResponse(_message.Message):
    __slots__ = ("topology", "acknowledged_sequence", "job", "num_minibatches")
    TOPOLOGY_FIELD_NUMBER: _ClassVar[int]
    ACKNOWLEDGED_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    NUM_MINIBATCHES_FIELD_NUMBER: _ClassVar[int]
    topology: _topology_pb2.Topology
    acknowledged_sequence: int
    job: str
    num_minibatches: int
    def __init__(self, topology: _Optional[_Union[_topology_pb2.Topology, _Mapping]] = ..., acknowledged_sequence: _Optional[int] = ..., job: _Optional[str] = ..., num_minibatches: _Optional[int] = ...) -> None: ...

class WatchAssignmentsRequest(_message.Message):
    __slots__ = ("consumer", "after_sequence", "include_trajectory_ids")
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    AFTER_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_TRAJECTORY_IDS_FIELD_NUMBER: _ClassVar[int]
    consumer: _topology_pb2.ConsumerId
    after_sequence: int
    include_trajectory_ids: bool
    def __init__(self, consumer: _Optional[_Union[_topology_pb2.ConsumerId, _Mapping]] = ..., after_sequence: _Optional[int] = ..., include_trajectory_ids: _Optional[bool] = ...) -> None: ...

class WatchNodeAssignmentsRequest(_message.Message):
    __slots__ = ("consumers", "after_sequence")
    CONSUMERS_FIELD_NUMBER: _ClassVar[int]
    AFTER_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    consumers: _containers.RepeatedCompositeFieldContainer[_topology_pb2.ConsumerId]
    after_sequence: int
    def __init__(self, consumers: _Optional[_Iterable[_Union[_topology_pb2.ConsumerId, _Mapping]]] = ..., after_sequence: _Optional[int] = ...) -> None: ...

class WatchNodeAssignmentsResponse(_message.Message):
    __slots__ = ("assignments",)
    ASSIGNMENTS_FIELD_NUMBER: _ClassVar[int]
    assignments: _containers.RepeatedCompositeFieldContainer[NodeAssignment]
    def __init__(self, assignments: _Optional[_Iterable[_Union[NodeAssignment, _Mapping]]] = ...) -> None: ...

class NodeAssignment(_message.Message):
    __slots__ = ("consumer_indices", "assignment")
    CONSUMER_INDICES_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENT_FIELD_NUMBER: _ClassVar[int]
    consumer_indices: _containers.RepeatedScalarFieldContainer[int]
    assignment: WatchAssignmentsResponse
    def __init__(self, consumer_indices: _Optional[_Iterable[int]] = ..., assignment: _Optional[_Union[WatchAssignmentsResponse, _Mapping]] = ...) -> None: ...

class WatchAssignmentsResponse(_message.Message):
    __slots__ = ("sequence", "admission", "global_loss_tokens", "assignment", "rank_assignment")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    ADMISSION_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_LOSS_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENT_FIELD_NUMBER: _ClassVar[int]
    RANK_ASSIGNMENT_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    admission: _admission_pb2.MiniBatchAdmission
    global_loss_tokens: int
    assignment: _plan_pb2.ConsumerAssignment
    rank_assignment: _plan_pb2.RankAssignment
    def __init__(self, sequence: _Optional[int] = ..., admission: _Optional[_Union[_admission_pb2.MiniBatchAdmission, _Mapping]] = ..., global_loss_tokens: _Optional[int] = ..., assignment: _Optional[_Union[_plan_pb2.ConsumerAssignment, _Mapping]] = ..., rank_assignment: _Optional[_Union[_plan_pb2.RankAssignment, _Mapping]] = ...) -> None: ...

class ReportProgressRequest(_message.Message):
    __slots__ = ("request_id", "consumer", "sequence", "stage")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    consumer: _topology_pb2.ConsumerId
    sequence: int
    stage: ProgressStage
    def __init__(self, request_id: _Optional[str] = ..., consumer: _Optional[_Union[_topology_pb2.ConsumerId, _Mapping]] = ..., sequence: _Optional[int] = ..., stage: _Optional[_Union[ProgressStage, str]] = ...) -> None: ...

class ReportProgressResponse(_message.Message):
    __slots__ = ("released",)
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    released: bool
    def __init__(self, released: _Optional[bool] = ...) -> None: ...

class ReportCheckpointRequest(_message.Message):
    __slots__ = ("request_id", "train_batch_index", "minibatch_index")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TRAIN_BATCH_INDEX_FIELD_NUMBER: _ClassVar[int]
    MINIBATCH_INDEX_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    train_batch_index: int
    minibatch_index: int
    def __init__(self, request_id: _Optional[str] = ..., train_batch_index: _Optional[int] = ..., minibatch_index: _Optional[int] = ...) -> None: ...

class ReportCheckpointResponse(_message.Message):
    __slots__ = ("released_minibatches", "checkpoint_train_batch_index", "checkpoint_minibatch_index")
    RELEASED_MINIBATCHES_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_TRAIN_BATCH_INDEX_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_MINIBATCH_INDEX_FIELD_NUMBER: _ClassVar[int]
    released_minibatches: int
    checkpoint_train_batch_index: int
    checkpoint_minibatch_index: int
    def __init__(self, released_minibatches: _Optional[int] = ..., checkpoint_train_batch_index: _Optional[int] = ..., checkpoint_minibatch_index: _Optional[int] = ...) -> None: ...

class AdvanceVersionRequest(_message.Message):
    __slots__ = ("request_id", "train_batch_index", "new_version")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TRAIN_BATCH_INDEX_FIELD_NUMBER: _ClassVar[int]
    NEW_VERSION_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    train_batch_index: int
    new_version: int
    def __init__(self, request_id: _Optional[str] = ..., train_batch_index: _Optional[int] = ..., new_version: _Optional[int] = ...) -> None: ...

class AdvanceVersionResponse(_message.Message):
    __slots__ = ("version",)
    VERSION_FIELD_NUMBER: _ClassVar[int]
    version: int
    def __init__(self, version: _Optional[int] = ...) -> None: ...

class GetStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SourceStatus(_message.Message):
    __slots__ = ("source", "pool", "admitted", "quota", "target", "slack")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    ADMITTED_FIELD_NUMBER: _ClassVar[int]
    QUOTA_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    SLACK_FIELD_NUMBER: _ClassVar[int]
    source: str
    pool: int
    admitted: int
    quota: int
    target: float
    slack: int
    def __init__(self, source: _Optional[str] = ..., pool: _Optional[int] = ..., admitted: _Optional[int] = ..., quota: _Optional[int] = ..., target: _Optional[float] = ..., slack: _Optional[int] = ...) -> None: ...

class GetStatusResponse(_message.Message):
    __slots__ = ("sources", "train_batch_index", "minibatch_index", "num_minibatches", "policy_version", "blocking_reason", "blocking_detail", "blocked_seconds", "pool_size", "admitted_total", "dropped_stale", "released_minibatches", "failed_minibatches", "recent_failures")
    SOURCES_FIELD_NUMBER: _ClassVar[int]
    TRAIN_BATCH_INDEX_FIELD_NUMBER: _ClassVar[int]
    MINIBATCH_INDEX_FIELD_NUMBER: _ClassVar[int]
    NUM_MINIBATCHES_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    BLOCKING_REASON_FIELD_NUMBER: _ClassVar[int]
    BLOCKING_DETAIL_FIELD_NUMBER: _ClassVar[int]
    BLOCKED_SECONDS_FIELD_NUMBER: _ClassVar[int]
    POOL_SIZE_FIELD_NUMBER: _ClassVar[int]
    ADMITTED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    DROPPED_STALE_FIELD_NUMBER: _ClassVar[int]
    RELEASED_MINIBATCHES_FIELD_NUMBER: _ClassVar[int]
    FAILED_MINIBATCHES_FIELD_NUMBER: _ClassVar[int]
    RECENT_FAILURES_FIELD_NUMBER: _ClassVar[int]
    sources: _containers.RepeatedCompositeFieldContainer[SourceStatus]
    train_batch_index: int
    minibatch_index: int
    num_minibatches: int
    policy_version: int
    blocking_reason: _admission_pb2.BlockingReason
    blocking_detail: str
    blocked_seconds: float
    pool_size: int
    admitted_total: int
    dropped_stale: int
    released_minibatches: int
    failed_minibatches: int
    recent_failures: _containers.RepeatedCompositeFieldContainer[ConsumerFailure]
    def __init__(self, sources: _Optional[_Iterable[_Union[SourceStatus, _Mapping]]] = ..., train_batch_index: _Optional[int] = ..., minibatch_index: _Optional[int] = ..., num_minibatches: _Optional[int] = ..., policy_version: _Optional[int] = ..., blocking_reason: _Optional[_Union[_admission_pb2.BlockingReason, str]] = ..., blocking_detail: _Optional[str] = ..., blocked_seconds: _Optional[float] = ..., pool_size: _Optional[int] = ..., admitted_total: _Optional[int] = ..., dropped_stale: _Optional[int] = ..., released_minibatches: _Optional[int] = ..., failed_minibatches: _Optional[int] = ..., recent_failures: _Optional[_Iterable[_Union[ConsumerFailure, _Mapping]]] = ...) -> None: ...

class ConsumerFailure(_message.Message):
    __slots__ = ("consumer", "sequence", "train_batch_index", "minibatch_index", "microbatch_index", "trajectory_id", "unit_key", "reason")
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    TRAIN_BATCH_INDEX_FIELD_NUMBER: _ClassVar[int]
    MINIBATCH_INDEX_FIELD_NUMBER: _ClassVar[int]
    MICROBATCH_INDEX_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORY_ID_FIELD_NUMBER: _ClassVar[int]
    UNIT_KEY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    consumer: _topology_pb2.ConsumerId
    sequence: int
    train_batch_index: int
    minibatch_index: int
    microbatch_index: int
    trajectory_id: str
    unit_key: str
    reason: str
    def __init__(self, consumer: _Optional[_Union[_topology_pb2.ConsumerId, _Mapping]] = ..., sequence: _Optional[int] = ..., train_batch_index: _Optional[int] = ..., minibatch_index: _Optional[int] = ..., microbatch_index: _Optional[int] = ..., trajectory_id: _Optional[str] = ..., unit_key: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class ReportConsumerFailureRequest(_message.Message):
    __slots__ = ("request_id", "failure")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    failure: ConsumerFailure
    def __init__(self, request_id: _Optional[str] = ..., failure: _Optional[_Union[ConsumerFailure, _Mapping]] = ...) -> None: ...

class ReportConsumerFailureResponse(_message.Message):
    __slots__ = ("recorded",)
    RECORDED_FIELD_NUMBER: _ClassVar[int]
    recorded: bool
    def __init__(self, recorded: _Optional[bool] = ...) -> None: ...

class WaitMiniBatchVerdictRequest(_message.Message):
    __slots__ = ("sequence", "timeout_seconds", "role")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    timeout_seconds: float
    role: str
    def __init__(self, sequence: _Optional[int] = ..., timeout_seconds: _Optional[float] = ..., role: _Optional[str] = ...) -> None: ...

class WaitMiniBatchVerdictResponse(_message.Message):
    __slots__ = ("verdict", "failure", "waiting_for")
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    WAITING_FOR_FIELD_NUMBER: _ClassVar[int]
    verdict: MiniBatchVerdict
    failure: ConsumerFailure
    waiting_for: _containers.RepeatedCompositeFieldContainer[_topology_pb2.ConsumerId]
    def __init__(self, verdict: _Optional[_Union[MiniBatchVerdict, str]] = ..., failure: _Optional[_Union[ConsumerFailure, _Mapping]] = ..., waiting_for: _Optional[_Iterable[_Union[_topology_pb2.ConsumerId, _Mapping]]] = ...) -> None: ...

class UnitReservation(_message.Message):
    __slots__ = ("trajectory_id", "sample_id", "multimodal_keys", "unit_keys")
    TRAJECTORY_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_ID_FIELD_NUMBER: _ClassVar[int]
    MULTIMODAL_KEYS_FIELD_NUMBER: _ClassVar[int]
    UNIT_KEYS_FIELD_NUMBER: _ClassVar[int]
    trajectory_id: str
    sample_id: str
    multimodal_keys: _containers.RepeatedScalarFieldContainer[str]
    unit_keys: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, trajectory_id: _Optional[str] = ..., sample_id: _Optional[str] = ..., multimodal_keys: _Optional[_Iterable[str]] = ..., unit_keys: _Optional[_Iterable[str]] = ...) -> None: ...

class ReserveUnitsRequest(_message.Message):
    __slots__ = ("request_id", "reservations", "expires_at")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    RESERVATIONS_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    reservations: _containers.RepeatedCompositeFieldContainer[UnitReservation]
    expires_at: float
    def __init__(self, request_id: _Optional[str] = ..., reservations: _Optional[_Iterable[_Union[UnitReservation, _Mapping]]] = ..., expires_at: _Optional[float] = ...) -> None: ...

class ReserveUnitsResponse(_message.Message):
    __slots__ = ("reserved", "already_reported")
    RESERVED_FIELD_NUMBER: _ClassVar[int]
    ALREADY_REPORTED_FIELD_NUMBER: _ClassVar[int]
    reserved: int
    already_reported: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, reserved: _Optional[int] = ..., already_reported: _Optional[_Iterable[str]] = ...) -> None: ...

class CancelReservationsRequest(_message.Message):
    __slots__ = ("request_id", "trajectory_ids")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORY_IDS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    trajectory_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, request_id: _Optional[str] = ..., trajectory_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class CancelReservationsResponse(_message.Message):
    __slots__ = ("cancelled",)
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    cancelled: int
    def __init__(self, cancelled: _Optional[int] = ...) -> None: ...

class FieldAttachment(_message.Message):
    __slots__ = ("trajectory_id", "unit")
    TRAJECTORY_ID_FIELD_NUMBER: _ClassVar[int]
    UNIT_FIELD_NUMBER: _ClassVar[int]
    trajectory_id: str
    unit: _trajectory_pb2.UnitRef
    def __init__(self, trajectory_id: _Optional[str] = ..., unit: _Optional[_Union[_trajectory_pb2.UnitRef, _Mapping]] = ...) -> None: ...

class AttachFieldsRequest(_message.Message):
    __slots__ = ("request_id", "role", "sequence", "attachments")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    ATTACHMENTS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    role: str
    sequence: int
    attachments: _containers.RepeatedCompositeFieldContainer[FieldAttachment]
    def __init__(self, request_id: _Optional[str] = ..., role: _Optional[str] = ..., sequence: _Optional[int] = ..., attachments: _Optional[_Iterable[_Union[FieldAttachment, _Mapping]]] = ...) -> None: ...

class AttachFieldsResponse(_message.Message):
    __slots__ = ("attached", "unchanged", "complete")
    ATTACHED_FIELD_NUMBER: _ClassVar[int]
    UNCHANGED_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    attached: int
    unchanged: int
    complete: bool
    def __init__(self, attached: _Optional[int] = ..., unchanged: _Optional[int] = ..., complete: _Optional[bool] = ...) -> None: ...
