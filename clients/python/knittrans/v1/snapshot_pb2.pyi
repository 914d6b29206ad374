from knittrans.v1 import admission_pb2 as _admission_pb2
from knittrans.v1 import admission_service_pb2 as _admission_service_pb2
from knittrans.v1 import topology_pb2 as _topology_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ScalarValueKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SCALAR_VALUE_KIND_UNSPECIFIED: _ClassVar[ScalarValueKind]
    SCALAR_VALUE_KIND_FLOAT: _ClassVar[ScalarValueKind]
    SCALAR_VALUE_KIND_INT: _ClassVar[ScalarValueKind]
    SCALAR_VALUE_KIND_BOOL: _ClassVar[ScalarValueKind]

class MetadataValueKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    METADATA_VALUE_KIND_UNSPECIFIED: _ClassVar[MetadataValueKind]
    METADATA_VALUE_KIND_STR: _ClassVar[MetadataValueKind]
    METADATA_VALUE_KIND_BYTES: _ClassVar[MetadataValueKind]
    METADATA_VALUE_KIND_JSON: _ClassVar[MetadataValueKind]
SCALAR_VALUE_KIND_UNSPECIFIED: ScalarValueKind
SCALAR_VALUE_KIND_FLOAT: ScalarValueKind
SCALAR_VALUE_KIND_INT: ScalarValueKind
SCALAR_VALUE_KIND_BOOL: ScalarValueKind
METADATA_VALUE_KIND_UNSPECIFIED: MetadataValueKind
METADATA_VALUE_KIND_STR: MetadataValueKind
METADATA_VALUE_KIND_BYTES: MetadataValueKind
METADATA_VALUE_KIND_JSON: MetadataValueKind

