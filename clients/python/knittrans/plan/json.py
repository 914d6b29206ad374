"""JSON forms of plans (docs/plan-format.md): the ``knittrans.plan/v1`` form, and (from
:mod:`knittrans.plan.trajectory_json`) the BATCH.jsonl form of trajectories that ``knittrans plan`` reads.
Parsing is strict: unknown keys and wrong types raise :class:`~knittrans.errors.InvalidArgument` naming the
field.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any, cast

import numpy as np

from knittrans.errors import InvalidArgument
from knittrans.plan.geometry import segment_sums
from knittrans.plan.parts import (
    PLAN_FORMAT,
    ROUTE_COLUMNS,
    BackbonePlan,
    BalanceScheme,
    EncoderPlan,
    EncoderQuality,
    EncodingTable,
    Plan,
    PlanQuality,
    RouteMap,
)
from knittrans.plan.trajectory_json import Fields

# The trajectory forms: also imported from here (so re-exported explicitly).
from knittrans.plan.trajectory_json import topology_from_json_dict as topology_from_json_dict
from knittrans.plan.trajectory_json import topology_to_json_dict as topology_to_json_dict
from knittrans.plan.trajectory_json import trajectory_from_json_dict as trajectory_from_json_dict
from knittrans.plan.trajectory_json import trajectory_to_json_dict as trajectory_to_json_dict
from knittrans.types import Topology


def plan_to_json(plan: Plan, *, indent: int | None = None) -> str:
    """The JSON text of a plan (docs/plan-format.md)."""
    return json.dumps(plan_to_json_dict(plan), indent=indent)


def plan_from_json(text: str | bytes) -> Plan:
    """Parse and :meth:`~knittrans.plan.Plan.validate` a plan written by :func:`plan_to_json`."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidArgument(f"not valid JSON: {exc}", field="plan") from None
    return plan_from_json_dict(data)


def plan_to_json_dict(plan: Plan) -> dict[str, Any]:
    """The JSON form of a plan (docs/plan-format.md)."""
    b = plan.backbone
    per_rank = b.microbatches_per_rank
    items = b.microbatch_items
    tokens = segment_sums(b.microbatch_offsets, b.padded_tokens[items]) if len(items) else np.zeros(0)
    ranks = []
    for d in range(plan.topology.backbone.dp):
        microbatches = []
        for j in range(per_rank):
            g = d * per_rank + j
            microbatches.append(
                {
                    "trajectories": b.items(g).tolist(),
                    "loss_tokens": int(b.microbatch_loss_tokens[g]),
                    "padded_tokens": int(tokens[g]),
                }
            )
        ranks.append({"dp_rank": d, "microbatches": microbatches})
    encoders = []
    for encoder_plan, topo in zip(plan.encoders, plan.topology.encoders, strict=False):
        k = encoder_plan.microbatches_per_rank
        encoders.append(
            {
                "name": encoder_plan.name,
                "microbatches_per_rank": k,
                "ranks": [
                    {"dp_rank": d, "microbatches": [encoder_plan.encodings(d * k + j).tolist() for j in range(k)]}
                    for d in range(topo.dp)
                ],
            }
        )
    encodings = []
    for e in range(len(plan.encodings)):
        enc = plan.encoding(e)
        encodings.append(
            {
                "key": enc.key,
                "encoder": enc.encoder,
                "cost": enc.cost,
                "source": [int(plan.encodings.source_trajectory[e]), int(plan.encodings.source_reference[e])],
            }
        )
    return {
        "format": PLAN_FORMAT,
        "topology": topology_to_json_dict(plan.topology),
        "label_fields": list(plan.label_fields),
        "trajectories": [trajectory_to_json_dict(t) for t in plan.trajectories],
        "backbone": {
            "microbatches_per_rank": per_rank,
            "minibatch_loss_tokens": b.minibatch_loss_tokens,
            "ranks": ranks,
            "padded_tokens": b.padded_tokens.tolist(),
            "cp_spans": b.cp_spans.tolist(),
        },
        "encodings": encodings,
        "reference_encodings": plan.encodings.reference_encodings.tolist(),
        "encoders": encoders,
        "route": {name: getattr(plan.route, name).tolist() for name in ROUTE_COLUMNS},
        "quality": asdict(plan.quality),
    }


def plan_from_json_dict(data: Any) -> Plan:
    """Parse and :meth:`~knittrans.plan.Plan.validate` the JSON form of a plan."""
    plan = _plan_from_json_dict(data)
    plan.validate()
    return plan


