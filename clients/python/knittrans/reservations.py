"""A trajectory's reservation of the units it will reference, held by the admission service from before the
rollout writes them until the report takes it over (see :mod:`knittrans.rollout`)."""

from __future__ import annotations

from dataclasses import dataclass

from knittrans.errors import InvalidArgument
from knittrans.types import SampleId, TrajectoryId, TrajectoryMeta, UnitKey, check_id


@dataclass(frozen=True, kw_only=True)
class ReserveResult:
    """What ``ReserveUnits`` did: how many reservations were new, and which requested trajectories the service
    had acknowledged already (a resubmit must not write their units again)."""

    reserved: int = 0
    already_reported: frozenset[TrajectoryId] = frozenset()

    def __post_init__(self) -> None:
        if self.reserved < 0:
            raise InvalidArgument("must be >= 0", field="reserved")
        object.__setattr__(self, "already_reported", frozenset(self.already_reported))


@dataclass(frozen=True, kw_only=True)
class UnitReservation:
    """The units a trajectory will reference once reported, reserved before its rollout writes them: shared
    multimodal units (a sibling may have stored them already, and its release must not delete them in between)
    and its own units (deleted if it is never reported, after the service's ``unreported_unit_ttl_seconds``)."""

    trajectory_id: TrajectoryId
    sample_id: SampleId
    multimodal_keys: tuple[UnitKey, ...]
    unit_keys: tuple[UnitKey, ...] = ()

    def __post_init__(self) -> None:
        check_id(self.trajectory_id, "trajectory_id")
        check_id(self.sample_id, "sample_id")
        for name in ("multimodal_keys", "unit_keys"):
            object.__setattr__(self, name, tuple(dict.fromkeys(getattr(self, name))))
            for i, key in enumerate(getattr(self, name)):
                check_id(key, f"{name}[{i}]")
        if not self.multimodal_keys and not self.unit_keys:
            raise InvalidArgument("reserves nothing", field="unit_keys")

    @classmethod
    def of(cls, meta: TrajectoryMeta) -> UnitReservation | None:
        """The reservation a trajectory's report takes over, or None if it references no unit."""
        if not meta.multimodal and not meta.units:
            return None
        return cls(trajectory_id=meta.trajectory_id, sample_id=meta.sample_id,
                   multimodal_keys=tuple(ref.key for ref in meta.multimodal),
                   unit_keys=tuple(unit.key for unit in meta.units))
