"""Who consumes what in the step of :mod:`transfer_workload`: trajectories per DP rank, micro-batches per DP
rank, and the token ranges each CP rank needs of a sequence (the same for every arm)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from transfer_workload import Workload, WorkloadError, require_positive_int

from knittrans.plan.geometry import cp_read_spans, padded_lengths, zigzag_spans


@dataclass(frozen=True, kw_only=True)
class DpAssignment:
    """Trajectory indices per DP rank (equal counts, or counts differing by one)."""

    groups: tuple[tuple[int, ...], ...]

    def dp_rank_of(self, trajectory: int) -> int:
        for dp_rank, group in enumerate(self.groups):
            if trajectory in group:
                return dp_rank
        raise WorkloadError(f"trajectory {trajectory} is not assigned", field="trajectory")


def assign_dp(workload: Workload) -> DpAssignment:
    """Equal-count longest-processing-time balancing on length (compute is linear in tokens here).

    Longest first, each to the least-loaded DP rank that still has room; ties go to the lower rank, so the
    assignment is deterministic. Prompts are ignored, as sequence-length balancers in verl and slime do.
    """
    dp = workload.config.dp
    count = workload.num_trajectories
    capacity = [count // dp + (1 if rank < count % dp else 0) for rank in range(dp)]
    loads = [0] * dp
    groups: list[list[int]] = [[] for _ in range(dp)]
    for trajectory in sorted(range(count), key=lambda i: (-workload.lengths[i], i)):
        open_ranks = [rank for rank in range(dp) if len(groups[rank]) < capacity[rank]]
        rank = min(open_ranks, key=lambda r: (loads[r], r))
        groups[rank].append(trajectory)
        loads[rank] += workload.lengths[trajectory]
    return DpAssignment(groups=tuple(tuple(sorted(group)) for group in groups))


@dataclass(frozen=True, kw_only=True)
class MicroBatch:
    dp_rank: int
    index: int  # consumption order within the DP rank
    trajectories: tuple[int, ...]
    tokens: int


def plan_micro_batches(workload: Workload, assignment: DpAssignment) -> tuple[tuple[MicroBatch, ...], ...]:
    """Micro-batches per DP rank, in consumption order, with equal counts on every DP rank.

    First-fit-decreasing under ``max_tokens_per_micro_batch`` (an oversize sequence is a micro-batch of its
    own); then the heaviest splittable micro-batches are split in two until every DP rank has as many as the
    one with the most, because synchronous gradient accumulation hangs on unequal counts.
    """
    budget = workload.config.max_tokens_per_micro_batch
    bins_per_rank: list[list[list[int]]] = []
    for group in assignment.groups:
        bins: list[list[int]] = []
        loads: list[int] = []
        for trajectory in sorted(group, key=lambda i: (-workload.lengths[i], i)):
            length = workload.lengths[trajectory]
            for position, load in enumerate(loads):
                if load + length <= budget:
                    bins[position].append(trajectory)
                    loads[position] += length
                    break
            else:
                bins.append([trajectory])
                loads.append(length)
        bins_per_rank.append(bins)

    target = max(len(bins) for bins in bins_per_rank)
    for dp_rank, bins in enumerate(bins_per_rank):
        while len(bins) < target:
            splittable = [b for b in bins if len(b) > 1]
            if not splittable:
                raise WorkloadError(
                    f"DP rank {dp_rank} cannot reach {target} micro-batches; lower dp or raise the budget",
                    field="max_tokens_per_micro_batch",
                )
            heaviest = max(splittable, key=lambda b: (sum(workload.lengths[i] for i in b), -bins.index(b)))
            first, second = _halve(heaviest, workload.lengths)
            position = bins.index(heaviest)
            bins[position : position + 1] = [first, second]

    return tuple(
        tuple(
            MicroBatch(
                dp_rank=dp_rank,
                index=index,
                trajectories=tuple(members),
                tokens=sum(workload.lengths[i] for i in members),
            )
            for index, members in enumerate(bins)
        )
        for dp_rank, bins in enumerate(bins_per_rank)
    )


def _halve(members: list[int], lengths: Sequence[int]) -> tuple[list[int], list[int]]:
    first: list[int] = []
    second: list[int] = []
    for trajectory in sorted(members, key=lambda i: (-lengths[i], i)):
        target = first if sum(lengths[i] for i in first) <= sum(lengths[i] for i in second) else second
        target.append(trajectory)
    return first, second


# --------------------------------------------------------------------------------------------- CP split


def zigzag_token_ranges(length: int, cp: int, cp_rank: int, *, look_ahead: bool) -> tuple[tuple[int, int], ...]:
    """Half-open token ranges ``[start, end)`` of a sequence that CP rank ``cp_rank`` needs.

    The sequence is padded to a multiple of ``2*cp`` and cut into ``2*cp`` equal chunks; rank ``r`` gets
    chunks ``r`` and ``2*cp-1-r``. With ``look_ahead`` (label fields), each chunk also needs the token after
    its end, when that token exists. Ranges are clipped to the real tokens and adjacent ones merged.
    """
    if length < 0:
        raise WorkloadError("must be non-negative", field="length")
    require_positive_int(cp, "cp")
    if not 0 <= cp_rank < cp:
        raise WorkloadError(f"must be in [0, {cp})", field="cp_rank")
    padded = padded_lengths(np.array([length]), 2 * cp)
    spans = zigzag_spans(np.array([length]), padded, cp)[0, cp_rank].tolist()
    return tuple(cp_read_spans(spans, length, look_ahead))
