"""`AsyncRolloutClient`: :class:`~knittrans.rollout.RolloutClient` for asyncio rollout servers (sglang, vLLM,
slime's rollout), with nothing blocking on the event loop.

::

    async with AsyncAdmissionClient("admission:50051") as admission:
        rollout = AsyncRolloutClient(open_store("mooncake://..."), namespace="job", reporter=admission)
        meta = await rollout.submit({"input_ids": ids, "loss_mask": mask}, trajectory_id=..., ...)

It takes the same arguments and does the same steps as the sync client, with the same validation, clean-up and
errors: the splitting is the sync client's (:meth:`~knittrans.rollout.RolloutClient.split_many`) and the I/O
steps are :func:`knittrans.submission.store_and_report`. What differs is how each step waits: splitting
(a torch tensor may have to come off the GPU, an image is hashed) and every store call (the file, Ray and
Mooncake stores block) run in ``executor`` (the loop's default executor when None); the admission service is
awaited on grpc.aio. Concurrent submits proceed concurrently.

``reporter`` is an :class:`~knittrans.client.aio.AsyncAdmissionClient` (opened in this loop), or anything with
its ``async report``; with its ``reserve_units`` and ``cancel_reservations``, multimodal units are reserved
before they are written. It reports each submit at once and raises the service's rejection from that submit,
after removing its units.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import Executor
from typing import Any, Protocol, TypeVar, runtime_checkable

from knittrans.client.model import ReportResult
from knittrans.reservations import ReserveResult, UnitReservation
from knittrans.rollout import DEFAULT_BATCH_BYTES, MultimodalInput, RolloutClient, Trajectory
from knittrans.store.protocol import UnitStore, UnitWrite
from knittrans.submission import store_and_report
from knittrans.types import FieldAlignment, TrajectoryId, TrajectoryMeta, UnitKey, VersionSegment

T = TypeVar("T")


class AsyncMetadataReporter(Protocol):
    """Receives the metadata of stored trajectories (:class:`~knittrans.client.aio.AsyncAdmissionClient` does)."""

    async def report(self, trajectories: Sequence[TrajectoryMeta]) -> Sequence[ReportResult]: ...


@runtime_checkable
class AsyncUnitReserver(Protocol):
    async def reserve_units(self, reservations: Sequence[UnitReservation]) -> ReserveResult: ...

    async def cancel_reservations(self, trajectory_ids: Sequence[TrajectoryId]) -> object: ...


class ExecutorSubmitIO:
    """The async client's :class:`~knittrans.submission.SubmitIO`: store calls in an executor, reports awaited."""

    def __init__(self, store: UnitStore, reporter: AsyncMetadataReporter | None, executor: Executor | None) -> None:
        self._store = store
        self._reporter = reporter
        self._reserver = reporter if isinstance(reporter, AsyncUnitReserver) else None
        self._executor = executor

    async def run(self, function: Callable[[], T]) -> T:
        """``function()`` in the executor. A thread cannot be stopped: when the caller is cancelled, this
        waits for the call to end before raising CancelledError, so that what it did is known (and cleaned up)."""
        future = asyncio.get_running_loop().run_in_executor(self._executor, function)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            await asyncio.wait([future])
            raise

    async def reserve_units(self, reservations: Sequence[UnitReservation]) -> frozenset[TrajectoryId]:
        if self._reserver is None:
            return frozenset()
        return (await self._reserver.reserve_units(reservations)).already_reported

    async def cancel_reservations(self, trajectory_ids: Sequence[TrajectoryId]) -> None:
        if self._reserver is not None:
            await self._reserver.cancel_reservations(trajectory_ids)

    async def put_many(self, writes: Sequence[UnitWrite], created: list[UnitKey]) -> None:
        await self.run(lambda: created.extend(self._store.put_many(writes).created))

    async def delete_many(self, keys: Sequence[UnitKey]) -> None:
        await self.run(lambda: self._store.delete_many(keys))

    async def report(self, metas: Sequence[TrajectoryMeta]) -> Sequence[ReportResult] | None:
        return None if self._reporter is None else await self._reporter.report(metas)


class AsyncRolloutClient:
    """Writes trajectories' units to a unit store and returns (and optionally reports) their metadata, from
    coroutines (see the module docstring)."""

    def __init__(
        self,
        store: UnitStore,
        *,
        namespace: str = "default",
        reporter: AsyncMetadataReporter | None = None,
        batch_bytes: int = DEFAULT_BATCH_BYTES,
        clock: Callable[[], float] = time.time,
        executor: Executor | None = None,
    ) -> None:
        self._splitter = RolloutClient(store, namespace=namespace, batch_bytes=batch_bytes, clock=clock)
        self._batch_bytes = batch_bytes
        self._io = ExecutorSubmitIO(store, reporter, executor)

    @property
    def store(self) -> UnitStore:
        return self._splitter.store

    async def submit(
        self,
        fields: Mapping[str, Any],
        *,
        trajectory_id: str,
        sample_id: str,
        source: str,
        rollout_step: int,
        segments: Sequence[VersionSegment],
        multimodal: Sequence[MultimodalInput] = (),
        scalars: Mapping[str, float] | None = None,
        int_scalars: Mapping[str, int] | None = None,
        bool_scalars: Mapping[str, bool] | None = None,
        metadata: Mapping[str, Any] | None = None,
        accepted: bool = True,
        finished_at: float | None = None,
        tokens_field: str = "input_ids",
        loss_mask_field: str | None = "loss_mask",
        non_sequence_fields: Collection[str] = (),
        field_alignment: Mapping[str, FieldAlignment | str] | None = None,
        response_start: int = 0,
        response_fields: Collection[str] = (),
    ) -> TrajectoryMeta:
        """:meth:`RolloutClient.submit <knittrans.rollout.RolloutClient.submit>`, awaited."""
        trajectory = Trajectory(
            trajectory_id=trajectory_id,
            sample_id=sample_id,
            source=source,
            rollout_step=rollout_step,
            segments=segments,
            fields=fields,
            multimodal=multimodal,
            scalars=scalars or {},
            int_scalars=int_scalars or {},
            bool_scalars=bool_scalars or {},
            metadata=metadata or {},
            accepted=accepted,
            finished_at=finished_at,
            tokens_field=tokens_field,
            loss_mask_field=loss_mask_field,
            non_sequence_fields=non_sequence_fields,
            field_alignment=field_alignment or {},
            response_start=response_start,
            response_fields=response_fields,
        )
        return (await self.submit_many([trajectory]))[0]

    async def submit_many(self, trajectories: Sequence[Trajectory]) -> list[TrajectoryMeta]:
        """Store several trajectories with shared batches; all are validated before anything is written."""
        metas, writes = await self._io.run(lambda: self._splitter.split_many(trajectories))
        await store_and_report(metas, writes, self._io, batch_bytes=self._batch_bytes)
        return metas
