"""Karmarkar–Karp (largest differencing) partitioning of weighted items into k parts.

Pure functions; no I/O. While states are merged, each part is a node id: a leaf is an item index, an
inner node joins two non-empty parts (recorded in ``children``), and -1 is an empty part. A merge then
costs O(k log k) whatever the part sizes, and the parts are flattened once at the end.
"""

from __future__ import annotations

import bisect
import heapq
import operator
from collections.abc import Sequence

from knittrans.errors import InvalidArgument

_EMPTY = -1


def karmarkar_karp(weights: Sequence[float], parts: int, *, equal_count: bool = False) -> list[list[int]]:
    """Partition item indices ``0 … len(weights)-1`` into ``parts`` lists of similar total weight.

    With ``equal_count`` every part gets the same number of items (``len(weights)`` must be a multiple of
    ``parts``): items are sorted by weight and cut into groups of ``parts`` consecutive items, each group a
    state with one item per part, and the states are then differenced. Without it each item starts as a
    state of its own. Ties break on the item index, so the result is deterministic. Parts come back sorted
    by total weight, heaviest first, with members in ascending index order.
    """
    if parts < 1:
        raise InvalidArgument(f"must be at least 1, got {parts}", field="parts")
    n = len(weights)
    if equal_count and n % parts:
        raise InvalidArgument(f"{n} items cannot be split into {parts} equal parts", field="parts")
    if n == 0:
        return [[] for _ in range(parts)]
    weights = [float(w) for w in weights]
    if parts == 1:
        return [list(range(n))]
    order = sorted(range(n), key=lambda i: (-weights[i], i))
    step = parts if equal_count else 1
    padding = [0.0] * (parts - step)
    empty_parts = [_EMPTY] * (parts - step)
    heap: list[tuple[float, int, list[float] | None, list[int] | int]] = []
    if equal_count:
        for seq, start in enumerate(range(0, n, step)):
            group = order[start : start + step]
            sums = [weights[i] for i in group] + padding
            heap.append((sums[-1] - sums[0], seq, sums, group + empty_parts))
    else:
        # A single item's state is kept as (no sums, its index) until it is merged: most states are single items,
        # and spelling each out as ``parts`` sums and nodes cost more than all the merges.
        heap.extend((-weights[i], seq, None, i) for seq, i in enumerate(order))
    heapq.heapify(heap)
    seq = len(heap)
    children: list[tuple[int, int]] = []  # inner node n + j joins children[j]
    pairing = range(parts)
    while len(heap) > 1:
        _, _, sums_a, nodes_a = heapq.heappop(heap)
        _, _, sums_b, nodes_b = heapq.heappop(heap)
        if sums_b is None:  # b is one item: it joins a's lightest part
            assert isinstance(nodes_b, int)
            sums, nodes = _spelled_out(sums_a, nodes_a, weights, parts)
            _add_to_lightest(sums, nodes, weights[nodes_b], nodes_b, n, children)
        elif sums_a is None:
            assert isinstance(nodes_a, int) and not isinstance(nodes_b, int)
            sums, nodes = sums_b, nodes_b
            _add_to_lightest(sums, nodes, weights[nodes_a], nodes_a, n, children)
        else:
            assert not isinstance(nodes_a, int) and not isinstance(nodes_b, int)
            only_b = _only_part(nodes_b)
            only_a = _only_part(nodes_a) if only_b is None else None
            if only_b is not None:
                sums, nodes = sums_a, nodes_a
                _add_to_lightest(sums, nodes, sums_b[only_b], nodes_b[only_b], n, children)
            elif only_a is not None:
                sums, nodes = sums_b, nodes_b
                _add_to_lightest(sums, nodes, sums_a[only_a], nodes_a[only_a], n, children)
            else:
                # Both are sorted heaviest first: pair a's heaviest part with b's lightest.
                nodes_b = nodes_b[::-1]
                paired = [x + y for x, y in zip(sums_a, reversed(sums_b), strict=True)]
                if _EMPTY in nodes_a or _EMPTY in nodes_b:
                    joined = []
                    for a, b in zip(nodes_a, nodes_b, strict=True):
                        if a == _EMPTY:
                            joined.append(b)
                        elif b == _EMPTY:
                            joined.append(a)
                        else:
                            joined.append(n + len(children))
                            children.append((a, b))
                else:  # every pair joins: whole lists at once
                    joined = list(range(n + len(children), n + len(children) + parts))
                    children.extend(zip(nodes_a, nodes_b, strict=True))
                # Heaviest first; a stable sort keeps pairing order among equal sums.
                order = sorted(pairing, key=paired.__getitem__, reverse=True)
                sums = [paired[i] for i in order]
                nodes = [joined[i] for i in order]
        heapq.heappush(heap, (sums[-1] - sums[0], seq, sums, nodes))
        seq += 1
    last_nodes = heap[0][3]
    if isinstance(last_nodes, int):  # one item in all
        return [[last_nodes]] + [[] for _ in range(parts - 1)]
    return [sorted(_leaves(node, n, children)) for node in last_nodes]


def _spelled_out(sums: list[float] | None, nodes: list[int] | int, weights: list[float],
                 parts: int) -> tuple[list[float], list[int]]:
    """A state as its parts' sums and nodes, heaviest first (a single item's state is kept as its index)."""
    if sums is not None:
        assert not isinstance(nodes, int)
        return sums, nodes
    assert isinstance(nodes, int)
    return [weights[nodes]] + [0.0] * (parts - 1), [nodes] + [_EMPTY] * (parts - 1)


def _add_to_lightest(
    sums: list[float], nodes: list[int], weight: float, node: int, n: int, children: list[tuple[int, int]]
) -> None:
    """Merge a single-part state into a state, in place: the part joins the lightest part (what pairing does)."""
    total = sums.pop() + weight
    lightest = nodes.pop()
    if lightest == _EMPTY:
        joined = node
    else:
        joined = n + len(children)
        children.append((lightest, node))
    # Keep heaviest-first order: the grown part goes after every part at least as heavy.
    position = bisect.bisect_right(sums, -total, key=operator.neg)
    sums.insert(position, total)
    nodes.insert(position, joined)


def _only_part(nodes: list[int]) -> int | None:
    """The position of a state's one non-empty part, or None if it has several. With zero weights a part
    can sit below an empty one (ties keep their order), so the check looks at every part, not only the
    second."""
    if nodes.count(_EMPTY) != len(nodes) - 1:  # counted in C: most states have several parts, or one
        return None
    for position, node in enumerate(nodes):
        if node != _EMPTY:
            return position
    return None


def _leaves(node: int, n: int, children: list[tuple[int, int]]) -> list[int]:
    leaves: list[int] = []
    stack = [node]
    while stack:
        node = stack.pop()
        if node == _EMPTY:
            continue
        if node < n:
            leaves.append(node)
        else:
            stack.extend(children[node - n])
    return leaves
