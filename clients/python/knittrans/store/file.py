"""The ``file`` backend: one file per unit in a directory, read by byte range.

Ranges are read with ``os.preadv``; ranges of at least ``MMAP_READ_THRESHOLD`` bytes are copied from a
read-only mapping instead, which moves large ranges about twice as fast on tmpfs, and which stays open for the
next read of the same unit (:mod:`knittrans.store.file_mappings`). Either way only the requested bytes are
copied, and the read statistics count the bytes ``preadv`` returned and the bytes copied out of mappings.

Under ``/dev/shm/knittrans-<job>/`` (tmpfs) it is the embedded single-machine store; on a shared
filesystem it is the disk backend (pass ``durable=True`` to fsync before publishing).

A unit is written to a private temporary file and then published with ``link(2)``, which, unlike
``rename(2)``, refuses to replace an existing name. Publishing is therefore atomic and write-once even
between processes: readers see a whole unit or none, and two writers of one key cannot overwrite each
other. Deleting unlinks the name; a reader that already opened the file still reads it whole.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import shutil
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from knittrans.errors import Conflict, InvalidArgument, StoreError, StoreFullError, UnitNotFound
from knittrans.store.buffers import BufferLike, writable_byte_view
from knittrans.store.file_mappings import DEFAULT_BUDGET_BYTES, MappingCache
from knittrans.store.protocol import PutResult, ReadStats, ReadTally, UnitRead, UnitWrite, dedupe_writes
from knittrans.types import ByteRange, UnitKey, check_id

logger = logging.getLogger(__name__)

SHM_ROOT = Path("/dev/shm")
_MAX_NAME = 240
_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT}
_HASH_CHUNK = 8 << 20
# Ranges at least this long are copied from a mapping instead of read with preadv (measured crossover).
MMAP_READ_THRESHOLD = 512 << 10


def default_root(job: str) -> Path:
    """``/dev/shm/knittrans-<job>``: the embedded single-machine store of one job."""
    check_id(job, "job")
    if "/" in job:
        raise InvalidArgument("must not contain '/'", field="job")
    return SHM_ROOT / f"knittrans-{job}"


def file_name(key: str) -> str:
    """A safe, injective file name for a key: ``/`` is escaped (``%`` never occurs in keys), and keys too
    long for one path component are named by their hash."""
    escaped = "u-" + key.replace("/", "%2F")
    if len(escaped) <= _MAX_NAME:
        return escaped
    return "h-" + hashlib.blake2b(key.encode(), digest_size=32).hexdigest()


class FileUnitStore:
    """A directory of unit files; many processes may share it."""

    def __init__(
        self, root: str | Path, *, durable: bool = False, mapping_cache_bytes: int = DEFAULT_BUDGET_BYTES
    ) -> None:
        self._root = Path(root)
        self._mappings = MappingCache(mapping_cache_bytes)
        self._units = self._root / "units"
        self._tmp = self._root / "tmp"
        self._durable = durable
        self._stats = ReadStats()
        try:
            for directory in (self._root, self._units, self._tmp):
                directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create the store directory: {exc.strerror}", field=str(self._root)) from exc

    @property
    def backend(self) -> str:
        return "file"

    @property
    def root(self) -> Path:
        return self._root

    @property
    def stats(self) -> ReadStats:
        return self._stats

    @property
    def mappings(self) -> MappingCache:
        """The open mappings of units read before (for monitoring and tests)."""
        return self._mappings

    def _path(self, key: str) -> Path:
        return self._units / file_name(key)

    # -- writes -------------------------------------------------------------------------------------

    def put_many(self, writes: Sequence[UnitWrite]) -> PutResult:
        pending: dict[str, UnitWrite] = {}
        present: list[UnitKey] = []
        for write in dedupe_writes(writes):
            if self._path(write.key).exists():
                self._check_same_content(write)
                present.append(write.key)
            else:
                pending[write.key] = write
        created: list[UnitKey] = []
        try:
            for write in pending.values():
                if self._publish(write):
                    created.append(write.key)
                else:
                    present.append(write.key)
        except BaseException:
            self.delete_many(created)
            raise
        return PutResult(created=tuple(created), already_present=tuple(present))

    def _check_same_content(self, write: UnitWrite) -> None:
        if write.content_addressed:
            return
        # UnitWrite checked the header's hash against the new bytes, so only the stored file is hashed.
        if self._hash_file(write.key) != write.header.content_hash:
            raise Conflict("key already holds different content", field=write.key)

    def _hash_file(self, key: str) -> str | None:
        digest = hashlib.blake2b(digest_size=16)
        try:
            with open(self._path(key), "rb", buffering=0) as handle:
                while chunk := handle.read(_HASH_CHUNK):
                    digest.update(chunk)
        except FileNotFoundError:
            return None
        return digest.hexdigest()

    def _publish(self, write: UnitWrite) -> bool:
        """Write one unit; False if a concurrent writer published the same bytes first."""
        final = self._path(write.key)
        # Unique across processes and across store instances of one process writing under the same root.
        temporary = self._tmp / f"{os.getpid()}.{uuid.uuid4().hex}"
        try:
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                view = write.data
                while view.nbytes:
                    written = os.write(fd, view)
                    view = view[written:]
                if self._durable:
                    os.fsync(fd)
            finally:
                os.close(fd)
            try:
                os.link(temporary, final)
            except FileExistsError:
                self._check_same_content(write)
                return False
            if self._durable:
                self._fsync_directory()
            return True
        except OSError as exc:
            raise _store_error(exc, write.key) from exc
        finally:
            with _ignore_missing():
                os.unlink(temporary)

    def _fsync_directory(self) -> None:
        fd = os.open(self._units, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    # -- reads --------------------------------------------------------------------------------------

    def get_into(self, key: UnitKey, buffer: BufferLike, ranges: Sequence[ByteRange] | None = None) -> int:
        return self.get_many_into([UnitRead.of(key, buffer, ranges)])[0]

    def get_many_into(self, reads: Sequence[UnitRead]) -> list[int]:
        results = []
        with self._stats.call() as tally:
            for read in reads:
                count = self._read(read, tally)
                tally.completed(requested_bytes=count)
                results.append(count)
        return results

    def _read(self, read: UnitRead, tally: ReadTally) -> int:
        path = self._path(read.key)
        try:
            status = os.stat(path)
            ranges = _checked_ranges(read, status.st_size)
            if any(r.length >= MMAP_READ_THRESHOLD for r in ranges):
                return self._mappings.copy(str(path), status, ranges, read.buffer, tally)
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            raise UnitNotFound("no such unit", field=read.key) from None
        except OSError as exc:
            raise _store_error(exc, read.key) from exc
        try:
            destination = 0
            for byte_range in ranges:
                view = read.buffer[destination : destination + byte_range.length]
                _pread_exactly(fd, view, byte_range.offset, tally)
                destination += byte_range.length
            return destination
        finally:
            os.close(fd)

    # -- housekeeping -------------------------------------------------------------------------------

    def exists(self, keys: Sequence[UnitKey]) -> list[bool]:
        return [self._path(key).exists() for key in keys]

    def sizes(self, keys: Sequence[UnitKey]) -> list[int | None]:
        return [self._size(key) for key in keys]

    def _size(self, key: UnitKey) -> int | None:
        try:
            return os.stat(self._path(key)).st_size  # a unit file holds exactly its bytes
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise _store_error(exc, key) from exc

    def delete_many(self, keys: Sequence[UnitKey]) -> int:
        removed = 0
        for key in keys:
            path = self._path(key)
            self._mappings.forget(str(path))
            try:
                os.unlink(path)
                removed += 1
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise _store_error(exc, key) from exc
        return removed

    def wait_removed(self, keys: Sequence[UnitKey]) -> None:
        return None  # unlinking is immediate

    def register_buffer(self, buffer: BufferLike) -> None:
        writable_byte_view(buffer)

    def unregister_buffer(self, buffer: BufferLike) -> None:
        return None

    def close(self) -> None:
        self._mappings.close()

    def purge(self) -> None:
        """Remove the whole store directory (end of a job, tests)."""
        self._mappings.close()
        remove_store_directory(self._root)


def remove_store_directory(root: Path) -> None:
    """Remove a file store's directory, saying what could not be removed: on tmpfs whatever is left holds
    memory until someone removes it. (A directory that is not there is removed already.)"""
    failures: list[tuple[str, BaseException]] = []

    def failed(_function: object, path: str, info: tuple[type[BaseException], BaseException, object]) -> None:
        if not isinstance(info[1], FileNotFoundError):
            failures.append((path, info[1]))

    shutil.rmtree(root, onerror=failed)
    if failures:
        path, error = failures[0]
        logger.warning("could not remove the file store %s whole (%d failures), so what is left still takes space;"
                       " first: %s (%s)", root, len(failures), path, error)


def _checked_ranges(read: UnitRead, size: int) -> tuple[ByteRange, ...]:
    if read.ranges is None:
        if size > read.buffer.nbytes:
            raise InvalidArgument(f"the unit has {size} bytes, the buffer {read.buffer.nbytes}", field="buffer")
        return (ByteRange(offset=0, length=size),)
    for byte_range in read.ranges:
        if byte_range.end > size:
            raise InvalidArgument(
                f"range [{byte_range.offset}, {byte_range.end}) is outside the unit's {size} bytes", field="range"
            )
    return tuple(read.ranges)


def _pread_exactly(fd: int, view: memoryview, offset: int, tally: ReadTally) -> None:
    while view.nbytes:
        count = os.preadv(fd, [view], offset)
        if count == 0:
            raise StoreError("the unit file is shorter than its size")
        tally.moved(count)
        view = view[count:]
        offset += count


def _store_error(exc: OSError, key: str) -> StoreError:
    if exc.errno in _FULL_ERRNOS:
        return StoreFullError(f"no space left: {exc.strerror}", field=key)
    return StoreError(f"{exc.strerror or exc}", field=key)


@contextmanager
def _ignore_missing() -> Iterator[None]:
    try:
        yield
    except FileNotFoundError:
        pass