class AdmissionSnapshot(_message.Message):
    __slots__ = ("sequence", "version", "engine", "live_reports", "fingerprint_chunks", "fingerprint_count", "fingerprint_size", "media", "reservations", "minibatches", "next_sequence", "acknowledged", "scheduled_requests", "scheduled", "pending_deletes", "last_wait", "admitted_total", "dropped_stale", "released_minibatches", "quota_violations", "schema", "failure_keys", "recent_failures", "failed_verdicts", "consumers", "sources", "checkpoint", "expiring_reservations", "attached", "role_failed_verdicts")
    class ScheduledEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    class FailedVerdictsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: _admission_service_pb2.ConsumerFailure
        def __init__(self, key: _Optional[int] = ..., value: _Optional[_Union[_admission_service_pb2.ConsumerFailure, _Mapping]] = ...) -> None: ...
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    LIVE_REPORTS_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_COUNT_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_SIZE_FIELD_NUMBER: _ClassVar[int]
    MEDIA_FIELD_NUMBER: _ClassVar[int]
    RESERVATIONS_FIELD_NUMBER: _ClassVar[int]
    MINIBATCHES_FIELD_NUMBER: _ClassVar[int]
    NEXT_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    ACKNOWLEDGED_FIELD_NUMBER: _ClassVar[int]
    SCHEDULED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    SCHEDULED_FIELD_NUMBER: _ClassVar[int]
    PENDING_DELETES_FIELD_NUMBER: _ClassVar[int]
    LAST_WAIT_FIELD_NUMBER: _ClassVar[int]
    ADMITTED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    DROPPED_STALE_FIELD_NUMBER: _ClassVar[int]
    RELEASED_MINIBATCHES_FIELD_NUMBER: _ClassVar[int]
    QUOTA_VIOLATIONS_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_FIELD_NUMBER: _ClassVar[int]
    FAILURE_KEYS_FIELD_NUMBER: _ClassVar[int]
    RECENT_FAILURES_FIELD_NUMBER: _ClassVar[int]
    FAILED_VERDICTS_FIELD_NUMBER: _ClassVar[int]
    CONSUMERS_FIELD_NUMBER: _ClassVar[int]
    SOURCES_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    EXPIRING_RESERVATIONS_FIELD_NUMBER: _ClassVar[int]
    ATTACHED_FIELD_NUMBER: _ClassVar[int]
    ROLE_FAILED_VERDICTS_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    version: int
    engine: EngineSnapshot
    live_reports: _containers.RepeatedCompositeFieldContainer[_admission_service_pb2.ReportTrajectoriesRequest]
    fingerprint_chunks: int
    fingerprint_count: int
    fingerprint_size: int
    media: _containers.RepeatedCompositeFieldContainer[MediaSignature]
    reservations: _containers.RepeatedCompositeFieldContainer[_admission_service_pb2.UnitReservation]
    minibatches: _containers.RepeatedCompositeFieldContainer[AdmittedMiniBatchSnapshot]
    next_sequence: int
    acknowledged: _containers.RepeatedCompositeFieldContainer[ConsumerPosition]
    scheduled_requests: _containers.RepeatedScalarFieldContainer[str]
    scheduled: _containers.ScalarMap[int, int]
    pending_deletes: _containers.RepeatedScalarFieldContainer[str]
    last_wait: TimedWait
    admitted_total: int
    dropped_stale: int
    released_minibatches: int
    quota_violations: int
    schema: JobSchemaSnapshot
    failure_keys: _containers.RepeatedCompositeFieldContainer[ConsumerFailureKey]
    recent_failures: _containers.RepeatedCompositeFieldContainer[_admission_service_pb2.ConsumerFailure]
    failed_verdicts: _containers.MessageMap[int, _admission_service_pb2.ConsumerFailure]
    consumers: _containers.RepeatedCompositeFieldContainer[_topology_pb2.ConsumerId]
    sources: _containers.RepeatedScalarFieldContainer[str]
    checkpoint: StepIndex
    expiring_reservations: _containers.RepeatedCompositeFieldContainer[ExpiringReservation]
    attached: _containers.RepeatedCompositeFieldContainer[_admission_service_pb2.FieldAttachment]
    role_failed_verdicts: _containers.RepeatedCompositeFieldContainer[_admission_service_pb2.ConsumerFailure]
    def __init__(self, sequence: _Optional[int] = ..., version: _Optional[int] = ..., engine: _Optional[_Union[EngineSnapshot, _Mapping]] = ..., live_reports: _Optional[_Iterable[_Union[_admission_service_pb2.ReportTrajectoriesRequest, _Mapping]]] = ..., fingerprint_chunks: _Optional[int] = ..., fingerprint_count: _Optional[int] = ..., fingerprint_size: _Optional[int] = ..., media: _Optional[_Iterable[_Union[MediaSignature, _Mapping]]] = ..., reservations: _Optional[_Iterable[_Union[_admission_service_pb2.UnitReservation, _Mapping]]] = ..., minibatches: _Optional[_Iterable[_Union[AdmittedMiniBatchSnapshot, _Mapping]]] = ..., next_sequence: _Optional[int] = ..., acknowledged: _Optional[_Iterable[_Union[ConsumerPosition, _Mapping]]] = ..., scheduled_requests: _Optional[_Iterable[str]] = ..., scheduled: _Optional[_Mapping[int, int]] = ..., pending_deletes: _Optional[_Iterable[str]] = ..., last_wait: _Optional[_Union[TimedWait, _Mapping]] = ..., admitted_total: _Optional[int] = ..., dropped_stale: _Optional[int] = ..., released_minibatches: _Optional[int] = ..., quota_violations: _Optional[int] = ..., schema: _Optional[_Union[JobSchemaSnapshot, _Mapping]] = ..., failure_keys: _Optional[_Iterable[_Union[ConsumerFailureKey, _Mapping]]] = ..., recent_failures: _Optional[_Iterable[_Union[_admission_service_pb2.ConsumerFailure, _Mapping]]] = ..., failed_verdicts: _Optional[_Mapping[int, _admission_service_pb2.ConsumerFailure]] = ..., consumers: _Optional[_Iterable[_Union[_topology_pb2.ConsumerId, _Mapping]]] = ..., sources: _Optional[_Iterable[str]] = ..., checkpoint: _Optional[_Union[StepIndex, _Mapping]] = ..., expiring_reservations: _Optional[_Iterable[_Union[ExpiringReservation, _Mapping]]] = ..., attached: _Optional[_Iterable[_Union[_admission_service_pb2.FieldAttachment, _Mapping]]] = ..., role_failed_verdicts: _Optional[_Iterable[_Union[_admission_service_pb2.ConsumerFailure, _Mapping]]] = ...) -> None: ...

class StepIndex(_message.Message):
    __slots__ = ("train_batch_index", "minibatch_index")
    TRAIN_BATCH_INDEX_FIELD_NUMBER: _ClassVar[int]
    MINIBATCH_INDEX_FIELD_NUMBER: _ClassVar[int]
    train_batch_index: int
    minibatch_index: int
    def __init__(self, train_batch_index: _Optional[int] = ..., minibatch_index: _Optional[int] = ...) -> None: ...

