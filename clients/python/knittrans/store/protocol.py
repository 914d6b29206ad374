"""The logical storage layer (DESIGN.md §5): the ``UnitStore`` protocol and its typed requests.

A unit is raw little-endian bytes described by a :class:`~knittrans.types.UnitHeader`; no backend
pickles, parses or reshapes them. Reads put byte ranges straight into the caller's buffer, and every
store counts the bytes it was asked for against the bytes its I/O really moved, so over-read is measured,
not assumed.

Contract shared by every backend (and checked by one parametrized test suite):

* keys are write-once: rewriting identical bytes succeeds and changes nothing; different bytes raise
  :class:`~knittrans.errors.Conflict` and leave the stored unit as it was;
* the header's ``content_hash`` is verified on write (:class:`UnitWrite` hashes the bytes it is given,
  BLAKE2b-128 as :func:`~knittrans.store.hashing.content_hash`): a wrong hash raises
  :class:`~knittrans.errors.InvalidArgument` naming ``header.content_hash`` and nothing is stored. Reads do
  not re-hash (a ranged read never sees the whole unit); the stores are trusted to return what was written;
* ``put_many`` writes all of its units or none of the ones it created (it removes them before raising);
* a missing key raises :class:`~knittrans.errors.UnitNotFound`, also for a zero-length read (``ranges=[]``
  or ranges of length 0); a range outside the unit (a zero-length range starting past its end included)
  or a buffer too small raises :class:`~knittrans.errors.InvalidArgument`; a full store raises
  :class:`~knittrans.errors.StoreFullError`, at once for a unit larger than the store could ever hold;
* ``delete_many`` is idempotent: deleting a missing key is not an error. Once it returns, this store
  object sees the units as gone; a backend whose readers hold leases (Mooncake) may finish removing a
  leased unit in the background, within the lease, so other clients can still see it until then.

Read statistics (:class:`ReadStats`) follow one rule on every backend:

* a ``get_many_into`` call that returns counts every one of its reads in ``units``, zero-length reads
  included, and adds to ``requested_bytes`` what each read asked for (the ranges' lengths, or the unit's
  size for a whole-unit read);
* a call that raises counts no units and no requested bytes;
* ``moved_bytes`` is what the backend's I/O really transferred for the call, whether it returned or
  raised: the counts ``preadv`` and the mapped copies report (file), the counts the transfer calls
  return (mooncake), the whole objects fetched (ray, which cannot fetch part of an object). So
  ``over_read_bytes`` shows bytes read beyond the ranges and bytes of failed calls.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import InitVar, dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from knittrans.errors import Conflict, InvalidArgument
from knittrans.store.buffers import BufferLike, byte_view, writable_byte_view
from knittrans.store.hashing import content_hash
from knittrans.types import ByteRange, DType, UnitHeader, UnitKey, check_id

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True, kw_only=True)
class UnitWrite:
    """One unit to store: its key, its header and a C-contiguous buffer holding exactly its bytes.

    ``content_addressed`` says the key embeds the content hash (multimodal units), so an existing key
    already holds these bytes and the store skips comparing them.

    The header's ``content_hash`` is checked against ``data`` here, so no store accepts a wrong one.
    :meth:`of_array` derives the header from the array's bytes and hashes them once.
    """

    key: UnitKey
    header: UnitHeader
    data: memoryview
    content_addressed: bool = False
    # Set only by of_array, whose header was hashed from these very bytes a moment earlier.
    _hash_checked: InitVar[bool] = False

    def __post_init__(self, _hash_checked: bool) -> None:
        check_id(self.key, "key")
        if not isinstance(self.header, UnitHeader):
            raise InvalidArgument("must be a UnitHeader", field="header")
        view = byte_view(self.data, field="data")
        object.__setattr__(self, "data", view)
        if view.nbytes != self.header.byte_length:
            raise InvalidArgument(
                f"holds {view.nbytes} bytes but the header describes {self.header.byte_length}", field="data"
            )
        if view.nbytes == 0:
            raise InvalidArgument("a unit must hold at least one byte", field="data")
        if not _hash_checked and content_hash(view) != self.header.content_hash:
            raise InvalidArgument(
                f"{self.header.content_hash} is not the hash of the {view.nbytes} bytes of unit {self.key!r}",
                field="header.content_hash",
            )

    @classmethod
    def of(cls, key: str, header: UnitHeader, data: BufferLike, *, content_addressed: bool = False) -> UnitWrite:
        return cls(key=UnitKey(key), header=header, data=byte_view(data), content_addressed=content_addressed)

    @classmethod
    def of_array(
        cls, key: str, array: np.ndarray, dtype: DType, *, sequence: bool, content_addressed: bool = False
    ) -> UnitWrite:
        """A write of a C-contiguous little-endian array (see :func:`knittrans.store.arrays.to_numpy`), its
        header computed from the array's bytes."""
        from knittrans.store.arrays import array_bytes, header_of

        return cls(
            key=UnitKey(key), header=header_of(array, dtype, sequence=sequence), data=array_bytes(array),
            content_addressed=content_addressed, _hash_checked=True,
        )

    @classmethod
    def content_addressed_of_array(
        cls, key_of_hash: Callable[[str], str], array: np.ndarray, dtype: DType
    ) -> UnitWrite:
        """A content-addressed write (a multimodal input, never sliced) whose key is ``key_of_hash`` of the
        content hash of the array's bytes; the bytes are hashed once."""
        from knittrans.store.arrays import array_bytes, header_of

        header = header_of(array, dtype, sequence=False)
        return cls(
            key=UnitKey(key_of_hash(header.content_hash)), header=header, data=array_bytes(array),
            content_addressed=True, _hash_checked=True,
        )


