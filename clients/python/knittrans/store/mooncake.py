"""The ``mooncake`` backend: the Mooncake distributed store, the production backend (DESIGN.md §5).

* Every client is a full ``setup()`` client with P2PHANDSHAKE metadata (the HTTP metadata server binds
  0.0.0.0). Writers contribute no segment by default (``global_segment_size=0``): the bytes live in a
  long-lived owner process (see :mod:`knittrans.launch.mooncake`), so they outlive the writer.
* Units are put with a hard pin, so the store never evicts acknowledged data; they leave only through
  :meth:`MooncakeUnitStore.delete_many`.
* Every read (and every existence check or size query of a present key) takes a lease on the unit for the master's
  ``default_kv_lease_ttl`` (10 s by default; ``--lease-ttl-ms`` of :mod:`knittrans.launch.mooncake`),
  and the master refuses to remove a leased unit (-706). ``delete_many`` never waits for that: it removes
  what it can at once and hands leased units to a background thread of the store object, which retries
  until they are gone (when their lease ends). This store object sees them as deleted at once (reads
  raise :class:`~knittrans.errors.UnitNotFound`, ``exists`` says False; rewriting such a key first waits
  for its removal); other clients may see them until the lease ends. :meth:`MooncakeUnitStore.close`
  waits up to ``lease_retry_seconds`` for those removals; a process that dies first leaves those units
  behind.
* A unit larger than ``max_unit_size`` (the largest segment; :attr:`~knittrans.launch.mooncake.
  MooncakeCluster.store_url` sets it) can never be stored: ``put_many`` raises ``StoreFullError`` at once
  instead of waiting ``full_retry_seconds`` for space.
* Bytes move by pointer with the batch calls (``batch_put_from``, ``batch_get_into``) and, for slices, a get
  session (``batch_get_into_multi_buffer_ranges``); buffers that are not registered for the whole client
  lifetime (see :meth:`MooncakeUnitStore.register_buffer`) are registered around each call, which costs
  microseconds.
* Keys are write-once in Mooncake (a put on an existing key returns 0 and changes nothing), so
  ``put_many`` first asks which keys exist and compares their stored bytes by content hash.
  Concurrent writers of one key with different bytes are not detected; KnitTrans never produces them
  (per-trajectory keys have one writer, multimodal keys embed their content hash).
* Mooncake's client waits for a transfer by polling its status in a loop, on a CPU of its own for as long as the
  transfer takes; the store makes every transfer call on a ``SCHED_IDLE`` thread (:mod:`knittrans.store.
  idle_waiter`), so that loop only takes CPU time the other threads of its scheduling group leave idle.

A store object serialises its own calls with a lock; use one per thread for parallel transfers.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from itertools import accumulate
from typing import Any

import numpy as np

from knittrans.errors import Conflict, InvalidArgument, StoreError, StoreFullError, Unavailable, UnitNotFound
from knittrans.retry import Backoff, RetryPolicy
from knittrans.store.buffers import BufferLike, address_of, byte_view, writable_byte_view
from knittrans.store.hashing import content_hash
from knittrans.store.idle_waiter import IdleWaiter
from knittrans.store.mooncake_errors import MooncakeCode, mooncake_error
from knittrans.store.mooncake_removal import LEASED, LeasedRemovals
from knittrans.store.protocol import PutResult, ReadStats, ReadTally, UnitRead, UnitWrite, dedupe_writes
from knittrans.types import ByteRange, UnitKey

logger = logging.getLogger(__name__)

MIB = 1 << 20
# Mooncake takes offsets as uint64 and adds lengths to them; no unit comes near this end.
_MAX_RANGE_END = (1 << 63) - 1


@dataclass(frozen=True, kw_only=True)
class MooncakeStoreConfig:
    """How one process connects to a Mooncake cluster."""

    master_address: str  # host:port of mooncake_master
    local_hostname: str = "127.0.0.1"
    metadata_server: str = "P2PHANDSHAKE"
    protocol: str = "tcp"
    rdma_devices: str = ""
    global_segment_size: int = 0  # bytes this client contributes to the pool; 0: the owner process holds them
    local_buffer_size: int = 32 * MIB
    hard_pin: bool = True
    max_unit_size: int = 0  # the largest unit any segment can hold (the largest segment); 0: not known
    full_retry_seconds: float = 5.0  # how long a put waits for space (-200) before StoreFullError
    # How long close() and a rewrite of a key deleted under a lease wait for leased removals; > the lease TTL.
    lease_retry_seconds: float = 30.0
    connect_timeout_seconds: float = 3.0

    def __post_init__(self) -> None:
        host, _, port = self.master_address.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise InvalidArgument(f"must be host:port, got {self.master_address!r}", field="master_address")
        for name in ("global_segment_size", "local_buffer_size", "max_unit_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise InvalidArgument(f"must be a non-negative integer, got {value!r}", field=name)
        for name in ("full_retry_seconds", "lease_retry_seconds", "connect_timeout_seconds"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value < 0:
                raise InvalidArgument(f"must be a non-negative number, got {value!r}", field=name)
        if self.protocol not in ("tcp", "rdma"):
            raise InvalidArgument(f"must be tcp or rdma, got {self.protocol!r}", field="protocol")

    @property
    def master_host(self) -> str:
        return self.master_address.rpartition(":")[0]

    @property
    def master_port(self) -> int:
        return int(self.master_address.rpartition(":")[2])


# Waiting for space (the store evicts, or readers release leases).
_FULL_RETRY = RetryPolicy(initial=0.01, cap=0.5)
# Reads of its own (for a ranged read, sessions of its own) for a read whose lease ran out before its transfer
# ended (the tests' leases last 200 ms).
_SINGLE_READ_SESSIONS = 2


def _read_again_where_lease_ran_out(counts: list[int], read_alone: Callable[[int], int]) -> None:
    """Replace each LEASE_EXPIRED in ``counts`` (bytes read per read, or Mooncake's error code) by what reading
    that read again on its own gives (``read_alone(i)``), up to ``_SINGLE_READ_SESSIONS`` times. A transfer
    outlasts its unit's lease when the segment owner stalls, or when this process's idle-priority transfer thread
    is starved by a saturated CPU and sees the transfer end late."""
    for i in [i for i, count in enumerate(counts) if count == MooncakeCode.LEASE_EXPIRED]:
        for _ in range(_SINGLE_READ_SESSIONS):
            counts[i] = read_alone(i)
            if counts[i] != MooncakeCode.LEASE_EXPIRED:
                break


class MooncakeUnitStore:
    """A full Mooncake client speaking the :class:`~knittrans.store.protocol.UnitStore` protocol."""

    def __init__(self, config: MooncakeStoreConfig) -> None:
        self._config = config
        self._stats = ReadStats()
        self._lock = threading.RLock()
        self._registered: dict[int, int] = {}  # start address -> end address of long-lived registrations
        self._check_master_reachable()
        from mooncake.store import MooncakeDistributedStore, ReplicateConfig

        self._client = MooncakeDistributedStore()
        code = self._client.setup(
            {
                "local_hostname": config.local_hostname,
                "metadata_server": config.metadata_server,
                "global_segment_size": config.global_segment_size,
                "local_buffer_size": config.local_buffer_size,
                "protocol": config.protocol,
                "rdma_devices": config.rdma_devices,
                "master_server_addr": config.master_address,
            }
        )
        if code != 0:
            raise Unavailable(f"mooncake setup failed with code {code}", field=config.master_address)
        self._replicate = ReplicateConfig()
        self._replicate.with_hard_pin = config.hard_pin
        self._removals = LeasedRemovals(self._client, self._lock, config.lease_retry_seconds)
        self._waiter = IdleWaiter("mooncake-transfer")
        self._closed = False

    def _check_master_reachable(self) -> None:
        # setup() retries an unreachable master for about a minute and a half; fail fast instead.
        try:
            with socket.create_connection(
                (self._config.master_host, self._config.master_port), timeout=self._config.connect_timeout_seconds
            ):
                pass
        except OSError as exc:
            raise Unavailable(f"mooncake master unreachable: {exc}", field=self._config.master_address) from exc

    @property
    def backend(self) -> str:
        return "mooncake"

    @property
    def stats(self) -> ReadStats:
        return self._stats

    @property
    def raw_client(self) -> Any:
        """The underlying ``MooncakeDistributedStore`` (benchmarks compare against it)."""
        return self._client

    # -- writes -------------------------------------------------------------------------------------

    def put_many(self, writes: Sequence[UnitWrite]) -> PutResult:
        unique = dedupe_writes(writes)
        if not unique:
            return PutResult()
        self._check_fits(unique)
        self._removals.remove_before_rewrite([w.key for w in unique])
        with self._lock:
            keys = [w.key for w in unique]
            present = set(self._existing(keys))
            self._check_same_content([w for w in unique if w.key in present and not w.content_addressed])
            new = [w for w in unique if w.key not in present]
            created = self._put_new(new)
            return PutResult(created=tuple(created), already_present=tuple(k for k in keys if k in present))

    def _check_fits(self, writes: Sequence[UnitWrite]) -> None:
        limit = self._config.max_unit_size
        for write in writes:
            if limit and write.header.byte_length > limit:
                raise StoreFullError(
                    f"unit {write.key!r} of {write.header.byte_length} bytes can never fit: the largest segment "
                    f"of the store holds {limit} bytes",
                    field=write.key,
                )

    def _existing(self, keys: Sequence[UnitKey]) -> list[UnitKey]:
        codes = self._client.batch_is_exist(list(keys))
        for key, code in zip(keys, codes, strict=True):
            if code < 0:
                raise StoreError(f"mooncake batch_is_exist failed ({code})", field=key)
        return [key for key, code in zip(keys, codes, strict=True) if code == 1]

    def _check_same_content(self, writes: Sequence[UnitWrite]) -> None:
        if not writes:
            return
        # One spare byte tells a longer stored unit apart from an equal one.
        scratch = [np.empty(w.header.byte_length + 1, dtype=np.uint8) for w in writes]
        views = [memoryview(s.data) for s in scratch]
        with self._transfer_addresses(views) as addresses:
            counts = self._waiter.run(self._client.batch_get_into, [w.key for w in writes], addresses,
                                      [v.nbytes for v in views])
        for write, buffer, count in zip(writes, views, counts, strict=True):
            if count == MooncakeCode.INVALID_PARAMS:  # stored unit is longer than the new one
                raise Conflict("key already holds different content", field=write.key)
            if count < 0:
                raise mooncake_error(count, key=write.key, operation="batch_get_into")
            # UnitWrite checked its header's hash against its bytes; only the stored bytes need hashing.
            if count != write.header.byte_length or content_hash(buffer[:count]) != write.header.content_hash:
                raise Conflict("key already holds different content", field=write.key)

    def _put_new(self, writes: Sequence[UnitWrite]) -> list[UnitKey]:
        created: list[UnitKey] = []
        remaining = list(writes)
        backoff = Backoff(replace(_FULL_RETRY, deadline=self._config.full_retry_seconds))
        try:
            with self._transfer_addresses([w.data for w in writes]) as addresses:
                address_of_key = {w.key: a for w, a in zip(writes, addresses, strict=True)}
                while remaining:
                    codes = self._waiter.run(
                        self._client.batch_put_from,
                        [w.key for w in remaining],
                        [address_of_key[w.key] for w in remaining],
                        [w.header.byte_length for w in remaining],
                        self._replicate,
                    )
                    full: list[UnitWrite] = []
                    for write, code in zip(remaining, codes, strict=True):
                        if code == 0:
                            created.append(write.key)
                        elif code == MooncakeCode.NO_AVAILABLE_HANDLE:
                            full.append(write)
                        else:
                            raise mooncake_error(code, key=write.key, operation="batch_put_from")
                    remaining = full
                    if remaining and not backoff.sleep():
                        waiting = sum(w.header.byte_length for w in remaining)
                        raise StoreFullError(
                            f"no space for {len(remaining)} units ({waiting} bytes; the first, {remaining[0].key!r}, "
                            f"{remaining[0].header.byte_length} bytes) after {self._config.full_retry_seconds:.1f}s",
                            field=remaining[0].key,
                        )
        except BaseException:
            if created:
                self.delete_many(created)
            raise
        return created

    # -- reads --------------------------------------------------------------------------------------

    def get_into(self, key: UnitKey, buffer: BufferLike, ranges: Sequence[ByteRange] | None = None) -> int:
        return self.get_many_into([UnitRead.of(key, buffer, ranges)])[0]

    def get_many_into(self, reads: Sequence[UnitRead]) -> list[int]:
        with self._stats.call() as tally, self._lock:
            for read in reads:
                self._check_readable(read)
            results = [0] * len(reads)
            whole = [i for i, r in enumerate(reads) if r.ranges is None]
            ranged = [i for i, r in enumerate(reads) if r.ranges is not None and r.requested_bytes > 0]
            empty = [i for i, r in enumerate(reads) if r.ranges is not None and r.requested_bytes == 0]
            with self._transfer_addresses([reads[i].buffer for i in whole + ranged]) as addresses:
                if whole:
                    self._get_whole([reads[i] for i in whole], addresses[: len(whole)], whole, results, tally)
                if ranged:
                    self._get_ranges([reads[i] for i in ranged], addresses[len(whole) :], ranged, results, tally)
            for i in empty:
                self._check_empty_read(reads[i])
            for count in results:
                tally.completed(requested_bytes=count)
            return results

    def _check_readable(self, read: UnitRead) -> None:
        if self._removals.pending((read.key,)):
            raise UnitNotFound("no such unit (deleted)", field=read.key)
        for byte_range in read.ranges or ():
            if byte_range.end > _MAX_RANGE_END:
                raise InvalidArgument(
                    f"range [{byte_range.offset}, {byte_range.end}) is outside every unit", field="range"
                )

    def _check_empty_read(self, read: UnitRead) -> None:
        """A read of no bytes moves nothing, but the unit must exist and hold the ranges' offsets."""
        size = self._client.get_size(read.key)
        if size < 0:
            raise mooncake_error(size, key=read.key, operation="get_size")
        for byte_range in read.ranges or ():
            if byte_range.offset > size:
                raise InvalidArgument(
                    f"range [{byte_range.offset}, {byte_range.end}) is outside the unit's {size} bytes", field="range"
                )

    def _get_whole(
        self, reads: list[UnitRead], addresses: list[int], slots: list[int], results: list[int], tally: ReadTally
    ) -> None:
        counts = self._waiter.run(self._client.batch_get_into, [r.key for r in reads], addresses,
                                  [r.buffer.nbytes for r in reads])
        _read_again_where_lease_ran_out(counts, lambda i: self._waiter.run(
            self._client.batch_get_into, [reads[i].key], [addresses[i]], [reads[i].buffer.nbytes])[0])
        tally.moved(sum(count for count in counts if count > 0))
        for read, slot, count in zip(reads, slots, counts, strict=True):
            if count < 0:
                raise mooncake_error(count, key=read.key, operation="batch_get_into")
            results[slot] = count

    def _get_ranges(
        self, reads: list[UnitRead], addresses: list[int], slots: list[int], results: list[int], tally: ReadTally
    ) -> None:
        """Every range of every read in one get session: one master query for all the units' replicas, then one
        batched transfer of all the ranges. (``get_into_ranges``, used before, read 4 KiB units' zigzag halves at
        0.4x the rate here: ``benchmarks/store.py``.) The session holds each unit's lease from the query to the
        end of the transfer; a read whose lease ran out meanwhile is read again on its own."""
        keys = [read.key for read in reads]
        pointers, sizes, offsets = [], [], []
        for read, address in zip(reads, addresses, strict=True):
            ranges = read.ranges or ()
            pointers.append(list(accumulate((r.length for r in ranges[:-1]), initial=address)))
            sizes.append([r.length for r in ranges])
            offsets.append([r.offset for r in ranges])
        counts = self._read_in_session(keys, pointers, sizes, offsets)
        # A session's lease must outlast its whole transfer; a read whose lease ran out gets sessions of its own,
        # each as short as one unit's transfer.
        _read_again_where_lease_ran_out(
            counts, lambda i: self._read_in_session([keys[i]], [pointers[i]], [sizes[i]], [offsets[i]])[0])
        tally.moved(sum(count for count in counts if count > 0))
        for read, slot, count, wanted in zip(reads, slots, counts, sizes, strict=True):
            if count < 0:
                raise mooncake_error(count, key=read.key, operation="batch_get_into_multi_buffer_ranges")
            if count != sum(wanted):
                raise StoreError(f"short ranged read: {count} of {sum(wanted)} bytes", field=read.key)
            results[slot] = count

    def _read_in_session(
        self, keys: list[UnitKey], pointers: list[list[int]], sizes: list[list[int]], offsets: list[list[int]]
    ) -> list[int]:
        """Bytes read per key (negative: Mooncake's error code). A unit whose replica query fails raises before
        anything moves."""
        unique = list(dict.fromkeys(keys))
        started = self._client.batch_get_session_start(unique)
        try:
            for key, code in zip(unique, started, strict=True):
                if code < 0:
                    raise mooncake_error(code, key=key, operation="batch_get_session_start")
            return list(self._waiter.run(self._client.batch_get_into_multi_buffer_ranges, keys, pointers, sizes,
                                         offsets))
        finally:
            self._client.batch_get_session_end(unique)

    # -- housekeeping -------------------------------------------------------------------------------

    def exists(self, keys: Sequence[UnitKey]) -> list[bool]:
        if not keys:
            return []
        deleted = self._removals.pending(keys)
        with self._lock:
            present = set(self._existing([key for key in keys if key not in deleted]))
        return [key in present for key in keys]

    def sizes(self, keys: Sequence[UnitKey]) -> list[int | None]:
        """One ``batch_get_replica_desc`` call (metadata only, no transfer) for all keys; like a read, it
        leases the units it finds. A unit without a complete replica is not readable, so it counts as missing."""
        if not keys:
            return []
        deleted = self._removals.pending(keys)
        wanted = list(dict.fromkeys(key for key in keys if key not in deleted))
        with self._lock:
            replicas = self._client.batch_get_replica_desc(wanted) if wanted else {}
        found = {key: _replica_size(replicas.get(key, ())) for key in wanted}
        return [found.get(key) for key in keys]

    def delete_many(self, keys: Sequence[UnitKey]) -> int:
        """Remove units without waiting for read leases: a leased unit (-706) is removed in the background
        once its lease ends. Returns how many of the keys existed (and were not being removed already)."""
        deleted = self._removals.pending(keys)
        unique = [key for key in dict.fromkeys(keys) if key not in deleted]
        if not unique:
            return 0
        with self._lock:
            codes = self._client.batch_remove(unique, False)
        removed = 0
        leased: list[UnitKey] = []
        failure: Exception | None = None
        for key, code in zip(unique, codes, strict=True):
            if code == MooncakeCode.OK:
                removed += 1
            elif code in LEASED:
                leased.append(key)
            elif code != MooncakeCode.OBJECT_NOT_FOUND and failure is None:
                failure = mooncake_error(code, key=key, operation="batch_remove")
        if leased:
            self._removals.schedule(leased)
        if failure is not None:
            raise failure
        return removed + len(leased)

    def wait_removed(self, keys: Sequence[UnitKey]) -> None:
        self._removals.wait_removed(keys)

    def pending_removals(self) -> int:
        """How many deleted units are still waiting for a lease to end."""
        return self._removals.count()

    def register_buffer(self, buffer: BufferLike) -> None:
        view = writable_byte_view(buffer)
        start, end = address_of(view), address_of(view) + view.nbytes
        with self._lock:
            if any(start < e and s < end for s, e in self._registered.items()):
                raise InvalidArgument("overlaps a buffer registered earlier", field="buffer")
            code = self._client.register_buffer(start, view.nbytes)
            if code != 0:
                raise mooncake_error(code, key=None, operation="register_buffer")
            self._registered[start] = end

    def unregister_buffer(self, buffer: BufferLike) -> None:
        view = byte_view(buffer, field="buffer")
        start = address_of(view)
        with self._lock:
            if self._registered.pop(start, None) is not None:
                self._client.unregister_buffer(start)

    def close(self) -> None:
        self._removals.drain()
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for start in list(self._registered):
                self._client.unregister_buffer(start)
            self._registered.clear()
            self._client.close()
            self._waiter.close()

    # -- buffer registration ------------------------------------------------------------------------

    @contextmanager
    def _transfer_addresses(self, views: Sequence[memoryview]) -> Iterator[list[int]]:
        """Addresses of ``views``, registered with the transfer engine for the duration of the block.

        Regions inside a long-lived registration are used as they are; the rest are merged into
        disjoint intervals, registered, and unregistered afterwards.
        """
        addresses = [address_of(v) for v in views]
        intervals = sorted((a, a + v.nbytes) for a, v in zip(addresses, views, strict=True) if v.nbytes)
        merged: list[list[int]] = []
        for start, end in intervals:
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        temporary: list[int] = []
        try:
            for start, end in merged:
                if self._inside_registered(start, end):
                    continue
                if any(start < e and s < end for s, e in self._registered.items()):
                    raise InvalidArgument("a buffer straddles the edge of a registered buffer", field="buffer")
                code = self._client.register_buffer(start, end - start)
                if code != 0:
                    raise mooncake_error(code, key=None, operation="register_buffer")
                temporary.append(start)
            yield addresses
        finally:
            for start in temporary:
                self._client.unregister_buffer(start)

    def _inside_registered(self, start: int, end: int) -> bool:
        return any(s <= start and end <= e for s, e in self._registered.items())


def _replica_size(replicas: Sequence[Any]) -> int | None:
    """The object size a complete replica records (memory or disk), None when no replica is complete."""
    for replica in replicas:
        if replica.status.name != "COMPLETE":
            continue
        if replica.is_memory_replica():
            return int(replica.get_memory_descriptor().buffer_descriptor.size)
        if replica.is_disk_replica():
            return int(replica.get_disk_descriptor().object_size)
    return None
