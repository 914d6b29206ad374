"""`AdmissionClient`: typed, deadline-bound calls to the admission service, for code without an event loop.

It runs the one admission client, :class:`~knittrans.client.aio.AsyncAdmissionClient`, on an event loop of
its own in a background thread: the same calls, retries and errors (status codes come back as the same
:class:`~knittrans.errors.KnitTransError` classes the service raised).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine, Iterator, Sequence
from datetime import timedelta
from typing import Any, TypeVar

from knittrans.client.aio import AsyncAdmissionClient
from knittrans.client.connection import ConnectionSettings
from knittrans.client.model import (
    DEFAULT_DEADLINE,
    AdmissionStatus,
    Assignment,
    ConsumerFailure,
    MiniBatchVerdict,
    ProgressStage,
    Registration,
    ReportOutcome,
    ReportResult,
    SourceStatus,
    VerdictState,
    assignment_from_proto,
    new_request_id,
    status_from_proto,
)
from knittrans.errors import error_class_for_status
from knittrans.types import ConsumerId, TrajectoryId, TrajectoryMeta, UnitReservation
from knittrans.v1 import trajectory_pb2

T = TypeVar("T")

__all__ = [
    "DEFAULT_DEADLINE",
    "AdmissionClient",
    "AdmissionStatus",
    "Assignment",
    "ConsumerFailure",
    "MiniBatchVerdict",
    "ProgressStage",
    "Registration",
    "ReportOutcome",
    "ReportResult",
    "SourceStatus",
    "VerdictState",
    "assignment_from_proto",
    "new_request_id",
    "status_from_proto",
]


class _LoopThread:
    """An event loop running in a daemon thread; :meth:`run` blocks the caller on one coroutine."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            # The client closed under a waiting call: what a closed grpc channel raises.
            raise error_class_for_status("CANCELLED")("Channel closed!") from None

    def in_loop_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def stop(self) -> None:
        if self.loop.is_closed():
            return

        async def cancel_the_rest() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.loop.shutdown_asyncgens()

        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(cancel_the_rest(), self.loop).result()
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join()
        self.loop.close()


class AdmissionClient:
    def __init__(self, connection: ConnectionSettings | str, *, deadline: timedelta = DEFAULT_DEADLINE) -> None:
        self.connection = ConnectionSettings(target=connection) if isinstance(connection, str) else connection
        self._loop = _LoopThread(name=f"admission-client {self.connection.target}")

        async def open_client() -> AsyncAdmissionClient:  # on the loop: the channel belongs to it
            return AsyncAdmissionClient(self.connection, deadline=deadline)

        try:
            self._client = self._loop.run(open_client())
        except BaseException:
            self._loop.stop()
            raise

    def close(self) -> None:
        if not self._loop.loop.is_closed():
            self._loop.run(self._client.close())
            self._loop.stop()

    def __enter__(self) -> AdmissionClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def report(
        self,
        trajectories: Sequence[TrajectoryMeta | trajectory_pb2.TrajectoryMetadata],
        *,
        request_id: str | None = None,
        deadline: timedelta | None = None,
        columnar: bool = True,
    ) -> list[ReportResult]:
        """Report trajectories; one result per trajectory, in order. They travel as one columnar
        ``TrajectoryBatch`` (the service checks and stores those several times faster than a list of messages),
        unless ``columnar`` is false or a message has no columnar form (a unit without a header, which the
        service rejects either way)."""
        return self._loop.run(self._client.report(trajectories, request_id=request_id, deadline=deadline,
                                                  columnar=columnar))

    def reserve_units(
        self, reservations: Sequence[UnitReservation], *, request_id: str | None = None,
        deadline: timedelta | None = None,
    ) -> int:
        """Reserve the multimodal units these trajectories will reference, before writing them (see
        ``ReserveUnits`` in the proto); returns how many reservations were new."""
        return self._loop.run(self._client.reserve_units(reservations, request_id=request_id, deadline=deadline))

    def cancel_reservations(
        self, trajectory_ids: Sequence[TrajectoryId], *, request_id: str | None = None,
        deadline: timedelta | None = None,
    ) -> int:
        """Drop the reservations of trajectories that will never be reported; returns how many were held."""
        return self._loop.run(self._client.cancel_reservations(trajectory_ids, request_id=request_id,
                                                               deadline=deadline))

    def report_scheduled(
        self, rollout_step: int, count: int, *, request_id: str | None = None, deadline: timedelta | None = None
    ) -> int:
        return self._loop.run(self._client.report_scheduled(rollout_step, count, request_id=request_id,
                                                            deadline=deadline))

    def register_consumer(self, consumer: ConsumerId, *, deadline: timedelta | None = None) -> Registration:
        return self._loop.run(self._client.register_consumer(consumer, deadline=deadline))

    def watch_assignments(self, consumer: ConsumerId, *, after_sequence: int = 0) -> Iterator[Assignment]:
        """Yield assignments in order; the stream has no deadline (keep-alive pings detect a dead peer)."""
        stream = self._client.watch_assignments(consumer, after_sequence=after_sequence)

        async def next_assignment() -> Assignment | None:
            try:
                return await anext(stream)
            except StopAsyncIteration:
                return None

        try:
            while (assignment := self._loop.run(next_assignment())) is not None:
                yield assignment
        finally:
            if self._loop.in_loop_thread():  # collected on the loop's own thread: it must not wait for itself
                self._loop.loop.create_task(stream.aclose())
            elif not self._loop.loop.is_closed():
                self._loop.run(stream.aclose())

    def report_progress(
        self, consumer: ConsumerId, sequence: int, stage: ProgressStage, *, deadline: timedelta | None = None
    ) -> bool:
        return self._loop.run(self._client.report_progress(consumer, sequence, stage, deadline=deadline))

    def advance_version(self, train_batch_index: int, new_version: int, *, deadline: timedelta | None = None) -> int:
        return self._loop.run(self._client.advance_version(train_batch_index, new_version, deadline=deadline))

    def status(self, *, deadline: timedelta | None = None) -> AdmissionStatus:
        """The job's state; like every read, retried while the service is unavailable (not started yet, restarting)."""
        return self._loop.run(self._client.status(deadline=deadline))

    def report_consumer_failure(
        self, failure: ConsumerFailure, *, request_id: str | None = None, deadline: timedelta | None = None
    ) -> bool:
        """A consumer could not read or pack a mini-batch; returns False when it had already reported one."""
        return self._loop.run(self._client.report_consumer_failure(failure, request_id=request_id,
                                                                   deadline=deadline))

    def wait_minibatch_verdict(
        self, sequence: int, *, wait: timedelta, deadline: timedelta | None = None
    ) -> MiniBatchVerdict:
        """One long poll for the verdict on mini-batch ``sequence`` (PENDING if none came within ``wait``)."""
        return self._loop.run(self._client.wait_minibatch_verdict(sequence, wait=wait, deadline=deadline))