class ExpiringReservation(_message.Message):
    __slots__ = ("trajectory_id", "expires_at", "unit_keys")
    TRAJECTORY_ID_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    UNIT_KEYS_FIELD_NUMBER: _ClassVar[int]
    trajectory_id: str
    expires_at: float
    unit_keys: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, trajectory_id: _Optional[str] = ..., expires_at: _Optional[float] = ..., unit_keys: _Optional[_Iterable[str]] = ...) -> None: ...

class TimedWait(_message.Message):
    __slots__ = ("wait", "since")
    WAIT_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    wait: _admission_pb2.AdmissionWait
    since: float
    def __init__(self, wait: _Optional[_Union[_admission_pb2.AdmissionWait, _Mapping]] = ..., since: _Optional[float] = ...) -> None: ...

class MediaSignature(_message.Message):
    __slots__ = ("key", "encoder", "cost", "placeholder_length", "kind", "content_hash")
    KEY_FIELD_NUMBER: _ClassVar[int]
    ENCODER_FIELD_NUMBER: _ClassVar[int]
    COST_FIELD_NUMBER: _ClassVar[int]
    PLACEHOLDER_LENGTH_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    CONTENT_HASH_FIELD_NUMBER: _ClassVar[int]
    key: str
    encoder: str
    cost: float
    placeholder_length: int
    kind: int
    content_hash: str
    def __init__(self, key: _Optional[str] = ..., encoder: _Optional[str] = ..., cost: _Optional[float] = ..., placeholder_length: _Optional[int] = ..., kind: _Optional[int] = ..., content_hash: _Optional[str] = ...) -> None: ...

class AdmittedMiniBatchSnapshot(_message.Message):
    __slots__ = ("sequence", "admission", "owed_steps", "verified", "verdict", "released", "role_verdicts", "first_step_at")
    class RoleVerdictsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: _admission_service_pb2.MiniBatchVerdict
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[_admission_service_pb2.MiniBatchVerdict, str]] = ...) -> None: ...
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    ADMISSION_FIELD_NUMBER: _ClassVar[int]
    OWED_STEPS_FIELD_NUMBER: _ClassVar[int]
    VERIFIED_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    ROLE_VERDICTS_FIELD_NUMBER: _ClassVar[int]
    FIRST_STEP_AT_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    admission: _admission_pb2.MiniBatchAdmission
    owed_steps: _containers.RepeatedCompositeFieldContainer[_topology_pb2.ConsumerId]
    verified: _containers.RepeatedCompositeFieldContainer[_topology_pb2.ConsumerId]
    verdict: _admission_service_pb2.MiniBatchVerdict
    released: bool
    role_verdicts: _containers.ScalarMap[str, _admission_service_pb2.MiniBatchVerdict]
    first_step_at: float
    def __init__(self, sequence: _Optional[int] = ..., admission: _Optional[_Union[_admission_pb2.MiniBatchAdmission, _Mapping]] = ..., owed_steps: _Optional[_Iterable[_Union[_topology_pb2.ConsumerId, _Mapping]]] = ..., verified: _Optional[_Iterable[_Union[_topology_pb2.ConsumerId, _Mapping]]] = ..., verdict: _Optional[_Union[_admission_service_pb2.MiniBatchVerdict, str]] = ..., released: _Optional[bool] = ..., role_verdicts: _Optional[_Mapping[str, _admission_service_pb2.MiniBatchVerdict]] = ..., first_step_at: _Optional[float] = ...) -> None: ...

class ConsumerPosition(_message.Message):
    __slots__ = ("consumer", "sequence")
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    consumer: _topology_pb2.ConsumerId
    sequence: int
    def __init__(self, consumer: _Optional[_Union[_topology_pb2.ConsumerId, _Mapping]] = ..., sequence: _Optional[int] = ...) -> None: ...

class ConsumerFailureKey(_message.Message):
    __slots__ = ("consumer", "sequence")
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    consumer: _topology_pb2.ConsumerId
    sequence: int
    def __init__(self, consumer: _Optional[_Union[_topology_pb2.ConsumerId, _Mapping]] = ..., sequence: _Optional[int] = ...) -> None: ...

class JobSchemaSnapshot(_message.Message):
    __slots__ = ("fields", "scalars", "metadata", "declared")
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    SCALARS_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    DECLARED_FIELD_NUMBER: _ClassVar[int]
    fields: _containers.RepeatedCompositeFieldContainer[FieldSchemaEntry]
    scalars: _containers.RepeatedCompositeFieldContainer[ScalarRule]
    metadata: _containers.RepeatedCompositeFieldContainer[MetadataRule]
    declared: bool
    def __init__(self, fields: _Optional[_Iterable[_Union[FieldSchemaEntry, _Mapping]]] = ..., scalars: _Optional[_Iterable[_Union[ScalarRule, _Mapping]]] = ..., metadata: _Optional[_Iterable[_Union[MetadataRule, _Mapping]]] = ..., declared: _Optional[bool] = ...) -> None: ...

