"""The hierarchical index: sample -> trajectories -> unit keys, with reference counts.

A trajectory owns its per-token and non-sequence units (count 1). A multimodal unit belongs to one
sample (its key is scoped by the sample id and embeds the content hash) and is counted once per live
trajectory of that sample that consumes it. Scoping by sample means releasing one sample can never
delete another sample's inputs.

The index is deterministic and does no I/O. Its owner, the admission service, keeps it in journaled
state and decides releases (DESIGN.md §2 step 7): :meth:`UnitIndex.release` returns the keys that just
lost their last reference, and the owner deletes them from the store in batches (``delete_many``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from knittrans.errors import Conflict, InvalidArgument
from knittrans.types import SampleId, TrajectoryId, TrajectoryMeta, UnitKey, check_id


@dataclass(frozen=True, kw_only=True)
class IndexEntry:
    """The keys one trajectory references."""

    trajectory_id: TrajectoryId
    sample_id: SampleId
    unit_keys: tuple[UnitKey, ...] = ()
    multimodal_keys: tuple[UnitKey, ...] = ()

    def __post_init__(self) -> None:
        check_id(self.trajectory_id, "trajectory_id")
        check_id(self.sample_id, "sample_id")
        object.__setattr__(self, "unit_keys", tuple(self.unit_keys))
        object.__setattr__(self, "multimodal_keys", tuple(dict.fromkeys(self.multimodal_keys)))
        for i, key in enumerate(self.unit_keys):
            check_id(key, f"unit_keys[{i}]")
        if len(set(self.unit_keys)) != len(self.unit_keys):
            raise InvalidArgument("a unit key appears twice", field="unit_keys")
        for i, key in enumerate(self.multimodal_keys):
            check_id(key, f"multimodal_keys[{i}]")
            if key in self.unit_keys:
                raise InvalidArgument("is also one of the trajectory's own units", field=f"multimodal_keys[{i}]")

    @classmethod
    def from_meta(cls, meta: TrajectoryMeta) -> IndexEntry:
        return cls(
            trajectory_id=meta.trajectory_id,
            sample_id=meta.sample_id,
            unit_keys=tuple(unit.key for unit in meta.units),
            multimodal_keys=tuple(ref.key for ref in meta.multimodal),
        )

    @property
    def keys(self) -> tuple[UnitKey, ...]:
        return self.unit_keys + self.multimodal_keys


class UnitIndex:
    """Mutable, deterministic and free of I/O; its owner serialises access and journals the changes."""

    def __init__(self, entries: Iterable[IndexEntry] = ()) -> None:
        self._entries: dict[TrajectoryId, IndexEntry] = {}
        self._by_sample: dict[SampleId, dict[TrajectoryId, None]] = {}
        self._refcounts: dict[UnitKey, int] = {}
        self._key_owner: dict[UnitKey, SampleId | TrajectoryId] = {}
        for entry in entries:
            self.add(entry)

    def add(self, entry: IndexEntry) -> bool:
        """Index a trajectory; False if the identical entry is already there (reports are idempotent).

        Raises :class:`Conflict` for a different entry under the same trajectory id, and
        :class:`InvalidArgument` when a key is already owned elsewhere (another trajectory's unit, or a
        multimodal unit of another sample).
        """
        existing = self._entries.get(entry.trajectory_id)
        if existing is not None:
            if existing != entry:
                raise Conflict("already indexed with different keys", field=entry.trajectory_id)
            return False
        for key in entry.unit_keys:
            if key in self._key_owner:
                raise InvalidArgument(f"already referenced by {self._key_owner[key]!r}", field=key)
        for key in entry.multimodal_keys:
            owner = self._key_owner.get(key)
            if owner is not None and owner != entry.sample_id:
                raise InvalidArgument(f"belongs to {owner!r}, not to sample {entry.sample_id!r}", field=key)
        self._entries[entry.trajectory_id] = entry
        self._by_sample.setdefault(entry.sample_id, {})[entry.trajectory_id] = None
        for key in entry.unit_keys:
            self._key_owner[key] = entry.trajectory_id
            self._refcounts[key] = 1
        for key in entry.multimodal_keys:
            self._key_owner[key] = entry.sample_id
            self._refcounts[key] = self._refcounts.get(key, 0) + 1
        return True

    def release(self, trajectory_ids: Iterable[TrajectoryId]) -> tuple[UnitKey, ...]:
        """Drop trajectories; returns the keys that lost their last reference, to delete from the store.

        Unknown (or already released) trajectories are skipped, so a replayed release is harmless.
        """
        freed: list[UnitKey] = []
        for trajectory_id in trajectory_ids:
            entry = self._entries.pop(trajectory_id, None)
            if entry is None:
                continue
            siblings = self._by_sample[entry.sample_id]
            del siblings[trajectory_id]
            if not siblings:
                del self._by_sample[entry.sample_id]
            for key in entry.keys:
                remaining = self._refcounts[key] - 1
                if remaining:
                    self._refcounts[key] = remaining
                else:
                    del self._refcounts[key]
                    del self._key_owner[key]
                    freed.append(key)
        return tuple(freed)

    def entry(self, trajectory_id: TrajectoryId) -> IndexEntry:
        try:
            return self._entries[trajectory_id]
        except KeyError:
            raise InvalidArgument("not indexed", field=trajectory_id) from None

    def trajectories(self, sample_id: SampleId) -> tuple[TrajectoryId, ...]:
        return tuple(self._by_sample.get(sample_id, ()))

    def samples(self) -> tuple[SampleId, ...]:
        return tuple(self._by_sample)

    def owner(self, key: UnitKey) -> SampleId | TrajectoryId | None:
        """The trajectory that owns a unit, or the sample that owns a multimodal unit; None if unknown."""
        return self._key_owner.get(key)

    def refcount(self, key: UnitKey) -> int:
        return self._refcounts.get(key, 0)

    def live_keys(self) -> frozenset[UnitKey]:
        return frozenset(self._refcounts)

    def entries(self) -> tuple[IndexEntry, ...]:
        """Every entry in insertion order; ``UnitIndex(index.entries())`` rebuilds the same index."""
        return tuple(self._entries.values())

    def __contains__(self, trajectory_id: object) -> bool:
        return trajectory_id in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[TrajectoryId]:
        return iter(self._entries)
