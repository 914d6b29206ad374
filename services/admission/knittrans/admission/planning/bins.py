"""Bin packing of weighted items under a budget, and splitting bins to reach a bin count.

Pure functions over numpy arrays; no I/O.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np

from knittrans.plan import segment_sums


def first_fit_decreasing(sizes: np.ndarray, capacity: float) -> list[list[int]]:
    """Pack item indices into bins of ``capacity`` by first-fit decreasing.

    Items are placed largest first (ties by index) into the first bin with room. An item larger than the
    capacity gets a bin of its own that nothing joins. Members of a bin come back in placement order.

    The leftmost bin with room is found in O(log n) with a max-tree over the bins' free room, in which every
    not yet opened bin has the full capacity; plain Python lists beat numpy calls at this grain.
    """
    sizes = np.asarray(sizes)
    order = np.argsort(-sizes, kind="stable")
    leaves = 1
    while leaves < max(len(sizes), 1):
        leaves *= 2
    room = [float(capacity)] * (2 * leaves)
    bins: list[list[int]] = []
    for index, size in zip(order.tolist(), sizes[order].tolist(), strict=True):
        if size > capacity:
            node = len(bins) + leaves
            room[node] = -1.0
            bins.append([index])
        else:
            node = 1
            while node < leaves:
                node <<= 1
                if room[node] < size:
                    node += 1
            first = node - leaves
            if first == len(bins):
                bins.append([index])
            else:
                bins[first].append(index)
            room[node] -= size
        node >>= 1
        while node:
            left, right = room[2 * node], room[2 * node + 1]
            most = left if left > right else right
            if room[node] == most:
                break
            room[node] = most
            node >>= 1
    return bins


def split_heaviest(bins: list[list[int]], weights: np.ndarray, target: int) -> list[list[int]]:
    """Split the heaviest bins holding two or more items in two until there are ``target`` bins.

    A split deals the bin's items, heaviest first, to the lighter half, so both halves are non-empty and
    each stays within whatever budget the bin met. Stops early when no bin can be split; the caller pads.
    """
    bins = [list(b) for b in bins]
    if len(bins) >= target:
        return bins
    offsets, members = bins_to_csr(bins)
    loads = segment_sums(offsets, np.asarray(weights, dtype=np.float64)[members]).tolist()
    heap = [(-loads[i], i) for i, b in enumerate(bins) if len(b) > 1]
    heapq.heapify(heap)
    while len(bins) < target and heap:
        _, index = heapq.heappop(heap)
        halves = split_in_two(bins[index], weights)
        bins[index] = halves[0]
        bins.append(halves[1])
        for position in (index, len(bins) - 1):
            if len(bins[position]) > 1:
                heapq.heappush(heap, (-float(weights[bins[position]].sum()), position))
    return bins


def split_in_two(members: Sequence[int], weights: np.ndarray) -> tuple[list[int], list[int]]:
    """Deal ``members`` (at least two) heaviest first to the lighter of two halves."""
    halves: tuple[list[int], list[int]] = ([], [])
    loads = [0.0, 0.0]
    for item in sorted(members, key=lambda i: (-weights[i], i)):
        side = 0 if loads[0] <= loads[1] else 1
        halves[side].append(item)
        loads[side] += float(weights[item])
    return halves


def bins_to_csr(bins: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Offsets and flat members of a list of bins."""
    lengths = np.fromiter((len(b) for b in bins), dtype=np.int64, count=len(bins))
    offsets = np.zeros(len(bins) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    members = np.fromiter((i for b in bins for i in b), dtype=np.int64, count=int(offsets[-1]))
    return offsets, members
