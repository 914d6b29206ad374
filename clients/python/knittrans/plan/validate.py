"""The invariants of a plan (DESIGN.md §4): :func:`validate_plan` raises
:class:`~knittrans.errors.InvalidArgument` naming the first broken one."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from knittrans.errors import InvalidArgument
from knittrans.plan.geometry import padded_lengths, segment_sums, zigzag_spans
from knittrans.types import UnitKey, UnitKind

if TYPE_CHECKING:
    from knittrans.plan.parts import Plan

# Per reference: (encoder, key), cost, and (kind, content hash): what identifies its unit.
_ReferenceColumns = tuple[list[tuple[str, UnitKey]], np.ndarray, list[tuple[UnitKind, str | None]]]


def validate_plan(plan: Plan) -> None:
    """Check every invariant of DESIGN.md §4; raise :class:`InvalidArgument` naming the first broken one.

    - every trajectory appears exactly once in the backbone plan, every DP rank has the same number of
      micro-batches (a multiple of ``microbatch_multiple``), and budgets hold except for oversize singletons;
    - the CP ranges of every sequence are its zigzag chunks and tile it exactly, with no gap or overlap;
    - loss-token counts add up;
    - every unique encoding has exactly one owner, within its encoder's budgets, and equal micro-batch
      counts over the encoder's DP ranks;
    - the route map covers every reference exactly, for every TP rank, at the rank that trains it.
    """
    if not plan.trajectories:
        raise InvalidArgument("a plan needs at least one trajectory", field="trajectories")
    ids = [t.trajectory_id for t in plan.trajectories]
    if len(set(ids)) != len(ids):
        raise InvalidArgument("a trajectory id appears twice", field="trajectories")
    _validate_backbone(plan)
    columns = _reference_columns(plan)
    source = _validate_encodings(plan, columns)
    _validate_encoders(plan, columns, source)
    _validate_route(plan)
    _validate_quality(plan)


def _validate_backbone(plan: Plan) -> None:
    topo = plan.topology.backbone
    b = plan.backbone
    n = len(plan.trajectories)
    per_rank = b.microbatches_per_rank
    if per_rank < 1 or per_rank % topo.microbatch_multiple:
        raise InvalidArgument(
            f"{per_rank} is not a positive multiple of microbatch_multiple={topo.microbatch_multiple}",
            field="backbone.microbatches_per_rank",
        )
    offsets = b.microbatch_offsets
    if (
        len(offsets) != topo.dp * per_rank + 1
        or offsets[0] != 0
        or offsets[-1] != n
        or np.any(np.diff(offsets) < 0)
    ):
        raise InvalidArgument(
            f"must be {topo.dp * per_rank + 1} non-decreasing offsets from 0 to {n}",
            field="backbone.microbatch_offsets",
        )
    items = b.microbatch_items
    if len(items) != n or items.min() < 0 or items.max() >= n or np.any(np.bincount(items, minlength=n) != 1):
        raise InvalidArgument("every trajectory must appear exactly once", field="backbone.microbatch_items")
    lengths = plan.num_tokens
    if b.padded_tokens.shape != (n,) or np.any(
        b.padded_tokens != padded_lengths(lengths, topo.effective_pad_multiple)
    ):
        raise InvalidArgument(
            f"must be each length padded to a multiple of {topo.effective_pad_multiple}",
            field="backbone.padded_tokens",
        )
    spans = b.cp_spans
    if spans.shape != (n, topo.cp, 2, 2):
        raise InvalidArgument(f"must have shape {(n, topo.cp, 2, 2)}, got {spans.shape}", field="backbone.cp_spans")
    _check_tiling(spans.reshape(n, 2 * topo.cp, 2), lengths)
    wrong = np.any(spans != zigzag_spans(lengths, b.padded_tokens, topo.cp), axis=(1, 2, 3))
    if np.any(wrong):
        bad = int(np.flatnonzero(wrong)[0])
        raise InvalidArgument("CP rank r must hold zigzag chunks r and 2cp-1-r", field=f"backbone.cp_spans[{bad}]")
    loss = segment_sums(offsets, plan.num_loss_tokens[items])
    if np.any(loss != b.microbatch_loss_tokens):
        raise InvalidArgument(
            "does not match the trajectories' loss tokens", field="backbone.microbatch_loss_tokens"
        )
    if b.minibatch_loss_tokens != int(plan.num_loss_tokens.sum()):
        raise InvalidArgument(
            "does not match the trajectories' loss tokens", field="backbone.minibatch_loss_tokens"
        )
    tokens = segment_sums(offsets, b.padded_tokens[items])
    over = np.flatnonzero((tokens > topo.max_tokens_per_microbatch) & (np.diff(offsets) > 1))
    if len(over):
        g = int(over[0])
        raise InvalidArgument(
            f"dp rank {g // per_rank} micro-batch {g % per_rank} holds {int(tokens[g])} padded tokens, over the "
            f"budget of {topo.max_tokens_per_microbatch}, and is not a single oversize sequence",
            field="backbone.microbatch_offsets",
        )


def _reference_columns(plan: Plan) -> _ReferenceColumns:
    """Per reference: (encoder, key), cost, and (kind, content hash) — what identifies its unit."""
    refs = [m for t in plan.trajectories for m in t.multimodal]
    identities = [(m.encoder, m.key) for m in refs]
    costs = np.fromiter((m.cost for m in refs), dtype=np.float64, count=len(refs))
    contents = [(m.kind, m.header.content_hash if m.header is not None else None) for m in refs]
    return identities, costs, contents


def _encoding_source_references(plan: Plan) -> np.ndarray:
    """Per encoding: the global index of its source reference (once _validate_encodings checked the table)."""
    table = plan.encodings
    references: np.ndarray = plan.reference_offsets[table.source_trajectory] + table.source_reference
    return references


def _validate_encodings(plan: Plan, columns: _ReferenceColumns) -> np.ndarray:
    """Check the encoding table; return each encoding's source reference."""
    table = plan.encodings
    n = len(plan.trajectories)
    n_refs = plan.num_references
    n_enc = len(table)
    if len(table.reference_encodings) != n_refs:
        raise InvalidArgument(f"needs one encoding id per reference ({n_refs})", field="reference_encodings")
    counts = np.diff(plan.reference_offsets)
    t, j = table.source_trajectory, table.source_reference
    bad = np.flatnonzero((t < 0) | (t >= n) | (j < 0) | (j >= counts[np.clip(t, 0, max(n - 1, 0))]))
    if len(bad):
        e = int(bad[0])
        raise InvalidArgument(f"names an unknown reference ({int(t[e])}, {int(j[e])})", field=f"encodings[{e}]")
    identities, costs, contents = columns
    source = _encoding_source_references(plan)
    encoding_identities = [identities[r] for r in source.tolist()]
    known = {e.name for e in plan.topology.encoders}
    for e, (encoder, _) in enumerate(encoding_identities):
        if encoder not in known:
            raise InvalidArgument(f"unknown encoder {encoder!r}", field=f"encodings[{e}].encoder")
    if len(set(encoding_identities)) != n_enc:
        raise InvalidArgument("two encodings hold the same unit", field="encodings")
    if n_refs == 0:
        return source
    ids = table.reference_encodings
    if ids.min() < 0 or ids.max() >= n_enc:
        raise InvalidArgument("names an unknown encoding", field="reference_encodings")
    if np.any(np.bincount(ids, minlength=n_enc) == 0):
        raise InvalidArgument("an encoding is never referenced", field="encodings")
    expected = source[ids].tolist()
    for r, (identity, content, first) in enumerate(zip(identities, contents, expected, strict=True)):
        if identity != identities[first] or content != contents[first]:
            raise InvalidArgument(
                f"maps to encoding {int(ids[r])}, which holds another unit", field=f"reference_encodings[{r}]"
            )
    placeholders = plan.placeholders
    rows = placeholders[:, 1] - placeholders[:, 0]
    bad = np.flatnonzero((rows != rows[source][ids]) | (costs != costs[source][ids]))
    if len(bad):
        r = int(bad[0])
        raise InvalidArgument(
            f"disagrees with encoding {int(ids[r])} on placeholder length or cost",
            field=f"reference_encodings[{r}]",
        )
    lengths = plan.num_tokens[plan.reference_trajectories]
    bad = np.flatnonzero((rows <= 0) | (placeholders[:, 1] > lengths))
    if len(bad):
        raise InvalidArgument("placeholder is empty or outside the sequence", field=f"references[{int(bad[0])}]")
    return source


