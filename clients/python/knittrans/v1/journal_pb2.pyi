from knittrans.v1 import admission_pb2 as _admission_pb2
from knittrans.v1 import admission_service_pb2 as _admission_service_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class UnitsDeleted(_message.Message):
    __slots__ = ("keys",)
    KEYS_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, keys: _Optional[_Iterable[str]] = ...) -> None: ...

class JournalRecord(_message.Message):
    __slots__ = ("at", "sequence", "report", "scheduled", "admission", "drop", "version", "progress", "deleted", "wait", "reserved", "reservations_cancelled", "consumer_failure", "checkpoint", "attached")
    AT_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    REPORT_FIELD_NUMBER: _ClassVar[int]
    SCHEDULED_FIELD_NUMBER: _ClassVar[int]
    ADMISSION_FIELD_NUMBER: _ClassVar[int]
    DROP_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    DELETED_FIELD_NUMBER: _ClassVar[int]
    WAIT_FIELD_NUMBER: _ClassVar[int]
    RESERVED_FIELD_NUMBER: _ClassVar[int]
    RESERVATIONS_CANCELLED_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_FAILURE_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    ATTACHED_FIELD_NUMBER: _ClassVar[int]
    at: float
    sequence: int
    report: _admission_service_pb2.ReportTrajectoriesRequest
    scheduled: _admission_service_pb2.ReportScheduledRequest
    admission: _admission_pb2.MiniBatchAdmission
    drop: _admission_pb2.TrajectoryDrop
    version: _admission_service_pb2.AdvanceVersionRequest
    progress: _admission_service_pb2.ReportProgressRequest
    deleted: UnitsDeleted
    wait: _admission_pb2.AdmissionWait
    reserved: _admission_service_pb2.ReserveUnitsRequest
    reservations_cancelled: _admission_service_pb2.CancelReservationsRequest
    consumer_failure: _admission_service_pb2.ReportConsumerFailureRequest
    checkpoint: _admission_service_pb2.ReportCheckpointRequest
    attached: _admission_service_pb2.AttachFieldsRequest
    def __init__(self, at: _Optional[float] = ..., sequence: _Optional[int] = ..., report: _Optional[_Union[_admission_service_pb2.ReportTrajectoriesRequest, _Mapping]] = ..., scheduled: _Optional[_Union[_admission_service_pb2.ReportScheduledRequest, _Mapping]] = ..., admission: _Optional[_Union[_admission_pb2.MiniBatchAdmission, _Mapping]] = ..., drop: _Optional[_Union[_admission_pb2.TrajectoryDrop, _Mapping]] = ..., version: _Optional[_Union[_admission_service_pb2.AdvanceVersionRequest, _Mapping]] = ..., progress: _Optional[_Union[_admission_service_pb2.ReportProgressRequest, _Mapping]] = ..., deleted: _Optional[_Union[UnitsDeleted, _Mapping]] = ..., wait: _Optional[_Union[_admission_pb2.AdmissionWait, _Mapping]] = ..., reserved: _Optional[_Union[_admission_service_pb2.ReserveUnitsRequest, _Mapping]] = ..., reservations_cancelled: _Optional[_Union[_admission_service_pb2.CancelReservationsRequest, _Mapping]] = ..., consumer_failure: _Optional[_Union[_admission_service_pb2.ReportConsumerFailureRequest, _Mapping]] = ..., checkpoint: _Optional[_Union[_admission_service_pb2.ReportCheckpointRequest, _Mapping]] = ..., attached: _Optional[_Union[_admission_service_pb2.AttachFieldsRequest, _Mapping]] = ...) -> None: ...
