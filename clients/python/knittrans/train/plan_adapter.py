"""The planner's :class:`~knittrans.plan.Plan` as an :class:`EncodingSchedule` for one encoder (pure, no torch).

Placeholder positions in the plan are token indices of each trajectory; the schedule needs them in the
backbone micro-batch's local token layout. This module uses the packed layout of the reorg sidecar
(:func:`local_token_position`): the micro-batch's trajectories in plan order, each occupying its CP rank's
two zigzag chunks (chunk r, then chunk 2cp−1−r) at their padded length.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from knittrans.errors import InvalidArgument
from knittrans.plan import Plan, zigzag_chunks
from knittrans.train.schedule import (
    BackboneMicroBatch,
    EncoderMicroBatch,
    EncodingSchedule,
    EncodingUse,
    RankSchedule,
    schedule_from_ranks,
)

BackboneRankOf = Callable[[int, int, int], int]
"""(dp rank, cp rank, tp rank) of the backbone -> global rank."""

EncoderRankOf = Callable[[int], int]
"""Encoder DP rank -> global rank."""


def megatron_backbone_rank(dp: int, cp: int, tp: int) -> BackboneRankOf:
    """TP fastest, then CP, then DP: rank = ((dp_rank · cp) + cp_rank) · tp + tp_rank."""

    def rank_of(dp_rank: int, cp_rank: int, tp_rank: int) -> int:
        return (dp_rank * cp + cp_rank) * tp + tp_rank

    return rank_of


@dataclass(frozen=True, kw_only=True)
class _Item:
    trajectory: int
    offset: int  # first local token of the item in its micro-batch


def local_token_position(plan: Plan, trajectory: int, cp_rank: int, token: int, item_offset: int) -> int:
    """Where trajectory token ``token`` sits in CP rank ``cp_rank``'s packed micro-batch."""
    cp = plan.topology.backbone.cp
    chunk_tokens = int(plan.backbone.padded_tokens[trajectory]) // (2 * cp)
    chunk = token // chunk_tokens
    held = zigzag_chunks(cp, cp_rank)
    if chunk not in held:
        raise InvalidArgument(
            f"token {token} of trajectory {trajectory} lies in chunk {chunk}, not held by cp rank {cp_rank}",
            field="route",
        )
    return item_offset + held.index(chunk) * chunk_tokens + token - chunk * chunk_tokens


def _items(plan: Plan, dp_rank: int) -> list[list[_Item]]:
    """Per micro-batch of ``dp_rank``: its trajectories and their offsets in the packed layout."""
    cp = plan.topology.backbone.cp
    layout = []
    for trajectories in plan.microbatches(dp_rank):
        offset, items = 0, []
        for t in trajectories:
            items.append(_Item(trajectory=int(t), offset=offset))
            offset += int(plan.backbone.padded_tokens[int(t)]) // cp
        layout.append(items)
    return layout


def schedule_from_plan(
    plan: Plan,
    *,
    encoder: str,
    backbone_rank: BackboneRankOf | None = None,
    encoder_rank: EncoderRankOf | None = None,
) -> EncodingSchedule:
    """The encoding schedule of encoder ``encoder`` for every rank of the backbone's (dp × cp × tp) world.

    ``backbone_rank`` maps backbone coordinates to global ranks (default: :func:`megatron_backbone_rank`);
    ``encoder_rank`` maps encoder DP ranks to global ranks (default: the identity). Encoder tensor
    parallelism is not supported: one rank owns each encoding. Routes come from
    :func:`~knittrans.train.schedule.schedule_from_ranks`, like every other schedule's.
    """
    topology = plan.topology
    b = topology.backbone
    encoder_topology = topology.encoder(encoder)
    if encoder_topology.tp != 1:
        raise InvalidArgument("encoding reuse needs encoder tp = 1: one rank owns each encoding", field="encoder")
    rank_of = backbone_rank or megatron_backbone_rank(b.dp, b.cp, b.tp)
    world = b.dp * b.cp * b.tp
    owner_of = encoder_rank or (lambda d: d)

    coordinates: dict[int, tuple[int, int, int]] = {}
    for d in range(b.dp):
        for c in range(b.cp):
            for t in range(b.tp):
                rank = rank_of(d, c, t)
                if not (0 <= rank < world) or rank in coordinates:
                    raise InvalidArgument(
                        f"maps (dp={d}, cp={c}, tp={t}) to rank {rank}: not a permutation of 0..{world - 1}",
                        field="backbone_rank",
                    )
                coordinates[rank] = (d, c, t)

    encoder_micro_batches: dict[int, list[EncoderMicroBatch]] = {rank: [] for rank in range(world)}
    num_rows_by_id: dict[int, int] = {}
    for d in range(encoder_topology.dp):
        rank = owner_of(d)
        if not 0 <= rank < world:
            raise InvalidArgument(
                f"maps encoder dp rank {d} to rank {rank}, outside 0..{world - 1}", field="encoder_rank"
            )
        for ids in plan.encoder_microbatches(encoder, d):
            if len(ids) == 0:
                continue  # the planner pads ranks with empty micro-batches to equal counts
            keys = []
            for e in ids:
                num_rows_by_id[int(e)] = plan.encoding(int(e)).num_rows
                keys.append(plan.encoding(int(e)).key)
            encoder_micro_batches[rank].append(EncoderMicroBatch(keys=tuple(keys)))

    per_rank = plan.microbatches_per_rank
    layouts = {d: _items(plan, d) for d in range(b.dp)}
    uses: dict[tuple[int, int], list[EncodingUse]] = {}
    route = plan.route
    for row in range(len(route)):
        encoding_id = int(route.encodings[row])
        if encoding_id not in num_rows_by_id:
            continue  # another encoder's encoding
        d, c, t = int(route.dp_ranks[row]), int(route.cp_ranks[row]), int(route.tp_ranks[row])
        microbatch = int(route.microbatches[row])
        reference = int(route.references[row])
        trajectory = int(plan.reference_trajectories[reference])
        item = next(i for i in layouts[d][microbatch] if i.trajectory == trajectory)
        start, end = int(route.starts[row]), int(route.ends[row])
        uses.setdefault((rank_of(d, c, t), microbatch), []).append(
            EncodingUse(
                key=plan.encoding(encoding_id).key,
                position=local_token_position(plan, trajectory, c, start, item.offset),
                num_rows=end - start,
                first_row=start - plan.reference(reference).placeholder.start,
            )
        )

    ranks = tuple(
        RankSchedule(
            rank=rank,
            dp_rank=coordinates[rank][0],
            cp_rank=coordinates[rank][1],
            tp_rank=coordinates[rank][2],
            encoder_micro_batches=tuple(encoder_micro_batches[rank]),
            backbone_micro_batches=tuple(
                BackboneMicroBatch(uses=tuple(sorted(uses.get((rank, j), ()), key=lambda u: u.position)))
                for j in range(per_rank)
            ),
        )
        for rank in range(world)
    )
    num_rows: dict[str, int] = {plan.encoding(e).key: rows for e, rows in num_rows_by_id.items()}
    return schedule_from_ranks(ranks=ranks, num_rows=num_rows, tp_size=b.tp)