class ScalarRule(_message.Message):
    __slots__ = ("name", "kind", "required")
    NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    REQUIRED_FIELD_NUMBER: _ClassVar[int]
    name: str
    kind: ScalarValueKind
    required: bool
    def __init__(self, name: _Optional[str] = ..., kind: _Optional[_Union[ScalarValueKind, str]] = ..., required: _Optional[bool] = ...) -> None: ...

class MetadataRule(_message.Message):
    __slots__ = ("name", "kind", "max_bytes", "required")
    NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    REQUIRED_FIELD_NUMBER: _ClassVar[int]
    name: str
    kind: MetadataValueKind
    max_bytes: int
    required: bool
    def __init__(self, name: _Optional[str] = ..., kind: _Optional[_Union[MetadataValueKind, str]] = ..., max_bytes: _Optional[int] = ..., required: _Optional[bool] = ...) -> None: ...

class FieldSchemaEntry(_message.Message):
    __slots__ = ("name", "kind", "dtype", "has_trailing_shape", "trailing_shape", "coverage")
    NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    HAS_TRAILING_SHAPE_FIELD_NUMBER: _ClassVar[int]
    TRAILING_SHAPE_FIELD_NUMBER: _ClassVar[int]
    COVERAGE_FIELD_NUMBER: _ClassVar[int]
    name: str
    kind: int
    dtype: int
    has_trailing_shape: bool
    trailing_shape: _containers.RepeatedScalarFieldContainer[int]
    coverage: int
    def __init__(self, name: _Optional[str] = ..., kind: _Optional[int] = ..., dtype: _Optional[int] = ..., has_trailing_shape: _Optional[bool] = ..., trailing_shape: _Optional[_Iterable[int]] = ..., coverage: _Optional[int] = ...) -> None: ...

