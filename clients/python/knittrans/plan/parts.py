"""The typed plan of one admitted mini-batch (DESIGN.md §4) and its parts.

Bulk index data is kept as read-only numpy arrays (CSR offsets plus flat index arrays), so a plan of thousands
of trajectories costs no Python object per range.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property
from typing import Any

import numpy as np

from knittrans.errors import InvalidArgument
from knittrans.plan.assignment import (
    AssignmentSource,
    ConsumerAssignment,
    Encoding,
    RouteEntry,
    assignment_source,
    consumer_assignment,
)
from knittrans.plan.geometry import covered_spans, cp_read_spans
from knittrans.plan.validate import validate_plan
from knittrans.types import (
    BACKBONE_ROLE,
    ENCODER_ROLE_PREFIX,
    ConsumerId,
    FieldAlignment,
    MultimodalRef,
    TokenSpan,
    Topology,
    TrajectoryMeta,
    UnitRef,
    check_id,
)

PLAN_FORMAT = "knittrans.plan/v1"
DEFAULT_LABEL_FIELDS = ("input_ids",)


def _frozen_array(value: Any, field: str, *, ndim: int = 1, dtype: type = np.int64) -> np.ndarray:
    try:
        array: np.ndarray = np.asarray(value, dtype=dtype)
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"not an array of {np.dtype(dtype).name}: {exc}", field=field) from None
    if array.ndim != ndim and not (array.size == 0 and ndim > 1):
        raise InvalidArgument(f"must have {ndim} dimension(s), got shape {array.shape}", field=field)
    view = array.view()
    view.flags.writeable = False
    return view


def _check_count(value: int, field: str) -> None:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 0:
        raise InvalidArgument(f"must be a non-negative integer, got {value!r}", field=field)



@dataclass(frozen=True, kw_only=True, eq=False)
class BackbonePlan:
    """Backbone micro-batches: micro-batch ``g`` is DP rank ``g // microbatches_per_rank``'s
    ``g % microbatches_per_rank``-th and holds trajectories ``microbatch_items[offsets[g]:offsets[g+1]]``."""

    microbatches_per_rank: int
    microbatch_offsets: np.ndarray  # [dp·K + 1]
    microbatch_items: np.ndarray  # [N] trajectory indices
    padded_tokens: np.ndarray  # [N]
    cp_spans: np.ndarray  # [N, cp, 2, 2], see zigzag_spans
    microbatch_loss_tokens: np.ndarray  # [dp·K]
    minibatch_loss_tokens: int

    def __post_init__(self) -> None:
        _check_count(self.microbatches_per_rank, "backbone.microbatches_per_rank")
        _check_count(self.minibatch_loss_tokens, "backbone.minibatch_loss_tokens")
        for name in ("microbatch_offsets", "microbatch_items", "padded_tokens", "microbatch_loss_tokens"):
            object.__setattr__(self, name, _frozen_array(getattr(self, name), f"backbone.{name}"))
        object.__setattr__(self, "cp_spans", _frozen_array(self.cp_spans, "backbone.cp_spans", ndim=4))
        if len(self.microbatch_offsets) < 1:
            raise InvalidArgument("needs at least one offset", field="backbone.microbatch_offsets")
        if len(self.microbatch_loss_tokens) != self.num_microbatches:
            raise InvalidArgument("needs one count per micro-batch", field="backbone.microbatch_loss_tokens")
        if self.cp_spans.shape[1:] and self.cp_spans.shape[2:] != (2, 2):
            raise InvalidArgument(
                f"must have shape [N, cp, 2, 2], got {self.cp_spans.shape}", field="backbone.cp_spans"
            )

    @property
    def num_microbatches(self) -> int:
        return len(self.microbatch_offsets) - 1

    def items(self, microbatch: int) -> np.ndarray:
        """Trajectory indices of global micro-batch ``microbatch``."""
        return self.microbatch_items[self.microbatch_offsets[microbatch] : self.microbatch_offsets[microbatch + 1]]


@dataclass(frozen=True, kw_only=True, eq=False)
class EncodingTable:
    """The unique multimodal inputs and which one every reference uses.

    Encoding ``e`` is first referenced by multimodal entry ``source_reference[e]`` of trajectory
    ``source_trajectory[e]``; its key, encoder, cost and header come from there.
    """

    source_trajectory: np.ndarray  # [E]
    source_reference: np.ndarray  # [E]
    reference_encodings: np.ndarray  # [R]

    def __post_init__(self) -> None:
        for name in ("source_trajectory", "source_reference", "reference_encodings"):
            object.__setattr__(self, name, _frozen_array(getattr(self, name), f"encodings.{name}"))
        if len(self.source_trajectory) != len(self.source_reference):
            raise InvalidArgument("needs one value per encoding", field="encodings.source_reference")

    def __len__(self) -> int:
        return len(self.source_trajectory)


@dataclass(frozen=True, kw_only=True, eq=False)
class EncoderPlan:
    """One encoder's micro-batches, laid out like :class:`BackbonePlan`'s, holding encoding ids."""

    name: str
    microbatches_per_rank: int
    microbatch_offsets: np.ndarray  # [dp_e·K_e + 1]
    microbatch_encodings: np.ndarray

    def __post_init__(self) -> None:
        check_id(self.name, "encoders.name")
        _check_count(self.microbatches_per_rank, f"encoders[{self.name}].microbatches_per_rank")
        for name in ("microbatch_offsets", "microbatch_encodings"):
            object.__setattr__(self, name, _frozen_array(getattr(self, name), f"encoders[{self.name}].{name}"))
        if len(self.microbatch_offsets) < 1:
            raise InvalidArgument("needs at least one offset", field=f"encoders[{self.name}].microbatch_offsets")

    @property
    def num_microbatches(self) -> int:
        return len(self.microbatch_offsets) - 1

    def encodings(self, microbatch: int) -> np.ndarray:
        """Encoding ids of global encoder micro-batch ``microbatch``."""
        return self.microbatch_encodings[self.microbatch_offsets[microbatch] : self.microbatch_offsets[microbatch + 1]]


ROUTE_COLUMNS = ("encodings", "references", "dp_ranks", "cp_ranks", "tp_ranks", "microbatches", "starts", "ends")


@dataclass(frozen=True, kw_only=True, eq=False)
class RouteMap:
    """Column ``[i]`` of every array describes route row i: encoding ``encodings[i]``, consumed through
    reference ``references[i]`` by backbone rank (``dp_ranks[i]``, ``cp_ranks[i]``, ``tp_ranks[i]``) in its
    micro-batch ``microbatches[i]``, filling placeholder positions ``[starts[i], ends[i])``.

    There is one row per (reference, CP rank, zigzag chunk, TP rank) whose chunk holds placeholder positions,
    so a placeholder cut by a CP boundary appears once per CP rank. Rows are sorted by encoding.
    """

    encodings: np.ndarray
    references: np.ndarray
    dp_ranks: np.ndarray
    cp_ranks: np.ndarray
    tp_ranks: np.ndarray
    microbatches: np.ndarray
    starts: np.ndarray
    ends: np.ndarray

    def __post_init__(self) -> None:
        for name in ROUTE_COLUMNS:
            object.__setattr__(self, name, _frozen_array(getattr(self, name), f"route.{name}"))
        lengths = {len(getattr(self, name)) for name in ROUTE_COLUMNS}
        if len(lengths) != 1:
            raise InvalidArgument("every column needs one value per row", field="route")

    def __len__(self) -> int:
        return len(self.encodings)

    @classmethod
    def empty(cls) -> RouteMap:
        return cls(**{name: np.zeros(0, dtype=np.int64) for name in ROUTE_COLUMNS})


class BalanceScheme(StrEnum):
    """How the backbone micro-batches were balanced over DP ranks."""

    PACK_THEN_DEAL = "pack_then_deal"  # pack under the budget, then deal with equal-count Karmarkar–Karp
    DEAL_THEN_PACK = "deal_then_pack"  # deal sequences with Karmarkar–Karp, then pack each rank's share


@dataclass(frozen=True, kw_only=True)
class EncoderQuality:
    name: str
    imbalance: float
    rank_costs: tuple[float, ...]
    microbatches_per_rank: int
    empty_microbatches: int
    oversize_microbatches: int
    unique_encodings: int


@dataclass(frozen=True, kw_only=True)
class PlanQuality:
    """How good a plan is. Imbalance is max/mean of the backbone workload (cost model on padded lengths) per
    DP rank; lockstep imbalance sums the slowest rank of every micro-batch step instead of whole ranks."""

    imbalance: float
    rank_workloads: tuple[float, ...]
    lockstep_imbalance: float
    microbatches_per_rank: int
    padding_tokens: int
    empty_microbatches: int
    oversize_microbatches: int
    references: int
    unique_encodings: int
    dedup_factor: float
    encoders: tuple[EncoderQuality, ...] = ()
    scheme: BalanceScheme = BalanceScheme.PACK_THEN_DEAL

    def __post_init__(self) -> None:
        object.__setattr__(self, "rank_workloads", tuple(float(w) for w in self.rank_workloads))
        object.__setattr__(self, "encoders", tuple(self.encoders))
        if not isinstance(self.scheme, BalanceScheme):
            try:
                object.__setattr__(self, "scheme", BalanceScheme(self.scheme))
            except ValueError:
                choices = ", ".join(s.value for s in BalanceScheme)
                raise InvalidArgument(
                    f"must be one of {choices}, got {self.scheme!r}", field="quality.scheme"
                ) from None


@dataclass(frozen=True, kw_only=True)
class EncodingOwner:
    """Where an encoding is computed: encoder DP rank, encoder micro-batch on that rank, slot inside it."""

    encoder: str
    dp_rank: int
    microbatch: int
    slot: int


# --------------------------------------------------------------------------------------------------------------
# The plan
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, eq=False)
class Plan:
    """The plan of one admitted mini-batch. Build it with the planner; check it with :meth:`validate`."""

    topology: Topology
    label_fields: tuple[str, ...]
    trajectories: tuple[TrajectoryMeta, ...]
    backbone: BackbonePlan
    encodings: EncodingTable
    encoders: tuple[EncoderPlan, ...]
    route: RouteMap
    quality: PlanQuality

    def __post_init__(self) -> None:
        object.__setattr__(self, "label_fields", tuple(self.label_fields))
        object.__setattr__(self, "trajectories", tuple(self.trajectories))
        object.__setattr__(self, "encoders", tuple(self.encoders))
        for i, name in enumerate(self.label_fields):
            check_id(name, f"label_fields[{i}]")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Plan):
            return NotImplemented
        return _comparable(self) == _comparable(other)

    __hash__ = None  # type: ignore[assignment]

    # ---- derived arrays -----------------------------------------------------------------------------------

    @property
    def num_trajectories(self) -> int:
        return len(self.trajectories)

    @property
    def microbatches_per_rank(self) -> int:
        return self.backbone.microbatches_per_rank

    @cached_property
    def num_tokens(self) -> np.ndarray:
        """Per trajectory: its real length."""
        return _frozen_array(
            np.fromiter((t.num_tokens for t in self.trajectories), np.int64, len(self.trajectories)), "num_tokens"
        )

    @cached_property
    def num_loss_tokens(self) -> np.ndarray:
        return _frozen_array(
            np.fromiter((t.num_loss_tokens for t in self.trajectories), np.int64, len(self.trajectories)), "loss"
        )

    @cached_property
    def reference_offsets(self) -> np.ndarray:
        """CSR offsets: trajectory t's references are ``reference_offsets[t] … reference_offsets[t+1]``."""
        counts = np.fromiter((len(t.multimodal) for t in self.trajectories), np.int64, len(self.trajectories))
        return _frozen_array(np.concatenate([np.zeros(1, np.int64), np.cumsum(counts)]), "reference_offsets")

    @property
    def num_references(self) -> int:
        return int(self.reference_offsets[-1])

    @cached_property
    def reference_trajectories(self) -> np.ndarray:
        """Per reference: the trajectory that holds it."""
        return _frozen_array(
            np.repeat(np.arange(len(self.trajectories), dtype=np.int64), np.diff(self.reference_offsets)), "refs"
        )

    def reference(self, reference: int) -> MultimodalRef:
        trajectory = int(self.reference_trajectories[reference])
        return self.trajectories[trajectory].multimodal[reference - int(self.reference_offsets[trajectory])]

    @cached_property
    def placeholders(self) -> np.ndarray:
        """Per reference: placeholder [start, end)."""
        spans = np.array(
            [(m.placeholder.start, m.placeholder.end) for t in self.trajectories for m in t.multimodal], dtype=np.int64
        )
        return spans.reshape(-1, 2)

    @cached_property
    def trajectory_dp_ranks(self) -> np.ndarray:
        """Per trajectory: the backbone DP rank that trains it."""
        ranks, _ = self._placement
        return ranks

    @cached_property
    def trajectory_microbatches(self) -> np.ndarray:
        """Per trajectory: the index of its micro-batch on its DP rank."""
        _, microbatches = self._placement
        return microbatches

    @cached_property
    def _placement(self) -> tuple[np.ndarray, np.ndarray]:
        b = self.backbone
        per_rank = max(b.microbatches_per_rank, 1)
        global_mb = np.repeat(np.arange(b.num_microbatches, dtype=np.int64), np.diff(b.microbatch_offsets))
        ranks = np.full(len(self.trajectories), -1, dtype=np.int64)
        microbatches = np.full(len(self.trajectories), -1, dtype=np.int64)
        items = b.microbatch_items
        if len(items) == len(global_mb) and (len(items) == 0 or (items.min() >= 0 and items.max() < len(ranks))):
            ranks[items] = global_mb // per_rank
            microbatches[items] = global_mb % per_rank
        return _frozen_array(ranks, "dp"), _frozen_array(microbatches, "mb")

    @cached_property
    def _route_by_encoding(self) -> np.ndarray:
        return np.searchsorted(self.route.encodings, np.arange(len(self.encodings) + 1))

    # ---- accessors ----------------------------------------------------------------------------------------

    def microbatches(self, dp_rank: int) -> tuple[np.ndarray, ...]:
        """The trajectory indices of each micro-batch of ``dp_rank``, in consumption order."""
        per_rank = self.backbone.microbatches_per_rank
        return tuple(self.backbone.items(dp_rank * per_rank + j) for j in range(per_rank))

    def cp_token_spans(self, trajectory: int, cp_rank: int) -> tuple[TokenSpan, TokenSpan]:
        """The real tokens of ``cp_rank``'s two zigzag chunks of a trajectory."""
        spans = self.backbone.cp_spans[trajectory, cp_rank]
        return (
            TokenSpan(start=int(spans[0, 0]), end=int(spans[0, 1])),
            TokenSpan(start=int(spans[1, 0]), end=int(spans[1, 1])),
        )

    def needs_look_ahead(self, unit: UnitRef) -> bool:
        """Whether ``cp_rank``'s reads of a per-token field take the token after each chunk too: label fields
        (labels are the next token) and token-aligned fields (packed shifted by one to be label-aligned)."""
        return unit.field_name in self.label_fields or unit.alignment is FieldAlignment.TOKEN

    def read_spans(self, trajectory: int, cp_rank: int, field_name: str) -> tuple[TokenSpan, ...]:
        """Token ranges of a per-token field that ``cp_rank`` reads (see :meth:`needs_look_ahead`); a response-only
        field's lie inside its response."""
        spans, meta = self.backbone.cp_spans[trajectory, cp_rank], self.trajectories[trajectory]
        unit = next((u for u in meta.units if u.field_name == field_name), None)
        look_ahead = field_name in self.label_fields if unit is None else self.needs_look_ahead(unit)
        read = covered_spans(cp_read_spans(spans, meta.num_tokens, look_ahead), meta.first_token(unit) if unit else 0)
        return tuple(TokenSpan(start=s, end=e) for s, e in read)

    def encoding(self, encoding_id: int) -> Encoding:
        table = self.encodings
        ref = self.trajectories[int(table.source_trajectory[encoding_id])].multimodal[
            int(table.source_reference[encoding_id])
        ]
        return Encoding(
            encoding_id=int(encoding_id),
            key=ref.key,
            encoder=ref.encoder,
            cost=float(ref.cost),
            num_rows=ref.placeholder.length,
            kind=ref.kind,
            header=ref.header,
        )

    def encoder_plan(self, name: str) -> EncoderPlan:
        for plan in self.encoders:
            if plan.name == name:
                return plan
        raise InvalidArgument(f"unknown encoder {name!r}", field="encoder")

    def encoder_microbatches(self, name: str, dp_rank: int) -> tuple[np.ndarray, ...]:
        """The encoding ids of each encoder micro-batch of encoder ``name``'s DP rank ``dp_rank``."""
        plan = self.encoder_plan(name)
        per_rank = plan.microbatches_per_rank
        return tuple(plan.encodings(dp_rank * per_rank + j) for j in range(per_rank))

    @cached_property
    def _owners(self) -> dict[int, EncodingOwner]:
        owners: dict[int, EncodingOwner] = {}
        for plan in self.encoders:
            per_rank = max(plan.microbatches_per_rank, 1)
            for g in range(plan.num_microbatches):
                for slot, encoding_id in enumerate(plan.encodings(g)):
                    owners[int(encoding_id)] = EncodingOwner(
                        encoder=plan.name, dp_rank=g // per_rank, microbatch=g % per_rank, slot=slot
                    )
        return owners

    def encoding_owner(self, encoding_id: int) -> EncodingOwner:
        try:
            return self._owners[int(encoding_id)]
        except KeyError:
            raise InvalidArgument(f"encoding {encoding_id} has no owner", field="encoding_id") from None

    def routes(self, encoding_id: int) -> tuple[RouteEntry, ...]:
        """Every backbone destination of an encoding, TP replicas and CP-boundary copies included."""
        bounds = self._route_by_encoding
        route = self.route
        entries = []
        for row in range(int(bounds[encoding_id]), int(bounds[encoding_id + 1])):
            reference = int(route.references[row])
            trajectory = int(self.reference_trajectories[reference])
            start = int(route.starts[row])
            entries.append(
                RouteEntry(
                    consumer=ConsumerId(
                        role=BACKBONE_ROLE, dp_rank=int(route.dp_ranks[row]), cp_rank=int(route.cp_ranks[row])
                    ),
                    tp_rank=int(route.tp_ranks[row]),
                    microbatch=int(route.microbatches[row]),
                    trajectory_index=trajectory,
                    trajectory_id=self.trajectories[trajectory].trajectory_id,
                    reference=reference,
                    positions=TokenSpan(start=start, end=int(route.ends[row])),
                    row_start=start - int(self.placeholders[reference, 0]),
                )
            )
        return tuple(entries)

    def consumers(self) -> tuple[ConsumerId, ...]:
        """Every consumer the plan assigns: backbone (dp, cp) pairs, then each encoder's DP ranks."""
        b = self.topology.backbone
        backbone = [ConsumerId(role=BACKBONE_ROLE, dp_rank=d, cp_rank=c) for d in range(b.dp) for c in range(b.cp)]
        encoders = [
            ConsumerId(role=f"{ENCODER_ROLE_PREFIX}{e.name}", dp_rank=d)
            for e in self.topology.encoders
            for d in range(e.dp)
        ]
        return tuple(backbone + encoders)

    def for_consumer(self, consumer: ConsumerId) -> ConsumerAssignment:
        """One consumer's part of the plan, with exact token and byte ranges, in consumption order."""
        consumer.check_within(self.topology)
        return consumer_assignment(self, consumer)

    @cached_property
    def assignment_source(self) -> AssignmentSource:
        """The plan as :func:`~knittrans.plan.assignment.expand_backbone` reads it (built once per plan)."""
        return assignment_source(self)

    def validate(self) -> None:
        """Check every invariant of DESIGN.md §4; raise :class:`InvalidArgument` naming the first broken one
        (see :func:`knittrans.plan.validate.validate_plan`)."""
        validate_plan(self)


def _comparable(plan: Plan) -> tuple[object, ...]:
    """What makes two plans equal: every part, with each trajectory's scalars as a mapping (their order carries
    nothing; the wire forms keep them as one)."""
    arrays = [plan.backbone.microbatch_offsets, plan.backbone.microbatch_items, plan.backbone.padded_tokens,
              plan.backbone.cp_spans, plan.backbone.microbatch_loss_tokens, plan.encodings.source_trajectory,
              plan.encodings.source_reference, plan.encodings.reference_encodings]
    arrays += [p.microbatch_offsets for p in plan.encoders] + [p.microbatch_encodings for p in plan.encoders]
    arrays += [getattr(plan.route, name) for name in ROUTE_COLUMNS]
    return (
        plan.topology,
        plan.label_fields,
        tuple((vars(t) | {"scalars": dict(t.scalars)}) for t in plan.trajectories),
        plan.backbone.microbatches_per_rank,
        plan.backbone.minibatch_loss_tokens,
        tuple((p.name, p.microbatches_per_rank) for p in plan.encoders),
        tuple((a.shape, a.tobytes()) for a in arrays),
        plan.quality,
    )
