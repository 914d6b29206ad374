"""A dependency-free progress bar on a text stream (stderr), redrawn at most a few times a second."""

from __future__ import annotations

import time
from typing import TextIO

_WIDTH = 30
_REDRAW_SECONDS = 0.2


class ProgressBar:
    """``update(done)`` with a running count; ``close()`` ends the line. Disabled bars do nothing."""

    def __init__(self, stream: TextIO, *, total: int, label: str, enabled: bool = True) -> None:
        self._stream = stream
        self._total = max(1, total)
        self._label = label
        self._enabled = enabled
        self._started = time.monotonic()
        self._last_draw = 0.0
        self._done = 0

    def update(self, done: int) -> None:
        self._done = done
        if not self._enabled:
            return
        now = time.monotonic()
        if now - self._last_draw >= _REDRAW_SECONDS:
            self._last_draw = now
            self._draw(now)

    def close(self) -> None:
        if self._enabled:
            self._done = self._total
            self._draw(time.monotonic())
            self._stream.write("\n")
            self._stream.flush()

    def _draw(self, now: float) -> None:
        fraction = min(1.0, self._done / self._total)
        filled = int(fraction * _WIDTH)
        elapsed = max(now - self._started, 1e-9)
        rate = self._done / elapsed
        self._stream.write(
            f"\r{self._label:<12} [{'#' * filled}{'.' * (_WIDTH - filled)}] {fraction:6.1%} "
            f"{self._done}/{self._total} trajectories, {rate:,.0f}/s"
        )
        self._stream.flush()
