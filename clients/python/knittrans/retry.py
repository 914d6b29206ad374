"""One retry policy: exponential back-off, optionally jittered, that never sleeps past a deadline.

:class:`RetryPolicy` says how long to wait between attempts; :class:`Backoff` applies it against a clock, for
callers that loop themselves (a stream that reconnects, a store that waits for space); :func:`retry_call` and
:func:`retry_call_async` retry one call. No grpc here: the store and the trainer use it too.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from knittrans.errors import InvalidArgument

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """Delays ``initial``, ``initial * multiplier``, ... up to ``cap`` seconds, each shortened by up to
    ``jitter`` of itself (so that clients that failed together do not retry together), for at most
    ``deadline`` seconds of failing (None: for ever)."""

    initial: float
    cap: float
    multiplier: float = 2.0
    deadline: float | None = None
    jitter: float = 0.0

    def __post_init__(self) -> None:
        if not self.initial > 0:
            raise InvalidArgument(f"must be positive, got {self.initial}", field="initial")
        if not self.cap >= self.initial:
            raise InvalidArgument(f"must be at least initial ({self.initial}), got {self.cap}", field="cap")
        if not self.multiplier >= 1:
            raise InvalidArgument(f"must be at least 1, got {self.multiplier}", field="multiplier")
        if self.deadline is not None and not self.deadline >= 0:
            raise InvalidArgument(f"must not be negative, got {self.deadline}", field="deadline")
        if not 0 <= self.jitter < 1:
            raise InvalidArgument(f"must be in [0, 1), got {self.jitter}", field="jitter")

    def delays(self) -> Iterator[float]:
        """The nominal delays (before jitter and the deadline), without end."""
        delay = self.initial
        while True:
            yield delay
            delay = min(delay * self.multiplier, self.cap)


class Backoff:
    """One run of failures under a :class:`RetryPolicy`: :meth:`next_delay` says how long to sleep before the
    next attempt, or None once the deadline has passed; :meth:`reset` after a success.

    The deadline counts from construction (``start_now``) or else from the first failure after construction
    or the last :meth:`reset`.
    """

    def __init__(
        self,
        policy: RetryPolicy,
        *,
        start_now: bool = True,
        clock: Callable[[], float] = time.monotonic,
        uniform: Callable[[], float] = random.random,
    ) -> None:
        self.policy = policy
        self._clock = clock
        self._uniform = uniform
        self._delays = policy.delays()
        self._since: float | None = clock() if start_now else None

    def reset(self) -> None:
        self._delays = self.policy.delays()
        self._since = None

    def failing_for(self) -> float:
        """Seconds since the deadline's count began (0 before the first failure)."""
        return 0.0 if self._since is None else self._clock() - self._since

    def next_delay(self) -> float | None:
        now = self._clock()
        if self._since is None:
            self._since = now
        delay = next(self._delays) * (1.0 - self.policy.jitter * self._uniform())
        if self.policy.deadline is None:
            return delay
        remaining = self._since + self.policy.deadline - now
        return min(delay, remaining) if remaining > 0 else None

    def sleep(self, sleep: Callable[[float], None] = time.sleep) -> bool:
        """Sleep before the next attempt; False (without sleeping) once the deadline has passed."""
        delay = self.next_delay()
        if delay is None:
            return False
        sleep(delay)
        return True

    async def sleep_async(self) -> bool:
        delay = self.next_delay()
        if delay is None:
            return False
        await asyncio.sleep(delay)
        return True


def retry_call(
    attempt: Callable[[], T],
    *,
    policy: RetryPolicy,
    retryable: Callable[[BaseException], bool],
    on_retry: Callable[[BaseException], None] = lambda error: None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """``attempt()``, again after each retryable failure until the policy's deadline (counted from the first
    attempt); the last failure propagates. ``on_retry`` hears of each failure that will be retried."""
    backoff = Backoff(policy, clock=clock)
    while True:
        try:
            return attempt()
        except Exception as error:
            if not retryable(error):
                raise
            delay = backoff.next_delay()
            if delay is None:
                raise
            on_retry(error)
            sleep(delay)


async def retry_call_async(
    attempt: Callable[[], Awaitable[T]],
    *,
    policy: RetryPolicy,
    retryable: Callable[[BaseException], bool],
    on_retry: Callable[[BaseException], None] = lambda error: None,
) -> T:
    """The async :func:`retry_call`; ``on_retry`` hears of each failure that will be retried."""
    backoff = Backoff(policy)
    while True:
        try:
            return await attempt()
        except Exception as error:
            if not retryable(error):
                raise
            delay = backoff.next_delay()
            if delay is None:
                raise
            on_retry(error)
            await asyncio.sleep(delay)
