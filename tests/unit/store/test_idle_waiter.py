"""IdleWaiter: calls run on a SCHED_IDLE thread while the caller sleeps."""

import os
import signal
import threading
import time

import pytest

from knittrans.store.idle_waiter import IdleWaiter


@pytest.fixture
def waiter():
    waiter = IdleWaiter("test-idle")
    yield waiter
    waiter.close()


def test_calls_run_on_another_thread_at_the_idle_policy(waiter):
    policy, thread = waiter.run(lambda: (os.sched_getscheduler(0), threading.get_ident()))
    assert policy == os.SCHED_IDLE
    assert thread != threading.get_ident()
    assert os.sched_getscheduler(0) != os.SCHED_IDLE  # the caller's own policy is left alone


def test_arguments_and_results_pass_through_and_errors_reach_the_caller(waiter):
    assert waiter.run(divmod, 17, 5) == (3, 2)
    with pytest.raises(ZeroDivisionError):
        waiter.run(divmod, 1, 0)
    assert waiter.run(sum, [1, 2, 3]) == 6  # the thread survives a failed call


def test_the_caller_sleeps_while_its_call_spins(waiter):
    def spin(seconds: float) -> float:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass
        return seconds

    started = time.thread_time()
    assert waiter.run(spin, 0.3) == 0.3
    assert time.thread_time() - started < 0.1


class Interrupted(Exception):
    pass


def test_an_interrupt_in_the_caller_waits_for_the_call_to_end(waiter):
    """A signal handler's exception must not hand the caller back the buffers a transfer still writes into."""
    finished = threading.Event()

    def long_call() -> None:
        time.sleep(0.4)
        finished.set()

    def interrupt(signum, frame):
        raise Interrupted

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        with pytest.raises(Interrupted):
            waiter.run(long_call)
        assert finished.is_set()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
