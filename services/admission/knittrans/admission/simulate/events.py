"""The simulator's event queue: a heap of (time, kind, argument) on the rollout clock.

Plain tuples and integer kinds keep the hot loop cheap; ties are broken by kind, then argument, so a run is
deterministic. A version change comes first at an instant, so that whatever else happens then sees it.
"""

from __future__ import annotations

import heapq

VERSION = 0  # a sync finished: the policy version increments (argument unused)
SLOTS = 1  # rollout slots become free for the first time (argument: how many), staggered at the start
COMPLETE = 2  # a trajectory finished generating (argument: its index)
WAKE = 3  # the engine asked to decide again at this time (starvation handling; argument unused)

Event = tuple[float, int, int]


class EventQueue:
    __slots__ = ("_heap",)

    def __init__(self) -> None:
        self._heap: list[Event] = []

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, when: float, kind: int, argument: int = 0) -> None:
        heapq.heappush(self._heap, (when, kind, argument))

    def pop_next_instant(self) -> tuple[float, list[tuple[int, int]]]:
        """The earliest time in the queue and every (kind, argument) due then, in order; the queue is not empty."""
        heap = self._heap
        when, kind, argument = heapq.heappop(heap)
        due = [(kind, argument)]
        while heap and heap[0][0] == when:
            _, kind, argument = heapq.heappop(heap)
            due.append((kind, argument))
        return when, due
