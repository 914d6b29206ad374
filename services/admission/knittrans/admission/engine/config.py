"""The admission engine's configuration: policy, starvation handling and the validated :class:`EngineConfig`."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType

from knittrans.errors import InvalidArgument
from knittrans.types import AdmissionUnit, SourceName, check_id

# Used by a bare ``relax`` or ``fail``: a quota that has blocked admission this long is starving.
DEFAULT_STARVATION_SECONDS = 600.0

# Schedules and ratios are user-written decimals; this absorbs their binary rounding.
RATIO_TOLERANCE = 1e-9


class AdmissionPolicy(StrEnum):
    """The admission policies of DESIGN.md §3.7; all run on the same engine."""

    TRAIN_BATCH = "train-batch"  # every predicate at its final target before the first mini-batch
    LINEAR = "linear"  # α = M_t/τ₀ for every predicate, each mini-batch mirrors the final composition
    STREAM = "stream"  # admit on completion, no quotas, no guard (StreamRL, AsyncFlow)
    NO_GUARD = "no-guard"  # configured (relaxed) schedules, no feasibility guard
    KNITTRANS = "knittrans"  # configured (relaxed) schedules plus feasibility guards

    @classmethod
    def parse(cls, value: str, field_name: str = "policy") -> AdmissionPolicy:
        try:
            return cls(value)
        except ValueError:
            choices = ", ".join(p.value for p in cls)
            raise InvalidArgument(f"unknown policy {value!r}; expected one of {choices}", field=field_name) from None


class StarvationAction(StrEnum):
    WAIT = "wait"  # keep waiting; the blocking reason and its duration stay visible
    RELAX = "relax"  # waive the quotas for the rest of the train batch
    FAIL = "fail"  # raise StarvationError


_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(s|m|h)?\s*$")
_DURATION_UNITS = {None: 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(value: str | float, field_name: str) -> float:
    """Seconds from a number or a string such as ``90``, ``90s``, ``10m`` or ``1.5h``."""
    if isinstance(value, bool):
        raise InvalidArgument(f"expected a duration, got {value!r}", field=field_name)
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value))
        if not match:
            raise InvalidArgument(f"expected a duration such as 600, 90s, 10m or 1h, got {value!r}", field=field_name)
        seconds = float(match.group(1)) * _DURATION_UNITS[match.group(2)]
    if not math.isfinite(seconds) or seconds < 0:
        raise InvalidArgument(f"must be a finite non-negative duration, got {value!r}", field=field_name)
    return seconds


@dataclass(frozen=True, kw_only=True)
class OnStarvation:
    """What the engine does once a quota (source, completion or feasibility) has blocked it for ``after_seconds``.

    Written in a config either as a mapping (``{action: relax, after_seconds: 600}``) or as one of the strings
    ``wait``, ``relax_after=<duration>``, ``fail_after=<duration>``, ``relax`` or ``fail`` (the last two after
    :data:`DEFAULT_STARVATION_SECONDS`).
    """

    action: StarvationAction = StarvationAction.WAIT
    after_seconds: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.action, StarvationAction):
            try:
                object.__setattr__(self, "action", StarvationAction(self.action))
            except ValueError:
                raise InvalidArgument(
                    f"unknown action {self.action!r}; expected wait, relax or fail", field="action"
                ) from None
        object.__setattr__(self, "after_seconds", parse_duration(self.after_seconds, "after_seconds"))

    @classmethod
    def parse(cls, text: str, field_name: str = "on_starvation") -> OnStarvation:
        value = text.strip()
        if value == "wait":
            return cls()
        if value in ("relax", "fail"):
            return cls(action=StarvationAction(value), after_seconds=DEFAULT_STARVATION_SECONDS)
        name, sep, duration = value.partition("=")
        actions = {"relax_after": StarvationAction.RELAX, "fail_after": StarvationAction.FAIL}
        if not sep or name.strip() not in actions:
            raise InvalidArgument(
                f"expected wait, relax, fail, relax_after=<duration> or fail_after=<duration>, got {text!r}",
                field=field_name,
            )
        return cls(action=actions[name.strip()], after_seconds=parse_duration(duration, field_name))

    def __str__(self) -> str:
        if self.action is StarvationAction.WAIT:
            return "wait"
        return f"{self.action.value}_after={self.after_seconds:g}"


def _check_int(value: object, field_name: str, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise InvalidArgument(f"must be an integer of at least {minimum}, got {value!r}", field=field_name)


def check_schedule(schedule: tuple[float, ...], length: int, field_name: str) -> tuple[float, ...]:
    """An α schedule: ``length`` values in [0, 1], non-decreasing, ending at 1 (DESIGN.md §3.2)."""
    if isinstance(schedule, (str, bytes)) or not isinstance(schedule, (list, tuple)):
        raise InvalidArgument(f"expected a list of {length} numbers, got {schedule!r}", field=field_name)
    values = tuple(schedule)
    if len(values) != length:
        raise InvalidArgument(
            f"has {len(values)} values but there are {length} mini-batches (num_minibatches)", field=field_name
        )
    previous = 0.0
    for index, alpha in enumerate(values):
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
            raise InvalidArgument(f"value {alpha!r} at index {index} is not a number", field=field_name)
        if not -RATIO_TOLERANCE <= alpha <= 1 + RATIO_TOLERANCE:
            raise InvalidArgument(f"value {alpha} at index {index} is outside [0, 1]", field=field_name)
        if alpha < previous - RATIO_TOLERANCE:
            raise InvalidArgument(
                f"must be non-decreasing, but {alpha} at index {index} follows {previous}", field=field_name
            )
        previous = alpha
    if abs(values[-1] - 1.0) > RATIO_TOLERANCE:
        raise InvalidArgument(f"must end at 1, ends at {values[-1]}", field=field_name)
    return (*(min(1.0, max(0.0, float(a))) for a in values[:-1]), 1.0)


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """Everything the admission engine needs; counts are in admission units (trajectories, or groups).

    ``sources`` maps each data source, in priority order, to the minimum share ``r_i`` of every train batch;
    the shares may sum to less than 1 but not more. A schedule left unset takes its policy's default: the
    size schedule is linear, the source schedule is relaxed (0 for the first half of the mini-batches, then
    linear up to 1, e.g. (0, 0, 0.5, 1) for n = 4), and the completion schedule follows the source schedule.
    The ``train-batch``, ``linear`` and ``stream`` policies override the schedules with their own.

    ``max_batches_ahead`` bounds how far admission runs ahead of training: train batch k (trained at
    version v₀ + k) is admitted only while the policy version is at least v₀ + k − max_batches_ahead.
    ``None`` removes the bound.
    """

    train_batch_size: int
    num_minibatches: int
    sources: Mapping[SourceName, float]
    source_schedule: tuple[float, ...] | None = None
    size_schedule: tuple[float, ...] | None = None
    completion_quota: float | None = None
    completion_schedule: tuple[float, ...] | None = None
    staleness_bound: int | None = None
    admission_unit: AdmissionUnit = AdmissionUnit.TRAJECTORY
    group_size: int | None = None
    on_starvation: OnStarvation | str = "wait"
    policy: AdmissionPolicy = AdmissionPolicy.KNITTRANS
    max_batches_ahead: int | None = 1

    def __post_init__(self) -> None:
        _check_int(self.train_batch_size, "train_batch_size", 1)
        _check_int(self.num_minibatches, "num_minibatches", 1)
        if self.num_minibatches > self.train_batch_size:
            raise InvalidArgument(
                f"{self.num_minibatches} mini-batches do not fit in a train batch of {self.train_batch_size}",
                field="num_minibatches",
            )
        self._check_sources()
        for name in ("source_schedule", "size_schedule", "completion_schedule"):
            schedule = getattr(self, name)
            if schedule is not None:
                object.__setattr__(self, name, check_schedule(schedule, self.num_minibatches, name))
        if self.completion_quota is not None:
            quota = self.completion_quota
            if isinstance(quota, bool) or not isinstance(quota, (int, float)) or not 0 < quota <= 1:
                raise InvalidArgument(f"must be a fraction in (0, 1], got {quota!r}", field="completion_quota")
            object.__setattr__(self, "completion_quota", float(quota))
        if self.staleness_bound is not None:
            _check_int(self.staleness_bound, "staleness_bound", 0)
        if not isinstance(self.admission_unit, AdmissionUnit):
            try:
                object.__setattr__(self, "admission_unit", AdmissionUnit(self.admission_unit))
            except ValueError:
                raise InvalidArgument(
                    f"must be trajectory or group, got {self.admission_unit!r}", field="admission_unit"
                ) from None
        if self.group_size is not None:
            _check_int(self.group_size, "group_size", 1)
        if isinstance(self.on_starvation, str):
            object.__setattr__(self, "on_starvation", OnStarvation.parse(self.on_starvation))
        elif not isinstance(self.on_starvation, OnStarvation):
            raise InvalidArgument(f"expected a string or a mapping, got {self.on_starvation!r}", field="on_starvation")
        if not isinstance(self.policy, AdmissionPolicy):
            object.__setattr__(self, "policy", AdmissionPolicy.parse(str(self.policy)))
        if self.max_batches_ahead is not None:
            _check_int(self.max_batches_ahead, "max_batches_ahead", 0)

    def _check_sources(self) -> None:
        if isinstance(self.sources, (str, bytes)) or not isinstance(self.sources, Mapping) or not self.sources:
            raise InvalidArgument("must map at least one source name to its minimum share", field="sources")
        ratios: dict[SourceName, float] = {}
        for name, ratio in self.sources.items():
            check_id(name, f"sources.{name}")
            if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 <= ratio <= 1:
                raise InvalidArgument(f"must be a share in [0, 1], got {ratio!r}", field=f"sources.{name}")
            ratios[SourceName(name)] = float(ratio)
        total = math.fsum(ratios.values())
        if total > 1 + RATIO_TOLERANCE:
            raise InvalidArgument(f"minimum shares sum to {total:g}, above 1", field="sources")
        object.__setattr__(self, "sources", MappingProxyType(ratios))

    @property
    def source_names(self) -> tuple[SourceName, ...]:
        return tuple(self.sources)

    @property
    def starvation(self) -> OnStarvation:
        """``on_starvation`` after validation (always an :class:`OnStarvation`)."""
        assert isinstance(self.on_starvation, OnStarvation)
        return self.on_starvation
