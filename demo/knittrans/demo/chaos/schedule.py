"""The chaos schedule: which process to hit, how, and when; a pure function of the seed and the settings.

A schedule is a sequence of faults, each after a pause drawn from an exponential distribution (a Poisson process
of mean ``mean_interval_seconds``). Each fault names a target kind, an action (kill -9, or SIGSTOP for a while
then SIGCONT) and a ``pick``: a draw that selects one of the kind's live instances when the fault fires (the
injector takes ``pick`` modulo their number). The same seed and settings give the same schedule, so a failing
seed reproduces the same sequence of faults; when exactly a fault lands in the job is up to the machine.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum

from knittrans.errors import InvalidArgument


class FaultTarget(StrEnum):
    ADMISSION = "admission"
    REDIS = "redis"
    SIDECAR = "sidecar"
    TRAINER = "trainer"
    ROLLOUT = "rollout"
    MOONCAKE_STORE = "mooncake-store"


class FaultAction(StrEnum):
    KILL = "kill"  # SIGKILL; the supervisor restarts the process
    STOP = "stop"  # SIGSTOP, then SIGCONT after stop_seconds


ALL_TARGETS: tuple[FaultTarget, ...] = tuple(FaultTarget)
PICK_RANGE = 1 << 16


@dataclass(frozen=True, kw_only=True)
class ChaosSettings:
    """What the chaos run injects (``knittrans demo --chaos SEED --chaos-targets ...``)."""

    seed: int | None = None  # None: no chaos
    targets: tuple[FaultTarget, ...] = ALL_TARGETS
    mean_interval_seconds: float = 2.0  # mean pause between faults
    kill_probability: float = 0.5  # the rest are stalls
    # Stalls stay below the clients' time-outs (the sidecar's 15 s, Redis' 10 s): a longer one is a failure with
    # its own typed outcome, not a delay the job is meant to ride out.
    min_stop_seconds: float = 0.2
    max_stop_seconds: float = 3.0
    quiet_seconds: float = 1.0  # after the stack is up, before the first fault

    def __post_init__(self) -> None:
        if not self.targets:
            raise InvalidArgument("must name at least one target", field="targets")
        if len(set(self.targets)) != len(self.targets):
            raise InvalidArgument("names a target twice", field="targets")
        if self.mean_interval_seconds <= 0:
            raise InvalidArgument("must be positive", field="mean_interval_seconds")
        if not 0 <= self.kill_probability <= 1:
            raise InvalidArgument("must be between 0 and 1", field="kill_probability")
        if not 0 < self.min_stop_seconds <= self.max_stop_seconds:
            raise InvalidArgument("needs 0 < min_stop_seconds <= max_stop_seconds", field="max_stop_seconds")
        if self.quiet_seconds < 0:
            raise InvalidArgument("must not be negative", field="quiet_seconds")

    @property
    def enabled(self) -> bool:
        return self.seed is not None


@dataclass(frozen=True, kw_only=True)
class Fault:
    """One fault: after ``delay_seconds`` (from the previous fault's end), hit instance ``pick`` of ``target``."""

    index: int
    delay_seconds: float
    target: FaultTarget
    action: FaultAction
    pick: int
    stop_seconds: float = 0.0  # STOP only

    def __post_init__(self) -> None:
        if self.delay_seconds < 0:
            raise InvalidArgument("must not be negative", field="delay_seconds")
        if not 0 <= self.pick < PICK_RANGE:
            raise InvalidArgument(f"must be in [0, {PICK_RANGE})", field="pick")
        if (self.action is FaultAction.STOP) != (self.stop_seconds > 0):
            raise InvalidArgument("a stop, and only a stop, lasts a positive time", field="stop_seconds")


def parse_targets(text: str) -> tuple[FaultTarget, ...]:
    """``admission,redis,...`` (or ``all``) as targets, in the order given."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if names == ["all"]:
        return ALL_TARGETS
    try:
        return tuple(FaultTarget(name) for name in names)
    except ValueError:
        known = ", ".join(t.value for t in FaultTarget)
        raise InvalidArgument(f"unknown target in {text!r}; known: {known} (or all)", field="chaos_targets") from None


def fault_schedule(settings: ChaosSettings, count: int) -> tuple[Fault, ...]:
    """The first ``count`` faults of the seed's schedule; a longer schedule extends a shorter one."""
    if count < 0:
        raise InvalidArgument("must not be negative", field="count")
    return tuple(itertools.islice(faults_of(settings), count))


def faults_of(settings: ChaosSettings) -> Iterator[Fault]:
    """The seed's schedule, without end (none without a seed)."""
    if settings.seed is None:
        return
    rng = random.Random(settings.seed)
    for index in itertools.count():
        # Draw every value for every fault, so that the targets chosen never shift the other draws.
        delay = rng.expovariate(1.0 / settings.mean_interval_seconds)
        target = settings.targets[rng.randrange(len(settings.targets))]
        kill = rng.random() < settings.kill_probability
        pick = rng.randrange(PICK_RANGE)
        stop = rng.uniform(settings.min_stop_seconds, settings.max_stop_seconds)
        yield Fault(
            index=index, delay_seconds=(settings.quiet_seconds if index == 0 else 0.0) + delay, target=target,
            action=FaultAction.KILL if kill else FaultAction.STOP, pick=pick, stop_seconds=0.0 if kill else stop,
        )
