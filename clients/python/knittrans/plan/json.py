"""JSON forms of trajectories and plans (docs/plan-format.md).

Trajectories use the BATCH.jsonl form of ``knittrans plan``; plans the ``knittrans.plan/v1`` form. Parsing is
strict: unknown keys and wrong types raise :class:`~knittrans.errors.InvalidArgument` naming the field.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from functools import partial
from typing import Any

import numpy as np

from knittrans.config import build
from knittrans.errors import InvalidArgument, within
from knittrans.plan.geometry import segment_sums
from knittrans.plan.parts import (
    PLAN_FORMAT,
    ROUTE_COLUMNS,
    BackbonePlan,
    EncoderPlan,
    EncoderQuality,
    EncodingTable,
    Plan,
    PlanQuality,
    RouteMap,
)
from knittrans.types import (
    DType,
    FieldAlignment,
    MultimodalRef,
    SampleId,
    SourceName,
    TokenSpan,
    Topology,
    TrajectoryId,
    TrajectoryMeta,
    UnitHeader,
    UnitKey,
    UnitKind,
    UnitRef,
    VersionSegment,
)


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
        "topology": _topology_to_json_dict(plan.topology),
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


# --------------------------------------------------------------------------------------------------------------


class _Fields:
    """Typed, strict reads from one JSON object, naming the field of every error."""

    def __init__(self, data: Any, path: str, known: Sequence[str]) -> None:
        if not isinstance(data, Mapping):
            raise InvalidArgument(f"expected an object, got {type(data).__name__}", field=path or "<root>")
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise InvalidArgument(
                f"unknown key; known keys are: {', '.join(known)}", field=self._join(path, unknown[0])
            )
        self.data = data
        self.path = path

    @staticmethod
    def _join(path: str, key: str) -> str:
        return f"{path}.{key}" if path else key

    def field(self, key: str) -> str:
        return self._join(self.path, key)

    def has(self, key: str) -> bool:
        return key in self.data

    def raw(self, key: str, default: Any = ...) -> Any:
        if key not in self.data:
            if default is ...:
                raise InvalidArgument("is required", field=self.field(key))
            return default
        return self.data[key]

    def int(self, key: str, default: Any = ...) -> int:
        value = self.raw(key, default)
        if not isinstance(value, int) or isinstance(value, bool):
            raise InvalidArgument(f"expected an integer, got {value!r}", field=self.field(key))
        return value

    def float(self, key: str, default: Any = ...) -> float:
        value = self.raw(key, default)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise InvalidArgument(f"expected a number, got {value!r}", field=self.field(key))
        return float(value)

    def str(self, key: str, default: Any = ...) -> str:
        value = self.raw(key, default)
        if not isinstance(value, str):
            raise InvalidArgument(f"expected a string, got {value!r}", field=self.field(key))
        return value

    def bool(self, key: str, default: Any = ...) -> bool:
        value = self.raw(key, default)
        if not isinstance(value, bool):
            raise InvalidArgument(f"expected true or false, got {value!r}", field=self.field(key))
        return value

    def list(self, key: str, default: Any = ...) -> list[Any]:
        value = self.raw(key, default)
        if not isinstance(value, list):
            raise InvalidArgument(f"expected a list, got {value!r}", field=self.field(key))
        return value

    def ints(self, key: str, default: Any = ...) -> list[int]:
        values = self.list(key, default)
        for i, v in enumerate(values):
            if not isinstance(v, int) or isinstance(v, bool):
                raise InvalidArgument(f"expected an integer, got {v!r}", field=f"{self.field(key)}[{i}]")
        return values


def _header_to_json_dict(header: UnitHeader) -> dict[str, Any]:
    data: dict[str, Any] = {
        "dtype": header.dtype.value,
        "shape": list(header.shape),
        "byte_length": header.byte_length,
        "content_hash": header.content_hash,
    }
    if header.seq_axis is not None:
        data["seq_axis"] = header.seq_axis
    if header.chunk_tokens:
        data["chunk_tokens"] = header.chunk_tokens
    return data


def _header_from_json_dict(data: Any, path: str) -> UnitHeader:
    f = _Fields(data, path, ("dtype", "shape", "byte_length", "content_hash", "seq_axis", "chunk_tokens"))
    dtype = DType.parse(f.str("dtype"), f.field("dtype"))
    shape = tuple(f.ints("shape"))
    seq_axis = f.raw("seq_axis", None)
    if seq_axis is not None:
        seq_axis = f.int("seq_axis")
    # Fields are read (and named in full) before `within`, which adds the path only to the dataclass's errors.
    byte_length = f.int("byte_length", math.prod(shape) * dtype.itemsize)
    content_hash = f.str("content_hash")
    chunk_tokens = f.int("chunk_tokens", 0)
    return within(
        path,
        partial(
            UnitHeader, dtype=dtype, shape=shape, byte_length=byte_length, content_hash=content_hash,
            seq_axis=seq_axis, chunk_tokens=chunk_tokens,
        ),
    )


def _kind_from_json(value: str, field: str) -> UnitKind:
    try:
        return UnitKind(value)
    except ValueError:
        choices = ", ".join(k.value for k in UnitKind)
        raise InvalidArgument(f"must be one of {choices}, got {value!r}", field=field) from None


def trajectory_to_json_dict(meta: TrajectoryMeta) -> dict[str, Any]:
    """The JSON form of a trajectory's metadata (one line of a BATCH.jsonl file; see docs/plan-format.md)."""
    return {
        "trajectory_id": meta.trajectory_id,
        "sample_id": meta.sample_id,
        "source": meta.source,
        "rollout_step": meta.rollout_step,
        "num_tokens": meta.num_tokens,
        "num_loss_tokens": meta.num_loss_tokens,
        "segments": [{"version": s.version, "num_tokens": s.num_tokens} for s in meta.segments],
        "units": [
            {"key": u.key, "field_name": u.field_name, "kind": u.kind.value, "header": _header_to_json_dict(u.header),
             **({"alignment": u.alignment.value} if u.alignment is not None else {})}
            for u in meta.units
        ],
        "multimodal": [
            {
                "key": m.key,
                "encoder": m.encoder,
                "cost": m.cost,
                "placeholder": [m.placeholder.start, m.placeholder.end],
                "kind": m.kind.value,
                **({"header": _header_to_json_dict(m.header)} if m.header is not None else {}),
            }
            for m in meta.multimodal
        ],
        "accepted": meta.accepted,
        "scalars": dict(meta.scalars),
        "finished_at": meta.finished_at,
    }