def _validate_encoders(plan: Plan, columns: _ReferenceColumns, source_references: np.ndarray) -> None:
    if tuple(p.name for p in plan.encoders) != tuple(e.name for e in plan.topology.encoders):
        raise InvalidArgument("needs one plan per topology encoder, in topology order", field="encoders")
    n_enc = len(plan.encodings)
    identities, ref_costs, _ = columns
    source = source_references.tolist()
    costs = ref_costs[source] if n_enc else np.zeros(0)
    encoder_index = {e.name: i for i, e in enumerate(plan.topology.encoders)}
    encoder_of = np.array([encoder_index[identities[r][0]] for r in source], dtype=np.int64)
    owner_count = np.zeros(n_enc, dtype=np.int64)
    for index, (encoder, topo) in enumerate(zip(plan.encoders, plan.topology.encoders, strict=True)):
        where = f"encoders[{encoder.name}]"
        per_rank = encoder.microbatches_per_rank
        offsets = encoder.microbatch_offsets
        ids = encoder.microbatch_encodings
        if (
            len(offsets) != topo.dp * per_rank + 1
            or offsets[0] != 0
            or offsets[-1] != len(ids)
            or np.any(np.diff(offsets) < 0)
        ):
            raise InvalidArgument(
                f"must be {topo.dp * per_rank + 1} non-decreasing offsets", field=f"{where}.microbatch_offsets"
            )
        if len(ids) == 0:
            continue
        if ids.min() < 0 or ids.max() >= n_enc:
            raise InvalidArgument("names an unknown encoding", field=f"{where}.microbatch_encodings")
        foreign = np.flatnonzero(encoder_of[ids] != index)
        if len(foreign):
            e = int(ids[foreign[0]])
            raise InvalidArgument(
                f"encoding {e} belongs to encoder {identities[source[e]][0]!r}",
                field=f"{where}.microbatch_encodings",
            )
        owner_count += np.bincount(ids, minlength=n_enc)
        cost = segment_sums(offsets, costs[ids])
        over = np.flatnonzero((cost > topo.max_cost_per_microbatch) & (np.diff(offsets) > 1))
        if len(over):
            g = int(over[0])
            raise InvalidArgument(
                f"dp rank {g // per_rank} micro-batch {g % per_rank} costs {cost[g]}, over the budget of "
                f"{topo.max_cost_per_microbatch}, and is not a single oversize input",
                field=f"{where}.microbatch_offsets",
            )
    if np.any(owner_count != 1):
        e = int(np.flatnonzero(owner_count != 1)[0])
        raise InvalidArgument(f"encoding {e} has {int(owner_count[e])} owners, not exactly one", field="encoders")


