"""Applying the journal's reservation records to the ledger: ``reserved`` (a ``ReserveUnits`` call) and
``reservations_cancelled`` (a ``CancelReservations`` call, or reservations that expired unreported; see
:mod:`~knittrans.admission.service.expiry`). The ledger calls these from its record handlers."""

from __future__ import annotations

from typing import TYPE_CHECKING

from knittrans.types import SampleId, TrajectoryId, UnitKey
from knittrans.v1 import journal_pb2

if TYPE_CHECKING:
    from knittrans.admission.service.ledger import AdmissionLedger


def apply_reserved(ledger: AdmissionLedger, record: journal_pb2.JournalRecord) -> None:
    expires_at = record.reserved.expires_at
    for reservation in record.reserved.reservations:
        trajectory_id = TrajectoryId(reservation.trajectory_id)
        if ledger.is_reported(trajectory_id):
            continue  # a retried submit whose report already arrived: the report holds the units
        keys = [UnitKey(key) for key in reservation.multimodal_keys]
        own = [UnitKey(key) for key in reservation.unit_keys]
        if ledger.index.reserve(trajectory_id, SampleId(reservation.sample_id), keys):
            ledger.expiry.hold(trajectory_id, expires_at, own)
            ledger.revive([*keys, *own])


def apply_cancelled(ledger: AdmissionLedger, record: journal_pb2.JournalRecord) -> tuple[UnitKey, ...]:
    """Drop the reservations; returns the keys to delete: multimodal units nothing else references, and the
    trajectories' own units (never reported, so nothing else can reference them)."""
    trajectory_ids = [TrajectoryId(t) for t in record.reservations_cancelled.trajectory_ids]
    freed = ledger.index.cancel_reservations(trajectory_ids) + ledger.expiry.drop(trajectory_ids)
    for key in freed:
        ledger.pending_deletes[key] = None
        ledger.media_forget(key)
    return freed
