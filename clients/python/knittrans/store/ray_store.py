"""The ``ray`` backend: the Ray object store, for Ray-native frameworks.

Keys map to object refs through one named registry actor per store name.

**Ownership.** A Ray object dies with the process that put it (``_owner`` is gone since Ray 2.56), and
rollout workers come and go. So the registry actor owns every unit: a writer sends the bytes to the
actor, which ``ray.put``s them itself. Units therefore live as long as the registry (a detached actor,
so as long as the Ray cluster), independent of any writer; they leave through ``delete_many``. The cost
is one extra copy inside the object store per write. Readers borrow the refs: a unit deleted while a
reader still holds its array stays readable for that reader.

Bytes travel as one-dimensional ``uint8`` arrays, which Ray serialises out of band (raw buffers, no
pickling of the data). A read fetches whole objects (Ray cannot fetch part of one) and copies the
requested ranges out of them, so the read statistics count every fetched object whole as moved: the
bytes that cross the network when the object lives on another node (on its own node Ray maps it).
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from knittrans.errors import Conflict, FailedPrecondition, InvalidArgument, StoreError, StoreFullError, UnitNotFound
from knittrans.store.buffers import BufferLike
from knittrans.store.hashing import content_hash
from knittrans.store.protocol import PutResult, ReadStats, UnitRead, UnitWrite, dedupe_writes
from knittrans.types import ByteRange, UnitKey

logger = logging.getLogger(__name__)

DEFAULT_REGISTRY = "knittrans-units"
DEFAULT_NAMESPACE = "knittrans"


class UnitRegistry:
    """The actor that owns the units: key -> (object ref, size). Runs inside Ray; plain data in and out."""

    def __init__(self) -> None:
        self._units: dict[str, tuple[Any, int]] = {}

    def put_many(
        self, keys: list[str], content_addressed: list[bool], payloads: list[np.ndarray]
    ) -> tuple[str, str, list[str], list[str]]:
        """Returns (status, key, created, present); status is ok, conflict or full. All or nothing."""
        import ray

        for key, addressed, payload in zip(keys, content_addressed, payloads, strict=True):
            stored = self._units.get(key)
            if stored is None or addressed:
                continue
            ref, size = stored
            if size != payload.nbytes or content_hash(ray.get(ref)) != content_hash(payload):
                return "conflict", key, [], []
        created: list[str] = []
        present: list[str] = []
        try:
            for key, payload in zip(keys, payloads, strict=True):
                if key in self._units:
                    present.append(key)
                    continue
                self._units[key] = (ray.put(payload), payload.nbytes)
                created.append(key)
        except ray.exceptions.ObjectStoreFullError:
            for key in created:
                self._units.pop(key, None)
            return "full", key, [], []
        return "ok", "", created, present

    def lookup(self, keys: list[str]) -> list[Any]:
        """Refs (borrowed by the caller) or None for missing keys; a list so Ray does not resolve them."""
        return [self._units[key][0] if key in self._units else None for key in keys]

    def exists(self, keys: list[str]) -> list[bool]:
        return [key in self._units for key in keys]

    def sizes(self, keys: list[str]) -> list[int | None]:
        return [self._units[key][1] if key in self._units else None for key in keys]

    def delete_many(self, keys: list[str]) -> int:
        return sum(1 for key in keys if self._units.pop(key, None) is not None)

    def count(self) -> int:
        return len(self._units)


def ensure_ray(address: str, *, namespace: str = DEFAULT_NAMESPACE, node_ip_address: str = "") -> None:
    """Join the Ray cluster at ``address`` unless this process has initialised Ray already (a Ray-native trainer
    has; the KnitTrans services have not), through the Raylet at ``node_ip_address`` when given (else Ray's
    choice: the only Raylet on this host, or the head's)."""
    import ray

    if ray.is_initialized():
        return
    logger.info("joining Ray at %r (namespace %r, node %r)", address, namespace, node_ip_address or "any")
    # ray.init replaces the SIGTERM handler with sys.exit; the services' graceful shutdown needs theirs back.
    handlers = {}
    if threading.current_thread() is threading.main_thread():
        handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        ray.init(address=address, namespace=namespace, log_to_driver=False, _node_ip_address=node_ip_address or None)
    except ConnectionError as exc:
        raise FailedPrecondition(f"cannot join Ray at {address!r}: {exc}", field="store.address") from exc
    finally:
        for signum, handler in handlers.items():
            if handler is not None:
                signal.signal(signum, handler)


def registry_actor(name: str = DEFAULT_REGISTRY, namespace: str = DEFAULT_NAMESPACE) -> Any:
    """The named registry actor, created on first use; it outlives its creator (detached)."""
    import ray

    if not ray.is_initialized():
        raise FailedPrecondition("Ray is not initialised; call ray.init() before opening a ray:// store")
    remote_class = ray.remote(num_cpus=0, max_restarts=0)(UnitRegistry)
    return remote_class.options(
        name=name, namespace=namespace, get_if_exists=True, lifetime="detached"
    ).remote()


class RayUnitStore:
    """A :class:`~knittrans.store.protocol.UnitStore` over the Ray object store."""

    def __init__(self, *, registry: str = DEFAULT_REGISTRY, namespace: str = DEFAULT_NAMESPACE) -> None:
        self._registry_name = registry
        self._namespace = namespace
        self._registry = registry_actor(registry, namespace)
        self._stats = ReadStats()

    @property
    def backend(self) -> str:
        return "ray"

    @property
    def stats(self) -> ReadStats:
        return self._stats

    def _call(self, method: str, *args: Any) -> Any:
        import ray

        try:
            return ray.get(getattr(self._registry, method).remote(*args))
        except ray.exceptions.ObjectStoreFullError as exc:
            raise StoreFullError(f"ray object store is full: {exc}") from exc
        except ray.exceptions.RayError as exc:
            raise StoreError(f"ray registry {self._registry_name!r} failed: {exc}") from exc

    def put_many(self, writes: Sequence[UnitWrite]) -> PutResult:
        unique = dedupe_writes(writes)
        addressed = [w.key for w in unique if w.content_addressed]
        known: list[str] = []
        if addressed:  # do not ship bytes the registry already holds
            known = [k for k, held in zip(addressed, self._call("exists", addressed), strict=True) if held]
            unique = [w for w in unique if w.key not in set(known)]
        if not unique:
            return PutResult(already_present=tuple(map(UnitKey, known)))
        status, key, created, present = self._call(
            "put_many",
            [w.key for w in unique],
            [w.content_addressed for w in unique],
            [np.frombuffer(w.data, dtype=np.uint8) for w in unique],
        )
        if status == "conflict":
            raise Conflict("key already holds different content", field=key)
        if status == "full":
            raise StoreFullError("ray object store is full", field=key)
        return PutResult(created=tuple(map(UnitKey, created)), already_present=tuple(map(UnitKey, known + present)))

    def get_into(self, key: UnitKey, buffer: BufferLike, ranges: Sequence[ByteRange] | None = None) -> int:
        return self.get_many_into([UnitRead.of(key, buffer, ranges)])[0]

    def get_many_into(self, reads: Sequence[UnitRead]) -> list[int]:
        import ray

        if not reads:
            return []
        results = []
        with self._stats.call() as tally:
            refs = self._call("lookup", [r.key for r in reads])
            for read, ref in zip(reads, refs, strict=True):
                if ref is None:
                    raise UnitNotFound("no such unit", field=read.key)
            try:
                arrays = ray.get(refs)
            except ray.exceptions.RayError as exc:
                raise StoreError(f"ray could not fetch units: {exc}") from exc
            # A ref read twice in one call is fetched once.
            fetched = {ref.hex(): array.nbytes for ref, array in zip(refs, arrays, strict=True)}
            tally.moved(sum(fetched.values()))
            for read, array in zip(reads, arrays, strict=True):
                count = _copy_ranges(read, memoryview(array).cast("B"))
                tally.completed(requested_bytes=count)
                results.append(count)
        return results

    def exists(self, keys: Sequence[UnitKey]) -> list[bool]:
        return list(self._call("exists", list(keys))) if keys else []

    def sizes(self, keys: Sequence[UnitKey]) -> list[int | None]:
        return list(self._call("sizes", list(keys))) if keys else []

    def delete_many(self, keys: Sequence[UnitKey]) -> int:
        return int(self._call("delete_many", list(dict.fromkeys(keys)))) if keys else 0

    def wait_removed(self, keys: Sequence[UnitKey]) -> None:
        return None  # the registry drops its reference at once

    def count(self) -> int:
        return int(self._call("count"))

    def register_buffer(self, buffer: BufferLike) -> None:
        return None

    def unregister_buffer(self, buffer: BufferLike) -> None:
        return None

    def close(self) -> None:
        return None

    def destroy(self) -> None:
        """Kill the registry actor, dropping every unit it owns (end of a job, tests)."""
        import ray

        ray.kill(self._registry, no_restart=True)


def _copy_ranges(read: UnitRead, source: memoryview) -> int:
    size = source.nbytes
    if read.ranges is None:
        if size > read.buffer.nbytes:
            raise InvalidArgument(f"the unit has {size} bytes, the buffer {read.buffer.nbytes}", field="buffer")
        read.buffer[:size] = source
        return size
    position = 0
    for byte_range in read.ranges:
        if byte_range.end > size:
            raise InvalidArgument(
                f"range [{byte_range.offset}, {byte_range.end}) is outside the unit's {size} bytes", field="range"
            )
    for byte_range in read.ranges:
        read.buffer[position : position + byte_range.length] = source[byte_range.offset : byte_range.end]
        position += byte_range.length
    return position
