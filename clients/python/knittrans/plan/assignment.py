"""What one consumer receives, and the one expansion of a plan into it.

A consumer's part (:class:`ConsumerAssignment`) lists, in consumption order, its backbone micro-batches (each
item with its zigzag chunks, the exact token and byte ranges it reads and the encodings it consumes) or its
encoder micro-batches (each unique input with every backbone destination).

:func:`expand_backbone` computes a backbone consumer's part once, as plain integers, from an
:class:`AssignmentSource`: the plan's arrays as Python lists (indexing numpy one value at a time is slow).
:meth:`knittrans.plan.Plan.for_consumer` turns the result into the typed objects below; the admission service
turns the same result straight into protobuf constructor fields, which skips building the typed objects of
every admitted trajectory on its report-to-assignment path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from functools import cached_property
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from knittrans.plan.geometry import chunk_padded_spans, covered_spans, cp_read_spans
from knittrans.types import (
    ByteRange,
    ConsumerId,
    FieldAlignment,
    TokenSpan,
    TrajectoryId,
    TrajectoryMeta,
    UnitHeader,
    UnitKey,
    UnitKind,
    UnitRef,
)

if TYPE_CHECKING:
    from knittrans.plan.parts import Plan


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


# --------------------------------------------------------------------------------------------------------------
# The expansion
# --------------------------------------------------------------------------------------------------------------


class UnitRead(IntEnum):
    """How a backbone consumer reads a unit of its item."""

    NONE = 0  # images and videos reach the backbone only as encodings
    WHOLE = 1  # a per-trajectory field: every byte
    TOKENS = 2  # a per-token field: the token ranges of the consumer's CP rank

    @staticmethod
    def of(kind: UnitKind) -> UnitRead:
        if kind is UnitKind.TOKEN_FIELD:
            return UnitRead.TOKENS
        return UnitRead.WHOLE if kind is UnitKind.FIELD else UnitRead.NONE


ROUTE_LISTS = ("encodings", "references", "cp_ranks", "tp_ranks", "starts", "ends")


@dataclass(frozen=True, kw_only=True, eq=False)
class AssignmentSource:
    """What expanding backbone consumers reads: a plan's arrays and its trajectories' units as Python lists.

    Trajectory t's units are ``unit_*[unit_offsets[t]:unit_offsets[t + 1]]`` in its ``units`` order; a
    reference's placeholder starts at ``reference_starts[reference]``. Route columns are the plan's
    :class:`~knittrans.plan.RouteMap` columns, as lists.
    """

    cp: int
    label_fields: frozenset[str]
    microbatches_per_rank: int
    microbatch_offsets: Sequence[int]
    microbatch_items: Sequence[int]
    microbatch_loss_tokens: Sequence[int]
    num_tokens: Sequence[int]
    padded_tokens: Sequence[int]
    cp_spans: Sequence[Sequence[Sequence[Sequence[int]]]]  # [N][cp][chunk 0|1][start|end]
    unit_offsets: Sequence[int]
    unit_reads: Sequence[UnitRead]
    unit_field_names: Sequence[str]
    unit_token_aligned: Sequence[bool]
    unit_first_tokens: Sequence[int]  # the token of each unit's row 0: response_start for a response-only one
    route: dict[str, list[int]]  # ROUTE_LISTS
    reference_trajectories: Sequence[int]
    reference_starts: Sequence[int]

    @cached_property
    def route_by_trajectory(self) -> list[list[int]]:
        """Per trajectory, its route rows of TP rank 0 (in route order)."""
        trajectories = self.reference_trajectories
        by_trajectory: list[list[int]] = [[] for _ in self.padded_tokens]
        for row, (reference, tp_rank) in enumerate(zip(self.route["references"], self.route["tp_ranks"], strict=True)):
            if tp_rank == 0:
                by_trajectory[trajectories[reference]].append(row)
        return by_trajectory


def token_field_read(unit: UnitRef, spans: Sequence[tuple[int, int]], first_token: int, look_ahead: bool) -> FieldRead:
    """The read of a per-token unit's token ``spans`` (sequence coordinates, already inside the unit's tokens). The
    unit's row 0 is token ``first_token`` (a response-only unit's ``response_start``), so its bytes are the spans
    shifted by that: exact byte ranges, nothing for the prompt."""
    header = unit.header
    return FieldRead(
        unit=unit,
        spans=tuple(TokenSpan(start=s, end=e) for s, e in spans),
        byte_ranges=tuple(header.byte_range(TokenSpan(start=s - first_token, end=e - first_token)) for s, e in spans),
        look_ahead=look_ahead,
    )


class ItemLayout(NamedTuple):
    """One item as one CP rank receives it, as plain integers (see :class:`ItemAssignment`)."""

    trajectory: int
    padded_tokens: int
    chunks: tuple[tuple[int, int, int, int, int], ...]  # (chunk, padded start, padded end, token start, token end)
    reads: list[tuple[int, bool, list[tuple[int, int]] | None]]  # (unit, look-ahead, token spans | None: whole)
    encodings: list[tuple[int, int, int, int, int]]  # (encoding, reference, start, end, row start), by start


class MicroBatchLayout(NamedTuple):
    microbatch_index: int  # not `index`, which would shadow tuple.index
    last: bool
    num_loss_tokens: int
    items: list[ItemLayout]


def expand_backbone(source: AssignmentSource, dp_rank: int, cp_rank: int) -> list[MicroBatchLayout]:
    """Backbone consumer (dp_rank, cp_rank)'s micro-batches, in consumption order."""
    per_rank = source.microbatches_per_rank
    offsets, items = source.microbatch_offsets, source.microbatch_items
    return [
        MicroBatchLayout(j, j == per_rank - 1, source.microbatch_loss_tokens[g],
                         [expand_item(source, t, cp_rank) for t in items[offsets[g] : offsets[g + 1]]])
        for j, g in ((j, dp_rank * per_rank + j) for j in range(per_rank))
    ]


