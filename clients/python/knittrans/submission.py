"""The I/O half of a submit, once, for :class:`~knittrans.rollout.RolloutClient` and
:class:`~knittrans.aio.AsyncRolloutClient`.

A submit is validated and split into units first (pure: :meth:`RolloutClient.split_many`); then
:func:`store_and_report` reserves the multimodal units, writes the units in batches, and reports the metadata,
cleaning up after a failure at each step (see :mod:`knittrans.rollout`). Its I/O goes through a
:class:`SubmitIO`: the sync client's blocks and never suspends (it runs the coroutine with
:func:`~knittrans.blocking.run_to_completion`); the async client's awaits the admission service on grpc.aio and
runs each blocking store call in an executor, off the event loop.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from typing import Protocol

from knittrans.client.model import ReportOutcome, ReportResult
from knittrans.errors import Conflict, InvalidArgument
from knittrans.reservations import UnitReservation
from knittrans.store.protocol import UnitWrite
from knittrans.types import TrajectoryId, TrajectoryMeta, UnitKey

logger = logging.getLogger(__name__)

Discard = Callable[[Sequence[TrajectoryMeta]], None]


class QueuedDespiteEarlierFailure(Exception):
    """A reporter that takes care of rejections itself queued this submit's metadata and raised what an earlier
    report met (:meth:`~knittrans.client.reporter.BatchingReporter.report`). The error is the caller's to see,
    but nothing of this submit is to be removed: its trajectories will be reported, and acknowledged, and the
    rejected ones were discarded by the reporter when they were rejected."""

    def __init__(self, error: InvalidArgument) -> None:
        super().__init__(str(error))
        self.error = error


class SubmitIO(Protocol):
    """The store and the reporter of a rollout client; a missing reporter makes the reporting steps no-ops."""

    async def reserve_units(self, reservations: Sequence[UnitReservation]) -> frozenset[TrajectoryId]:
        """Reserve the units; returns the trajectories the service had acknowledged already."""
        ...

    async def cancel_reservations(self, trajectory_ids: Sequence[TrajectoryId]) -> None: ...

    async def put_many(self, writes: Sequence[UnitWrite], created: list[UnitKey]) -> None:
        """Store the units, adding the keys this call created to ``created`` (also when it fails or is
        cancelled part-way: a cancelled call returns only once the store call it started has ended)."""
        ...

    async def delete_many(self, keys: Sequence[UnitKey]) -> None: ...

    async def report(self, metas: Sequence[TrajectoryMeta]) -> Sequence[ReportResult] | None:
        """Hand the metadata over. A reporter that batches takes care of rejections itself and returns None, or
        raises :class:`QueuedDespiteEarlierFailure`; one that reports at once returns its results or raises
        the service's rejection, after which :func:`store_and_report` removes what the submit stored."""
        ...


async def store_and_report(
    metas: Sequence[TrajectoryMeta], writes: Sequence[UnitWrite], io: SubmitIO, *, batch_bytes: int
) -> None:
    """Reserve, write, report (see the module docstring); a failure at any step leaves nothing of this submit
    behind, except multimodal units a sibling trajectory may already reference (released with their sample)."""
    reservations = [r for r in map(UnitReservation.of, metas) if r is not None]
    acknowledged = await io.reserve_units(reservations) if reservations else frozenset()
    if acknowledged:
        # A resubmit (a worker restarted, say): the acknowledged trajectory's units stay as they are, even if this
        # one's differ; its report answers DUPLICATE or CONFLICT without anything written.
        skipped = {key for meta in metas if meta.trajectory_id in acknowledged
                   for key in (*(unit.key for unit in meta.units), *(ref.key for ref in meta.multimodal))}
        writes = [write for write in writes if write.key not in skipped]
        logger.info("%d trajectories of this submit were acknowledged before; their units are not written again",
                    len(acknowledged))
    try:
        await _write(writes, io, batch_bytes)
    except BaseException:
        if reservations:
            try:
                await io.cancel_reservations([r.trajectory_id for r in reservations])
            except Exception:
                logger.exception("could not cancel the reservations of a failed submit")
        raise
    try:
        results = await io.report(metas)
    except QueuedDespiteEarlierFailure as queued:
        raise queued.error from None
    except InvalidArgument as rejection:
        # Never the acknowledged trajectories' units: they are theirs, not this submit's.
        await discard_rejected([meta for meta in metas if meta.trajectory_id not in acknowledged], io)
        raise _rejected(rejection, metas) from rejection
    conflicts = [r for r in results or () if r.outcome is ReportOutcome.CONFLICT]
    if conflicts:  # the units under that id belong to its first report: nothing to remove
        raise Conflict(conflicts[0].reason or "reported before with other content",
                       field=f"trajectory {conflicts[0].trajectory_id}")


async def discard_rejected(metas: Sequence[TrajectoryMeta], io: SubmitIO) -> None:
    """The admission service rejected these trajectories, so nothing will ever release their units: remove their
    own units, and cancel their reservations, so that the service deletes the multimodal units that no other
    trajectory, of any rollout worker, references."""
    keys = [unit.key for meta in metas for unit in meta.units]
    if keys:
        await io.delete_many(keys)
        logger.info("removed %d units of %d rejected trajectories", len(keys), len(metas))
    reserved = [meta.trajectory_id for meta in metas if meta.multimodal or meta.units]
    if reserved:
        try:
            await io.cancel_reservations(reserved)
        except Exception:  # the rejection is what the caller sees; a held reservation only delays a delete
            logger.exception("could not cancel the reservations of %d rejected trajectories", len(reserved))


def _rejected(rejection: InvalidArgument, metas: Sequence[TrajectoryMeta]) -> InvalidArgument:
    """The service's rejection in the submit's terms: which trajectory, and the submit argument at fault (the
    service names ``trajectories[i].source``; the caller passed ``source``), as the batching reporter says it."""
    match = re.fullmatch(r"trajectories\[(\d+)\](?:\.(.+))?", rejection.field or "")
    if match is None or int(match.group(1)) >= len(metas):
        return rejection
    trajectory_id = metas[int(match.group(1))].trajectory_id
    return InvalidArgument(f"the admission service rejected trajectory {trajectory_id!r}: {rejection.message}; "
                           "its units were removed from the store", field=match.group(2))


async def _write(writes: Sequence[UnitWrite], io: SubmitIO, batch_bytes: int) -> None:
    created: list[UnitKey] = []
    batch: list[UnitWrite] = []
    size = 0
    try:
        for write in writes:
            if batch and size + write.header.byte_length > batch_bytes:
                await io.put_many(batch, created)
                batch, size = [], 0
            batch.append(write)
            size += write.header.byte_length
        if batch:
            await io.put_many(batch, created)
    except BaseException:
        content_addressed = {w.key for w in writes if w.content_addressed}
        owned = [key for key in created if key not in content_addressed]
        if owned:
            try:
                await io.delete_many(owned)
            except Exception:
                logger.exception("could not remove %d units of a failed submit", len(owned))
        raise
