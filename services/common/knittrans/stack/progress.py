"""A status line on stderr while a local stack starts or runs."""

from __future__ import annotations

from typing import TextIO


class Progress:
    """Redrawn in place on a terminal; in a log (CI, ``make demo > log``) plain lines, one per change of what it
    is waiting for, without carriage returns or terminal escape codes."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._in_place = stream.isatty()
        self._line_open = False
        self._last_key: object = None

    def show(self, message: str, *, key: object = None) -> None:
        """Show ``message``; in a log only when ``key`` (default: the message) differs from the last one's."""
        key = message if key is None else key
        if self._in_place:
            print(f"\r\033[K{message}", end="", file=self._stream, flush=True)
            self._line_open = True
        elif key != self._last_key:
            print(message, file=self._stream, flush=True)
        self._last_key = key

    def end_line(self) -> None:
        if self._line_open:
            print(file=self._stream, flush=True)
            self._line_open = False
