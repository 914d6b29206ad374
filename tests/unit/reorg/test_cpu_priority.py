"""``lower_cpu_priority`` where the system forbids it: the sidecar serves on at the priority it has, saying so."""

from __future__ import annotations

import logging
import os

import pytest

from knittrans.reorg import cli


def test_a_refused_niceness_is_logged_and_the_sidecar_goes_on(monkeypatch, caplog) -> None:
    def refuse(*_: int) -> None:
        raise PermissionError("operation not permitted")

    monkeypatch.setattr(os, "setpriority", refuse)
    with caplog.at_level(logging.WARNING, logger=cli.__name__):
        cli.lower_cpu_priority(19)
    assert "cannot set CPU niceness 19" in caplog.text


@pytest.mark.skipif(not os.path.isdir(cli.TASKS), reason="needs /proc/self/task (Linux)")
def test_a_niceness_already_higher_is_kept(monkeypatch) -> None:
    calls: list[tuple[int, int, int]] = []
    monkeypatch.setattr(os, "getpriority", lambda *_: 15)
    monkeypatch.setattr(os, "setpriority", lambda *args: calls.append(args))
    cli.lower_cpu_priority(10)
    assert calls == []