def expand_item(source: AssignmentSource, t: int, cp_rank: int) -> ItemLayout:
    """Trajectory t as CP rank ``cp_rank`` receives it."""
    padded = source.padded_tokens[t]
    spans = source.cp_spans[t][cp_rank]
    chunks = tuple(
        (c, start, end, spans[k][0], spans[k][1])
        for k, (c, start, end) in enumerate(chunk_padded_spans(padded, source.cp, cp_rank))
    )
    num_tokens = source.num_tokens[t]
    label_fields = source.label_fields
    unit_reads, names, token_aligned = source.unit_reads, source.unit_field_names, source.unit_token_aligned
    first_tokens = source.unit_first_tokens
    reads: list[tuple[int, bool, list[tuple[int, int]] | None]] = []
    by_look_ahead: dict[tuple[bool, int], list[tuple[int, int]]] = {}  # the same spans for most fields of the item
    for k in range(source.unit_offsets[t], source.unit_offsets[t + 1]):
        read = unit_reads[k]
        if read == UnitRead.TOKENS:
            # Label fields (labels are the next token) and token-aligned fields (packed shifted by one).
            look_ahead = names[k] in label_fields or token_aligned[k]
            key = (look_ahead, first_tokens[k])
            token_spans = by_look_ahead.get(key)
            if token_spans is None:
                token_spans = by_look_ahead[key] = covered_spans(cp_read_spans(spans, num_tokens, look_ahead), key[1])
            reads.append((k, look_ahead, token_spans))
        elif read == UnitRead.WHOLE:
            reads.append((k, False, None))
    route = source.route
    cp_ranks, references, starts, ends, encodings = (
        route["cp_ranks"], route["references"], route["starts"], route["ends"], route["encodings"])
    placeholder_starts = source.reference_starts
    uses = []
    for row in source.route_by_trajectory[t]:
        if cp_ranks[row] != cp_rank:
            continue
        reference = references[row]
        start = starts[row]
        uses.append((encodings[row], reference, start, ends[row], start - placeholder_starts[reference]))
    uses.sort(key=lambda use: use[2])
    return ItemLayout(t, padded, chunks, reads, uses)


