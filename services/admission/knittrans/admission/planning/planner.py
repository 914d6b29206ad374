"""``plan_minibatch``: the pure planner of one admitted mini-batch (DESIGN.md §4).

No I/O, no clock, no globals: the plan is a function of the trajectories' metadata and the topology.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from knittrans.admission.planning.backbone import plan_backbone
from knittrans.admission.planning.encoder import (
    ReferenceColumns,
    References,
    build_route,
    collect_reference_columns,
    collect_references,
    plan_encoder,
)
from knittrans.errors import InvalidArgument
from knittrans.plan import (
    DEFAULT_LABEL_FIELDS,
    BackbonePlan,
    EncoderPlan,
    EncodingTable,
    Plan,
    PlanQuality,
    RouteMap,
)
from knittrans.types import Topology, TrajectoryMeta, check_id


def plan_minibatch(
    trajectories: Sequence[TrajectoryMeta],
    topology: Topology,
    *,
    label_fields: Sequence[str] = DEFAULT_LABEL_FIELDS,
    balance_target: float = 1.01,
) -> Plan:
    """Plan one admitted mini-batch: backbone micro-batches per DP rank with zigzag CP ranges, the encoder
    plan of its unique multimodal inputs, and the route map. Trajectories never leave the mini-batch.

    ``label_fields`` name the per-token fields that next-token labels come from; their CP ranges get one
    token of look-ahead, as do those of token-aligned units (packed shifted by one, see ``FieldAlignment``).
    When packing then dealing leaves the DP imbalance (max/mean workload) above ``balance_target``, dealing
    then packing is tried too and the better one kept.
    Raises :class:`InvalidArgument` naming the field for bad input.
    """
    _check_topology(topology)
    trajectories = tuple(trajectories)
    _check_trajectories(trajectories)
    for i, name in enumerate(label_fields):
        check_id(name, f"label_fields[{i}]")
    if not (isinstance(balance_target, (int, float)) and balance_target >= 1.0):
        raise InvalidArgument(f"must be a number of at least 1.0, got {balance_target!r}", field="balance_target")
    count = len(trajectories)
    num_tokens = np.fromiter((t.num_tokens for t in trajectories), dtype=np.int64, count=count)
    loss_tokens = np.fromiter((t.num_loss_tokens for t in trajectories), dtype=np.int64, count=count)
    _check_lengths(num_tokens, loss_tokens)
    layout = _plan_layout(
        num_tokens, loss_tokens, lambda: collect_references(trajectories, topology), topology, balance_target
    )
    return Plan(
        topology=topology,
        label_fields=tuple(label_fields),
        trajectories=trajectories,
        backbone=layout.backbone,
        encodings=layout.encodings,
        encoders=layout.encoders,
        route=layout.route,
        quality=layout.quality,
    )


@dataclass(frozen=True, kw_only=True, eq=False)
class PlanLayout:
    """Everything :func:`plan_minibatch` computes, without the trajectories' metadata it was computed from:
    ``Plan(topology=..., label_fields=..., trajectories=..., **layout.parts())`` is that plan."""

    backbone: BackbonePlan
    encodings: EncodingTable
    encoders: tuple[EncoderPlan, ...]
    route: RouteMap
    quality: PlanQuality

    def parts(self) -> dict[str, object]:
        return {"backbone": self.backbone, "encodings": self.encodings, "encoders": self.encoders,
                "route": self.route, "quality": self.quality}


def plan_columns(
    trajectory_ids: Sequence[str],
    num_tokens: np.ndarray,
    loss_tokens: np.ndarray,
    references: ReferenceColumns,
    topology: Topology,
    *,
    balance_target: float = 1.01,
) -> PlanLayout:
    """:func:`plan_minibatch` on columns (per trajectory its id, length and loss tokens; its multimodal
    references), for callers that hold the metadata in another form than :class:`TrajectoryMeta` (the
    admission service plans from its ingest columns). Same checks, same errors, same layout."""
    _check_topology(topology)
    if not len(trajectory_ids):
        raise InvalidArgument("an admitted mini-batch has at least one trajectory", field="trajectories")
    _check_unique(list(trajectory_ids))
    if not (isinstance(balance_target, (int, float)) and balance_target >= 1.0):
        raise InvalidArgument(f"must be a number of at least 1.0, got {balance_target!r}", field="balance_target")
    num_tokens = np.asarray(num_tokens, dtype=np.int64)
    loss_tokens = np.asarray(loss_tokens, dtype=np.int64)
    _check_lengths(num_tokens, loss_tokens)
    return _plan_layout(
        num_tokens, loss_tokens, lambda: collect_reference_columns(references, num_tokens, topology), topology,
        balance_target,
    )


def _plan_layout(
    num_tokens: np.ndarray,
    loss_tokens: np.ndarray,
    collect: Callable[[], References],
    topology: Topology,
    balance_target: float,
) -> PlanLayout:
    count = len(num_tokens)
    layout = plan_backbone(num_tokens, loss_tokens, topology.backbone, balance_target=balance_target)
    backbone = layout.plan

    references = collect()
    encoder_plans = []
    encoder_qualities = []
    for index, encoder in enumerate(topology.encoders):
        ids = np.flatnonzero(references.encoder_index == index)
        encoder_plan, encoder_quality = plan_encoder(encoder, ids, references.costs)
        encoder_plans.append(encoder_plan)
        encoder_qualities.append(encoder_quality)

    per_rank = backbone.microbatches_per_rank
    global_microbatch = np.repeat(
        np.arange(backbone.num_microbatches, dtype=np.int64), np.diff(backbone.microbatch_offsets)
    )
    placement = np.empty(count, dtype=np.int64)
    placement[backbone.microbatch_items] = global_microbatch
    route = build_route(
        references, placement // per_rank, placement % per_rank, backbone.cp_spans, topology.backbone.tp
    )

    rank_workloads = layout.rank_workloads
    mean = float(rank_workloads.mean())
    lockstep = float(layout.microbatch_workloads.max(axis=0).sum())
    n_refs = len(references.trajectory)
    n_unique = len(references.costs)
    quality = PlanQuality(
        imbalance=float(rank_workloads.max()) / mean,
        rank_workloads=tuple(rank_workloads.tolist()),
        lockstep_imbalance=lockstep / mean,
        microbatches_per_rank=per_rank,
        padding_tokens=layout.padding_tokens,
        empty_microbatches=layout.empty_microbatches,
        oversize_microbatches=layout.oversize_microbatches,
        references=n_refs,
        unique_encodings=n_unique,
        dedup_factor=n_refs / n_unique if n_unique else 1.0,
        encoders=tuple(encoder_qualities),
        scheme=layout.scheme,
    )
    return PlanLayout(
        backbone=backbone,
        encodings=EncodingTable(
            source_trajectory=references.source_trajectory,
            source_reference=references.source_reference,
            reference_encodings=references.encoding,
        ),
        encoders=tuple(encoder_plans),
        route=route,
        quality=quality,
    )


def _check_topology(topology: Topology) -> None:
    """The topology types validate themselves; re-check what the planner relies on, naming the field."""
    if not isinstance(topology, Topology):
        raise InvalidArgument(f"expected a Topology, got {type(topology).__name__}", field="topology")
    backbone = topology.backbone
    for name in ("dp", "cp", "tp", "microbatch_multiple", "max_tokens_per_microbatch"):
        value = getattr(backbone, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise InvalidArgument(f"must be at least 1, got {value!r}", field=f"topology.backbone.{name}")
    pad = backbone.effective_pad_multiple
    if pad < 1 or pad % (2 * backbone.cp):
        raise InvalidArgument(f"must be a positive multiple of 2·cp, got {pad}", field="topology.backbone.pad_multiple")
    for i, encoder in enumerate(topology.encoders):
        if not isinstance(encoder.dp, int) or encoder.dp < 1:
            raise InvalidArgument(f"must be at least 1, got {encoder.dp!r}", field=f"topology.encoders[{i}].dp")
        if not isinstance(encoder.tp, int) or encoder.tp < 1:
            raise InvalidArgument(f"must be at least 1, got {encoder.tp!r}", field=f"topology.encoders[{i}].tp")
        if not encoder.max_cost_per_microbatch >= 1:
            raise InvalidArgument(
                f"must be at least 1, got {encoder.max_cost_per_microbatch!r}",
                field=f"topology.encoders[{i}].max_cost_per_microbatch",
            )


def _check_trajectories(trajectories: tuple[TrajectoryMeta, ...]) -> None:
    if not trajectories:
        raise InvalidArgument("an admitted mini-batch has at least one trajectory", field="trajectories")
    bad = next((i for i, meta in enumerate(trajectories) if not isinstance(meta, TrajectoryMeta)), None)
    if bad is not None:
        raise InvalidArgument(
            f"expected TrajectoryMeta, got {type(trajectories[bad]).__name__}", field=f"trajectories[{bad}]"
        )
    _check_unique([meta.trajectory_id for meta in trajectories])


def _check_unique(ids: list[str]) -> None:
    if len(set(ids)) != len(ids):
        seen: dict[str, int] = {}
        for i, trajectory_id in enumerate(ids):
            if trajectory_id in seen:
                raise InvalidArgument(
                    f"id {trajectory_id!r} already appears at trajectories[{seen[trajectory_id]}]",
                    field=f"trajectories[{i}].trajectory_id",
                )
            seen[trajectory_id] = i


def _check_lengths(num_tokens: np.ndarray, loss_tokens: np.ndarray) -> None:
    bad = np.flatnonzero(num_tokens < 1)
    if len(bad):
        i = int(bad[0])
        raise InvalidArgument(f"must be positive, got {int(num_tokens[i])}", field=f"trajectories[{i}].num_tokens")
    bad = np.flatnonzero((loss_tokens < 0) | (loss_tokens > num_tokens))
    if len(bad):
        i = int(bad[0])
        raise InvalidArgument(
            f"must be in [0, num_tokens], got {int(loss_tokens[i])}", field=f"trajectories[{i}].num_loss_tokens"
        )