def _validate_route(plan: Plan) -> None:
    route = plan.route
    topo = plan.topology.backbone
    n_refs = plan.num_references
    if n_refs == 0:
        if len(route):
            raise InvalidArgument("has rows but the mini-batch has no multimodal references", field="route")
        return
    if len(route) == 0:
        raise InvalidArgument("does not cover the references", field="route")
    if np.any(np.diff(route.encodings) < 0):
        raise InvalidArgument("rows must be sorted by encoding", field="route.encodings")
    refs = route.references
    if refs.min() < 0 or refs.max() >= n_refs:
        raise InvalidArgument("names an unknown reference", field="route.references")
    if np.any(plan.encodings.reference_encodings[refs] != route.encodings):
        raise InvalidArgument("a row's encoding is not its reference's", field="route.encodings")
    trajectories = plan.reference_trajectories[refs]
    if np.any(route.dp_ranks != plan.trajectory_dp_ranks[trajectories]) or np.any(
        route.microbatches != plan.trajectory_microbatches[trajectories]
    ):
        raise InvalidArgument(
            "a row does not go to the rank and micro-batch that train its trajectory", field="route"
        )
    if route.cp_ranks.min() < 0 or route.cp_ranks.max() >= topo.cp:
        raise InvalidArgument(f"must be in [0, {topo.cp})", field="route.cp_ranks")
    if route.tp_ranks.min() < 0 or route.tp_ranks.max() >= topo.tp:
        raise InvalidArgument(f"must be in [0, {topo.tp})", field="route.tp_ranks")
    placeholders = plan.placeholders[refs]
    starts, ends = route.starts, route.ends
    if np.any(starts >= ends) or np.any(starts < placeholders[:, 0]) or np.any(ends > placeholders[:, 1]):
        raise InvalidArgument("a row is empty or outside its reference's placeholder", field="route.starts")
    chunks = plan.backbone.cp_spans[trajectories, route.cp_ranks]  # [rows, 2, 2]
    inside = ((starts >= chunks[:, 0, 0]) & (ends <= chunks[:, 0, 1])) | (
        (starts >= chunks[:, 1, 0]) & (ends <= chunks[:, 1, 1])
    )
    if not np.all(inside):
        row = int(np.flatnonzero(~inside)[0])
        raise InvalidArgument("positions must lie inside one chunk of the row's CP rank", field=f"route[{row}]")
    want = plan.placeholders[:, 1] - plan.placeholders[:, 0]
    for tp_rank in range(topo.tp):
        rows = np.flatnonzero(route.tp_ranks == tp_rank)
        covered = np.bincount(refs[rows], weights=(ends - starts)[rows], minlength=n_refs)
        if np.any(covered != want):
            r = int(np.flatnonzero(covered != want)[0])
            raise InvalidArgument(f"reference {r} is not covered exactly at tp rank {tp_rank}", field="route")
        order = np.lexsort((starts[rows], refs[rows]))
        same = refs[rows][order][1:] == refs[rows][order][:-1]
        if np.any(same & (starts[rows][order][1:] < ends[rows][order][:-1])):
            raise InvalidArgument(f"rows of one reference overlap at tp rank {tp_rank}", field="route")


