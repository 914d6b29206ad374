"""The one error hierarchy of KnitTrans.

Every class carries the gRPC status code it maps to, so the server boundary translates an exception
into a status with one lookup and the client maps the status back to the same class.
"""

from __future__ import annotations

from typing import ClassVar

import grpc

# The trailing-metadata key that carries the offending field of an InvalidArgument across the wire.
FIELD_TRAILER = "knittrans-field"


class KnitTransError(Exception):
    """Base of every error KnitTrans raises on purpose."""

    status_code: ClassVar[grpc.StatusCode] = grpc.StatusCode.INTERNAL

    def __init__(self, message: str, *, field: str | None = None) -> None:
        self.field = field
        super().__init__(f"{field}: {message}" if field else message)
        self.message = message


class InvalidArgument(KnitTransError, ValueError):
    """Bad input. `field` names the offending field, e.g. ``trajectories[3].num_tokens``."""

    status_code = grpc.StatusCode.INVALID_ARGUMENT


class ConfigError(InvalidArgument):
    """A config file, environment variable or flag is unknown or malformed."""


class TraceFormatError(InvalidArgument):
    """A line of a trace file is malformed; the message names the line and the field."""


class FailedPrecondition(KnitTransError):
    status_code = grpc.StatusCode.FAILED_PRECONDITION


class Conflict(KnitTransError):
    """Same identity, different content (a rewrite of a write-once key or trajectory)."""

    status_code = grpc.StatusCode.ALREADY_EXISTS


class NotFound(KnitTransError):
    status_code = grpc.StatusCode.NOT_FOUND


class UnitNotFound(NotFound):
    """A unit key is not in the store."""


class StoreError(KnitTransError):
    """The unit store failed in a way that retrying later may fix."""

    status_code = grpc.StatusCode.UNAVAILABLE


class StoreFullError(StoreError):
    status_code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unavailable(KnitTransError):
    """A peer (service, sidecar) cannot be reached."""

    status_code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(KnitTransError):
    status_code = grpc.StatusCode.DEADLINE_EXCEEDED


class Unauthenticated(KnitTransError):
    status_code = grpc.StatusCode.UNAUTHENTICATED


class ResourceExhausted(KnitTransError):
    status_code = grpc.StatusCode.RESOURCE_EXHAUSTED


class StarvationError(FailedPrecondition):
    """A source can no longer meet its quota and `on_starvation` is `fail`."""


class Aborted(KnitTransError):
    status_code = grpc.StatusCode.ABORTED


_BY_STATUS: dict[grpc.StatusCode, type[KnitTransError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.ALREADY_EXISTS: Conflict,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.ABORTED: Aborted,
}


def error_class_for_status(code: grpc.StatusCode) -> type[KnitTransError]:
    """The client-side mapping from a status code back to the hierarchy."""
    return _BY_STATUS.get(code, KnitTransError)
