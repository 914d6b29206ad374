"""The reporting half of the rollout client: metadata reports, batched in the background and retried.

Rollout workers call :meth:`BatchingReporter.report` from any thread; reports are sent in batches of up to
``max_batch`` trajectories, or after ``max_delay``, whichever comes first. Reports are idempotent by
trajectory id, so a batch that failed on the wire is simply sent again.

A bad submit fails at that submit, or at the next one, and leaves nothing behind:

* until the service has accepted a first report, :meth:`report` waits for the service's answer, so a
  systematic mistake (a source or an encoder the job does not have) fails the very submit that made it;
* a report the service rejects as invalid is not retried. Its trajectories are re-sent one by one, so the
  valid ones still get in; each rejected one is handed to the ``discard`` callback it was reported with
  (:class:`~knittrans.rollout.RolloutClient` removes its units from the store), and the error is raised from
  the next ``report``, ``flush`` or ``close``. A conflict (an id reported before with other content) is raised
  the same way, but nothing is discarded: the units under that id belong to the first report.
* a report that fails otherwise (the service out of reach past the retries, the admission client closed, or an
  error no client should raise) is raised from the next call too; the sender thread goes on with what comes
  next. Its trajectories were not acknowledged (their units stay until the service's unreported-unit expiry).

Reservations of shared units (:meth:`BatchingReporter.reserve_units`) are not batched: the rollout needs them
acknowledged before it writes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta

from knittrans.client.admission import AdmissionClient, ReportOutcome
from knittrans.errors import Conflict, InvalidArgument, KnitTransError
from knittrans.reservations import ReserveResult, UnitReservation
from knittrans.types import TrajectoryId, TrajectoryMeta

logger = logging.getLogger(__name__)

Discard = Callable[[Sequence[TrajectoryMeta]], None]


@dataclass(frozen=True)
class _Pending:
    meta: TrajectoryMeta
    discard: Discard | None


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
        self._pending: list[_Pending] = []
        self._in_flight = 0
        self._failure: KnitTransError | None = None
        self._accepted_once = False
        self._closed = False
        self._condition = threading.Condition()
        self._sender = threading.Thread(target=self._run, name="knittrans-reporter", daemon=True)
        self._sender.start()

    def reserve_units(self, reservations: Sequence[UnitReservation]) -> ReserveResult:
        return self._client.reserve_units(reservations)

    def cancel_reservations(self, trajectory_ids: Sequence[TrajectoryId]) -> None:
        self._client.cancel_reservations(trajectory_ids)

    def report(self, trajectories: Sequence[TrajectoryMeta], *, discard: Discard | None = None) -> None:
        """Queue reports; ``discard`` is called with those the service rejects as invalid (from the sender
        thread). Raises the error of an earlier rejected report, and, until the service has accepted one report,
        waits for this one's answer.

        These trajectories are queued even when an earlier error is raised: their units are already written, and
        a caller who sees the error cannot tell whether it came from this report or an earlier one, so dropping
        them would leave units that nothing reports or removes. Reporting them again is harmless (same content).
        """
        with self._condition:
            if self._closed:
                raise KnitTransError("the reporter is closed")
            self._pending.extend(_Pending(meta, discard) for meta in trajectories)
            self._condition.notify_all()
            self._raise_failure()
            accepted_once = self._accepted_once
        if not accepted_once:
            self.flush()

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

    def _fail(self, error: KnitTransError) -> None:
        with self._condition:
            if self._failure is None:  # the first error is the one to fix; the log has the others
                self._failure = error

    def _run(self) -> None:
        while True:
            with self._condition:
                self._condition.wait_for(lambda: self._pending or self._closed)
                if self._closed and not self._pending:
                    return
                if len(self._pending) < self._max_batch and self._accepted_once:
                    # Give a burst of completions a moment to share one RPC.
                    self._condition.wait(timeout=self._max_delay)
                batch = self._pending[: self._max_batch]
                del self._pending[: len(batch)]
                self._in_flight = len(batch)
            try:
                self._send(batch)
            except Exception as error:  # not an answer of the service: the thread must live on to raise it
                logger.exception("reporting %d trajectories failed", len(batch))
                self._fail(KnitTransError(f"reporting {len(batch)} trajectories failed: {error!r}"))
            finally:
                with self._condition:
                    self._in_flight = 0
                    self._condition.notify_all()

    def _send(self, batch: list[_Pending]) -> None:
        try:
            self._report(batch)
        except InvalidArgument as exc:
            if len(batch) == 1:
                self._reject(batch[0], exc)
                return
            logger.warning("the service rejected a report of %d trajectories (%s); sending them one by one",
                           len(batch), exc)
            for item in batch:
                try:
                    self._report([item])
                except InvalidArgument as one:
                    self._reject(item, one)
                except KnitTransError as one:
                    logger.error("reporting trajectory %s failed: %s", item.meta.trajectory_id, one)
                    self._fail(one)
        except KnitTransError as exc:
            logger.error("reporting %d trajectories failed: %s", len(batch), exc)
            self._fail(exc)

    def _report(self, batch: list[_Pending]) -> None:
        results = self._client.report([item.meta for item in batch])
        conflicts = [r for r in results if r.outcome is ReportOutcome.CONFLICT]
        with self._condition:
            self._accepted_once = self._accepted_once or len(conflicts) < len(results)
        if conflicts:
            raise Conflict(conflicts[0].reason, field=f"trajectory {conflicts[0].trajectory_id}")

    def _reject(self, item: _Pending, error: InvalidArgument) -> None:
        trajectory_id = item.meta.trajectory_id
        field = error.field.split(".", 1)[1] if error.field and "." in error.field else error.field
        # Held through the discard, so that nobody sees the units gone before the rejection is there to raise:
        # a submit made after that must raise it, not succeed and leave it to a later call. Rejections are rare,
        # and a submit waiting for one discard is the price.
        with self._condition:
            removed = ""
            if item.discard is not None:
                try:
                    item.discard([item.meta])
                    removed = "; its units were removed from the store"
                except Exception:
                    logger.exception("could not remove the units of rejected trajectory %s", trajectory_id)
            logger.error("the admission service rejected trajectory %s: %s", trajectory_id, error)
            self._fail(InvalidArgument(f"the admission service rejected trajectory {trajectory_id!r}: "
                                       f"{error.message}{removed}", field=field))
