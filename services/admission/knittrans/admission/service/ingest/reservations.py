"""A ``ReserveUnits`` request checked whole before it is journaled: its ids, and its keys against each other and the
unit index (a reservation must not claim a unit of another sample or another trajectory's own unit)."""

from __future__ import annotations

from knittrans.admission.service.index import UnitIndex
from knittrans.errors import Conflict, InvalidArgument
from knittrans.types import SampleId, TrajectoryId, UnitKey, check_id
from knittrans.v1 import admission_service_pb2


def check_reservations(request: admission_service_pb2.ReserveUnitsRequest, index: UnitIndex, *, limit: int) -> None:
    """Validate a reservation request whole, naming the field; changes nothing."""
    if len(request.reservations) > limit:
        raise InvalidArgument(f"{len(request.reservations)} reservations exceed the limit of {limit}",
                              field="reservations")
    trial = UnitIndex()  # the request's own reservations must agree with each other as well
    for i, reservation in enumerate(request.reservations):
        where = f"reservations[{i}]"
        trajectory_id, sample_id = TrajectoryId(reservation.trajectory_id), SampleId(reservation.sample_id)
        keys = [UnitKey(key) for key in reservation.multimodal_keys]
        check_id(trajectory_id, f"{where}.trajectory_id")
        check_id(sample_id, f"{where}.sample_id")
        if not keys and not reservation.unit_keys:
            raise InvalidArgument("reserves nothing", field=f"{where}.unit_keys")
        for name, listed in (("multimodal_keys", keys), ("unit_keys", reservation.unit_keys)):
            for k, key in enumerate(listed):
                check_id(key, f"{where}.{name}[{k}]")
        if set(keys) & set(reservation.unit_keys):
            raise InvalidArgument("names a multimodal key as one of its own units", field=f"{where}.unit_keys")
        if trial.reservation(trajectory_id) is not None:
            raise InvalidArgument("appears twice in one request", field=f"{where}.trajectory_id")
        for held in (trial, index):
            try:
                held.check_reservation(trajectory_id, sample_id, keys)
            except Conflict as exc:
                raise InvalidArgument(exc.message, field=f"{where}.multimodal_keys") from None
            except InvalidArgument as exc:
                raise InvalidArgument(f"{exc.field}: {exc.message}", field=f"{where}.multimodal_keys") from None
        trial.reserve(trajectory_id, sample_id, keys)
