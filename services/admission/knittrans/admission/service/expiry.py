"""When reservations of trajectories that were never reported expire (DESIGN.md §9, "Services restart cleanly").

A rollout reserves every unit key of a trajectory before it writes them (``ReserveUnits``). A worker killed
between its write and its report leaves units that nothing will ever release; its reservation names them, and
expires ``unreported_unit_ttl_seconds`` after it was made. The expiry time is journaled as an absolute time, so
replay rebuilds the same table; the shell's clock decides when to look (:meth:`ReservationExpiry.expired`), and
journals the expiry as a cancellation, whose application deletes the units nothing else references.

Deterministic and free of I/O, like the :class:`~knittrans.admission.service.index.UnitIndex` whose multimodal
reservations it complements: the index counts shared units, this table remembers each trajectory's own units
and when its reservation lapses. A report takes the reservation over, and then nothing of it expires.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from knittrans.types import TrajectoryId, UnitKey


class ReservationExpiry:
    """Trajectory -> (expiry, its own unit keys), for reservations neither reported nor cancelled yet. Only
    submits in flight hold one, so a scan over all of them is cheap."""

    def __init__(self) -> None:
        self._held: dict[TrajectoryId, tuple[float, tuple[UnitKey, ...]]] = {}

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, trajectory_id: TrajectoryId, expires_at: float, unit_keys: Iterable[UnitKey]) -> None:
        """Remember a new reservation (expires_at > 0; 0 means it never expires and is not held here)."""
        if expires_at > 0 and trajectory_id not in self._held:
            self._held[trajectory_id] = (expires_at, tuple(dict.fromkeys(unit_keys)))

    def held(self) -> Iterator[tuple[TrajectoryId, tuple[float, tuple[UnitKey, ...]]]]:
        """Every held reservation, as trajectory -> (expiry, its own unit keys), oldest first (for snapshots)."""
        return iter(self._held.items())

    def unit_keys(self, trajectory_id: TrajectoryId) -> tuple[UnitKey, ...]:
        held = self._held.get(trajectory_id)
        return () if held is None else held[1]

    def take_over(self, trajectory_ids: Iterable[TrajectoryId]) -> None:
        """The trajectories were reported: their report holds the units now, and nothing of them expires."""
        if self._held:
            for trajectory_id in trajectory_ids:
                self._held.pop(trajectory_id, None)

    def drop(self, trajectory_ids: Iterable[TrajectoryId]) -> tuple[UnitKey, ...]:
        """The reservations were cancelled (or expired): their own unit keys, which nothing references now."""
        freed: list[UnitKey] = []
        for trajectory_id in trajectory_ids:
            held = self._held.pop(trajectory_id, None)
            if held is not None:
                freed.extend(held[1])
        return tuple(freed)

    def expired(self, now: float, *, limit: int) -> list[TrajectoryId]:
        """Up to ``limit`` trajectories whose reservations expired at or before ``now``, oldest first."""
        due = sorted((expires_at, t) for t, (expires_at, _) in self._held.items() if expires_at <= now)
        return [t for _, t in due[:limit]]
