"""The typed plan of one admitted mini-batch (DESIGN.md §4).

The admission service computes a :class:`Plan` for every admitted mini-batch; sidecars and trainers consume
it, so it lives in the SDK. A plan holds:

- the backbone layout: per DP rank an ordered list of micro-batches (every rank has the same count), each a
  list of trajectory indices; per trajectory its padded length and the zigzag CP chunks (2·cp chunks, CP rank
  r holds chunks r and 2cp−1−r);
- the encoder plan: the mini-batch's unique multimodal inputs (encodings), and per encoder DP rank the
  encoder micro-batches that encode them;
- the route map: for every encoding, each backbone (dp, cp, tp) rank and micro-batch that consumes it, with
  the placeholder positions that fall in that CP rank's chunks;
- quality figures.

Bulk index data is kept as read-only numpy arrays (CSR offsets plus flat index arrays), so a plan of
thousands of trajectories costs no Python object per range. :meth:`Plan.for_consumer` expands one
consumer's part into typed objects with exact token and byte ranges.

Trajectories are referred to by their index in :attr:`Plan.trajectories`, encodings by their id (index in
the encoding table), and multimodal references by their global index: references are numbered trajectory by
trajectory, in each trajectory's ``multimodal`` order.

The JSON and protobuf codecs live in :mod:`knittrans.plan_json` and :mod:`knittrans.plan_proto`; the methods
here delegate to them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property
from typing import Any

import numpy as np

from knittrans.errors import InvalidArgument
from knittrans.types import (
    BACKBONE_ROLE,
    ENCODER_ROLE_PREFIX,
    ByteRange,
    ConsumerId,
    FieldAlignment,
    MultimodalRef,
    TokenSpan,
    Topology,
    TrajectoryId,
    TrajectoryMeta,
    UnitHeader,
    UnitKey,
    UnitKind,
    UnitRef,
    check_id,
)
from knittrans.v1 import plan_pb2

PLAN_FORMAT = "knittrans.plan/v1"
DEFAULT_LABEL_FIELDS = ("input_ids",)


# --------------------------------------------------------------------------------------------------------------
# Zigzag CP layout
# --------------------------------------------------------------------------------------------------------------


def padded_lengths(num_tokens: np.ndarray, pad_multiple: int) -> np.ndarray:
    """Each length rounded up to a multiple of ``pad_multiple``."""
    lengths = np.asarray(num_tokens, dtype=np.int64)
    return -(-lengths // pad_multiple) * pad_multiple


def zigzag_chunks(cp: int, cp_rank: int) -> tuple[int, int]:
    """The two chunk indices CP rank ``cp_rank`` holds: ``r`` and ``2cp−1−r``, which balances causal work."""
    return cp_rank, 2 * cp - 1 - cp_rank


def zigzag_spans(num_tokens: np.ndarray, padded_tokens: np.ndarray, cp: int) -> np.ndarray:
    """The real tokens of every zigzag chunk: an int64 array ``[trajectory, cp rank, chunk 0|1, start|end]``.

    A padded sequence of P tokens is cut into 2·cp chunks of P/(2·cp); ranges are clipped at the real length,
    so a chunk that is all padding has ``start == end == num_tokens``.
    """
    lengths = np.asarray(num_tokens, dtype=np.int64)[:, None, None]
    chunk = (np.asarray(padded_tokens, dtype=np.int64) // (2 * cp))[:, None, None]
    ranks = np.arange(cp, dtype=np.int64)
    chunk_ids = np.stack([ranks, 2 * cp - 1 - ranks], axis=1)[None]  # [1, cp, 2]
    starts = chunk * chunk_ids
    return np.stack([np.minimum(starts, lengths), np.minimum(starts + chunk, lengths)], axis=-1)


def merge_spans(spans: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted, non-empty spans with overlapping or touching ones merged."""
    merged: list[tuple[int, int]] = []
    for start, end in sorted(s for s in spans if s[1] > s[0]):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


# --------------------------------------------------------------------------------------------------------------
# Plan parts
# --------------------------------------------------------------------------------------------------------------


def _frozen_array(value: Any, field: str, *, ndim: int = 1, dtype: type = np.int64) -> np.ndarray:
    try:
        array = np.asarray(value, dtype=dtype)
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


