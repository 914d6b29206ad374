"""The launchers start real servers from relative paths, and a server that cannot start says why in the error."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest

from knittrans.errors import FailedPrecondition
from knittrans.launch import mooncake
from knittrans.launch.redis import start_redis


def test_redis_starts_from_a_relative_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    server = start_redis(Path("demo-out/redis"))
    try:
        assert server.process.poll() is None
        assert (tmp_path / "demo-out" / "redis" / "redis.log").is_file()  # the log is where it was asked for
    finally:
        server.stop()


def test_a_redis_that_cannot_start_shows_its_last_words(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))  # bound, not listening: redis cannot bind it, and nothing answers on it
        port = taken.getsockname()[1]
        with pytest.raises(FailedPrecondition) as failure:
            start_redis(tmp_path / "redis", port=port)
    assert "Address already in use" in str(failure.value)


def test_a_mooncake_server_that_cannot_start_shows_its_last_words(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    os.mkdir("logs")
    dying = [sys.executable, "-c", "import sys; print('cannot mount the segment: no memory'); sys.exit(3)"]
    with pytest.raises(FailedPrecondition) as failure:
        mooncake._start_listening(lambda port: dying, Path("logs/master.log"), "mooncake_master", 10.0, False)
    message = str(failure.value)
    assert "cannot mount the segment: no memory" in message
    assert str(tmp_path / "logs" / "master.log") in message  # an absolute path, valid from any directory