@dataclass(frozen=True, kw_only=True)
class UnitRead:
    """Read ``ranges`` of one unit (or the whole unit when ``ranges`` is None) into ``buffer``.

    The ranges land back to back from the start of ``buffer``; pass a slice of a larger buffer to place
    them at an offset. ``buffer`` must hold at least the bytes read.
    """

    key: UnitKey
    buffer: memoryview
    ranges: tuple[ByteRange, ...] | None = None

    def __post_init__(self) -> None:
        check_id(self.key, "key")
        object.__setattr__(self, "buffer", writable_byte_view(self.buffer, field="buffer"))
        if self.ranges is not None:
            ranges = tuple(self.ranges)
            object.__setattr__(self, "ranges", ranges)
            for i, byte_range in enumerate(ranges):
                if not isinstance(byte_range, ByteRange):
                    raise InvalidArgument("must be a ByteRange", field=f"ranges[{i}]")
            if self.requested_bytes > self.buffer.nbytes:
                raise InvalidArgument(
                    f"the ranges need {self.requested_bytes} bytes, the buffer has {self.buffer.nbytes}",
                    field="buffer",
                )

    @property
    def requested_bytes(self) -> int:
        """Bytes asked for by ranged reads; whole-unit reads learn their size from the store."""
        return sum(r.length for r in self.ranges) if self.ranges is not None else 0

    @classmethod
    def of(cls, key: str, buffer: BufferLike, ranges: Sequence[ByteRange] | None = None) -> UnitRead:
        return cls(
            key=UnitKey(key), buffer=writable_byte_view(buffer), ranges=None if ranges is None else tuple(ranges)
        )


@dataclass(frozen=True, kw_only=True)
class PutResult:
    """Which keys a ``put_many`` created and which already held the same bytes."""

    created: tuple[UnitKey, ...] = ()
    already_present: tuple[UnitKey, ...] = ()


@dataclass(frozen=True, kw_only=True)
class ReadStatsSnapshot:
    units: int
    requested_bytes: int
    moved_bytes: int

    @property
    def over_read_bytes(self) -> int:
        return self.moved_bytes - self.requested_bytes


@dataclass
class ReadTally:
    """What one ``get_many_into`` call read: filled in by the backend, recorded by :meth:`ReadStats.call`."""

    units: int = 0
    requested_bytes: int = 0
    moved_bytes: int = 0

    def completed(self, *, requested_bytes: int) -> None:
        """One read delivered what it asked for (``requested_bytes``; 0 for a zero-length read)."""
        self.units += 1
        self.requested_bytes += requested_bytes

    def moved(self, nbytes: int) -> None:
        """The backend's I/O transferred ``nbytes``, whatever becomes of the read."""
        self.moved_bytes += nbytes


