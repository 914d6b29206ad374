"""The one retry policy (knittrans.retry): back-off that grows to its cap and never sleeps past its deadline."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import subprocess
import sys

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from knittrans.errors import InvalidArgument, Unavailable
from knittrans.retry import Backoff, RetryPolicy, retry_call, retry_call_async

seconds = st.floats(min_value=1e-4, max_value=5.0, allow_nan=False)


@st.composite
def policies(draw, *, jitter: bool = True) -> RetryPolicy:
    initial = draw(seconds)
    cap = initial * draw(st.floats(min_value=1.0, max_value=100.0))
    return RetryPolicy(
        initial=initial,
        cap=cap,
        multiplier=draw(st.floats(min_value=1.0, max_value=4.0)),
        # At most a few hundred sleeps' worth, so that failing until the deadline stays a short loop.
        deadline=draw(st.none() | st.floats(min_value=0.0, max_value=cap * 200)),
        jitter=draw(st.floats(min_value=0.0, max_value=0.99)) if jitter else 0.0,
    )


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, delay: float) -> None:
        assert delay >= 0
        self.slept.append(delay)
        self.now += delay


@given(policies(jitter=False))
@example(RetryPolicy(initial=1.0, cap=22.0, multiplier=1.015625, deadline=None, jitter=0.0))  # found by hypothesis
def test_nominal_delays_start_at_initial_and_grow_without_passing_the_cap(policy: RetryPolicy) -> None:
    delays = list(itertools.islice(policy.delays(), 200))
    assert delays[0] == policy.initial
    assert all(a <= b for a, b in itertools.pairwise(delays))
    assert all(d <= policy.cap for d in delays)
    # Compounded 199 times, the initial delay passes the cap (with room for rounding): the last delay is the cap.
    # (A multiplier just above 1.01 may not get there in 200 delays: 1.015625 from 1 s stays below a 22 s cap.)
    if policy.initial * policy.multiplier ** 199 >= policy.cap * (1 + 1e-9):
        assert delays[-1] == policy.cap


@given(policies(), st.lists(st.floats(min_value=0.0, max_value=3.0), max_size=60), st.randoms(use_true_random=False))
def test_sleeps_are_jittered_below_the_nominal_delay_and_never_pass_the_deadline(
    policy: RetryPolicy, attempt_seconds: list[float], rng
) -> None:
    """Attempts take arbitrary time; whatever they take, the sleeps add up to no more than the deadline, each
    sleep lies within its jitter band (or is cut short by the deadline), and once the deadline has passed the
    back-off says stop, for good."""
    clock = FakeClock()
    backoff = Backoff(policy, clock=clock, uniform=rng.random)
    started = clock.now
    nominal = policy.delays()
    for spent in attempt_seconds:
        clock.now += spent  # the failed attempt
        expected = next(nominal)
        delay = backoff.next_delay()
        if delay is None:
            assert policy.deadline is not None and clock.now >= started + policy.deadline
            assert backoff.next_delay() is None and backoff.sleep(clock.sleep) is False
            break
        assert delay <= expected
        if policy.deadline is None or clock.now + expected * (1 - policy.jitter) < started + policy.deadline:
            assert delay >= expected * (1 - policy.jitter) * (1 - 1e-9)
        clock.sleep(delay)
    if policy.deadline is not None:
        # The back-off computes the time left from absolute clock readings, so the sleeps may exceed the deadline
        # by the clock's rounding (an ulp of its reading), never by more.
        assert sum(clock.slept) <= policy.deadline * (1 + 1e-9) + 4 * math.ulp(clock.now)
        assert clock.now - started <= policy.deadline + sum(attempt_seconds) * (1 + 1e-9) + 4 * math.ulp(clock.now)


@settings(deadline=None)
@given(policies(jitter=False).filter(lambda p: p.deadline is not None))
def test_failing_forever_stops_at_the_deadline(policy: RetryPolicy) -> None:
    """Instant attempts that always fail: the sleeps fill the deadline exactly, then the retries stop."""
    clock = FakeClock()
    attempts = 0

    def attempt() -> None:
        nonlocal attempts
        attempts += 1
        raise Unavailable("down")

    with pytest.raises(Unavailable):
        retry_call(attempt, policy=policy, retryable=lambda e: isinstance(e, Unavailable), sleep=clock.sleep,
                   clock=clock)
    assert sum(clock.slept) == pytest.approx(policy.deadline, rel=1e-12, abs=1e-9)
    assert attempts == len(clock.slept) + 1


def test_the_deadline_counts_from_the_first_failure_after_a_reset_when_not_started_now() -> None:
    clock = FakeClock()
    backoff = Backoff(RetryPolicy(initial=1.0, cap=1.0, deadline=2.0), start_now=False, clock=clock)
    clock.now += 100.0  # a long healthy stretch before the first failure
    assert backoff.next_delay() == 1.0
    clock.now += 2.0
    assert backoff.next_delay() is None
    backoff.reset()
    clock.now += 50.0
    assert backoff.failing_for() == 0.0
    assert backoff.next_delay() == 1.0


def test_a_call_that_succeeds_after_failures_returns_its_value_and_other_errors_are_not_retried() -> None:
    clock = FakeClock()
    outcomes = iter([Unavailable("down"), Unavailable("down"), "answer"])

    def attempt() -> str:
        outcome = next(outcomes)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    policy = RetryPolicy(initial=0.1, cap=1.0, deadline=10.0)
    retryable = lambda e: isinstance(e, Unavailable)  # noqa: E731
    assert retry_call(attempt, policy=policy, retryable=retryable, sleep=clock.sleep, clock=clock) == "answer"
    assert clock.slept == [0.1, 0.2]

    def invalid() -> None:
        raise InvalidArgument("bad", field="x")

    with pytest.raises(InvalidArgument):
        retry_call(invalid, policy=policy, retryable=retryable, sleep=clock.sleep, clock=clock)
    assert clock.slept == [0.1, 0.2]


def test_the_async_helper_retries_until_success_and_reports_each_retry() -> None:
    failures = [Unavailable("down"), Unavailable("again")]
    heard: list[BaseException] = []

    async def attempt() -> str:
        if failures:
            raise failures.pop(0)
        return "answer"

    policy = RetryPolicy(initial=0.001, cap=0.002, deadline=None)
    answer = asyncio.run(retry_call_async(attempt, policy=policy, retryable=lambda e: isinstance(e, Unavailable),
                                          on_retry=heard.append))
    assert answer == "answer"
    assert [str(e) for e in heard] == ["down", "again"]


def test_the_async_helper_gives_up_with_the_last_error_at_the_deadline() -> None:
    attempts = 0

    async def attempt() -> None:
        nonlocal attempts
        attempts += 1
        raise Unavailable(f"attempt {attempts}")

    policy = RetryPolicy(initial=0.001, cap=0.005, deadline=0.05)
    with pytest.raises(Unavailable) as failure:
        asyncio.run(retry_call_async(attempt, policy=policy, retryable=lambda e: isinstance(e, Unavailable)))
    assert str(failure.value) == f"attempt {attempts}" and attempts >= 2


@pytest.mark.parametrize("bad", [dict(initial=0.0, cap=1.0), dict(initial=1.0, cap=0.5),
                                 dict(initial=1.0, cap=1.0, multiplier=0.5), dict(initial=1.0, cap=1.0, deadline=-1),
                                 dict(initial=1.0, cap=1.0, jitter=1.0)])
def test_a_policy_that_makes_no_sense_is_refused(bad: dict) -> None:
    with pytest.raises(InvalidArgument):
        RetryPolicy(**bad)


def test_the_retry_module_loads_no_grpc() -> None:
    """The store and the trainer use it; it must not drag the RPC stack in."""
    probe = ("import json, sys; import knittrans.retry; "
             "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('grpc', 'google'))))")
    loaded = json.loads(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                                       check=True).stdout)
    assert loaded == []