def item_assignment(
    layout: ItemLayout, meta: TrajectoryMeta, first_unit: int, keys: Sequence[UnitKey]
) -> ItemAssignment:
    """The typed form of an item: ``meta`` is its trajectory, whose first unit is unit ``first_unit`` of the
    source; ``keys`` are the references' keys."""
    units = meta.units
    reads = []
    for k, look_ahead, token_spans in layout.reads:
        unit = units[k - first_unit]
        if token_spans is None:
            whole = ByteRange(offset=0, length=unit.header.byte_length)
            reads.append(FieldRead(unit=unit, spans=(), byte_ranges=(whole,)))
        else:
            reads.append(token_field_read(unit, token_spans, meta.first_token(unit), look_ahead))
    return ItemAssignment(
        trajectory_index=layout.trajectory,
        trajectory=meta,
        padded_tokens=layout.padded_tokens,
        chunks=tuple(
            ChunkSlice(chunk=c, padded=TokenSpan(start=ps, end=pe), tokens=TokenSpan(start=ts, end=te))
            for c, ps, pe, ts, te in layout.chunks
        ),
        reads=tuple(reads),
        encodings=tuple(
            EncodingUse(encoding_id=e, key=keys[r], positions=TokenSpan(start=s, end=end), row_start=row_start,
                        reference=r)
            for e, r, s, end, row_start in layout.encodings
        ),
    )


# --------------------------------------------------------------------------------------------------------------
# A plan's consumers
# --------------------------------------------------------------------------------------------------------------


def assignment_source(plan: Plan) -> AssignmentSource:
    """A plan as :func:`expand_backbone` reads it."""
    b = plan.backbone
    units = [u for t in plan.trajectories for u in t.units]
    counts = np.fromiter((len(t.units) for t in plan.trajectories), np.int64, len(plan.trajectories))
    return AssignmentSource(
        cp=plan.topology.backbone.cp,
        label_fields=frozenset(plan.label_fields),
        microbatches_per_rank=b.microbatches_per_rank,
        microbatch_offsets=b.microbatch_offsets.tolist(),
        microbatch_items=b.microbatch_items.tolist(),
        microbatch_loss_tokens=b.microbatch_loss_tokens.tolist(),
        num_tokens=plan.num_tokens.tolist(),
        padded_tokens=b.padded_tokens.tolist(),
        cp_spans=b.cp_spans.tolist(),
        unit_offsets=np.concatenate([np.zeros(1, np.int64), np.cumsum(counts)]).tolist(),
        unit_reads=[UnitRead.of(u.kind) for u in units],
        unit_field_names=[u.field_name for u in units],
        unit_token_aligned=[u.alignment is FieldAlignment.TOKEN for u in units],
        unit_first_tokens=[t.first_token(u) for t in plan.trajectories for u in t.units],
        route={name: getattr(plan.route, name).tolist() for name in ROUTE_LISTS},
        reference_trajectories=plan.reference_trajectories.tolist(),
        reference_starts=plan.placeholders[:, 0].tolist(),
    )


def consumer_assignment(plan: Plan, consumer: ConsumerId) -> ConsumerAssignment:
    """One consumer's part of ``plan`` (a consumer within its topology), in consumption order."""
    if consumer.encoder_name is None:
        return _backbone_assignment(plan, consumer)
    return _encoder_assignment(plan, consumer)


def _backbone_assignment(plan: Plan, consumer: ConsumerId) -> ConsumerAssignment:
    source = plan.assignment_source
    keys = [m.key for t in plan.trajectories for m in t.multimodal]
    microbatches = tuple(
        MicroBatchAssignment(
            index=mb.microbatch_index,
            last=mb.last,
            num_loss_tokens=mb.num_loss_tokens,
            items=tuple(
                item_assignment(item, plan.trajectories[item.trajectory], source.unit_offsets[item.trajectory], keys)
                for item in mb.items
            ),
        )
        for mb in expand_backbone(source, consumer.dp_rank, consumer.cp_rank)
    )
    return ConsumerAssignment(
        consumer=consumer,
        minibatch_loss_tokens=plan.backbone.minibatch_loss_tokens,
        cp=plan.topology.backbone.cp,
        microbatches=microbatches,
    )


def _encoder_assignment(plan: Plan, consumer: ConsumerId) -> ConsumerAssignment:
    encoder_plan = plan.encoder_plan(consumer.encoder_name or "")
    per_rank = encoder_plan.microbatches_per_rank
    microbatches = []
    for j in range(per_rank):
        g = consumer.dp_rank * per_rank + j
        encodings = tuple(
            EncodingAssignment(encoding=plan.encoding(int(e)), routes=plan.routes(int(e)))
            for e in encoder_plan.encodings(g)
        )
        microbatches.append(EncoderMicroBatchAssignment(index=j, last=j == per_rank - 1, encodings=encodings))
    return ConsumerAssignment(
        consumer=consumer,
        minibatch_loss_tokens=plan.backbone.minibatch_loss_tokens,
        cp=plan.topology.backbone.cp,
        encoder_microbatches=tuple(microbatches),
    )
