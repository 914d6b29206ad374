"""The hierarchical index: sample -> trajectories -> unit keys, with reference counts.

A trajectory owns its per-token and non-sequence units (count 1). A multimodal unit belongs to one
sample (its key is scoped by the sample id and embeds the content hash) and is counted once per live
trajectory of that sample that consumes it. Scoping by sample means releasing one sample can never
delete another sample's inputs.

A trajectory that is written but not reported yet may already rely on a multimodal unit: its rollout
skips writing a unit a sibling stored first. So that no release frees such a unit in between, the rollout
reserves the keys before writing (:meth:`UnitIndex.reserve`). A reservation counts like a reference until
the trajectory is indexed, which takes it over, or until it is cancelled.

The index is deterministic and does no I/O. Its owner, the admission service, keeps it in journaled
state and decides releases (DESIGN.md §2 step 7): :meth:`UnitIndex.release` returns the keys that just
lost their last reference, and the owner deletes them from the store in batches (``delete_many``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import chain, repeat

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


@dataclass(frozen=True, kw_only=True, eq=False)
class CheckedEntries:
    """Trajectories :meth:`UnitIndex.check_many` found fit to add (the new ones only), for
    :meth:`UnitIndex.add_checked`. ``in_bulk`` tells whether the set checks settled it (else it took the
    entry-by-entry check)."""

    trajectory_ids: Sequence[TrajectoryId]
    sample_ids: Sequence[SampleId]
    unit_keys: Sequence[tuple[UnitKey, ...]]
    multimodal_keys: Sequence[tuple[UnitKey, ...]]
    flat_units: list[UnitKey]
    flat_media: list[UnitKey]
    sample_of: dict[UnitKey, SampleId]
    in_bulk: bool
    generation: int


class UnitIndex:
    """Mutable, deterministic and free of I/O; its owner serialises access and journals the changes."""

    def __init__(self, entries: Iterable[IndexEntry] = ()) -> None:
        # Trajectory -> (sample, unit keys, multimodal keys): the fields of its IndexEntry, built on request.
        self._entries: dict[TrajectoryId, tuple[SampleId, tuple[UnitKey, ...], tuple[UnitKey, ...]]] = {}
        self._by_sample: dict[SampleId, dict[TrajectoryId, None]] = {}
        self._refcounts: dict[UnitKey, int] = {}  # of multimodal keys; a trajectory's own unit counts 1
        # Trajectory not indexed yet -> (sample, multimodal keys it reserved); each key counts in _refcounts.
        self._reservations: dict[TrajectoryId, tuple[SampleId, tuple[UnitKey, ...]]] = {}
        self._key_owner: dict[UnitKey, SampleId | TrajectoryId] = {}
        self._generation = 0  # counts changes, so checked entries know whether they are still checked
        for entry in entries:
            self.add(entry)

    def add(self, entry: IndexEntry) -> bool:
        """Index a trajectory; False if the identical entry is already there (reports are idempotent).

        Raises :class:`Conflict` for a different entry under the same trajectory id, and
        :class:`InvalidArgument` when a key is already owned elsewhere (another trajectory's unit, or a
        multimodal unit of another sample).
        """
        fields = (entry.sample_id, entry.unit_keys, entry.multimodal_keys)
        existing = self._entries.get(entry.trajectory_id)
        if existing is not None:
            if existing != fields:
                raise Conflict("already indexed with different keys", field=entry.trajectory_id)
            return False
        for key in entry.unit_keys:
            if key in self._key_owner:
                raise InvalidArgument(f"already referenced by {self._key_owner[key]!r}", field=key)
        for key in entry.multimodal_keys:
            owner = self._key_owner.get(key)
            if owner is not None and owner != entry.sample_id:
                raise InvalidArgument(f"belongs to {owner!r}, not to sample {entry.sample_id!r}", field=key)
        self._generation += 1
        self._entries[entry.trajectory_id] = fields
        self._by_sample.setdefault(entry.sample_id, {})[entry.trajectory_id] = None
        for key in entry.unit_keys:
            self._key_owner[key] = entry.trajectory_id
        for key in entry.multimodal_keys:
            self._key_owner[key] = entry.sample_id
            self._refcounts[key] = self._refcounts.get(key, 0) + 1
        if self._reservations:
            self._take_over_reservations((entry.trajectory_id,))
        return True

    def add_many(
        self,
        trajectory_ids: Sequence[TrajectoryId],
        sample_ids: Sequence[SampleId],
        unit_keys: Sequence[tuple[UnitKey, ...]],
        multimodal_keys: Sequence[tuple[UnitKey, ...]],
    ) -> int:
        """Index many trajectories given as columns (trajectory ``i`` is element ``i`` of each): the same as
        :meth:`add` of their entries, in order, but all or nothing (every one is checked before any is added).
        Returns how many were new.

        The values must be what :class:`IndexEntry` accepts (valid ids, distinct unit keys, multimodal keys
        distinct and not among the trajectory's unit keys): they are not checked again here, because the caller
        (the admission service) validated them already, thousands of reports a second. Ownership is checked, a
        set operation at a time unless a rule breaks, then the trajectories are added a column at a time."""
        return self.add_checked(self.check_many(trajectory_ids, sample_ids, unit_keys, multimodal_keys))

    def check_many(
        self,
        trajectory_ids: Sequence[TrajectoryId],
        sample_ids: Sequence[SampleId],
        unit_keys: Sequence[tuple[UnitKey, ...]],
        multimodal_keys: Sequence[tuple[UnitKey, ...]],
    ) -> CheckedEntries:
        """The checks of :meth:`add_many`, changing nothing: raises what it would raise, else returns the entries
        ready for :meth:`add_checked` (a caller that must validate before it commits checks only once)."""
        count = len(trajectory_ids)
        if count and not (len(sample_ids) == len(unit_keys) == len(multimodal_keys) == count):
            raise InvalidArgument("needs one value per trajectory in every column", field="trajectory_ids")
        known = not self._entries.keys().isdisjoint(trajectory_ids) or len(set(trajectory_ids)) != count
        if known:  # some are indexed already (or twice here): settle entry by entry, in order
            fresh = self._check_sequentially(trajectory_ids, sample_ids, unit_keys, multimodal_keys)
            trajectory_ids = [trajectory_ids[i] for i in fresh]
            sample_ids = [sample_ids[i] for i in fresh]
            unit_keys = [unit_keys[i] for i in fresh]
            multimodal_keys = [multimodal_keys[i] for i in fresh]
        flat_units = list(chain.from_iterable(unit_keys))
        flat_media = list(chain.from_iterable(multimodal_keys))
        media_samples = list(chain.from_iterable(map(repeat, sample_ids, map(len, multimodal_keys))))
        unit_set = set(flat_units)
        sample_of = dict(zip(flat_media, media_samples, strict=True))
        owner = self._key_owner
        in_bulk = not known and (
            len(unit_set) == len(flat_units)
            and owner.keys().isdisjoint(unit_set)
            and unit_set.isdisjoint(sample_of)
            and list(map(sample_of.__getitem__, flat_media)) == media_samples
            and all(o is None or o == s for o, s in zip(map(owner.get, sample_of), sample_of.values(), strict=True))
        )
        if not in_bulk and not known:
            self._check_sequentially(trajectory_ids, sample_ids, unit_keys, multimodal_keys)
        return CheckedEntries(
            trajectory_ids=trajectory_ids, sample_ids=sample_ids, unit_keys=unit_keys,
            multimodal_keys=multimodal_keys, flat_units=flat_units, flat_media=flat_media, sample_of=sample_of,
            in_bulk=in_bulk, generation=self._generation,
        )

    def add_checked(self, checked: CheckedEntries) -> int:
        """Add entries :meth:`check_many` returned. Should the index have changed since, they are checked again."""
        if checked.generation != self._generation:
            checked = self.check_many(checked.trajectory_ids, checked.sample_ids, checked.unit_keys,
                                      checked.multimodal_keys)
        self._generation += 1
        trajectory_ids, sample_ids, unit_keys = checked.trajectory_ids, checked.sample_ids, checked.unit_keys
        self._entries.update(zip(trajectory_ids, zip(sample_ids, unit_keys, checked.multimodal_keys, strict=True),
                                 strict=True))
        by_sample = self._by_sample
        for trajectory_id, sample_id in zip(trajectory_ids, sample_ids, strict=True):
            siblings = by_sample.get(sample_id)
            if siblings is None:
                by_sample[sample_id] = {trajectory_id: None}
            else:
                siblings[trajectory_id] = None
        owner = self._key_owner
        owners = chain.from_iterable(map(repeat, trajectory_ids, map(len, unit_keys)))
        owner.update(zip(checked.flat_units, owners, strict=True))
        owner.update(checked.sample_of)
        refcounts = self._refcounts
        for key, uses in Counter(checked.flat_media).items():
            refcounts[key] = refcounts.get(key, 0) + uses
        if self._reservations:
            self._take_over_reservations(trajectory_ids)
        return len(trajectory_ids)

    def _check_sequentially(
        self,
        trajectory_ids: Sequence[TrajectoryId],
        sample_ids: Sequence[SampleId],
        unit_keys: Sequence[tuple[UnitKey, ...]],
        multimodal_keys: Sequence[tuple[UnitKey, ...]],
    ) -> list[int]:
        """Raise the error :meth:`add` would raise first, adding the entries one by one (nothing is changed);
        else return which entries are new (an identical one already indexed is skipped)."""
        claimed: dict[UnitKey, SampleId | TrajectoryId] = {}
        added: dict[TrajectoryId, tuple] = {}
        fresh: list[int] = []
        for i, (trajectory_id, sample_id, units, media) in enumerate(
            zip(trajectory_ids, sample_ids, unit_keys, multimodal_keys, strict=True)
        ):
            fields = (sample_id, units, media)
            existing = self._entries.get(trajectory_id) or added.get(trajectory_id)
            if existing is not None:
                if existing != fields:
                    raise Conflict("already indexed with different keys", field=trajectory_id)
                continue
            for key in units:
                owner = self._key_owner.get(key) or claimed.get(key)
                if owner is not None:
                    raise InvalidArgument(f"already referenced by {owner!r}", field=key)
            for key in media:
                owner = self._key_owner.get(key) or claimed.get(key)
                if owner is not None and owner != sample_id:
                    raise InvalidArgument(f"belongs to {owner!r}, not to sample {sample_id!r}", field=key)
            claimed.update(dict.fromkeys(units, trajectory_id))
            claimed.update(dict.fromkeys(media, sample_id))
            added[trajectory_id] = fields
            fresh.append(i)
        return fresh

    def release(self, trajectory_ids: Iterable[TrajectoryId]) -> tuple[UnitKey, ...]:
        """Drop trajectories; returns the keys that lost their last reference, to delete from the store.

        Unknown (or already released) trajectories are skipped, so a replayed release is harmless.
        """
        freed: list[UnitKey] = []
        self._generation += 1
        for trajectory_id in trajectory_ids:
            fields = self._entries.pop(trajectory_id, None)
            if fields is None:
                continue
            sample_id, units, media = fields
            siblings = self._by_sample[sample_id]
            del siblings[trajectory_id]
            if not siblings:
                del self._by_sample[sample_id]
            for key in units:
                del self._key_owner[key]
                freed.append(key)
            freed.extend(self._drop_references(media))
        return tuple(freed)

    def attach_unit(self, trajectory_id: TrajectoryId, key: UnitKey) -> None:
        """Count ``key`` (a unit a trainer role attached, see attachments) as one of the trajectory's own units, so
        that its release frees it with the others."""
        sample_id, units, media = self._entries[trajectory_id]
        if key in self._key_owner:
            raise InvalidArgument(f"already referenced by {self._key_owner[key]!r}", field=key)
        self._generation += 1
        self._entries[trajectory_id] = (sample_id, (*units, key), media)
        self._key_owner[key] = trajectory_id

    # -- reservations --------------------------------------------------------------------------------

    def reserve(self, trajectory_id: TrajectoryId, sample_id: SampleId, keys: Sequence[UnitKey]) -> bool:
        """Count ``keys`` (multimodal units of ``sample_id``) as referenced by a trajectory that is not indexed
        yet. False when nothing changed: the trajectory is indexed already, or holds this very reservation.

        Raises :class:`Conflict` for a different reservation under the same trajectory id, and
        :class:`InvalidArgument` when a key belongs to another sample or is a trajectory's own unit."""
        keys = tuple(dict.fromkeys(keys))
        if not self.check_reservation(trajectory_id, sample_id, keys):
            return False
        self._generation += 1
        self._reservations[trajectory_id] = (sample_id, keys)
        for key in keys:
            self._key_owner[key] = sample_id
            self._refcounts[key] = self._refcounts.get(key, 0) + 1
        return True

    def check_reservation(self, trajectory_id: TrajectoryId, sample_id: SampleId, keys: Sequence[UnitKey]) -> bool:
        """What :meth:`reserve` would raise, changing nothing; else whether it would change anything."""
        keys = tuple(dict.fromkeys(keys))
        if trajectory_id in self._entries:
            return False
        held = self._reservations.get(trajectory_id)
        if held is not None:
            if held != (sample_id, keys):
                raise Conflict("already holds a different reservation", field=trajectory_id)
            return False
        for key in keys:
            owner = self._key_owner.get(key)
            if owner is not None and (owner != sample_id or key not in self._refcounts):
                raise InvalidArgument(f"belongs to {owner!r}, not to sample {sample_id!r}", field=key)
        return True

    def reservation(self, trajectory_id: TrajectoryId) -> tuple[UnitKey, ...] | None:
        """The keys a trajectory reserved, or None if it holds no reservation."""
        held = self._reservations.get(trajectory_id)
        return None if held is None else held[1]

    @property
    def has_reservations(self) -> bool:
        return bool(self._reservations)

    def cancel_reservations(self, trajectory_ids: Iterable[TrajectoryId]) -> tuple[UnitKey, ...]:
        """Drop the reservations of trajectories that will never be indexed; returns the keys that lost their
        last reference. Trajectories without a reservation are skipped."""
        freed: list[UnitKey] = []
        for trajectory_id in trajectory_ids:
            held = self._reservations.pop(trajectory_id, None)
            if held is not None:
                self._generation += 1
                freed.extend(self._drop_references(held[1]))
        return tuple(freed)

    def _take_over_reservations(self, trajectory_ids: Iterable[TrajectoryId]) -> None:
        """A trajectory just indexed counts its multimodal keys itself, so its reservation no longer does. The
        owner rejects a report whose keys differ from its reservation, so no count can reach zero here."""
        for trajectory_id in trajectory_ids:
            held = self._reservations.pop(trajectory_id, None)
            if held is not None:
                left_unreferenced = self._drop_references(held[1])
                if left_unreferenced:
                    raise AssertionError(f"reserved keys {left_unreferenced} were not reported by {trajectory_id}")

    def _drop_references(self, keys: Iterable[UnitKey]) -> list[UnitKey]:
        freed = []
        for key in keys:
            remaining = self._refcounts[key] - 1
            if remaining:
                self._refcounts[key] = remaining
            else:
                del self._refcounts[key]
                del self._key_owner[key]
                freed.append(key)
        return freed

    def entry(self, trajectory_id: TrajectoryId) -> IndexEntry:
        try:
            sample_id, units, media = self._entries[trajectory_id]
        except KeyError:
            raise InvalidArgument("not indexed", field=trajectory_id) from None
        return IndexEntry(trajectory_id=trajectory_id, sample_id=sample_id, unit_keys=units, multimodal_keys=media)

    def trajectories(self, sample_id: SampleId) -> tuple[TrajectoryId, ...]:
        return tuple(self._by_sample.get(sample_id, ()))

    def samples(self) -> tuple[SampleId, ...]:
        return tuple(self._by_sample)

    def owner(self, key: UnitKey) -> SampleId | TrajectoryId | None:
        """The trajectory that owns a unit, or the sample that owns a multimodal unit; None if unknown."""
        return self._key_owner.get(key)

    def owners(self, keys: Iterable[UnitKey]) -> list[SampleId | TrajectoryId | None]:
        """:meth:`owner` of each key, in one call."""
        return list(map(self._key_owner.get, keys))

    def any_owned(self, keys: Iterable[UnitKey]) -> bool:
        """Whether any of these keys is referenced already."""
        return not self._key_owner.keys().isdisjoint(keys)

    def refcount(self, key: UnitKey) -> int:
        return self._refcounts.get(key, 1 if key in self._key_owner else 0)

    def live_keys(self) -> frozenset[UnitKey]:
        return frozenset(self._key_owner)

    def entries(self) -> tuple[IndexEntry, ...]:
        """Every entry in insertion order; ``UnitIndex(index.entries())`` rebuilds the same index."""
        return tuple(self.entry(trajectory_id) for trajectory_id in self._entries)

    def __contains__(self, trajectory_id: object) -> bool:
        return trajectory_id in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[TrajectoryId]:
        return iter(self._entries)
