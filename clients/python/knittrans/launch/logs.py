"""What a child server said last: the tail of its log, for the error that reports its failure."""

from __future__ import annotations

from collections import deque
from pathlib import Path


def log_tail(path: Path, lines: int = 20) -> str:
    """The last ``lines`` lines of ``path`` (empty when it cannot be read)."""
    try:
        with open(path, errors="replace") as handle:
            return "".join(deque(handle, maxlen=lines)).rstrip()
    except OSError:
        return ""


def failure_message(what: str, why: str, log_path: Path) -> str:
    """``could not start <what> (<why>); last lines of <log>: ...``, naming the log by its absolute path."""
    tail = log_tail(log_path)
    said = f"; last lines of {log_path}:\n{tail}" if tail else f"; its log {log_path} is empty"
    return f"could not start {what} ({why}){said}"
