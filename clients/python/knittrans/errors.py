"""The one error hierarchy of KnitTrans.

Every class carries the name of the gRPC status code it maps to, so the server boundary translates an
exception into a status with one lookup and the client maps the status back to the same class. Names, not
``grpc.StatusCode`` values, keep this module (which the pure cores import) free of grpc.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar, TypeVar

# The trailing-metadata key that carries the offending field of an InvalidArgument across the wire.
FIELD_TRAILER = "knittrans-field"


class KnitTransError(Exception):
    """Base of every error KnitTrans raises on purpose."""

    status_code: ClassVar[str] = "INTERNAL"

    def __init__(self, message: str, *, field: str | None = None) -> None:
        self.field = field
        super().__init__(f"{field}: {message}" if field else message)
        self.message = message


class InvalidArgument(KnitTransError, ValueError):
    """Bad input. `field` names the offending field, e.g. ``trajectories[3].num_tokens``."""

    status_code = "INVALID_ARGUMENT"


class ConfigError(InvalidArgument):
    """A config file, environment variable or flag is unknown or malformed."""


class TraceFormatError(InvalidArgument):
    """A line of a trace file is malformed; the message names the line and the field."""


T = TypeVar("T")


def within(path: str, build: Callable[[], T]) -> T:
    """Run ``build`` and prefix the field of any :class:`InvalidArgument` with ``path``."""
    try:
        return build()
    except InvalidArgument as exc:
        field = f"{path}.{exc.field}" if exc.field else path
        raise InvalidArgument(exc.message, field=field) from exc


class FailedPrecondition(KnitTransError):
    status_code = "FAILED_PRECONDITION"


class Conflict(KnitTransError):
    """Same identity, different content (a rewrite of a write-once key or trajectory)."""

    status_code = "ALREADY_EXISTS"


class NotFound(KnitTransError):
    status_code = "NOT_FOUND"


class UnitNotFound(NotFound):
    """A unit key is not in the store."""


class StoreError(KnitTransError):
    """The unit store failed in a way that retrying later may fix."""

    status_code = "UNAVAILABLE"


class StoreFullError(StoreError):
    status_code = "RESOURCE_EXHAUSTED"


class Unavailable(KnitTransError):
    """A peer (service, sidecar) cannot be reached."""

    status_code = "UNAVAILABLE"


class DeadlineExceeded(KnitTransError):
    status_code = "DEADLINE_EXCEEDED"


class Unauthenticated(KnitTransError):
    status_code = "UNAUTHENTICATED"


class ResourceExhausted(KnitTransError):
    status_code = "RESOURCE_EXHAUSTED"


class StarvationError(FailedPrecondition):
    """A source can no longer meet its quota and `on_starvation` is `fail`."""


class Aborted(KnitTransError):
    status_code = "ABORTED"


class MiniBatchFailed(KnitTransError):
    """The data plane could not read or pack an admitted mini-batch (a unit missing from the store, bytes that
    disagree with their header). Every trainer rank of every consumer gets it instead of the mini-batch when
    verification found it (only the failing consumer's ranks when reading did, after verification); ``field``
    names the unit key (or the trajectory when no unit is to blame)."""

    status_code = "DATA_LOSS"

    def __init__(
        self,
        message: str,
        *,
        field: str | None = None,
        trajectory_id: str = "",
        unit_key: str = "",
        sequence: int = 0,
        train_batch_index: int = 0,
        minibatch_index: int = 0,
    ) -> None:
        super().__init__(message, field=field or unit_key or trajectory_id or None)
        self.trajectory_id = trajectory_id
        self.unit_key = unit_key or (field or "")
        self.sequence = sequence
        self.train_batch_index = train_batch_index
        self.minibatch_index = minibatch_index


class MiniBatchRestarted(Aborted):
    """The mini-batch being iterated was restarted: a TP rank of this consumer restarted in the middle of it, and
    every TP rank gets it again from its first micro-batch (DESIGN.md §9). Discard the gradient accumulated from
    its micro-batches (``optimizer.zero_grad()``), do not step, and go on with ``mini_batches()``, which yields it
    again whole."""

    def __init__(self, message: str, *, sequence: int = 0, train_batch_index: int = 0,
                 minibatch_index: int = 0) -> None:
        super().__init__(message, field="sequence")
        self.sequence = sequence
        self.train_batch_index = train_batch_index
        self.minibatch_index = minibatch_index


_BY_STATUS: dict[str, type[KnitTransError]] = {
    "INVALID_ARGUMENT": InvalidArgument,
    "FAILED_PRECONDITION": FailedPrecondition,
    "ALREADY_EXISTS": Conflict,
    "NOT_FOUND": NotFound,
    "UNAVAILABLE": Unavailable,
    "DEADLINE_EXCEEDED": DeadlineExceeded,
    "UNAUTHENTICATED": Unauthenticated,
    "RESOURCE_EXHAUSTED": ResourceExhausted,
    "ABORTED": Aborted,
    "DATA_LOSS": MiniBatchFailed,
}


def error_class_for_status(code_name: str) -> type[KnitTransError]:
    """The client-side mapping from a status code's name (``grpc.StatusCode.X.name``) back to the hierarchy."""
    return _BY_STATUS.get(code_name, KnitTransError)
