"""The shell's side of reservation expiry (:mod:`~knittrans.admission.service.expiry`): stamping each journaled
reservation with its absolute expiry, and a background task that journals the expiry of reservations whose
trajectories were never reported, as a cancellation. Applying it frees the units (the trajectories' own, and
shared ones nothing else references), which the service's deleter then removes from the store."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager

from knittrans.errors import KnitTransError
from knittrans.v1 import admission_service_pb2 as pb
from knittrans.v1 import journal_pb2

logger = logging.getLogger(__name__)

DEFAULT_UNREPORTED_UNIT_TTL = 600.0  # seconds


def stamped(request: pb.ReserveUnitsRequest, now: float, ttl_seconds: float) -> pb.ReserveUnitsRequest:
    """The request as it is journaled: with its expiry, absolute, so that replay needs no clock."""
    journaled = pb.ReserveUnitsRequest()
    journaled.CopyFrom(request)
    journaled.expires_at = now + ttl_seconds
    return journaled


def sweep_interval(ttl_seconds: float) -> float:
    """How often to look: a few times per TTL, so a unit outlives its TTL by a fraction of it at most."""
    return max(0.05, min(ttl_seconds / 4, 10.0))


async def collect_expired(
    *,
    ledger,  # AdmissionLedger
    mutating: Callable[[], AbstractAsyncContextManager[object]],
    commit: Callable[[journal_pb2.JournalRecord], Awaitable[object]],
    clock: Callable[[], float],
    ttl_seconds: float,
) -> None:
    """Forever: journal the expiry of every reservation past its time (runs until cancelled)."""
    interval = sweep_interval(ttl_seconds)
    while True:
        await asyncio.sleep(interval)
        try:
            async with mutating():
                expired = await expire_due(ledger=ledger, commit=commit, now=clock())
            if not expired:
                continue
            logger.warning("reservations of %d trajectories never reported expired (their rollout died between "
                           "writing and reporting?); deleting their units: %s", len(expired),
                           ", ".join(expired[:5]) + (", ..." if len(expired) > 5 else ""))
        except KnitTransError as error:  # Redis unavailable, say: tried again at the next sweep
            logger.warning("could not journal expired reservations: %s", error)


async def expire_due(*, ledger, commit: Callable[[journal_pb2.JournalRecord], Awaitable[object]],
                     now: float) -> list[str]:
    """Journal the expiry of the reservations past their time at ``now`` (the caller holds the mutation lock);
    returns their trajectories."""
    expired = ledger.expiry.expired(now, limit=ledger.settings.max_report_batch)
    if expired:
        cancelled = pb.CancelReservationsRequest(request_id=f"expired/{now:.6f}", trajectory_ids=expired)
        await commit(journal_pb2.JournalRecord(at=now, reservations_cancelled=cancelled))
    return expired
