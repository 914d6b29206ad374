"""The ready pool, indexed incrementally per source in policy order.

Policy order is (oldest version, ready time, unit id): the earliest staleness deadline first (the deadline
is the oldest version plus the bound, so ordering by version is the same order), then the oldest
completion, then the id, so replays are deterministic. Every selection the engine makes (deficit picks,
fill, stale drops) takes a prefix of some sources' orders, so each source keeps a sorted list with a
moving head: taking a prefix is O(1), an insertion is a binary search plus a short shift (arrivals come
mostly in completion order), and nothing is ever re-sorted.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections.abc import Sequence
from typing import NamedTuple

from knittrans.types import TrajectoryId

# (oldest version, ready time, unit id)
UnitKey = tuple[int, float, str]

NO_VERSION = 1 << 62  # the minimum version of an empty pool
_COMPACT_AT = 1024  # compact a queue's list once this many taken entries precede its head


class PooledUnit(NamedTuple):
    """One admission unit in the pool: a trajectory, or the accepted trajectories of one sample.

    A named tuple rather than a dataclass: one is built per report on the hot path, and it never leaves
    the engine.
    """

    key: UnitKey
    source: int
    trajectory_ids: tuple[TrajectoryId, ...]
    seq: int  # arrival order; units with seq below a train batch's start were its carry-over

    @property
    def unit_id(self) -> str:
        return self.key[2]


class SourceQueue:
    """One source's units in policy order: ``keys[head:]``."""

    __slots__ = ("head", "keys")

    def __init__(self) -> None:
        self.keys: list[UnitKey] = []
        self.head = 0

    def __len__(self) -> int:
        return len(self.keys) - self.head

    def pop_prefix(self, count: int) -> list[UnitKey]:
        head = self.head
        taken = self.keys[head : head + count]
        self.head = head + len(taken)
        if self.head >= _COMPACT_AT and 2 * self.head >= len(self.keys):
            del self.keys[: self.head]
            self.head = 0
        return taken

    def remove(self, key: UnitKey) -> bool:
        keys = self.keys
        index = bisect_left(keys, key, lo=self.head)
        if index == len(keys) or keys[index] != key:
            return False
        if index == self.head:
            self.pop_prefix(1)
        else:
            del keys[index]
        return True

    def count_below(self, version: int) -> int:
        """How many units at the head have an oldest version below ``version``."""
        return bisect_left(self.keys, (version,), lo=self.head) - self.head

    def head_version(self) -> int:
        return self.keys[self.head][0] if len(self.keys) > self.head else NO_VERSION


