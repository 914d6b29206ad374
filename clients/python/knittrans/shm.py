"""Named POSIX shared-memory segments shared by a reorg sidecar (owner) and its trainer ranks (attachers).

Not ``multiprocessing.shared_memory``: in Python 3.11 it registers every segment a process creates *or attaches
to* with the ``resource_tracker`` process, which unlinks them all when that process exits (a trainer rank that
merely read a micro-batch would delete the sidecar's segment), and each attach writes to the tracker's pipe, which
fails with ``BrokenPipeError`` once the tracker process is gone (seen in a trainer under load). Segments here are
``shm_open`` and ``mmap`` alone; the owner removes its segments itself (on close, SIGTERM, and at the next start
after a crash, by name prefix).
"""

from __future__ import annotations

import _posixshmem
import logging
import mmap
import os
import re
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


class _Mapping:
    """One process's mapping of a named segment. The descriptor is closed once mapped (``mmap`` keeps its own)."""

    def __init__(self, name: str, *, create: bool, size: int = 0) -> None:
        self._posix_name = "/" + name
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        descriptor = _posixshmem.shm_open(self._posix_name, flags, mode=SEGMENT_MODE)
        try:
            if create:
                os.fchmod(descriptor, SEGMENT_MODE)  # shm_open's mode passes through the umask
                os.ftruncate(descriptor, size)
            self._mmap: mmap.mmap | None = mmap.mmap(descriptor, os.fstat(descriptor).st_size)
        except BaseException:
            if create:
                self.unlink()
            raise
        finally:
            os.close(descriptor)
        self._buf: memoryview | None = memoryview(self._mmap)

    @property
    def buf(self) -> memoryview:
        if self._buf is None:
            raise ValueError(f"segment {self._posix_name} is closed")
        return self._buf

    def close(self) -> None:
        """Unmap; if views of the mapping are still exported, leave it to them (it is unmapped when the last view
        goes) rather than fail the caller, who is done with it."""
        buffer, mapping, self._buf, self._mmap = self._buf, self._mmap, None, None
        try:
            if buffer is not None:
                buffer.release()
            if mapping is not None:
                mapping.close()
        except BufferError:
            logger.debug("segment %s still has exported views at close", self._posix_name)

    def unlink(self) -> None:
        try:
            _posixshmem.shm_unlink(self._posix_name)
        except FileNotFoundError:
            pass


class OwnedSegment:
    """A segment this process created and will unlink."""

    def __init__(self, name: str, size: int) -> None:
        self._mapping = _Mapping(name, create=True, size=max(size, 1))
        self.name = name
        self.size = size

    @property
    def buf(self) -> memoryview:
        return self._mapping.buf

    def unlink(self) -> None:
        self._mapping.close()  # views still held keep the mapping; the name goes now
        self._mapping.unlink()


class AttachedSegment:
    """A segment another process owns; closing it never unlinks it."""

    def __init__(self, name: str) -> None:
        self._mapping = _Mapping(name, create=False)
        self.name = name

    @property
    def buf(self) -> memoryview:
        return self._mapping.buf

    def close(self) -> None:
        self._mapping.close()


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
