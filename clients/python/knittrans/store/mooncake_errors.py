"""Mooncake's negative return codes, translated into the KnitTrans error hierarchy in one place."""

from __future__ import annotations

from enum import IntEnum

from knittrans.errors import Conflict, InvalidArgument, KnitTransError, StoreError, StoreFullError, UnitNotFound


class MooncakeCode(IntEnum):
    """The codes of ``mooncake::ErrorCode`` that the unit store meets or names."""

    OK = 0
    INTERNAL_ERROR = -1
    BUFFER_OVERFLOW = -10
    SEGMENT_NOT_FOUND = -101
    NO_AVAILABLE_HANDLE = -200  # no space: the segments are full
    INVALID_VERSION = -300
    INVALID_KEY = -400
    WRITE_FAIL = -500
    INVALID_PARAMS = -600  # also: a range outside the object, a buffer too small or not registered
    ILLEGAL_CLIENT = -601
    INVALID_WRITE = -700
    INVALID_READ = -701
    INVALID_REPLICA = -702
    REPLICA_IS_NOT_READY = -703
    OBJECT_NOT_FOUND = -704
    OBJECT_ALREADY_EXISTS = -705
    OBJECT_HAS_LEASE = -706  # a reader holds a lease; removal must wait for it
    LEASE_EXPIRED = -707
    OBJECT_HAS_REPLICATION_TASK = -708
    TRANSFER_FAIL = -800
    RPC_FAIL = -900
    UNAVAILABLE_IN_CURRENT_STATUS = -1010


_INVALID_PARAMS_MEANING = {
    "batch_get_into_multi_buffer_ranges": ("a range lies outside", "range"),
    "batch_get_into": ("the buffer is smaller than the whole", "buffer"),
}


def code_name(code: int) -> str:
    try:
        return MooncakeCode(code).name
    except ValueError:
        return f"code {code}"


def mooncake_error(code: int, *, key: str | None, operation: str) -> KnitTransError:
    """The exception for a negative return code of ``operation`` on ``key``."""
    detail = f"mooncake {operation} failed with {code_name(code)} ({code})"
    if code == MooncakeCode.OBJECT_NOT_FOUND:
        return UnitNotFound("no such unit", field=key)
    if code == MooncakeCode.NO_AVAILABLE_HANDLE:
        return StoreFullError(f"{detail}: the store is full", field=key)
    if code == MooncakeCode.OBJECT_ALREADY_EXISTS:
        return Conflict(f"{detail}: key exists", field=key)
    if code == MooncakeCode.INVALID_PARAMS:
        reason, field = _INVALID_PARAMS_MEANING.get(operation, ("invalid parameters", key))
        return InvalidArgument(f"{reason} of unit {key!r} ({detail})", field=field)
    if code == MooncakeCode.INVALID_KEY:
        return InvalidArgument(detail, field=key)
    return StoreError(detail, field=key)