class ReadyPool:
    """Ready, accepted units per source; counts and the oldest version are kept up to date."""

    __slots__ = ("min_version", "queues", "sizes", "total", "units")

    def __init__(self, num_sources: int) -> None:
        self.queues = tuple(SourceQueue() for _ in range(num_sources))
        self.units: dict[str, PooledUnit] = {}
        self.sizes = [0] * num_sources  # units per source, read on every decision
        self.total = 0
        self.min_version = NO_VERSION

    def __contains__(self, unit_id: str) -> bool:
        return unit_id in self.units

    def counts(self) -> list[int]:
        return list(self.sizes)

    def insert(self, unit: PooledUnit) -> None:
        key = unit.key
        self.units[key[2]] = unit
        queue = self.queues[unit.source]
        keys = queue.keys
        if keys and keys[-1] > key:  # arrivals come mostly in policy order: usually an append
            insort(keys, key, lo=queue.head)
        else:
            keys.append(key)
        self.sizes[unit.source] += 1
        self.total += 1
        if key[0] < self.min_version:
            self.min_version = key[0]

    def insert_many(self, keys: Sequence[UnitKey], sources: list[int], units: list[PooledUnit]) -> None:
        """Insert units (with their keys and sources, column by column) as :meth:`insert` would one by one: each
        source's new keys are sorted once and merged with its queue's tail (usually just appended: arrivals come
        mostly in policy order)."""
        if not units:
            return
        self.units.update(zip([key[2] for key in keys], units, strict=True))
        present = set(sources)
        for source in present:
            mine = keys if len(present) == 1 else [key for key, s in zip(keys, sources, strict=True) if s == source]
            new = sorted(mine)
            added = len(new)
            queue = self.queues[source]
            existing = queue.keys
            if existing and existing[-1] > new[0]:
                at = bisect_left(existing, new[0], lo=queue.head)
                new = sorted(existing[at:] + new)  # two sorted runs: a linear merge
                del existing[at:]
            existing.extend(new)
            self.sizes[source] += added
        self.total += len(units)
        lowest = min(key[0] for key in keys)
        if lowest < self.min_version:
            self.min_version = lowest

    def take_prefixes(self, counts: dict[int, int]) -> list[PooledUnit]:
        """Remove and return the first ``counts[source]`` units of each source."""
        units = self.units
        taken: list[PooledUnit] = []
        for source, count in counts.items():
            prefix = self.queues[source].pop_prefix(count)
            self.sizes[source] -= len(prefix)
            taken.extend(units.pop(key[2]) for key in prefix)
        self.total -= len(taken)
        self._refresh_min_version()
        return taken

    def remove_all(self, unit_ids: list[str]) -> list[PooledUnit]:
        """Remove these units wherever they are; ids not in the pool are skipped."""
        removed = []
        for unit_id in unit_ids:
            unit = self.units.pop(unit_id, None)
            if unit is not None:
                self.queues[unit.source].remove(unit.key)
                self.sizes[unit.source] -= 1
                removed.append(unit)
        self.total -= len(removed)
        self._refresh_min_version()
        return removed

    def is_prefix(self, source: int, unit_ids: list[str]) -> bool:
        """Whether ``unit_ids`` are exactly the first units of ``source``, in order."""
        queue = self.queues[source]
        keys = queue.keys
        head = queue.head
        if len(keys) - head < len(unit_ids):
            return False
        return all(keys[head + i][2] == unit_id for i, unit_id in enumerate(unit_ids))

    def stale_units(self, below_version: int) -> list[PooledUnit]:
        """Units whose oldest version is below ``below_version``, source by source in policy order."""
        units = self.units
        stale: list[PooledUnit] = []
        for queue in self.queues:
            count = queue.count_below(below_version)
            if count:
                stale.extend(units[key[2]] for key in queue.keys[queue.head : queue.head + count])
        return stale

    def merge_take(self, offsets: list[int], count: int) -> list[UnitKey]:
        """The next ``count`` keys in policy order across sources, skipping ``offsets[i]`` of source i."""
        heap: list[tuple[UnitKey, int, int]] = []
        queues = self.queues
        for index, queue in enumerate(queues):
            position = queue.head + offsets[index]
            if position < len(queue.keys):
                heap.append((queue.keys[position], index, position))
        taken: list[UnitKey] = []
        if count <= 0 or not heap:
            return taken
        heapq.heapify(heap)
        while heap:
            _, index, position = heap[0]
            keys = queues[index].keys
            if len(heap) == 1:
                taken.extend(keys[position : position + count - len(taken)])
                break
            # Take the whole run of this source that precedes the next best head at once.
            runner_up = min(heap[1][0], heap[2][0]) if len(heap) > 2 else heap[1][0]
            end = min(len(keys), position + count - len(taken))
            stop = bisect_left(keys, runner_up, lo=position + 1, hi=end) if end > position + 1 else end
            taken.extend(keys[position:stop])
            if len(taken) >= count:
                break
            if stop < len(keys):
                heapq.heapreplace(heap, (keys[stop], index, stop))
            else:
                heapq.heappop(heap)
        return taken

    def _refresh_min_version(self) -> None:
        self.min_version = min((q.head_version() for q in self.queues), default=NO_VERSION)