_TRAJECTORY_KEYS = (
    "trajectory_id",
    "sample_id",
    "source",
    "rollout_step",
    "num_tokens",
    "num_loss_tokens",
    "segments",
    "units",
    "multimodal",
    "accepted",
    "scalars",
    "finished_at",
)


def trajectory_from_json_dict(data: Any, path: str = "") -> TrajectoryMeta:
    """Parse the JSON form of a trajectory, naming the field of any error (prefixed with ``path``).

    Only ``trajectory_id`` and ``num_tokens`` are required: ``sample_id`` defaults to the trajectory id,
    ``source`` to ``default``, ``num_loss_tokens`` to ``num_tokens``, ``segments`` to one version-0 segment
    over every token, and ``accepted`` to true.
    """
    f = _Fields(data, path, _TRAJECTORY_KEYS)
    trajectory_id = f.str("trajectory_id")
    num_tokens = f.int("num_tokens")
    segments = []
    default_segments = [{"version": 0, "num_tokens": num_tokens}] if num_tokens > 0 else []
    for i, raw in enumerate(f.list("segments", default_segments)):
        s = _Fields(raw, f"{f.field('segments')}[{i}]", ("version", "num_tokens"))
        version, segment_tokens = s.int("version"), s.int("num_tokens")
        segments.append(
            within(s.path, partial(VersionSegment, version=version, num_tokens=segment_tokens))
        )
    units = []
    for i, raw in enumerate(f.list("units", [])):
        u = _Fields(raw, f"{f.field('units')}[{i}]", ("key", "field_name", "kind", "header", "alignment"))
        header = _header_from_json_dict(u.raw("header"), u.field("header"))
        kind = _kind_from_json(u.str("kind"), u.field("kind"))
        key, field_name = UnitKey(u.str("key")), u.str("field_name")
        alignment = FieldAlignment.parse(u.str("alignment"), u.field("alignment")) if u.has("alignment") else None
        units.append(within(u.path, partial(UnitRef, key=key, field_name=field_name, kind=kind, header=header,
                                            alignment=alignment)))
    multimodal = []
    for i, raw in enumerate(f.list("multimodal", [])):
        m = _Fields(raw, f"{f.field('multimodal')}[{i}]", ("key", "encoder", "cost", "placeholder", "kind", "header"))
        span = m.ints("placeholder")
        if len(span) != 2:
            raise InvalidArgument("expected [start, end]", field=m.field("placeholder"))
        placeholder = within(m.field("placeholder"), lambda span=span: TokenSpan(start=span[0], end=span[1]))
        header = _header_from_json_dict(m.raw("header"), m.field("header")) if m.has("header") else None
        kind = _kind_from_json(m.str("kind", "image"), m.field("kind"))
        key, encoder, cost = UnitKey(m.str("key")), m.str("encoder"), m.float("cost")
        multimodal.append(
            within(
                m.path,
                partial(MultimodalRef, key=key, encoder=encoder, cost=cost, placeholder=placeholder, kind=kind,
                        header=header),
            )
        )
    scalars_raw = f.raw("scalars", {})
    if not isinstance(scalars_raw, Mapping):
        raise InvalidArgument("expected an object of numbers", field=f.field("scalars"))
    scalars = []
    for name, value in sorted(scalars_raw.items()):
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise InvalidArgument(f"expected a number, got {value!r}", field=f"{f.field('scalars')}.{name}")
        scalars.append((str(name), float(value)))
    sample_id = SampleId(f.str("sample_id", trajectory_id))
    source = SourceName(f.str("source", "default"))
    rollout_step = f.int("rollout_step", 0)
    num_loss_tokens = f.int("num_loss_tokens", max(num_tokens, 0))
    accepted = f.bool("accepted", True)
    finished_at = f.float("finished_at", 0.0)
    return within(
        path,
        lambda: TrajectoryMeta(
            trajectory_id=TrajectoryId(trajectory_id),
            sample_id=sample_id,
            source=source,
            rollout_step=rollout_step,
            num_tokens=num_tokens,
            num_loss_tokens=num_loss_tokens,
            segments=tuple(segments),
            units=tuple(units),
            multimodal=tuple(multimodal),
            accepted=accepted,
            scalars=tuple(scalars),
            finished_at=finished_at,
        ),
    )