def _plan_from_json_dict(data: Any) -> Plan:
    f = Fields(
        data,
        "",
        (
            "format",
            "topology",
            "label_fields",
            "trajectories",
            "backbone",
            "encodings",
            "reference_encodings",
            "encoders",
            "route",
            "quality",
        ),
    )
    if f.str("format") != PLAN_FORMAT:
        raise InvalidArgument(f"expected {PLAN_FORMAT!r}", field="format")
    topology = topology_from_json_dict(f.raw("topology"))
    label_fields = f.list("label_fields")
    for i, name in enumerate(label_fields):
        if not isinstance(name, str):
            raise InvalidArgument("expected a string", field=f"label_fields[{i}]")
    trajectories = tuple(
        trajectory_from_json_dict(t, f"trajectories[{i}]") for i, t in enumerate(f.list("trajectories"))
    )
    backbone = _backbone_from_json_dict(f.raw("backbone"), topology)
    encodings = f.list("encodings")
    source_trajectory, source_reference = [], []
    for i, raw in enumerate(encodings):
        e = Fields(raw, f"encodings[{i}]", ("key", "encoder", "cost", "source"))
        source = e.ints("source")
        if len(source) != 2:
            raise InvalidArgument("expected [trajectory, reference]", field=e.field("source"))
        t, j = source
        if not (0 <= t < len(trajectories) and 0 <= j < len(trajectories[t].multimodal)):
            raise InvalidArgument(f"names an unknown reference ({t}, {j})", field=e.field("source"))
        ref = trajectories[t].multimodal[j]
        if (e.str("key"), e.str("encoder"), e.float("cost")) != (ref.key, ref.encoder, ref.cost):
            raise InvalidArgument("key, encoder or cost differs from its source reference", field=e.path)
        source_trajectory.append(t)
        source_reference.append(j)
    table = EncodingTable(
        source_trajectory=np.array(source_trajectory, dtype=np.int64),
        source_reference=np.array(source_reference, dtype=np.int64),
        reference_encodings=np.array(f.ints("reference_encodings"), dtype=np.int64),
    )
    encoders = tuple(_encoder_plan_from_json_dict(raw, i) for i, raw in enumerate(f.list("encoders")))
    r = Fields(f.raw("route"), "route", ROUTE_COLUMNS)
    route = RouteMap(**{name: np.array(r.ints(name), dtype=np.int64) for name in ROUTE_COLUMNS})
    quality = _quality_from_json_dict(f.raw("quality"))
    return Plan(
        topology=topology,
        label_fields=tuple(label_fields),
        trajectories=trajectories,
        backbone=backbone,
        encodings=table,
        encoders=encoders,
        route=route,
        quality=quality,
    )


def _backbone_from_json_dict(data: Any, topology: Topology) -> BackbonePlan:
    f = Fields(
        data, "backbone", ("microbatches_per_rank", "minibatch_loss_tokens", "ranks", "padded_tokens", "cp_spans")
    )
    per_rank = f.int("microbatches_per_rank")
    ranks = f.list("ranks")
    if len(ranks) != topology.backbone.dp:
        raise InvalidArgument(f"expected {topology.backbone.dp} ranks", field=f.field("ranks"))
    offsets = [0]
    items: list[int] = []
    loss: list[int] = []
    padded_claimed: list[int] = []
    for d, raw in enumerate(ranks):
        rank = Fields(raw, f"backbone.ranks[{d}]", ("dp_rank", "microbatches"))
        if rank.int("dp_rank") != d:
            raise InvalidArgument(f"expected {d}", field=rank.field("dp_rank"))
        microbatches = rank.list("microbatches")
        if len(microbatches) != per_rank:
            raise InvalidArgument(f"expected {per_rank} micro-batches", field=rank.field("microbatches"))
        for j, mb_raw in enumerate(microbatches):
            mb = Fields(mb_raw, f"{rank.field('microbatches')}[{j}]", ("trajectories", "loss_tokens", "padded_tokens"))
            items.extend(mb.ints("trajectories"))
            offsets.append(len(items))
            loss.append(mb.int("loss_tokens"))
            padded_claimed.append(mb.int("padded_tokens"))
    padded = np.array(f.ints("padded_tokens"), dtype=np.int64)
    try:
        spans = np.array(f.list("cp_spans"), dtype=np.int64).reshape(len(padded), topology.backbone.cp, 2, 2)
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"expected integers of shape [N, cp, 2, 2]: {exc}", field="backbone.cp_spans") from None
    plan = BackbonePlan(
        microbatches_per_rank=per_rank,
        microbatch_offsets=np.array(offsets, dtype=np.int64),
        microbatch_items=np.array(items, dtype=np.int64),
        padded_tokens=padded,
        cp_spans=spans,
        microbatch_loss_tokens=np.array(loss, dtype=np.int64),
        minibatch_loss_tokens=f.int("minibatch_loss_tokens"),
    )
    items_array = plan.microbatch_items
    if len(items_array) and (items_array.min() < 0 or items_array.max() >= len(padded)):
        raise InvalidArgument("names an unknown trajectory", field="backbone.ranks")
    actual = segment_sums(plan.microbatch_offsets, padded[items_array]) if len(items_array) else np.zeros(len(loss))
    if np.any(actual != np.array(padded_claimed, dtype=np.int64)):
        raise InvalidArgument("a micro-batch's padded_tokens does not add up", field="backbone.ranks")
    return plan


