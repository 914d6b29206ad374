"""Read-only mappings of unit files, kept open between reads of the same unit.

Mapping a 4 MiB unit costs about as much as copying it: the kernel sets up a page-table entry per 4 KiB page
on first touch. A reader that comes back to a unit (every CP rank's chunk of a shared sidecar, a rebuilt
mini-batch, a benchmark's rounds) copies from the mapping it already has instead, at close to memcpy speed.

A cached mapping is only reused while the file under the unit's name is still the one it maps (same device,
inode, size and modification time), so a unit deleted and published again is mapped afresh. A mapping of a
deleted unit keeps its tmpfs pages alive, so the cache is bounded in bytes, drops a unit this process deletes
at once, and every ``SWEEP_EVERY`` new mappings drops the ones whose file is gone. Units are never truncated
(only unlinked), so a mapping cannot fault past its end.
"""

from __future__ import annotations

import mmap
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from knittrans.errors import StoreError
from knittrans.store.protocol import ReadTally
from knittrans.types import ByteRange

DEFAULT_BUDGET_BYTES = 256 << 20
SWEEP_EVERY = 16


@dataclass(frozen=True, kw_only=True, slots=True)
class FileIdentity:
    """What tells one published file from another under the same name."""

    device: int
    inode: int
    size: int
    modified_ns: int

    @classmethod
    def of(cls, status: os.stat_result) -> FileIdentity:
        return cls(device=status.st_dev, inode=status.st_ino, size=status.st_size, modified_ns=status.st_mtime_ns)


@dataclass(kw_only=True, slots=True)
class _Mapping:
    identity: FileIdentity
    mapping: mmap.mmap
    view: memoryview = field(init=False)

    def __post_init__(self) -> None:
        self.view = memoryview(self.mapping)

    def close(self) -> None:
        self.view.release()
        self.mapping.close()


class MappingCache:
    """Open read-only mappings by file path, least recently used first out, at most ``budget_bytes`` mapped.

    Thread-safe: copies happen under the cache's lock, so no mapping is closed while a copy reads it (the
    copy holds the GIL anyway, so the lock serialises nothing that could have run in parallel)."""

    def __init__(self, budget_bytes: int = DEFAULT_BUDGET_BYTES) -> None:
        if budget_bytes < 0:
            raise ValueError("budget_bytes must be >= 0")
        self._budget = budget_bytes
        self._entries: OrderedDict[str, _Mapping] = OrderedDict()
        self._mapped_bytes = 0
        self._new_mappings = 0
        self._lock = threading.Lock()

    @property
    def mapped_bytes(self) -> int:
        return self._mapped_bytes

    def __len__(self) -> int:
        return len(self._entries)

    def copy(
        self, path: str, status: os.stat_result, ranges: Sequence[ByteRange], buffer: memoryview, tally: ReadTally
    ) -> int:
        """Copy ``ranges`` of the file at ``path`` (whose ``os.stat`` the caller just took) into ``buffer``."""
        identity = FileIdentity.of(status)
        with self._lock:
            entry = self._entries.get(path)
            if entry is not None and entry.identity == identity:
                self._entries.move_to_end(path)
                return _copy_ranges(entry.view, ranges, buffer, tally)
            if entry is not None:
                self._drop(path)
            entry = _map(path)
            if entry.identity.size > self._budget:  # too large to keep: a one-shot mapping
                try:
                    return _copy_ranges(entry.view, ranges, buffer, tally)
                finally:
                    entry.close()
            self._keep(path, entry)
            return _copy_ranges(entry.view, ranges, buffer, tally)

    def forget(self, path: str) -> None:
        with self._lock:
            if path in self._entries:
                self._drop(path)

    def close(self) -> None:
        with self._lock:
            for path in list(self._entries):
                self._drop(path)

    def _keep(self, path: str, entry: _Mapping) -> None:
        self._new_mappings += 1
        if self._new_mappings % SWEEP_EVERY == 0:
            self._drop_deleted()
        self._entries[path] = entry
        self._mapped_bytes += entry.identity.size
        self._evict_over_budget()

    def _evict_over_budget(self) -> None:
        while self._mapped_bytes > self._budget and self._entries:
            self._drop(next(iter(self._entries)))

    def _drop_deleted(self) -> None:
        for path, entry in list(self._entries.items()):
            try:
                current = FileIdentity.of(os.stat(path))
            except FileNotFoundError:
                current = None
            if current != entry.identity:
                self._drop(path)

    def _drop(self, path: str) -> None:
        entry = self._entries.pop(path)
        self._mapped_bytes -= entry.identity.size
        entry.close()


def _map(path: str) -> _Mapping:
    fd = os.open(path, os.O_RDONLY)
    try:
        # The identity of what was opened, which may be newer than the caller's stat: the entry maps it.
        identity = FileIdentity.of(os.fstat(fd))
        return _Mapping(identity=identity, mapping=mmap.mmap(fd, identity.size, prot=mmap.PROT_READ))
    finally:
        os.close(fd)  # the mapping keeps the file alive


def _copy_ranges(source: memoryview, ranges: Sequence[ByteRange], buffer: memoryview, tally: ReadTally) -> int:
    if any(byte_range.end > source.nbytes for byte_range in ranges):
        # Only when the unit was deleted and published again, shorter, between the caller's stat and the open.
        raise StoreError("the unit changed while it was being read")
    destination = 0
    for byte_range in ranges:
        buffer[destination : destination + byte_range.length] = source[byte_range.offset : byte_range.end]
        tally.moved(byte_range.length)
        destination += byte_range.length
    return destination
