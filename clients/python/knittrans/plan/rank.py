"""A backbone DP rank's part of a plan, the same for all of its CP ranks, and each CP rank's cut of it.

Everything a backbone CP rank receives that differs from its DP rank's other CP ranks (its two zigzag chunks,
the token and byte ranges it reads, the encodings whose placeholder positions fall in its chunks) follows from
the trajectories' metadata, their padded lengths and the encoding of every multimodal reference, with the same
geometry the planner uses (:func:`~knittrans.plan.geometry.zigzag_spans`, :func:`chunk_padded_spans`,
:func:`cp_read_spans`, :func:`clip_to_chunks`). So the admission service sends one :class:`RankAssignment` per DP
rank, serialised once for all of its CP streams, and each sidecar derives its own part with :func:`cp_items`;
what it derives equals ``plan.for_consumer(ConsumerId(dp_rank=d, cp_rank=r))``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from knittrans.errors import InvalidArgument
from knittrans.plan.assignment import (
    ChunkSlice,
    ConsumerAssignment,
    EncodingUse,
    FieldRead,
    ItemAssignment,
    MicroBatchAssignment,
    token_field_read,
)
from knittrans.plan.geometry import chunk_padded_spans, clip_to_chunks, covered_spans, cp_read_spans, zigzag_spans
from knittrans.types import BACKBONE_ROLE, ByteRange, ConsumerId, FieldAlignment, TokenSpan, TrajectoryMeta, UnitKind

if TYPE_CHECKING:
    from knittrans.plan.parts import Plan


class RankItem(NamedTuple):
    """One trajectory of a DP rank's micro-batch: what every CP rank of the rank cuts its item from."""

    trajectory_index: int
    trajectory: TrajectoryMeta
    padded_tokens: int
    first_reference: int  # the global index of the trajectory's first multimodal reference
    reference_encodings: Sequence[int]  # per multimodal reference of the trajectory, its encoding id


@dataclass(frozen=True, kw_only=True)
class RankMicroBatch:
    index: int
    last: bool
    num_loss_tokens: int  # of the whole micro-batch, over all CP ranks
    items: tuple[RankItem, ...]


@dataclass(frozen=True, kw_only=True)
class RankAssignment:
    """A backbone DP rank's part of a plan (``consumer.cp_rank`` is 0: it serves every CP rank)."""

    consumer: ConsumerId
    minibatch_loss_tokens: int
    cp: int
    label_fields: frozenset[str]
    microbatches: tuple[RankMicroBatch, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "label_fields", frozenset(self.label_fields))
        if not self.consumer.trains_sequences or self.consumer.cp_rank != 0:
            raise InvalidArgument(f"must be a backbone (or trainer role) DP rank with cp_rank 0, got {self.consumer}",
                                  field="consumer")
        if self.cp < 1:
            raise InvalidArgument(f"must be at least 1, got {self.cp}", field="cp")

    def for_cp_rank(self, cp_rank: int) -> ConsumerAssignment:
        """CP rank ``cp_rank``'s whole part."""
        check_cp_rank(self.cp, cp_rank)
        return ConsumerAssignment(
            consumer=ConsumerId(role=self.consumer.role, dp_rank=self.consumer.dp_rank, cp_rank=cp_rank),
            minibatch_loss_tokens=self.minibatch_loss_tokens,
            cp=self.cp,
            microbatches=tuple(
                MicroBatchAssignment(index=mb.index, last=mb.last, num_loss_tokens=mb.num_loss_tokens,
                                     items=cp_items(mb.items, cp=self.cp, cp_rank=cp_rank,
                                                    label_fields=self.label_fields))
                for mb in self.microbatches
            ),
        )


def check_cp_rank(cp: int, cp_rank: int) -> None:
    if not 0 <= cp_rank < cp:
        raise InvalidArgument(f"must be in [0, {cp}), got {cp_rank}", field="cp_rank")


def cp_items(
    items: Sequence[RankItem], *, cp: int, cp_rank: int, label_fields: frozenset[str]
) -> tuple[ItemAssignment, ...]:
    """The items of one micro-batch as CP rank ``cp_rank`` receives them: the planner's zigzag spans for the
    chunks, the planner's look-ahead rule for the reads, and the planner's route cut for the encodings."""
    count = len(items)
    if count == 0:
        return ()
    num_tokens = np.fromiter((item.trajectory.num_tokens for item in items), np.int64, count)
    padded = np.fromiter((item.padded_tokens for item in items), np.int64, count)
    chunk_spans = zigzag_spans(num_tokens, padded, cp)[:, cp_rank]  # [item, chunk 0|1, start|end]
    uses = _encoding_uses(items, chunk_spans)
    spans = chunk_spans.tolist()
    return tuple(
        _item(item, spans[i], uses[i], cp=cp, cp_rank=cp_rank, label_fields=label_fields)
        for i, item in enumerate(items)
    )