def _topology_to_json_dict(topology: Topology) -> dict[str, Any]:
    data = asdict(topology)
    data["encoders"] = list(data["encoders"])
    return data


def topology_from_json_dict(data: Any, path: str = "topology") -> Topology:
    """A topology from its JSON/YAML mapping, with the config loader's strict key checks."""
    return within(path, lambda: build(Topology, data))


def plan_from_json_dict(data: Any) -> Plan:
    """Parse and :meth:`~knittrans.plan.Plan.validate` the JSON form of a plan."""
    plan = _plan_from_json_dict(data)
    plan.validate()
    return plan


def _plan_from_json_dict(data: Any) -> Plan:
    f = _Fields(
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
        e = _Fields(raw, f"encodings[{i}]", ("key", "encoder", "cost", "source"))
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
    r = _Fields(f.raw("route"), "route", ROUTE_COLUMNS)
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
    f = _Fields(
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
        rank = _Fields(raw, f"backbone.ranks[{d}]", ("dp_rank", "microbatches"))
        if rank.int("dp_rank") != d:
            raise InvalidArgument(f"expected {d}", field=rank.field("dp_rank"))
        microbatches = rank.list("microbatches")
        if len(microbatches) != per_rank:
            raise InvalidArgument(f"expected {per_rank} micro-batches", field=rank.field("microbatches"))
        for j, mb_raw in enumerate(microbatches):
            mb = _Fields(mb_raw, f"{rank.field('microbatches')}[{j}]", ("trajectories", "loss_tokens", "padded_tokens"))
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
    f = _Fields(data, f"encoders[{index}]", ("name", "microbatches_per_rank", "ranks"))
    per_rank = f.int("microbatches_per_rank")
    offsets = [0]
    ids: list[int] = []
    for d, raw in enumerate(f.list("ranks")):
        rank = _Fields(raw, f"{f.field('ranks')}[{d}]", ("dp_rank", "microbatches"))
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


def _floats(f: _Fields, key: str) -> tuple[float, ...]:
    values = f.list(key)
    for i, v in enumerate(values):
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            raise InvalidArgument(f"expected a number, got {v!r}", field=f"{f.field(key)}[{i}]")
    return tuple(float(v) for v in values)


def _quality_from_json_dict(data: Any) -> PlanQuality:
    f = _Fields(data, "quality", _QUALITY_KEYS)
    encoders = []
    for i, raw in enumerate(f.list("encoders")):
        e = _Fields(raw, f"quality.encoders[{i}]", _ENCODER_QUALITY_KEYS)
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
        scheme=f.str("scheme"),
    )
