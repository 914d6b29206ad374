"""``lower_cpu_priority`` where the system forbids it: the process goes on at the priority it has, saying so; and
only a session leader lowers its session's group."""

from __future__ import annotations

import logging
import os

import pytest

from knittrans.serving import priority


def test_a_refused_niceness_is_logged_and_the_sidecar_goes_on(monkeypatch, caplog) -> None:
    def refuse(*_: int) -> None:
        raise PermissionError("operation not permitted")

    monkeypatch.setattr(os, "setpriority", refuse)
    with caplog.at_level(logging.WARNING, logger=priority.__name__):
        priority.lower_cpu_priority(19)
    assert "cannot set CPU niceness 19" in caplog.text


@pytest.mark.skipif(not os.path.isdir(priority.TASKS), reason="needs /proc/self/task (Linux)")
def test_a_niceness_already_higher_is_kept(monkeypatch) -> None:
    calls: list[tuple[int, int, int]] = []
    monkeypatch.setattr(os, "getpriority", lambda *_: 15)
    monkeypatch.setattr(os, "setpriority", lambda *args: calls.append(args))
    priority.lower_cpu_priority(10)
    assert calls == []


@pytest.mark.parametrize(("leads_session", "before", "after"), [(True, 0, "10"), (True, 15, "/autogroup-7 nice 15"),
                                                                 (False, 0, "/autogroup-7 nice 0")])
def test_only_a_session_leader_makes_its_session_group_nicer(monkeypatch, tmp_path, leads_session: bool,
                                                             before: int, after: str) -> None:
    """A sidecar in the trainer's session would lower the trainer's priority with its own: it leaves the group."""
    group = tmp_path / "autogroup"
    group.write_text(f"/autogroup-7 nice {before}\n")
    monkeypatch.setattr(priority, "AUTOGROUP", group)
    monkeypatch.setattr(os, "getsid", lambda _: os.getpid() if leads_session else os.getpid() + 1)
    priority.lower_session_priority(10)
    assert group.read_text().strip() == after
