"""Backbone planning: micro-batches under the token budget, the same count on every DP rank, balanced work.

The default scheme packs, then deals (DESIGN.md §4):
1. pack sequences first-fit-decreasing under ``max_tokens_per_microbatch``, counted in padded tokens of the
   whole CP group; a sequence over the budget is a micro-batch of its own;
2. split the heaviest micro-batches until the count is a multiple of dp · microbatch_multiple, and pad with
   empty micro-batches only when nothing is left to split;
3. deal the micro-batches to DP ranks with equal-count Karmarkar–Karp on their workloads (a·L + b·L²).

Dealing whole micro-batches is coarse when each rank gets only a few. When the result misses the balance
target, the planner also tries dealing first: Karmarkar–Karp on sequence workloads over DP ranks, then
first-fit-decreasing per rank, then splitting the heaviest micro-batches of ranks with fewer until every rank
has the same count. It keeps that only when it is better balanced and needs no more empty micro-batches
(benchmarks/planner.py compares the two with the baselines).
Each rank consumes its micro-batches heaviest first, so ranks that synchronise per micro-batch wait least.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from knittrans.admission.planning.bins import (
    bins_to_csr,
    first_fit_decreasing,
    split_heaviest,
)
from knittrans.admission.planning.partition import karmarkar_karp
from knittrans.plan import BackbonePlan, BalanceScheme, padded_lengths, segment_sums, zigzag_spans
from knittrans.types import BackboneTopology, CostModel

# Dealing first replaces packing first only when it lowers the imbalance by more than this fraction.
_MIN_GAIN = 1e-3

# Per DP rank, its micro-batches in consumption order, each a list of sequence indices.
RankLayout = list[list[list[int]]]


@dataclass(frozen=True, kw_only=True, eq=False)
class BackboneLayout:
    plan: BackbonePlan
    scheme: BalanceScheme
    rank_workloads: np.ndarray  # [dp]
    microbatch_workloads: np.ndarray  # [dp, K]
    padding_tokens: int
    empty_microbatches: int
    oversize_microbatches: int


def sequence_workloads(padded_tokens: np.ndarray, cost: CostModel) -> np.ndarray:
    """Backbone work of each sequence: a·P + b·P² on its padded length (padding is computed too)."""
    lengths = padded_tokens.astype(np.float64)
    return cost.linear * lengths + cost.quadratic * lengths * lengths


def pack_then_deal(padded_tokens: np.ndarray, workloads: np.ndarray, topology: BackboneTopology) -> RankLayout:
    bins = first_fit_decreasing(padded_tokens, topology.max_tokens_per_microbatch)
    quantum = topology.dp * topology.microbatch_multiple
    target = -(-len(bins) // quantum) * quantum
    bins = split_heaviest(bins, workloads, target)
    bins.extend([] for _ in range(target - len(bins)))
    offsets, members = bins_to_csr(bins)
    bin_work = segment_sums(offsets, workloads[members])
    ranks = karmarkar_karp(bin_work.tolist(), topology.dp, equal_count=True)
    ranks = swap_to_balance(ranks, bin_work, rounds=4 * topology.dp)
    work = workloads.tolist()
    return [_heaviest_first([bins[b] for b in rank], work) for rank in ranks]


def swap_to_balance(ranks: list[list[int]], work: np.ndarray, *, rounds: int) -> list[list[int]]:
    """Polish a dealing: swap one item of the heaviest rank with one of the lightest while that lowers the
    heavier of the two. Counts stay equal and the maximum never grows; Karmarkar–Karp leaves little to do
    but its residue, which matters when each rank holds only a few micro-batches."""
    ranks = [list(rank) for rank in ranks]
    loads = np.array([work[rank].sum() if rank else 0.0 for rank in ranks])
    for _ in range(rounds):
        heavy, light = int(loads.argmax()), int(loads.argmin())
        if heavy == light or not ranks[heavy]:
            break
        moved = work[ranks[heavy]][:, None] - work[ranks[light]][None, :]
        pair_max = np.maximum(loads[heavy] - moved, loads[light] + moved)
        i, j = np.unravel_index(int(pair_max.argmin()), pair_max.shape)
        if pair_max[i, j] >= loads[heavy] * (1 - 1e-12):
            break
        ranks[heavy][i], ranks[light][j] = ranks[light][j], ranks[heavy][i]
        loads[heavy] -= moved[i, j]
        loads[light] += moved[i, j]
    return ranks


def deal_then_pack(padded_tokens: np.ndarray, workloads: np.ndarray, topology: BackboneTopology) -> RankLayout:
    ranks = karmarkar_karp(workloads.tolist(), topology.dp)
    packed = [
        [[rank[i] for i in b] for b in first_fit_decreasing(padded_tokens[rank], topology.max_tokens_per_microbatch)]
        if rank
        else []
        for rank in ranks
    ]
    multiple = topology.microbatch_multiple
    per_rank = max(1, -(-max(len(p) for p in packed) // multiple) * multiple)
    packed = [split_heaviest(bins, workloads, per_rank) for bins in packed]
    _lend_smallest_sequences(packed, workloads, per_rank)
    work = workloads.tolist()
    layout = []
    for bins in packed:
        bins.extend([] for _ in range(per_rank - len(bins)))
        layout.append(_heaviest_first(bins, work))
    return layout


def _lend_smallest_sequences(packed: list[list[list[int]]], workloads: np.ndarray, per_rank: int) -> None:
    """Give a rank that still has fewer micro-batches than ``per_rank`` (it holds too few sequences to split)
    the lightest sequences of other ranks' multi-sequence micro-batches, each as a micro-batch of its own,
    rather than empty micro-batches. The donors keep their counts; the balance moves by the lightest work."""
    if all(len(bins) >= per_rank for bins in packed):
        return
    donors = sorted(
        (float(workloads[s]), s, r, b)
        for r, bins in enumerate(packed)
        for b, members in enumerate(bins)
        if len(members) > 1
        for s in members
    )
    for receiver, bins in enumerate(packed):
        while len(bins) < per_rank and donors:
            _, sequence, donor, bin_index = donors.pop(0)
            members = packed[donor][bin_index]
            if donor == receiver or len(members) < 2 or sequence not in members:
                continue
            members.remove(sequence)
            bins.append([sequence])


def _heaviest_first(bins: list[list[int]], work: list[float]) -> list[list[int]]:
    """Members sorted, bins by falling workload. ``work`` is a plain list: at this grain, a numpy call per
    bin would cost more than the sums."""
    keyed = [(-sum(work[i] for i in members), sorted(members)) for members in bins]
    keyed.sort()
    return [members for _, members in keyed]


def _empty_count(layout: RankLayout) -> int:
    return sum(1 for rank in layout for microbatch in rank if not microbatch)


def _imbalance(layout: RankLayout, workloads: np.ndarray) -> float:
    work: list[float] = workloads.tolist()
    totals = [sum(work[i] for microbatch in rank for i in microbatch) for rank in layout]
    return max(totals) / (sum(totals) / len(totals))


def plan_backbone(
    num_tokens: np.ndarray, loss_tokens: np.ndarray, topology: BackboneTopology, *, balance_target: float = 1.01
) -> BackboneLayout:
    padded = padded_lengths(num_tokens, topology.effective_pad_multiple)
    workloads = sequence_workloads(padded, topology.cost)
    layout = pack_then_deal(padded, workloads, topology)
    scheme = BalanceScheme.PACK_THEN_DEAL
    imbalance = _imbalance(layout, workloads)
    if imbalance > balance_target:
        alternative = deal_then_pack(padded, workloads, topology)
        # Empty micro-batches are a last resort: dealing first never buys balance with more of them.
        better = _imbalance(alternative, workloads) < imbalance * (1 - _MIN_GAIN)
        if better and _empty_count(alternative) <= _empty_count(layout):
            layout, scheme = alternative, BalanceScheme.DEAL_THEN_PACK
    ordered = [microbatch for rank in layout for microbatch in rank]
    offsets, items = bins_to_csr(ordered)
    per_rank = len(ordered) // topology.dp
    microbatch_workloads = segment_sums(offsets, workloads[items]).reshape(topology.dp, per_rank)
    plan = BackbonePlan(
        microbatches_per_rank=per_rank,
        microbatch_offsets=offsets,
        microbatch_items=items,
        padded_tokens=padded,
        cp_spans=zigzag_spans(num_tokens, padded, topology.cp),
        microbatch_loss_tokens=segment_sums(offsets, loss_tokens[items]),
        minibatch_loss_tokens=int(loss_tokens.sum()),
    )
    counts = np.diff(offsets)
    singles = items[offsets[:-1][counts == 1]]
    return BackboneLayout(
        plan=plan,
        scheme=scheme,
        rank_workloads=microbatch_workloads.sum(axis=1),
        microbatch_workloads=microbatch_workloads,
        padding_tokens=int((padded - num_tokens).sum()),
        empty_microbatches=int((counts == 0).sum()),
        oversize_microbatches=int((padded[singles] > topology.max_tokens_per_microbatch).sum()),
    )