def segment_sums(offsets: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Sum of ``values`` over each CSR segment, exact for integers and correct for empty segments."""
    totals = np.concatenate([np.zeros(1, dtype=values.dtype), np.cumsum(values)])
    return totals[offsets[1:]] - totals[offsets[:-1]]


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


# --------------------------------------------------------------------------------------------------------------
# One consumer's part
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Encoding:
    """One unique multimodal input of the mini-batch."""

    encoding_id: int
    key: UnitKey
    encoder: str
    cost: float
    num_rows: int  # encoder output rows: the placeholder length of every reference
    kind: UnitKind = UnitKind.IMAGE
    header: UnitHeader | None = None

    @property
    def needed_bytes(self) -> int:
        return self.header.byte_length if self.header is not None else 0


@dataclass(frozen=True, kw_only=True)
class EncodingOwner:
    """Where an encoding is computed: encoder DP rank, encoder micro-batch on that rank, slot inside it."""

    encoder: str
    dp_rank: int
    microbatch: int
    slot: int


@dataclass(frozen=True, kw_only=True)
class ChunkSlice:
    """One zigzag chunk of a sequence: ``padded`` in padded coordinates (position ids), ``tokens`` the real
    tokens inside it (empty when the chunk is all padding)."""

    chunk: int
    padded: TokenSpan
    tokens: TokenSpan


@dataclass(frozen=True, kw_only=True)
class FieldRead:
    """The reads of one field of one trajectory: token spans (empty for a whole-unit read) and their bytes."""

    unit: UnitRef
    spans: tuple[TokenSpan, ...]
    byte_ranges: tuple[ByteRange, ...]
    look_ahead: bool = False

    @property
    def needed_bytes(self) -> int:
        return sum(r.length for r in self.byte_ranges)


@dataclass(frozen=True, kw_only=True)
class EncodingUse:
    """An encoding consumed by a backbone item: encoder output rows ``row_start …`` fill ``positions``."""

    encoding_id: int
    key: UnitKey
    positions: TokenSpan
    row_start: int
    reference: int


@dataclass(frozen=True, kw_only=True)
class ItemAssignment:
    """One trajectory of a micro-batch as one CP rank sees it."""

    trajectory_index: int
    trajectory: TrajectoryMeta
    padded_tokens: int
    chunks: tuple[ChunkSlice, ...]
    reads: tuple[FieldRead, ...]
    encodings: tuple[EncodingUse, ...] = ()

    @property
    def local_tokens(self) -> int:
        """Tokens this CP rank packs for the item, padding included."""
        return sum(c.padded.length for c in self.chunks)

    @property
    def needed_bytes(self) -> int:
        return sum(r.needed_bytes for r in self.reads)


@dataclass(frozen=True, kw_only=True)
class MicroBatchAssignment:
    index: int
    last: bool
    num_loss_tokens: int  # of the whole micro-batch, over all CP ranks
    items: tuple[ItemAssignment, ...]

    @property
    def local_tokens(self) -> int:
        return sum(i.local_tokens for i in self.items)

    @property
    def needed_bytes(self) -> int:
        return sum(i.needed_bytes for i in self.items)


@dataclass(frozen=True, kw_only=True)
class RouteEntry:
    """One destination of an encoding: a backbone consumer's TP rank, its micro-batch and the positions."""

    consumer: ConsumerId
    tp_rank: int
    microbatch: int
    trajectory_index: int
    trajectory_id: TrajectoryId
    reference: int
    positions: TokenSpan
    row_start: int


@dataclass(frozen=True, kw_only=True)
class EncodingAssignment:
    encoding: Encoding
    routes: tuple[RouteEntry, ...]


@dataclass(frozen=True, kw_only=True)
class EncoderMicroBatchAssignment:
    index: int
    last: bool
    encodings: tuple[EncodingAssignment, ...]

    @property
    def cost(self) -> float:
        return sum(e.encoding.cost for e in self.encodings)

    @property
    def needed_bytes(self) -> int:
        return sum(e.encoding.needed_bytes for e in self.encodings)


@dataclass(frozen=True, kw_only=True)
class ConsumerAssignment:
    """One consumer's part of a plan, in consumption order: backbone micro-batches for a backbone consumer,
    encoder micro-batches for an encoder consumer."""

    consumer: ConsumerId
    minibatch_loss_tokens: int
    cp: int
    microbatches: tuple[MicroBatchAssignment, ...] = ()
    encoder_microbatches: tuple[EncoderMicroBatchAssignment, ...] = ()

    @property
    def needed_bytes(self) -> int:
        return sum(m.needed_bytes for m in self.microbatches) + sum(m.needed_bytes for m in self.encoder_microbatches)

    def to_proto(self) -> plan_pb2.ConsumerAssignment:
        from knittrans.plan_proto import assignment_to_proto  # plan_proto imports this module

        return assignment_to_proto(self)

    @staticmethod
    def from_proto(message: plan_pb2.ConsumerAssignment) -> ConsumerAssignment:
        from knittrans.plan_proto import assignment_from_proto

        return assignment_from_proto(message)


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
        return self.to_proto() == other.to_proto()

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
    def _placeholders(self) -> np.ndarray:
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

    @cached_property
    def _route_by_trajectory(self) -> tuple[np.ndarray, np.ndarray]:
        """Route rows of TP rank 0 grouped by trajectory: (row indices, CSR offsets)."""
        rows = np.flatnonzero(self.route.tp_ranks == 0)
        trajectories = self.reference_trajectories[self.route.references[rows]]
        order = np.argsort(trajectories, kind="stable")
        offsets = np.searchsorted(trajectories[order], np.arange(len(self.trajectories) + 1))
        return rows[order], offsets

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
        """Token ranges of a per-token field that ``cp_rank`` reads (see :meth:`needs_look_ahead`)."""
        spans = self.backbone.cp_spans[trajectory, cp_rank]
        unit = next((u for u in self.trajectories[trajectory].units if u.field_name == field_name), None)
        look_ahead = field_name in self.label_fields if unit is None else self.needs_look_ahead(unit)
        return tuple(
            TokenSpan(start=s, end=e)
            for s, e in _token_read_spans(spans, int(self.num_tokens[trajectory]), look_ahead=look_ahead)
        )

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
                    row_start=start - int(self._placeholders[reference, 0]),
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
        if consumer.encoder_name is None:
            return self._backbone_assignment(consumer)
        return self._encoder_assignment(consumer)

    def _backbone_assignment(self, consumer: ConsumerId) -> ConsumerAssignment:
        per_rank = self.backbone.microbatches_per_rank
        microbatches = []
        for j in range(per_rank):
            g = consumer.dp_rank * per_rank + j
            items = tuple(self._item_assignment(int(t), consumer.cp_rank) for t in self.backbone.items(g))
            microbatches.append(
                MicroBatchAssignment(
                    index=j,
                    last=j == per_rank - 1,
                    num_loss_tokens=int(self.backbone.microbatch_loss_tokens[g]),
                    items=items,
                )
            )
        return ConsumerAssignment(
            consumer=consumer,
            minibatch_loss_tokens=self.backbone.minibatch_loss_tokens,
            cp=self.topology.backbone.cp,
            microbatches=tuple(microbatches),
        )

    def _item_assignment(self, trajectory: int, cp_rank: int) -> ItemAssignment:
        meta = self.trajectories[trajectory]
        cp = self.topology.backbone.cp
        padded = int(self.backbone.padded_tokens[trajectory])
        chunk_tokens = padded // (2 * cp)
        spans = self.backbone.cp_spans[trajectory, cp_rank]
        chunks = tuple(
            ChunkSlice(
                chunk=c,
                padded=TokenSpan(start=c * chunk_tokens, end=(c + 1) * chunk_tokens),
                tokens=TokenSpan(start=int(spans[k, 0]), end=int(spans[k, 1])),
            )
            for k, c in enumerate(zigzag_chunks(cp, cp_rank))
        )
        reads = []
        for unit in meta.units:
            if unit.kind is UnitKind.TOKEN_FIELD:
                look_ahead = self.needs_look_ahead(unit)
                token_spans = tuple(
                    TokenSpan(start=s, end=e) for s, e in _token_read_spans(spans, meta.num_tokens, look_ahead)
                )
                reads.append(
                    FieldRead(
                        unit=unit,
                        spans=token_spans,
                        byte_ranges=tuple(unit.header.byte_range(s) for s in token_spans),
                        look_ahead=look_ahead,
                    )
                )
            elif unit.kind is UnitKind.FIELD:  # images and videos reach the backbone only as encodings
                reads.append(
                    FieldRead(unit=unit, spans=(), byte_ranges=(ByteRange(offset=0, length=unit.header.byte_length),))
                )
        rows, offsets = self._route_by_trajectory
        route = self.route
        uses = []
        for row in rows[offsets[trajectory] : offsets[trajectory + 1]]:
            if route.cp_ranks[row] != cp_rank:
                continue
            reference = int(route.references[row])
            start = int(route.starts[row])
            uses.append(
                EncodingUse(
                    encoding_id=int(route.encodings[row]),
                    key=self.reference(reference).key,
                    positions=TokenSpan(start=start, end=int(route.ends[row])),
                    row_start=start - int(self._placeholders[reference, 0]),
                    reference=reference,
                )
            )
        uses.sort(key=lambda u: u.positions.start)
        return ItemAssignment(
            trajectory_index=trajectory,
            trajectory=meta,
            padded_tokens=padded,
            chunks=chunks,
            reads=tuple(reads),
            encodings=tuple(uses),
        )

    def _encoder_assignment(self, consumer: ConsumerId) -> ConsumerAssignment:
        plan = self.encoder_plan(consumer.encoder_name or "")
        per_rank = plan.microbatches_per_rank
        microbatches = []
        for j in range(per_rank):
            g = consumer.dp_rank * per_rank + j
            encodings = tuple(
                EncodingAssignment(encoding=self.encoding(int(e)), routes=self.routes(int(e)))
                for e in plan.encodings(g)
            )
            microbatches.append(EncoderMicroBatchAssignment(index=j, last=j == per_rank - 1, encodings=encodings))
        return ConsumerAssignment(
            consumer=consumer,
            minibatch_loss_tokens=self.backbone.minibatch_loss_tokens,
            cp=self.topology.backbone.cp,
            encoder_microbatches=tuple(microbatches),
        )

    # ---- invariants ---------------------------------------------------------------------------------------

    def validate(self) -> None:
        """Check every invariant of DESIGN.md §4; raise :class:`InvalidArgument` naming the first broken one.

        - every trajectory appears exactly once in the backbone plan, every DP rank has the same number of
          micro-batches (a multiple of ``microbatch_multiple``), and budgets hold except for oversize singletons;
        - the CP ranges of every sequence are its zigzag chunks and tile it exactly, with no gap or overlap;
        - loss-token counts add up;
        - every unique encoding has exactly one owner, within its encoder's budgets, and equal micro-batch
          counts over the encoder's DP ranks;
        - the route map covers every reference exactly, for every TP rank, at the rank that trains it.
        """
        if not self.trajectories:
            raise InvalidArgument("a plan needs at least one trajectory", field="trajectories")
        ids = [t.trajectory_id for t in self.trajectories]
        if len(set(ids)) != len(ids):
            raise InvalidArgument("a trajectory id appears twice", field="trajectories")
        self._validate_backbone()
        self._validate_encodings()
        self._validate_encoders()
        self._validate_route()
        self._validate_quality()

    def _validate_backbone(self) -> None:
        topo = self.topology.backbone
        b = self.backbone
        n = len(self.trajectories)
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
        lengths = self.num_tokens
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
        loss = segment_sums(offsets, self.num_loss_tokens[items])
        if np.any(loss != b.microbatch_loss_tokens):
            raise InvalidArgument(
                "does not match the trajectories' loss tokens", field="backbone.microbatch_loss_tokens"
            )
        if b.minibatch_loss_tokens != int(self.num_loss_tokens.sum()):
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

    @cached_property
    def _reference_columns(self) -> tuple[list[tuple[str, str]], np.ndarray, list[tuple[UnitKind, str | None]]]:
        """Per reference: (encoder, key), cost, and (kind, content hash) — what identifies its unit."""
        refs = [m for t in self.trajectories for m in t.multimodal]
        identities = [(m.encoder, m.key) for m in refs]
        costs = np.fromiter((m.cost for m in refs), dtype=np.float64, count=len(refs))
        contents = [(m.kind, m.header.content_hash if m.header is not None else None) for m in refs]
        return identities, costs, contents

    @cached_property
    def _encoding_source_references(self) -> np.ndarray:
        """Per encoding: the global index of its source reference (after _validate_encodings' checks)."""
        table = self.encodings
        return self.reference_offsets[table.source_trajectory] + table.source_reference

    def _validate_encodings(self) -> None:
        table = self.encodings
        n = len(self.trajectories)
        n_refs = self.num_references
        n_enc = len(table)
        if len(table.reference_encodings) != n_refs:
            raise InvalidArgument(f"needs one encoding id per reference ({n_refs})", field="reference_encodings")
        counts = np.diff(self.reference_offsets)
        t, j = table.source_trajectory, table.source_reference
        bad = np.flatnonzero((t < 0) | (t >= n) | (j < 0) | (j >= counts[np.clip(t, 0, max(n - 1, 0))]))
        if len(bad):
            e = int(bad[0])
            raise InvalidArgument(f"names an unknown reference ({int(t[e])}, {int(j[e])})", field=f"encodings[{e}]")
        identities, costs, contents = self._reference_columns
        source = self._encoding_source_references
        encoding_identities = [identities[r] for r in source.tolist()]
        known = {e.name for e in self.topology.encoders}
        for e, (encoder, _) in enumerate(encoding_identities):
            if encoder not in known:
                raise InvalidArgument(f"unknown encoder {encoder!r}", field=f"encodings[{e}].encoder")
        if len(set(encoding_identities)) != n_enc:
            raise InvalidArgument("two encodings hold the same unit", field="encodings")
        if n_refs == 0:
            return
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
        placeholders = self._placeholders
        rows = placeholders[:, 1] - placeholders[:, 0]
        bad = np.flatnonzero((rows != rows[source][ids]) | (costs != costs[source][ids]))
        if len(bad):
            r = int(bad[0])
            raise InvalidArgument(
                f"disagrees with encoding {int(ids[r])} on placeholder length or cost",
                field=f"reference_encodings[{r}]",
            )
        lengths = self.num_tokens[self.reference_trajectories]
        bad = np.flatnonzero((rows <= 0) | (placeholders[:, 1] > lengths))
        if len(bad):
            raise InvalidArgument("placeholder is empty or outside the sequence", field=f"references[{int(bad[0])}]")

    def _validate_encoders(self) -> None:
        if tuple(p.name for p in self.encoders) != tuple(e.name for e in self.topology.encoders):
            raise InvalidArgument("needs one plan per topology encoder, in topology order", field="encoders")
        n_enc = len(self.encodings)
        identities, ref_costs, _ = self._reference_columns
        source = self._encoding_source_references.tolist()
        costs = ref_costs[source] if n_enc else np.zeros(0)
        encoder_index = {e.name: i for i, e in enumerate(self.topology.encoders)}
        encoder_of = np.array([encoder_index[identities[r][0]] for r in source], dtype=np.int64)
        owner_count = np.zeros(n_enc, dtype=np.int64)
        for index, (plan, topo) in enumerate(zip(self.encoders, self.topology.encoders, strict=True)):
            where = f"encoders[{plan.name}]"
            per_rank = plan.microbatches_per_rank
            offsets = plan.microbatch_offsets
            ids = plan.microbatch_encodings
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

    def _validate_route(self) -> None:
        route = self.route
        topo = self.topology.backbone
        n_refs = self.num_references
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
        if np.any(self.encodings.reference_encodings[refs] != route.encodings):
            raise InvalidArgument("a row's encoding is not its reference's", field="route.encodings")
        trajectories = self.reference_trajectories[refs]
        if np.any(route.dp_ranks != self.trajectory_dp_ranks[trajectories]) or np.any(
            route.microbatches != self.trajectory_microbatches[trajectories]
        ):
            raise InvalidArgument(
                "a row does not go to the rank and micro-batch that train its trajectory", field="route"
            )
        if route.cp_ranks.min() < 0 or route.cp_ranks.max() >= topo.cp:
            raise InvalidArgument(f"must be in [0, {topo.cp})", field="route.cp_ranks")
        if route.tp_ranks.min() < 0 or route.tp_ranks.max() >= topo.tp:
            raise InvalidArgument(f"must be in [0, {topo.tp})", field="route.tp_ranks")
        placeholders = self._placeholders[refs]
        starts, ends = route.starts, route.ends
        if np.any(starts >= ends) or np.any(starts < placeholders[:, 0]) or np.any(ends > placeholders[:, 1]):
            raise InvalidArgument("a row is empty or outside its reference's placeholder", field="route.starts")
        chunks = self.backbone.cp_spans[trajectories, route.cp_ranks]  # [rows, 2, 2]
        inside = ((starts >= chunks[:, 0, 0]) & (ends <= chunks[:, 0, 1])) | (
            (starts >= chunks[:, 1, 0]) & (ends <= chunks[:, 1, 1])
        )
        if not np.all(inside):
            row = int(np.flatnonzero(~inside)[0])
            raise InvalidArgument("positions must lie inside one chunk of the row's CP rank", field=f"route[{row}]")
        want = self._placeholders[:, 1] - self._placeholders[:, 0]
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

    def _validate_quality(self) -> None:
        q = self.quality
        if len(q.rank_workloads) != self.topology.backbone.dp:
            raise InvalidArgument("needs one workload per DP rank", field="quality.rank_workloads")
        if q.microbatches_per_rank != self.backbone.microbatches_per_rank:
            raise InvalidArgument("does not match the backbone plan", field="quality.microbatches_per_rank")
        if q.references != self.num_references or q.unique_encodings != len(self.encodings):
            raise InvalidArgument("does not match the encoding table", field="quality.references")

    # ---- JSON and protobuf (codecs in knittrans.plan_json and knittrans.plan_proto) -------------------------

    def to_json_dict(self) -> dict[str, Any]:
        from knittrans.plan_json import plan_to_json_dict  # the codec modules import this one

        return plan_to_json_dict(self)

    def to_json(self, *, indent: int | None = None) -> str:
        return json.dumps(self.to_json_dict(), indent=indent)

    @staticmethod
    def from_json(text: str | bytes) -> Plan:
        """Parse and :meth:`validate` a plan written by :meth:`to_json`."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidArgument(f"not valid JSON: {exc}", field="plan") from None
        return Plan.from_json_dict(data)

    @staticmethod
    def from_json_dict(data: Mapping[str, Any]) -> Plan:
        from knittrans.plan_json import plan_from_json_dict

        plan = plan_from_json_dict(data)
        plan.validate()
        return plan

    def to_proto(self) -> plan_pb2.Plan:
        from knittrans.plan_proto import plan_to_proto

        return plan_to_proto(self)

    @staticmethod
    def from_proto(message: plan_pb2.Plan) -> Plan:
        """Convert and :meth:`validate` a plan message."""
        from knittrans.plan_proto import plan_from_proto

        plan = plan_from_proto(message)
        plan.validate()
        return plan


def _token_read_spans(chunk_spans: np.ndarray, num_tokens: int, look_ahead: bool) -> list[tuple[int, int]]:
    extra = 1 if look_ahead else 0
    return merge_spans([(int(s), min(int(e) + extra, num_tokens)) for s, e in chunk_spans if e > s])


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


__all__ = [
    "DEFAULT_LABEL_FIELDS",
    "PLAN_FORMAT",
    "ROUTE_COLUMNS",
    "BackbonePlan",
    "BalanceScheme",
    "ChunkSlice",
    "ConsumerAssignment",
    "EncoderMicroBatchAssignment",
    "EncoderPlan",
    "EncoderQuality",
    "Encoding",
    "EncodingAssignment",
    "EncodingOwner",
    "EncodingTable",
    "EncodingUse",
    "FieldRead",
    "ItemAssignment",
    "MicroBatchAssignment",
    "Plan",
    "PlanQuality",
    "RouteEntry",
    "RouteMap",
    "merge_spans",
    "padded_lengths",
    "segment_sums",
    "zigzag_chunks",
    "zigzag_spans",
]