class EngineSnapshot(_message.Message):
    __slots__ = ("version_base", "train_batch_index", "minibatch_index", "admitted", "admitted_total", "relaxed", "blocking", "blocked_since", "starving_since", "last_wait", "filtered", "unit_versions", "unit_ready_at", "unit_ids", "unit_sources", "unit_seqs", "unit_member_counts", "unit_members", "pending_groups", "group_sizes", "closed_samples", "next_seq", "carry", "carry_total", "carry_seq", "completion")
    class GroupSizesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    VERSION_BASE_FIELD_NUMBER: _ClassVar[int]
    TRAIN_BATCH_INDEX_FIELD_NUMBER: _ClassVar[int]
    MINIBATCH_INDEX_FIELD_NUMBER: _ClassVar[int]
    ADMITTED_FIELD_NUMBER: _ClassVar[int]
    ADMITTED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    RELAXED_FIELD_NUMBER: _ClassVar[int]
    BLOCKING_FIELD_NUMBER: _ClassVar[int]
    BLOCKED_SINCE_FIELD_NUMBER: _ClassVar[int]
    STARVING_SINCE_FIELD_NUMBER: _ClassVar[int]
    LAST_WAIT_FIELD_NUMBER: _ClassVar[int]
    FILTERED_FIELD_NUMBER: _ClassVar[int]
    UNIT_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    UNIT_READY_AT_FIELD_NUMBER: _ClassVar[int]
    UNIT_IDS_FIELD_NUMBER: _ClassVar[int]
    UNIT_SOURCES_FIELD_NUMBER: _ClassVar[int]
    UNIT_SEQS_FIELD_NUMBER: _ClassVar[int]
    UNIT_MEMBER_COUNTS_FIELD_NUMBER: _ClassVar[int]
    UNIT_MEMBERS_FIELD_NUMBER: _ClassVar[int]
    PENDING_GROUPS_FIELD_NUMBER: _ClassVar[int]
    GROUP_SIZES_FIELD_NUMBER: _ClassVar[int]
    CLOSED_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    NEXT_SEQ_FIELD_NUMBER: _ClassVar[int]
    CARRY_FIELD_NUMBER: _ClassVar[int]
    CARRY_TOTAL_FIELD_NUMBER: _ClassVar[int]
    CARRY_SEQ_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_FIELD_NUMBER: _ClassVar[int]
    version_base: int
    train_batch_index: int
    minibatch_index: int
    admitted: _containers.RepeatedScalarFieldContainer[int]
    admitted_total: int
    relaxed: bool
    blocking: _admission_pb2.BlockingReason
    blocked_since: float
    starving_since: float
    last_wait: TimedWait
    filtered: _containers.RepeatedScalarFieldContainer[str]
    unit_versions: _containers.RepeatedScalarFieldContainer[int]
    unit_ready_at: _containers.RepeatedScalarFieldContainer[float]
    unit_ids: _containers.RepeatedScalarFieldContainer[str]
    unit_sources: _containers.RepeatedScalarFieldContainer[int]
    unit_seqs: _containers.RepeatedScalarFieldContainer[int]
    unit_member_counts: _containers.RepeatedScalarFieldContainer[int]
    unit_members: _containers.RepeatedScalarFieldContainer[str]
    pending_groups: _containers.RepeatedCompositeFieldContainer[PendingGroupSnapshot]
    group_sizes: _containers.ScalarMap[str, int]
    closed_samples: _containers.RepeatedScalarFieldContainer[str]
    next_seq: int
    carry: _containers.RepeatedScalarFieldContainer[int]
    carry_total: int
    carry_seq: int
    completion: CompletionSnapshot
    def __init__(self, version_base: _Optional[int] = ..., train_batch_index: _Optional[int] = ..., minibatch_index: _Optional[int] = ..., admitted: _Optional[_Iterable[int]] = ..., admitted_total: _Optional[int] = ..., relaxed: _Optional[bool] = ..., blocking: _Optional[_Union[_admission_pb2.BlockingReason, str]] = ..., blocked_since: _Optional[float] = ..., starving_since: _Optional[float] = ..., last_wait: _Optional[_Union[TimedWait, _Mapping]] = ..., filtered: _Optional[_Iterable[str]] = ..., unit_versions: _Optional[_Iterable[int]] = ..., unit_ready_at: _Optional[_Iterable[float]] = ..., unit_ids: _Optional[_Iterable[str]] = ..., unit_sources: _Optional[_Iterable[int]] = ..., unit_seqs: _Optional[_Iterable[int]] = ..., unit_member_counts: _Optional[_Iterable[int]] = ..., unit_members: _Optional[_Iterable[str]] = ..., pending_groups: _Optional[_Iterable[_Union[PendingGroupSnapshot, _Mapping]]] = ..., group_sizes: _Optional[_Mapping[str, int]] = ..., closed_samples: _Optional[_Iterable[str]] = ..., next_seq: _Optional[int] = ..., carry: _Optional[_Iterable[int]] = ..., carry_total: _Optional[int] = ..., carry_seq: _Optional[int] = ..., completion: _Optional[_Union[CompletionSnapshot, _Mapping]] = ...) -> None: ...

class PendingGroupSnapshot(_message.Message):
    __slots__ = ("sample_id", "source", "size", "reported", "accepted", "oldest_version", "ready_at")
    SAMPLE_ID_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    REPORTED_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    OLDEST_VERSION_FIELD_NUMBER: _ClassVar[int]
    READY_AT_FIELD_NUMBER: _ClassVar[int]
    sample_id: str
    source: int
    size: int
    reported: int
    accepted: _containers.RepeatedScalarFieldContainer[str]
    oldest_version: int
    ready_at: float
    def __init__(self, sample_id: _Optional[str] = ..., source: _Optional[int] = ..., size: _Optional[int] = ..., reported: _Optional[int] = ..., accepted: _Optional[_Iterable[str]] = ..., oldest_version: _Optional[int] = ..., ready_at: _Optional[float] = ...) -> None: ...

class CompletionSnapshot(_message.Message):
    __slots__ = ("declared", "completed", "completed_at_start")
    class DeclaredEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    class CompletedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    class CompletedAtStartEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    DECLARED_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_AT_START_FIELD_NUMBER: _ClassVar[int]
    declared: _containers.ScalarMap[int, int]
    completed: _containers.ScalarMap[int, int]
    completed_at_start: _containers.ScalarMap[int, int]
    def __init__(self, declared: _Optional[_Mapping[int, int]] = ..., completed: _Optional[_Mapping[int, int]] = ..., completed_at_start: _Optional[_Mapping[int, int]] = ...) -> None: ...

class FingerprintChunk(_message.Message):
    __slots__ = ("trajectory_ids", "fingerprints")
    TRAJECTORY_IDS_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINTS_FIELD_NUMBER: _ClassVar[int]
    trajectory_ids: _containers.RepeatedScalarFieldContainer[str]
    fingerprints: bytes
    def __init__(self, trajectory_ids: _Optional[_Iterable[str]] = ..., fingerprints: _Optional[bytes] = ...) -> None: ...
