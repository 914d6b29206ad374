"""A stop signal that comes while a driver starts a child: the child is never left outside what the driver stops.

The drivers' handlers raise the stop in the main thread (``knittrans demo``, ``knittrans up``). A SIGTERM that came
while ``knittrans demo`` started its second rollout worker once left that worker running outside the process group,
writing into the file store after the clean-up had removed it. These tests send real signals to this process.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from knittrans.launch.interruptions import raise_stop, stop_deferred
from knittrans.launch.redis import start_redis
from knittrans.stack.processes import ProcessGroup
from tests.live_processes import children_of, live_processes


class Stopped(KeyboardInterrupt):
    pass


@pytest.fixture
def sigterm_raises_through_raise_stop() -> Iterator[None]:
    previous = signal.signal(signal.SIGTERM, lambda _signum, _frame: raise_stop(Stopped()))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _sigterm_to_this_process_and_run_its_handler() -> None:
    os.kill(os.getpid(), signal.SIGTERM)
    for _ in range(100):  # the handler runs between bytecodes of the main thread, soon after the signal
        time.sleep(0.001)


def stopped_by_sigterm_after(delay: float, work: Callable[[], None]) -> bool:
    """Run ``work`` with a SIGTERM sent to this process after ``delay`` seconds; whether the stop came out of it
    (else it comes out of the wait after it)."""
    signal_timer = threading.Timer(delay, os.kill, (os.getpid(), signal.SIGTERM))
    try:
        signal_timer.start()  # in the try: a timer of no delay can fire before start() returns
        work()
        # Under load the timer can fire after the work: its handler must still run inside this try, or the stop
        # would end the test run itself.
        signal_timer.join()
        for _ in range(100):
            time.sleep(0.001)
    except Stopped:
        return True
    finally:
        signal_timer.join()
    return False


def test_a_stop_outside_any_section_is_raised_at_once(sigterm_raises_through_raise_stop: None) -> None:
    with pytest.raises(Stopped):
        _sigterm_to_this_process_and_run_its_handler()


def test_a_stop_inside_a_section_is_raised_as_the_outermost_section_ends(
    sigterm_raises_through_raise_stop: None,
) -> None:
    reached: list[str] = []
    with pytest.raises(Stopped):
        with stop_deferred():
            with stop_deferred():
                _sigterm_to_this_process_and_run_its_handler()
                reached.append("after the signal")
            reached.append("after the inner section")
    assert reached == ["after the signal", "after the inner section"]
    with stop_deferred():  # nothing is left held back to be raised by a later section
        reached.append("a later section")
    assert reached[-1] == "a later section"


def test_a_stop_held_back_replaces_the_error_that_ended_the_section(sigterm_raises_through_raise_stop: None) -> None:
    with pytest.raises(Stopped) as stopped:
        with stop_deferred():
            _sigterm_to_this_process_and_run_its_handler()
            raise ValueError("the section failed too")
    assert isinstance(stopped.value.__context__, ValueError)


def test_a_section_in_another_thread_holds_back_nothing(sigterm_raises_through_raise_stop: None) -> None:
    inside = threading.Event()
    leave = threading.Event()

    def section_elsewhere() -> None:
        with stop_deferred():
            inside.set()
            leave.wait(10)

    thread = threading.Thread(target=section_elsewhere)
    thread.start()
    try:
        assert inside.wait(10)
        with pytest.raises(Stopped):
            _sigterm_to_this_process_and_run_its_handler()
    finally:
        leave.set()
        thread.join()


def test_a_stop_while_the_group_starts_children_leaves_none_outside_it(
    tmp_path: Path, sigterm_raises_through_raise_stop: None,
) -> None:
    """SIGTERM at random moments of three starts (before the fix most interrupted starts left a child behind:
    ``subprocess.Popen`` waits for the child's exec after the fork, and a stop raised there loses the child)."""
    marker = f"{3600 + random.random():.6f}"  # sleep's argument: names this test's children on their command lines
    rng = random.Random(7)
    interrupted = 0
    for attempt in range(30):
        group = ProcessGroup(tmp_path / f"logs-{attempt}", stop_with_parent=True)

        def start_three(group: ProcessGroup = group) -> None:
            for index in range(3):
                group.start(f"sleeper-{index}", ["sleep", marker], service=False)

        try:
            interrupted += stopped_by_sigterm_after(rng.uniform(0.0, 0.004), start_three)
        finally:
            ours = {pid for pid, command in children_of(os.getpid()).items() if marker in command}
            recorded = {managed.process.pid for managed in group.processes}
            group.stop_all()
            for pid in ours - recorded:  # so that a failure leaves nothing running
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
        assert ours <= recorded, f"attempt {attempt}: children {sorted(ours - recorded)} outside the group"
    assert interrupted == 30
    assert not [pid for pid, command in children_of(os.getpid()).items() if marker in command]


def test_a_stop_while_redis_starts_leaves_no_server_running(
    tmp_path: Path, sigterm_raises_through_raise_stop: None,
) -> None:
    """A launcher holds its server only until it returns it: stopped before, it stops the server itself (also
    when the stop was held back through the fork and comes out at the section's end)."""
    rng = random.Random(11)
    stopped = 0
    for attempt in range(12):
        directory = tmp_path / f"redis-{attempt}"
        servers: list = []
        try:
            stopped += stopped_by_sigterm_after(
                rng.uniform(0.0, 0.03), lambda d=directory, held=servers: held.append(start_redis(d)))
        finally:
            for server in servers:
                server.stop()
        left = {pid: command for pid, command in live_processes().items() if str(directory) in command}
        for pid in left:  # so that a failure leaves nothing running
            os.kill(pid, signal.SIGKILL)
        assert not left, f"attempt {attempt}: {list(left.values())}"
    assert stopped == 12
