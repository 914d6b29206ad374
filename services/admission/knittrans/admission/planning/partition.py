"""Karmarkar–Karp (largest differencing) partitioning of weighted items into k parts.

Pure functions; no I/O. While states are merged, each part is a node id: a leaf is an item index, an
inner node joins two non-empty parts (recorded in ``children``), and -1 is an empty part. A merge then
costs O(k log k) whatever the part sizes, and the parts are flattened once at the end.
"""

from __future__ import annotations

import heapq
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
    order = sorted(range(n), key=lambda i: (-weights[i], i))
    step = parts if equal_count else 1
    padding = [0.0] * (parts - step)
    empty_parts = [_EMPTY] * (parts - step)
    heap = []
    for seq, start in enumerate(range(0, n, step)):
        group = order[start : start + step]
        sums = [weights[i] for i in group] + padding
        heap.append((sums[-1] - sums[0], seq, sums, group + empty_parts))
    heapq.heapify(heap)
    seq = len(heap)
    children: list[tuple[int, int]] = []  # inner node n + j joins children[j]
    pairing = range(parts)
    while len(heap) > 1:
        _, _, sums_a, nodes_a = heapq.heappop(heap)
        _, _, sums_b, nodes_b = heapq.heappop(heap)
        only_b = _only_part(nodes_b) if parts > 1 else None
        only_a = _only_part(nodes_a) if parts > 1 and only_b is None else None
        if only_b is not None:
            sums, nodes = _add_to_lightest(sums_a, nodes_a, sums_b[only_b], nodes_b[only_b], n, children)
        elif only_a is not None:
            sums, nodes = _add_to_lightest(sums_b, nodes_b, sums_a[only_a], nodes_a[only_a], n, children)
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
    return [sorted(_leaves(node, n, children)) for node in heap[0][3]]


def _add_to_lightest(
    sums: list[float], nodes: list[int], weight: float, node: int, n: int, children: list[tuple[int, int]]
) -> tuple[list[float], list[int]]:
    """Merge a state with a single-part state: the part joins the lightest part (what pairing does)."""
    total = sums[-1] + weight
    lightest = nodes[-1]
    if lightest == _EMPTY:
        joined = node
    else:
        joined = n + len(children)
        children.append((lightest, node))
    # Keep heaviest-first order: find where the grown part goes among the others.
    position = len(sums) - 1
    while position > 0 and sums[position - 1] < total:
        position -= 1
    return (
        [*sums[:position], total, *sums[position:-1]],
        [*nodes[:position], joined, *nodes[position:-1]],
    )


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
