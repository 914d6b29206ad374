"""Named POSIX shared-memory segments shared by a reorg sidecar (owner) and its trainer ranks (attachers).

Python 3.11's ``multiprocessing.resource_tracker`` registers every segment a process creates *or attaches
to*, and unlinks them all when that process exits; a trainer rank that merely read a micro-batch would
delete the sidecar's segment. Both sides therefore unregister at once: the owner removes its segments
itself (on close, SIGTERM, and at the next start after a crash, by name prefix).
"""

from __future__ import annotations

import _posixshmem
import logging
import os
import re
import threading
from multiprocessing import resource_tracker, shared_memory
from pathlib import Path

from knittrans.errors import InvalidArgument

logger = logging.getLogger(__name__)

SHM_DIR = Path("/dev/shm")
SEGMENT_MODE = 0o600
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")
MAX_NAME = 200


def segment_prefix(job: str, owner: str) -> str:
    """Every segment of one owner starts with this, so a restarted owner can find its predecessor's.

    ``@`` is in no job name or owner: the prefix of one (job, owner) is never a prefix of another's segments (with
    ``-``, job ``a``'s prefix ``knittrans-a-backbone-dp0-cp0-`` began the segments of job ``a-backbone-dp0-cp0``).
    """
    prefix = f"knittrans-{_UNSAFE.sub('_', job)}@{_UNSAFE.sub('_', owner)}@"
    if len(prefix) > MAX_NAME:
        raise InvalidArgument(f"job and owner make a segment prefix longer than {MAX_NAME} characters", field="job")
    return prefix


def owner_lease_path(job: str, owner: str) -> Path:
    """The lock file that holds an owner's segments (see knittrans.job.FileLease): next to them, so that it
    guards exactly the shared memory the segments live in; it never starts with a segment prefix."""
    return SHM_DIR / f"{segment_prefix(job, owner)[:-1]}.lease"


# SharedMemory() registers the name with the tracker and _untrack() unregisters it; two threads attaching the same
# segment could interleave those into register, register, unregister, unregister (a KeyError in the tracker).
_TRACKER_LOCK = threading.Lock()


def _untracked(name: str, *, create: bool, size: int = 0) -> shared_memory.SharedMemory:
    with _TRACKER_LOCK:
        segment = shared_memory.SharedMemory(name=name, create=create, size=size)
        _untrack(segment)
    return segment


def _untrack(segment: shared_memory.SharedMemory) -> None:
    resource_tracker.unregister(segment._name, "shared_memory")  # type: ignore[attr-defined]


def _close(segment: shared_memory.SharedMemory, name: str) -> None:
    """Close a mapping; if views of it are still exported, leave the mapping to them (it is unmapped when
    the last view goes) instead of failing now and again, noisily, in ``SharedMemory.__del__``."""
    try:
        segment.close()
    except BufferError:
        logger.debug("segment %s still has exported views at close", name)
        segment._buf = None  # type: ignore[attr-defined]
        segment._mmap = None  # type: ignore[attr-defined]
        if segment._fd >= 0:  # type: ignore[attr-defined]
            os.close(segment._fd)  # type: ignore[attr-defined]
            segment._fd = -1  # type: ignore[attr-defined]


class OwnedSegment:
    """A segment this process created and will unlink."""

    def __init__(self, name: str, size: int) -> None:
        self._segment = _untracked(name, create=True, size=max(size, 1))
        os.fchmod(self._segment._fd, SEGMENT_MODE)  # type: ignore[attr-defined]
        self.name = name
        self.size = size

    @property
    def buf(self) -> memoryview:
        buffer = self._segment.buf
        assert buffer is not None
        return buffer

    def unlink(self) -> None:
        _close(self._segment, self.name)  # views still held keep the mapping; the name goes now
        try:
            # Not SharedMemory.unlink(): it unregisters from the resource tracker a second time, and the tracker
            # process prints a KeyError traceback for every segment.
            _posixshmem.shm_unlink(self._segment._name)  # type: ignore[attr-defined]
        except FileNotFoundError:
            pass


class AttachedSegment:
    """A segment another process owns; closing it never unlinks it."""

    def __init__(self, name: str) -> None:
        self._segment = _untracked(name, create=False)
        self.name = name

    @property
    def buf(self) -> memoryview:
        buffer = self._segment.buf
        assert buffer is not None
        return buffer

    def close(self) -> None:
        _close(self._segment, self.name)


def remove_segments(prefix: str) -> list[str]:
    """Unlink every segment whose name starts with ``prefix`` (a crashed predecessor's); returns the names."""
    removed: list[str] = []
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