@dataclass
class ReadStats:
    """Running totals of reads: bytes the callers needed against bytes the backend moved (the rule is in
    the module docstring)."""

    units: int = 0
    requested_bytes: int = 0
    moved_bytes: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def record(self, *, units: int, requested_bytes: int, moved_bytes: int) -> None:
        with self._lock:
            self.units += units
            self.requested_bytes += requested_bytes
            self.moved_bytes += moved_bytes

    @contextmanager
    def call(self) -> Iterator[ReadTally]:
        """Count one ``get_many_into`` call: its reads if it returns, only its moved bytes if it raises."""
        tally = ReadTally()
        try:
            yield tally
        except BaseException:
            self.record(units=0, requested_bytes=0, moved_bytes=tally.moved_bytes)
            raise
        self.record(units=tally.units, requested_bytes=tally.requested_bytes, moved_bytes=tally.moved_bytes)

    def snapshot(self) -> ReadStatsSnapshot:
        with self._lock:
            return ReadStatsSnapshot(
                units=self.units, requested_bytes=self.requested_bytes, moved_bytes=self.moved_bytes
            )

    def reset(self) -> None:
        with self._lock:
            self.units = self.requested_bytes = self.moved_bytes = 0


def dedupe_writes(writes: Sequence[UnitWrite]) -> list[UnitWrite]:
    """One write per key, first occurrence kept; the same key twice must carry the same bytes."""
    by_key: dict[str, UnitWrite] = {}
    for write in writes:
        earlier = by_key.get(write.key)
        if earlier is None:
            by_key[write.key] = write
        elif earlier.data != write.data:  # memoryview equality compares the bytes
            raise Conflict("written twice with different content in one batch", field=write.key)
    return list(by_key.values())


@runtime_checkable
class UnitStore(Protocol):
    """Atomic-unit storage. Backends: ``file``, ``mooncake``, ``ray`` (see :mod:`knittrans.store.factory`)."""

    @property
    def backend(self) -> str: ...

    @property
    def stats(self) -> ReadStats: ...

    def put_many(self, writes: Sequence[UnitWrite]) -> PutResult:
        """Store every unit, in as few backend calls as the backend allows, without copying the buffers."""
        ...

    def get_into(self, key: UnitKey, buffer: BufferLike, ranges: Sequence[ByteRange] | None = None) -> int:
        """Read ``ranges`` (or the whole unit) of ``key`` into ``buffer``; returns the bytes written.

        Empty ``ranges`` still check that the unit exists (and lies around the ranges) and return 0."""
        ...

    def get_many_into(self, reads: Sequence[UnitRead]) -> list[int]:
        """The batched form of :meth:`get_into`; returns the bytes written per read."""
        ...

    def exists(self, keys: Sequence[UnitKey]) -> list[bool]: ...

    def sizes(self, keys: Sequence[UnitKey]) -> list[int | None]:
        """Each unit's stored size in bytes, None for a missing one: a metadata query in as few backend calls
        as the backend allows, moving no unit bytes (a reorg sidecar checks a whole mini-batch with it before
        delivering any of it). Like ``exists``, it takes a read lease on present units where reads do."""
        ...

    def delete_many(self, keys: Sequence[UnitKey]) -> int:
        """Remove the units; returns how many existed. Missing keys are skipped. Never waits for readers'
        leases: a leased unit is removed in the background (see the module docstring)."""
        ...

    def wait_removed(self, keys: Sequence[UnitKey]) -> None:
        """Block until units this store deleted are gone for every client (a leased unit's background removal
        has ended); raises :class:`StoreError` if one is still there after the backend's lease retry time.
        The admission service calls it before it counts a unit deleted: a rollout that reserves the unit
        again must find it absent and store it anew, not find it present and see it removed afterwards."""
        ...

    def register_buffer(self, buffer: BufferLike) -> None:
        """Declare a long-lived buffer (e.g. a shared-memory ring) as a transfer target; a no-op where
        the backend does not need it."""
        ...

    def unregister_buffer(self, buffer: BufferLike) -> None: ...

    def close(self) -> None:
        """Release this client's resources, after finishing removals still under way. Stored units stay;
        they outlive the writer."""
        ...
