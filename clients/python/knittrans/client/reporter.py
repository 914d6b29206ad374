"""The reporting half of the rollout client: metadata reports, batched in the background and retried.

Rollout workers call :meth:`BatchingReporter.report` from any thread; reports are sent in batches of up to
``max_batch`` trajectories, or after ``max_delay``, whichever comes first. Reports are idempotent by
trajectory id, so a batch that failed on the wire is simply sent again. A batch the service rejects
(invalid input, conflict) is not retried: the error is raised from the next ``report`` or ``flush``.
Reservations of shared units (:meth:`BatchingReporter.reserve_units`) are not batched: the rollout needs
them acknowledged before it writes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from datetime import timedelta

from knittrans.client.admission import AdmissionClient, ReportOutcome
from knittrans.errors import Conflict, KnitTransError
from knittrans.types import TrajectoryId, TrajectoryMeta, UnitReservation

logger = logging.getLogger(__name__)


class BatchingReporter:
    def __init__(
        self,
        client: AdmissionClient,
        *,
        max_batch: int = 1000,
        max_delay: timedelta = timedelta(milliseconds=20),
    ) -> None:
        self._client = client
        self._max_batch = max_batch
        self._max_delay = max_delay.total_seconds()
        self._pending: list[TrajectoryMeta] = []
        self._in_flight = 0
        self._failure: KnitTransError | None = None
        self._closed = False
        self._condition = threading.Condition()
        self._sender = threading.Thread(target=self._run, name="knittrans-reporter", daemon=True)
        self._sender.start()

    def reserve_units(self, reservations: Sequence[UnitReservation]) -> None:
        self._client.reserve_units(reservations)

    def cancel_reservations(self, trajectory_ids: Sequence[TrajectoryId]) -> None:
        self._client.cancel_reservations(trajectory_ids)

    def report(self, trajectories: Sequence[TrajectoryMeta]) -> None:
        with self._condition:
            self._raise_failure()
            if self._closed:
                raise KnitTransError("the reporter is closed")
            self._pending.extend(trajectories)
            self._condition.notify_all()

    def flush(self) -> None:
        """Block until every trajectory reported so far is acknowledged by the service."""
        with self._condition:
            self._condition.notify_all()
            self._condition.wait_for(lambda: (not self._pending and not self._in_flight) or self._failure is not None)
            self._raise_failure()

    def close(self) -> None:
        try:
            self.flush()
        finally:
            with self._condition:
                self._closed = True
                self._condition.notify_all()
            self._sender.join(timeout=30)

    def _raise_failure(self) -> None:
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise failure

    def _run(self) -> None:
        while True:
            with self._condition:
                self._condition.wait_for(lambda: self._pending or self._closed)
                if self._closed and not self._pending:
                    return
                if len(self._pending) < self._max_batch:
                    # Give a burst of completions a moment to share one RPC.
                    self._condition.wait(timeout=self._max_delay)
                batch = self._pending[: self._max_batch]
                del self._pending[: len(batch)]
                self._in_flight = len(batch)
            try:
                results = self._client.report(batch)
                conflicts = [r for r in results if r.outcome is ReportOutcome.CONFLICT]
                if conflicts:
                    raise Conflict(conflicts[0].reason, field=f"trajectory {conflicts[0].trajectory_id}")
            except KnitTransError as exc:
                logger.error("reporting %d trajectories failed: %s", len(batch), exc)
                with self._condition:
                    self._failure = exc
            finally:
                with self._condition:
                    self._in_flight = 0
                    self._condition.notify_all()
