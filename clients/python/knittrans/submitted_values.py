"""Checks of what a rollout worker submits that go beyond one array (:mod:`knittrans.rollout` splits the rest):
response-only fields against the trajectory's response, scalars, and typed values (pure: no I/O)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import partial
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from knittrans.errors import InvalidArgument, within
from knittrans.store.arrays import is_tensor
from knittrans.values import MetadataValue, TrajectoryValues

if TYPE_CHECKING:
    from knittrans.rollout import Trajectory


def response_field_names(
    trajectory: Trajectory, arrays: Mapping[str, tuple[np.ndarray, Any]], num_tokens: int
) -> set[str]:
    """The response-only fields, checked: arrays of ``num_tokens - response_start`` rows."""
    start = trajectory.response_start
    if not isinstance(start, int) or isinstance(start, bool) or not 0 <= start <= num_tokens:
        raise InvalidArgument(f"must be an integer in [0, num_tokens = {num_tokens}], got {start!r}",
                              field="response_start")
    names = set(trajectory.response_fields)
    for name in sorted(names):
        where = f"response_fields.{name}"
        if name not in trajectory.fields:
            raise InvalidArgument("is not one of the fields", field=where)
        if name == trajectory.tokens_field or name in trajectory.non_sequence_fields:
            raise InvalidArgument("is the tokens field or a non-sequence field", field=where)
        if name not in arrays or arrays[name][0].ndim < 1 or arrays[name][0].shape[0] != num_tokens - start:
            shape = arrays[name][0].shape if name in arrays else "a scalar"
            raise InvalidArgument(f"covers the response, tokens [{start}, {num_tokens}), so its leading dimension "
                                  f"must be {num_tokens - start}, got {shape}", field=f"fields.{name}")
    return names


def checked_values(trajectory: Trajectory) -> TrajectoryValues:
    """The trajectory's integer and boolean scalars and metadata, validated (numpy and torch numbers allowed)."""
    ints, bools, metadata = [], [], []
    for name, value in cast("Mapping[str, Any]", trajectory.int_scalars).items():
        number = value.item() if is_tensor(value) or isinstance(value, np.generic) else value
        if isinstance(number, bool) or not isinstance(number, int):
            raise InvalidArgument(f"must be an integer, got {type(value).__name__}", field=f"int_scalars.{name}")
        ints.append((name, number))
    for name, value in cast("Mapping[str, Any]", trajectory.bool_scalars).items():
        flag = value.item() if is_tensor(value) or isinstance(value, np.generic) else value
        if not isinstance(flag, bool):
            raise InvalidArgument(f"must be a bool, got {type(value).__name__}", field=f"bool_scalars.{name}")
        bools.append((name, flag))
    for name, value in trajectory.metadata.items():
        metadata.append((name, within(f"metadata.{name}", partial(MetadataValue.of, value))))
    return TrajectoryValues(int_scalars=tuple(ints), bool_scalars=tuple(bools), metadata=tuple(metadata))


def is_scalar(value: Any) -> bool:
    if isinstance(value, (bool, int, float, np.number, np.bool_)):
        return True
    if isinstance(value, np.ndarray):
        return value.ndim == 0
    if is_tensor(value):
        return bool(value.dim() == 0)
    return False


def scalar_value(value: Any, *, field: str) -> float:
    if is_tensor(value):
        value = value.item()
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise InvalidArgument(f"must be a number, got {type(value).__name__}", field=field) from None
    if not math.isfinite(number):
        raise InvalidArgument(f"must be finite, got {number}", field=field)
    return number
