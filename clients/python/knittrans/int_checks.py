"""The integer checks every typed domain object shares: plain ints only (a bool is an int to Python, never here)."""

from __future__ import annotations

from knittrans.errors import InvalidArgument


def check_non_negative_int(value: int, field_name: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidArgument(f"must be a non-negative integer, got {value!r}", field=field_name)


def check_positive_int(value: int, field_name: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidArgument(f"must be a positive integer, got {value!r}", field=field_name)