def _item(
    item: RankItem,
    spans: list[list[int]],
    uses: tuple[EncodingUse, ...],
    *,
    cp: int,
    cp_rank: int,
    label_fields: frozenset[str],
) -> ItemAssignment:
    meta = item.trajectory
    chunks = tuple(
        ChunkSlice(chunk=c, padded=TokenSpan(start=start, end=end),
                   tokens=TokenSpan(start=spans[k][0], end=spans[k][1]))
        for k, (c, start, end) in enumerate(chunk_padded_spans(item.padded_tokens, cp, cp_rank))
    )
    reads = []
    by_look_ahead: dict[tuple[bool, int], list[tuple[int, int]]] = {}  # the same spans for most fields of the item
    for unit in meta.units:
        if unit.kind is UnitKind.TOKEN_FIELD:
            # Label fields (labels are the next token) and token-aligned fields (packed shifted by one).
            look_ahead = unit.field_name in label_fields or unit.alignment is FieldAlignment.TOKEN
            key = (look_ahead, meta.first_token(unit))
            token_spans = by_look_ahead.get(key)
            if token_spans is None:
                token_spans = by_look_ahead[key] = covered_spans(cp_read_spans(spans, meta.num_tokens, look_ahead),
                                                                 key[1])
            reads.append(token_field_read(unit, token_spans, key[1], look_ahead))
        elif unit.kind is UnitKind.FIELD:
            reads.append(FieldRead(unit=unit, spans=(), byte_ranges=(ByteRange(offset=0,
                                                                                length=unit.header.byte_length),)))
    return ItemAssignment(trajectory_index=item.trajectory_index, trajectory=meta, padded_tokens=item.padded_tokens,
                          chunks=chunks, reads=tuple(reads), encodings=uses)


def _encoding_uses(items: Sequence[RankItem], chunk_spans: np.ndarray) -> list[tuple[EncodingUse, ...]]:
    """Per item, the encodings whose placeholder positions fall in this CP rank's chunks, in the order the plan's
    route gives them (by position; at equal positions, by encoding, reference and chunk)."""
    owners: list[int] = []
    starts: list[int] = []
    ends: list[int] = []
    for i, item in enumerate(items):
        refs = item.trajectory.multimodal
        if len(item.reference_encodings) != len(refs):
            raise InvalidArgument(f"has {len(item.reference_encodings)} encodings for {len(refs)} multimodal "
                                  "references", field="reference_encodings")
        for ref in refs:
            owners.append(i)
            starts.append(ref.placeholder.start)
            ends.append(ref.placeholder.end)
    uses: list[list[tuple[int, int, int, int, int, int]]] = [[] for _ in items]
    if owners:
        owner = np.array(owners, dtype=np.int64)
        cut_starts, cut_ends = clip_to_chunks(chunk_spans[owner], np.array(starts, dtype=np.int64),
                                              np.array(ends, dtype=np.int64))  # [reference, chunk]
        rows, chunks = np.nonzero(cut_ends > cut_starts)
        offsets = np.concatenate([[0], np.cumsum(np.bincount(owner, minlength=len(items)))]).tolist()
        for row, chunk, start, end in zip(rows.tolist(), chunks.tolist(), cut_starts[rows, chunks].tolist(),
                                          cut_ends[rows, chunks].tolist(), strict=True):
            i = owners[row]
            m = row - offsets[i]
            item = items[i]
            uses[i].append((start, item.reference_encodings[m], item.first_reference + m, chunk, end, m))
    result = []
    for i, item_uses in enumerate(uses):
        item_uses.sort()
        refs = items[i].trajectory.multimodal
        result.append(tuple(
            EncodingUse(encoding_id=e, key=refs[m].key, positions=TokenSpan(start=start, end=end),
                        row_start=start - refs[m].placeholder.start, reference=r)
            for start, e, r, _, end, m in item_uses
        ))
    return result


def rank_assignment(plan: Plan, dp_rank: int) -> RankAssignment:
    """Backbone DP rank ``dp_rank``'s part of ``plan``, for all of its CP ranks."""
    b = plan.backbone
    per_rank = b.microbatches_per_rank
    offsets, items = b.microbatch_offsets.tolist(), b.microbatch_items.tolist()
    padded = b.padded_tokens.tolist()
    encodings = plan.encodings.reference_encodings.tolist()
    first = np.concatenate([[0], np.cumsum([len(t.multimodal) for t in plan.trajectories])]).astype(int).tolist()
    microbatches = []
    for j in range(per_rank):
        g = dp_rank * per_rank + j
        microbatches.append(RankMicroBatch(
            index=j, last=j == per_rank - 1, num_loss_tokens=int(b.microbatch_loss_tokens[g]),
            items=tuple(RankItem(t, plan.trajectories[t], padded[t], first[t], encodings[first[t]:first[t + 1]])
                        for t in items[offsets[g]:offsets[g + 1]]),
        ))
    return RankAssignment(consumer=ConsumerId(role=BACKBONE_ROLE, dp_rank=dp_rank),
                          label_fields=frozenset(plan.label_fields),
                          minibatch_loss_tokens=b.minibatch_loss_tokens, cp=plan.topology.backbone.cp,
                          microbatches=tuple(microbatches))
