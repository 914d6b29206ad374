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

from knittrans.admission.planning.packing import bins_to_csr, first_fit_decreasing, split_heaviest
from knittrans.admission.planning.partition import karmarkar_karp
from knittrans.errors import InvalidArgument
from knittrans.plan import EncoderPlan, EncoderQuality, RouteMap
from knittrans.types import EncoderTopology, Topology, TrajectoryMeta, UnitKind


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
    encoder_ids = {e.name: i for i, e in enumerate(topology.encoders)}
    first_seen: dict[tuple[str, str], int] = {}
    signatures: list[tuple[float, int, UnitKind, str | None]] = []
    sources: list[tuple[int, int]] = []
    ref_trajectory: list[int] = []
    ref_encoding: list[int] = []
    ref_starts: list[int] = []
    ref_ends: list[int] = []
    # One pass in plain Python: this loop dominates planning time for multimodal batches, so it builds no
    # strings and calls nothing unless an input is bad.
    for t, meta in enumerate(trajectories):
        if not meta.multimodal:
            continue
        num_tokens = meta.num_tokens
        for j, ref in enumerate(meta.multimodal):
            span = ref.placeholder
            start, end = span.start, span.end
            if start >= end or end > num_tokens:
                raise InvalidArgument(
                    f"[{start}, {end}) is empty or outside the sequence of {num_tokens} tokens",
                    field=f"trajectories[{t}].multimodal[{j}].placeholder",
                )
            header = ref.header
            signature = (ref.cost, end - start, ref.kind, header.content_hash if header is not None else None)
            identity = (ref.encoder, ref.key)
            encoding = first_seen.get(identity)
            if encoding is None:
                if ref.encoder not in encoder_ids:
                    known = ", ".join(encoder_ids) or "none"
                    raise InvalidArgument(
                        f"unknown encoder {ref.encoder!r}; the topology has: {known}",
                        field=f"trajectories[{t}].multimodal[{j}].encoder",
                    )
                encoding = len(sources)
                first_seen[identity] = encoding
                sources.append((t, j))
                signatures.append(signature)
            elif signature != signatures[encoding]:
                _reject_different_unit(signature, signatures[encoding], sources[encoding], t, j)
            ref_trajectory.append(t)
            ref_encoding.append(encoding)
            ref_starts.append(start)
            ref_ends.append(end)
    source = np.array(sources, dtype=np.int64).reshape(-1, 2)
    return References(
        trajectory=np.array(ref_trajectory, dtype=np.int64),
        encoding=np.array(ref_encoding, dtype=np.int64),
        starts=np.array(ref_starts, dtype=np.int64),
        ends=np.array(ref_ends, dtype=np.int64),
        source_trajectory=source[:, 0],
        source_reference=source[:, 1],
        encoder_index=np.array(
            [encoder_ids[trajectories[t].multimodal[j].encoder] for t, j in sources], dtype=np.int64
        ),
        costs=np.array([s[0] for s in signatures], dtype=np.float64),
    )


def _reject_different_unit(
    signature: tuple, first: tuple, source: tuple[int, int], trajectory: int, reference: int
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
    spans = cp_spans[references.trajectory]  # [R, cp, 2, 2]
    starts = np.maximum(spans[..., 0], references.starts[:, None, None])
    ends = np.minimum(spans[..., 1], references.ends[:, None, None])
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