def _encoder_plan_from_json_dict(data: Any, index: int) -> EncoderPlan:
    f = Fields(data, f"encoders[{index}]", ("name", "microbatches_per_rank", "ranks"))
    per_rank = f.int("microbatches_per_rank")
    offsets = [0]
    ids: list[int] = []
    for d, raw in enumerate(f.list("ranks")):
        rank = Fields(raw, f"{f.field('ranks')}[{d}]", ("dp_rank", "microbatches"))
        if rank.int("dp_rank") != d:
            raise InvalidArgument(f"expected {d}", field=rank.field("dp_rank"))
        microbatches = rank.list("microbatches")
        if len(microbatches) != per_rank:
            raise InvalidArgument(f"expected {per_rank} micro-batches", field=rank.field("microbatches"))
        for j, mb in enumerate(microbatches):
            if not isinstance(mb, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in mb):
                raise InvalidArgument("expected a list of encoding ids", field=f"{rank.field('microbatches')}[{j}]")
            ids.extend(mb)
            offsets.append(len(ids))
    return EncoderPlan(
        name=f.str("name"),
        microbatches_per_rank=per_rank,
        microbatch_offsets=np.array(offsets, dtype=np.int64),
        microbatch_encodings=np.array(ids, dtype=np.int64),
    )


_QUALITY_KEYS = (
    "imbalance",
    "rank_workloads",
    "lockstep_imbalance",
    "microbatches_per_rank",
    "padding_tokens",
    "empty_microbatches",
    "oversize_microbatches",
    "references",
    "unique_encodings",
    "dedup_factor",
    "encoders",
    "scheme",
)
_ENCODER_QUALITY_KEYS = (
    "name",
    "imbalance",
    "rank_costs",
    "microbatches_per_rank",
    "empty_microbatches",
    "oversize_microbatches",
    "unique_encodings",
)


def _floats(f: Fields, key: str) -> tuple[float, ...]:
    values = f.list(key)
    for i, v in enumerate(values):
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            raise InvalidArgument(f"expected a number, got {v!r}", field=f"{f.field(key)}[{i}]")
    return tuple(float(v) for v in values)


def _quality_from_json_dict(data: Any) -> PlanQuality:
    f = Fields(data, "quality", _QUALITY_KEYS)
    encoders = []
    for i, raw in enumerate(f.list("encoders")):
        e = Fields(raw, f"quality.encoders[{i}]", _ENCODER_QUALITY_KEYS)
        encoders.append(
            EncoderQuality(
                name=e.str("name"),
                imbalance=e.float("imbalance"),
                rank_costs=_floats(e, "rank_costs"),
                microbatches_per_rank=e.int("microbatches_per_rank"),
                empty_microbatches=e.int("empty_microbatches"),
                oversize_microbatches=e.int("oversize_microbatches"),
                unique_encodings=e.int("unique_encodings"),
            )
        )
    return PlanQuality(
        imbalance=f.float("imbalance"),
        rank_workloads=_floats(f, "rank_workloads"),
        lockstep_imbalance=f.float("lockstep_imbalance"),
        microbatches_per_rank=f.int("microbatches_per_rank"),
        padding_tokens=f.int("padding_tokens"),
        empty_microbatches=f.int("empty_microbatches"),
        oversize_microbatches=f.int("oversize_microbatches"),
        references=f.int("references"),
        unique_encodings=f.int("unique_encodings"),
        dedup_factor=f.float("dedup_factor"),
        encoders=tuple(encoders),
        # PlanQuality parses the name, and names the field when it is unknown.
        scheme=cast(BalanceScheme, f.str("scheme")),
    )