def _validate_quality(plan: Plan) -> None:
    q = plan.quality
    if len(q.rank_workloads) != plan.topology.backbone.dp:
        raise InvalidArgument("needs one workload per DP rank", field="quality.rank_workloads")
    if q.microbatches_per_rank != plan.backbone.microbatches_per_rank:
        raise InvalidArgument("does not match the backbone plan", field="quality.microbatches_per_rank")
    if q.references != plan.num_references or q.unique_encodings != len(plan.encodings):
        raise InvalidArgument("does not match the encoding table", field="quality.references")


def _check_tiling(spans: np.ndarray, lengths: np.ndarray) -> None:
    """Spans ``[N, k, 2]`` of each sequence must tile ``[0, length)`` with no gap and no overlap."""
    starts, ends = spans[..., 0], spans[..., 1]
    full = lengths[:, None]
    if np.any(starts > ends) or np.any(starts < 0) or np.any(ends > full):
        raise InvalidArgument("a CP range is reversed or outside its sequence", field="backbone.cp_spans")
    empty = starts == ends
    starts = np.where(empty, full, starts)
    ends = np.where(empty, full, ends)
    order = np.argsort(starts, axis=1, kind="stable")
    starts = np.take_along_axis(starts, order, axis=1)
    ends = np.take_along_axis(ends, order, axis=1)
    gap_or_overlap = (starts[:, 0] != 0) | np.any(starts[:, 1:] != np.minimum(ends[:, :-1], full), axis=1)
    short = (ends - starts).sum(axis=1) != lengths
    bad = np.flatnonzero(gap_or_overlap | short)
    if len(bad):
        raise InvalidArgument(
            "the CP ranges do not tile the sequence exactly", field=f"backbone.cp_spans[{int(bad[0])}]"
        )
