"""Encoder planning and the route map (DESIGN.md §4, paper §5.3).

The mini-batch's multimodal references collapse to unique encodings (the ``group_size`` repeats of a
sample share one key). Each encoder balances its encodings over its own DP ranks by cost with
Karmarkar–Karp, packs each rank's share into encoder micro-batches under its budget, and equalises the
micro-batch count over its ranks. The route map then sends every encoding to each backbone rank whose CP
chunks hold placeholder positions of a reference to it, once per TP rank.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from knittrans.admission.planning.bins import bins_to_csr, first_fit_decreasing, split_heaviest
from knittrans.admission.planning.partition import karmarkar_karp
from knittrans.errors import InvalidArgument
from knittrans.plan import EncoderPlan, EncoderQuality, RouteMap
from knittrans.plan.geometry import clip_to_chunks
from knittrans.types import EncoderTopology, Topology, TrajectoryMeta, UnitKind

# What two references to one key must agree on: (cost, placeholder length, kind, content hash).
_UnitSignature = tuple[float, int, UnitKind, str | None]


@dataclass(frozen=True, kw_only=True, eq=False)
class References:
    """Every multimodal reference (numbered trajectory by trajectory) and the unique encodings."""

    trajectory: np.ndarray  # [R]
    encoding: np.ndarray  # [R]
    starts: np.ndarray  # [R] placeholder start
    ends: np.ndarray  # [R] placeholder end
    source_trajectory: np.ndarray  # [E]
    source_reference: np.ndarray  # [E]
    encoder_index: np.ndarray  # [E] index into topology.encoders
    costs: np.ndarray  # [E]


def collect_references(trajectories: Sequence[TrajectoryMeta], topology: Topology) -> References:
    """Number the references and find the unique encodings, rejecting unknown encoders, placeholders
    outside their sequence and references to one key that disagree on what the key holds."""
    refs = [(t, ref) for t, meta in enumerate(trajectories) for ref in meta.multimodal]
    return collect_reference_columns(
        ReferenceColumns(
            trajectories=np.fromiter((t for t, _ in refs), dtype=np.int64, count=len(refs)),
            keys=[ref.key for _, ref in refs],
            encoders=[ref.encoder for _, ref in refs],
            costs=np.fromiter((ref.cost for _, ref in refs), dtype=np.float64, count=len(refs)),
            starts=np.fromiter((ref.placeholder.start for _, ref in refs), dtype=np.int64, count=len(refs)),
            ends=np.fromiter((ref.placeholder.end for _, ref in refs), dtype=np.int64, count=len(refs)),
            kinds=[ref.kind for _, ref in refs],
            content_hashes=[ref.header.content_hash if ref.header is not None else None for _, ref in refs],
        ),
        np.fromiter((meta.num_tokens for meta in trajectories), dtype=np.int64, count=len(trajectories)),
        topology,
    )


@dataclass(frozen=True, kw_only=True, eq=False)
class ReferenceColumns:
    """Every multimodal reference of a mini-batch as columns, numbered trajectory by trajectory."""

    trajectories: np.ndarray  # [R] the trajectory (index in the mini-batch) that holds each reference
    keys: Sequence[str]
    encoders: Sequence[str]
    costs: np.ndarray  # [R] float64
    starts: np.ndarray  # [R] placeholder start
    ends: np.ndarray  # [R] placeholder end
    kinds: Sequence[UnitKind]
    content_hashes: Sequence[str | None]  # of each reference's header; None without one


def collect_reference_columns(refs: ReferenceColumns, num_tokens: np.ndarray, topology: Topology) -> References:
    """:func:`collect_references` on columns: the same encodings, and the same error for the first bad reference
    (references are checked in order: placeholder, then encoder at a key's first use, then agreement with it)."""
    count = len(refs.keys)
    first_seen: dict[tuple[str, str], int] = {}
    setdefault = first_seen.setdefault
    encoding_list = [setdefault(identity, len(first_seen)) for identity in zip(refs.encoders, refs.keys, strict=True)]
    encoding = np.array(encoding_list, dtype=np.int64)
    first_of = np.full(len(first_seen), count, dtype=np.int64)
    np.minimum.at(first_of, encoding, np.arange(count, dtype=np.int64))
    first = first_of[encoding]
    is_first = first == np.arange(count)
    starts, ends, costs = refs.starts, refs.ends, refs.costs
    trajectories = refs.trajectories
    placeholder_bad = (starts >= ends) | (ends > num_tokens[trajectories])
    encoder_ids = {e.name: i for i, e in enumerate(topology.encoders)}
    first_list = first.tolist()
    differs = (costs != costs[first]) | ((ends - starts) != (ends - starts)[first])
    for column in (refs.kinds, refs.content_hashes):  # compared as objects, element by element in C
        values = np.empty(count, dtype=object)
        values[:] = column
        differs |= values != values[first]
    if encoder_ids.keys() >= set(refs.encoders):
        unknown = np.zeros(count, dtype=bool)
    else:
        unknown = np.fromiter((e not in encoder_ids for e in refs.encoders), dtype=bool, count=count)
    bad = placeholder_bad | (is_first & unknown) | (~is_first & differs)
    if bad.any():
        _reject_reference(refs, int(np.flatnonzero(bad)[0]), first_list, num_tokens, encoder_ids)
    sources = np.flatnonzero(is_first)  # encodings in first-use order, as numbered
    source_trajectory = trajectories[sources]
    offsets = np.searchsorted(trajectories, source_trajectory, side="left")
    return References(
        trajectory=trajectories.astype(np.int64, copy=False),
        encoding=encoding,
        starts=starts.astype(np.int64, copy=False),
        ends=ends.astype(np.int64, copy=False),
        source_trajectory=source_trajectory.astype(np.int64, copy=False),
        source_reference=(sources - offsets).astype(np.int64, copy=False),
        encoder_index=np.array([encoder_ids[refs.encoders[r]] for r in sources.tolist()], dtype=np.int64),
        costs=costs[sources].astype(np.float64, copy=False),
    )


def _reject_reference(
    refs: ReferenceColumns, r: int, first: list[int], num_tokens: np.ndarray, encoder_ids: dict[str, int]
) -> None:
    trajectories = refs.trajectories
    t = int(trajectories[r])
    j = r - int(np.searchsorted(trajectories, t, side="left"))
    start, end, tokens = int(refs.starts[r]), int(refs.ends[r]), int(num_tokens[t])
    if start >= end or end > tokens:
        raise InvalidArgument(
            f"[{start}, {end}) is empty or outside the sequence of {tokens} tokens",
            field=f"trajectories[{t}].multimodal[{j}].placeholder",
        )
    f = first[r]
    if f == r:
        known = ", ".join(encoder_ids) or "none"
        raise InvalidArgument(
            f"unknown encoder {refs.encoders[r]!r}; the topology has: {known}",
            field=f"trajectories[{t}].multimodal[{j}].encoder",
        )

    def signature(k: int) -> _UnitSignature:
        return (float(refs.costs[k]), int(refs.ends[k] - refs.starts[k]), refs.kinds[k], refs.content_hashes[k])

    ft = int(trajectories[f])
    source = (ft, f - int(np.searchsorted(trajectories, ft, side="left")))
    _reject_different_unit(signature(r), signature(f), source, t, j)


def _reject_different_unit(
    signature: _UnitSignature, first: _UnitSignature, source: tuple[int, int], trajectory: int, reference: int
) -> None:
    where = f"trajectories[{trajectory}].multimodal[{reference}]"
    same = f"the same unit at trajectories[{source[0]}].multimodal[{source[1]}]"
    if signature[0] != first[0]:
        raise InvalidArgument(f"cost {signature[0]} differs from {first[0]} of {same}", field=f"{where}.cost")
    if signature[1] != first[1]:
        raise InvalidArgument(
            f"placeholder length {signature[1]} differs from {first[1]} of {same}", field=f"{where}.placeholder"
        )
    if signature[2] != first[2]:
        raise InvalidArgument(f"kind {signature[2]} differs from {first[2]} of {same}", field=f"{where}.kind")
    raise InvalidArgument(f"content hash differs from {same}", field=f"{where}.header.content_hash")


def plan_encoder(
    topology: EncoderTopology, encodings: np.ndarray, costs: np.ndarray
) -> tuple[EncoderPlan, EncoderQuality]:
    """Balance ``encodings`` (ids into ``costs``) over the encoder's DP ranks and pack their micro-batches."""
    parts = karmarkar_karp(costs[encodings].tolist(), topology.dp)
    rank_bins: list[list[list[int]]] = []
    oversize = 0
    for part in parts:
        ids = encodings[np.array(part, dtype=np.int64)]
        bins = [[int(ids[i]) for i in b] for b in first_fit_decreasing(costs[ids], topology.max_cost_per_microbatch)]
        oversize += sum(1 for b in bins if len(b) == 1 and costs[b[0]] > topology.max_cost_per_microbatch)
        rank_bins.append(bins)
    per_rank = max((len(b) for b in rank_bins), default=0)
    empty = 0
    ordered: list[list[int]] = []
    for bins in rank_bins:
        bins = split_heaviest(bins, costs, per_rank)
        empty += per_rank - len(bins)
        bins.extend([] for _ in range(per_rank - len(bins)))
        ordered.extend(sorted((sorted(b) for b in bins), key=lambda b: (-float(costs[b].sum()), b)))
    offsets, members = bins_to_csr(ordered)
    rank_costs = np.array([float(costs[encodings[part]].sum()) for part in parts])
    mean = float(rank_costs.mean())
    quality = EncoderQuality(
        name=topology.name,
        imbalance=float(rank_costs.max()) / mean if mean > 0 else 1.0,
        rank_costs=tuple(rank_costs.tolist()),
        microbatches_per_rank=per_rank,
        empty_microbatches=empty,
        oversize_microbatches=oversize,
        unique_encodings=len(encodings),
    )
    plan = EncoderPlan(
        name=topology.name, microbatches_per_rank=per_rank, microbatch_offsets=offsets, microbatch_encodings=members
    )
    return plan, quality


def build_route(
    references: References,
    dp_ranks: np.ndarray,
    microbatches: np.ndarray,
    cp_spans: np.ndarray,
    tp: int,
) -> RouteMap:
    """One row per (reference, CP rank, zigzag chunk, TP rank) whose chunk holds placeholder positions.

    ``dp_ranks`` and ``microbatches`` give each trajectory's backbone placement; ``cp_spans`` is the
    backbone's ``[trajectory, cp rank, chunk, start|end]`` array.
    """
    if len(references.trajectory) == 0:
        return RouteMap.empty()
    starts, ends = clip_to_chunks(cp_spans[references.trajectory], references.starts, references.ends)  # [R, cp, 2]
    ref, cp_rank, chunk = np.nonzero(ends > starts)
    row_starts = starts[ref, cp_rank, chunk]
    row_ends = ends[ref, cp_rank, chunk]
    encoding = references.encoding[ref]
    trajectory = references.trajectory[ref]
    # Rows are in (reference, cp rank, chunk) order; a stable sort by encoding keeps that inside each encoding.
    order = np.argsort(encoding, kind="stable")
    columns = {
        "encodings": encoding[order],
        "references": ref[order],
        "dp_ranks": dp_ranks[trajectory][order],
        "cp_ranks": cp_rank[order],
        "microbatches": microbatches[trajectory][order],
        "starts": row_starts[order],
        "ends": row_ends[order],
    }
    replicated = {name: np.repeat(values, tp) for name, values in columns.items()}
    replicated["tp_ranks"] = np.tile(np.arange(tp, dtype=np.int64), len(order))
    return RouteMap(**replicated)
