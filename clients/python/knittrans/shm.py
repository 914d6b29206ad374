"""Named POSIX shared-memory segments shared by a reorg sidecar (owner) and its trainer ranks (attachers).

Python 3.11's ``multiprocessing.resource_tracker`` registers every segment a process creates *or attaches
to*, and unlinks them all when that process exits; a trainer rank that merely read a micro-batch would
delete the sidecar's segment. Both sides therefore unregister at once: the owner removes its segments
itself (on close, SIGTERM, and at the next start after a crash, by name prefix).
"""

from __future__ import annotations

import logging
import os
import re
from multiprocessing import resource_tracker, shared_memory
from pathlib import Path

logger = logging.getLogger(__name__)

SHM_DIR = Path("/dev/shm")
SEGMENT_MODE = 0o600
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")
MAX_NAME = 200


def segment_prefix(job: str, owner: str) -> str:
    """Every segment of one owner starts with this, so a restarted owner can find its predecessor's."""
    return f"knittrans-{_UNSAFE.sub('_', job)}-{_UNSAFE.sub('_', owner)}-"[:MAX_NAME]


def _untrack(segment: shared_memory.SharedMemory) -> None:
    resource_tracker.unregister(segment._name, "shared_memory")  # type: ignore[attr-defined]


class OwnedSegment:
    """A segment this process created and will unlink."""

    def __init__(self, name: str, size: int) -> None:
        self._segment = shared_memory.SharedMemory(name=name, create=True, size=max(size, 1))
        _untrack(self._segment)
        os.fchmod(self._segment._fd, SEGMENT_MODE)  # type: ignore[attr-defined]
        self.name = name
        self.size = size

    @property
    def buf(self) -> memoryview:
        buffer = self._segment.buf
        assert buffer is not None
        return buffer

    def unlink(self) -> None:
        try:
            self._segment.close()
        except BufferError:
            # A caller still holds a view; the mapping goes away with the process, the name goes now.
            logger.debug("segment %s still has exported views at unlink", self.name)
        try:
            self._segment.unlink()
        except FileNotFoundError:
            pass


class AttachedSegment:
    """A segment another process owns; closing it never unlinks it."""

    def __init__(self, name: str) -> None:
        self._segment = shared_memory.SharedMemory(name=name, create=False)
        _untrack(self._segment)
        self.name = name

    @property
    def buf(self) -> memoryview:
        buffer = self._segment.buf
        assert buffer is not None
        return buffer

    def close(self) -> None:
        try:
            self._segment.close()
        except BufferError:
            logger.debug("segment %s still has exported views at close", self.name)


def remove_segments(prefix: str) -> list[str]:
    """Unlink every segment whose name starts with ``prefix`` (a crashed predecessor's); returns the names."""
    removed = []
    if not SHM_DIR.is_dir():
        return removed
    for entry in SHM_DIR.iterdir():
        if entry.name.startswith(prefix):
            try:
                entry.unlink()
                removed.append(entry.name)
            except FileNotFoundError:
                pass
    if removed:
        logger.info("removed %d stale shared-memory segments with prefix %s", len(removed), prefix)
    return removed


def list_segments(prefix: str) -> list[str]:
    if not SHM_DIR.is_dir():
        return []
    return sorted(entry.name for entry in SHM_DIR.iterdir() if entry.name.startswith(prefix))
