"""The mini-batch's :class:`~knittrans.train.EncodingSchedule` assembled from what each rank knows locally.

Encoding reuse needs the same global schedule on every rank. ``MiniBatch.encoding_schedule()`` derives it from
the full plan, which only exists when the assignment source sends one. Without it, each rank still knows its
own part: the encodings its backbone micro-batches use (``MiniBatch.encoding_uses``, in packed positions) and,
on an encoder consumer's rank, the encoder micro-batches it computes (``MiniBatch.assignment``). One all-gather
over the trainer ranks (bytes of canonical JSON; no pickle crosses a process boundary) gives every rank every
part, and every rank builds the identical schedule from them with :func:`knittrans.train.schedule_from_ranks`,
the same function :func:`knittrans.train.schedule_from_plan` uses: owners from the encoder parts, consumers from
the uses, routes in the schedule's canonical order.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from knittrans.packed.tensors import PackedEncodingUse
from knittrans.plan import EncoderMicroBatchAssignment
from knittrans.train.schedule import (
    BackboneMicroBatch,
    EncoderMicroBatch,
    EncodingSchedule,
    EncodingUse,
    RankSchedule,
    schedule_from_ranks,
)
from knittrans.types import UnitKey


@dataclass(frozen=True, kw_only=True)
class RankEncodingPart:
    """One rank's local view: per encoder micro-batch its (key, rows), per backbone micro-batch its uses."""

    dp_rank: int
    cp_rank: int
    encoder_micro_batches: tuple[tuple[tuple[UnitKey, int], ...], ...] = ()
    backbone_micro_batches: tuple[tuple[EncodingUse, ...], ...] = ()

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "dp": self.dp_rank,
                "cp": self.cp_rank,
                "encoder": [[[key, rows] for key, rows in micro] for micro in self.encoder_micro_batches],
                "backbone": [
                    [[u.key, u.position, u.num_rows, u.first_row] for u in micro]
                    for micro in self.backbone_micro_batches
                ],
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def from_json(cls, data: bytes) -> RankEncodingPart:
        raw = json.loads(data)
        return cls(
            dp_rank=raw["dp"],
            cp_rank=raw["cp"],
            encoder_micro_batches=tuple(
                tuple((UnitKey(key), int(rows)) for key, rows in micro) for micro in raw["encoder"]
            ),
            backbone_micro_batches=tuple(
                tuple(
                    EncodingUse(key=UnitKey(key), position=position, num_rows=rows, first_row=first)
                    for key, position, rows, first in micro
                )
                for micro in raw["backbone"]
            ),
        )


def rank_part(
    *,
    dp_rank: int,
    cp_rank: int,
    backbone_uses: Iterable[Iterable[PackedEncodingUse]],
    encoder_micro_batches: Iterable[EncoderMicroBatchAssignment] = (),
) -> RankEncodingPart:
    """A rank's part from ``TrainerClient`` data: ``MiniBatch.encoding_uses`` of its backbone consumer and, if the
    rank computes encodings, ``MiniBatch.assignment.encoder_microbatches`` of its encoder consumer."""
    return RankEncodingPart(
        dp_rank=dp_rank,
        cp_rank=cp_rank,
        encoder_micro_batches=tuple(
            tuple((UnitKey(e.encoding.key), e.encoding.num_rows) for e in micro.encodings)
            for micro in encoder_micro_batches
            if micro.encodings  # the planner pads ranks with empty encoder micro-batches
        ),
        backbone_micro_batches=tuple(
            tuple(
                sorted(
                    (
                        EncodingUse(
                            key=UnitKey(u.key), position=u.packed_start, num_rows=u.num_rows, first_row=u.row_start
                        )
                        for u in uses
                    ),
                    key=lambda use: use.position,
                )
            )
            for uses in backbone_uses
        ),
    )


def schedule_from_parts(parts: Sequence[RankEncodingPart]) -> EncodingSchedule:
    """The global schedule of ranks ``0 … len(parts) − 1`` (tp = 1), routes derived by
    :func:`knittrans.train.schedule_from_ranks` like every other schedule's; raises ``InvalidArgument`` when the
    parts do not fit together (an encoding with two owners or none, a use without an owner, …)."""
    num_rows: dict[str, int] = {}
    for part in parts:
        for micro in part.encoder_micro_batches:
            for key, rows in micro:
                num_rows.setdefault(key, rows)
    ranks = tuple(
        RankSchedule(
            rank=rank,
            dp_rank=part.dp_rank,
            cp_rank=part.cp_rank,
            encoder_micro_batches=tuple(
                EncoderMicroBatch(keys=tuple(key for key, _ in micro)) for micro in part.encoder_micro_batches
            ),
            backbone_micro_batches=tuple(BackboneMicroBatch(uses=micro) for micro in part.backbone_micro_batches),
        )
        for rank, part in enumerate(parts)
    )
    return schedule_from_ranks(ranks=ranks, num_rows=num_rows, tp_size=1)


def exchange_encoding_schedule(part: RankEncodingPart, *, group: dist.ProcessGroup | None = None) -> EncodingSchedule:
    """Every rank's part, all-gathered over ``group`` (the default group when None; ranks in group order), as
    the global schedule; a collective. Without torch.distributed the one part is the whole schedule."""
    if not (dist.is_available() and dist.is_initialized()):
        return schedule_from_parts([part])
    world = dist.get_world_size(group)
    data = torch.frombuffer(bytearray(part.to_json()), dtype=torch.uint8)
    length = torch.tensor([data.numel()], dtype=torch.int64)
    lengths = [torch.empty_like(length) for _ in range(world)]
    dist.all_gather(lengths, length, group=group)
    longest = max(int(n) for n in lengths)
    padded = torch.zeros(longest, dtype=torch.uint8)
    padded[: data.numel()] = data
    gathered = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(gathered, padded, group=group)
    parts = [
        RankEncodingPart.from_json(bytes(tensor[: int(n)].tolist()))
        for tensor, n in zip(gathered, lengths, strict=True)
    ]
    return schedule_from_parts(parts)
