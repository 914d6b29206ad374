"""Protobuf forms of a backbone DP rank's part (``RankAssignment``, proto/knittrans/v1/plan.proto).

A sidecar decodes one micro-batch at a time (:func:`cp_microbatch_from_proto`), straight into its own CP rank's
items: the only per-item objects it builds are the ones the packer reads. The service sends the trajectories as
one columnar batch per DP rank (``RankAssignment.trajectories``, decoded with
:func:`~knittrans.wire.batch_metas.metas_from_batch`); a message with a ``TrajectoryMetadata`` per item reads the
same. Conversions from messages name the field of any invalid value.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from itertools import accumulate

from knittrans.errors import InvalidArgument, within
from knittrans.plan.assignment import ConsumerAssignment, MicroBatchAssignment
from knittrans.plan.rank import RankAssignment, RankItem, RankMicroBatch, check_cp_rank, cp_items
from knittrans.types import ConsumerId, TrajectoryMeta
from knittrans.v1 import plan_pb2
from knittrans.wire import consumer_from_proto, consumer_to_proto, trajectory_from_proto, trajectory_to_proto
from knittrans.wire.batch_metas import metas_from_batch


def rank_assignment_to_proto(assignment: RankAssignment) -> plan_pb2.RankAssignment:
    return plan_pb2.RankAssignment(
        consumer=consumer_to_proto(assignment.consumer),
        minibatch_loss_tokens=assignment.minibatch_loss_tokens,
        cp=assignment.cp,
        label_fields=sorted(assignment.label_fields),
        microbatches=[
            plan_pb2.RankMicroBatch(
                index=mb.index, last=mb.last, num_loss_tokens=mb.num_loss_tokens,
                items=[
                    plan_pb2.RankItem(trajectory_index=item.trajectory_index,
                                      trajectory=trajectory_to_proto(item.trajectory),
                                      padded_tokens=item.padded_tokens, first_reference=item.first_reference,
                                      reference_encodings=item.reference_encodings)
                    for item in mb.items
                ],
            )
            for mb in assignment.microbatches
        ],
    )


def check_rank_message(message: plan_pb2.RankAssignment, consumer: ConsumerId) -> None:
    """That ``message`` is the part of ``consumer``'s DP rank, and ``consumer`` one of its CP ranks."""
    sent = within("rank_assignment.consumer", lambda: consumer_from_proto(message.consumer))
    if not consumer.trains_sequences or sent != ConsumerId(role=consumer.role, dp_rank=consumer.dp_rank):
        raise InvalidArgument(f"is {sent}'s part, not one for {consumer}", field="rank_assignment.consumer")
    if message.cp < 1:
        raise InvalidArgument(f"must be at least 1, got {message.cp}", field="rank_assignment.cp")
    within("rank_assignment", lambda: check_cp_rank(message.cp, consumer.cp_rank))
    if message.HasField("trajectories"):  # the columns a part is read by before it is decoded (verification)
        batch = message.trajectories
        items = sum(len(mb.items) for mb in message.microbatches)
        units = sum(batch.unit_counts)
        for name, values, expected in (("trajectory_ids", batch.trajectory_ids, items),
                                       ("unit_counts", batch.unit_counts, items),
                                       ("unit_keys", batch.unit_keys, units), ("unit_kinds", batch.unit_kinds, units),
                                       ("unit_headers.byte_lengths", batch.unit_headers.byte_lengths, units)):
            if len(values) != expected:
                raise InvalidArgument(f"has {len(values)} values, expected {expected}",
                                      field=f"rank_assignment.trajectories.{name}")


def _item_metas(message: plan_pb2.RankAssignment, first: int, stop: int, prefix: str) -> tuple[TrajectoryMeta, ...]:
    """The trajectories of the rank's items ``first:stop`` (counted across its micro-batches), from the rank's
    batch or, when it has none, from the items."""
    counts = [len(mb.items) for mb in message.microbatches]
    if not message.HasField("trajectories"):
        metas = []
        for i, mb in enumerate(message.microbatches):
            offset = sum(counts[:i])
            for j, item in enumerate(mb.items):
                if first <= offset + j < stop:
                    metas.append(within(f"{prefix}microbatches[{i}].items[{j}].trajectory",
                                        partial(trajectory_from_proto, item.trajectory)))
        return tuple(metas)
    for i, mb in enumerate(message.microbatches):
        for j, item in enumerate(mb.items):
            if item.HasField("trajectory"):
                raise InvalidArgument(f"is set beside {prefix}trajectories",
                                      field=f"{prefix}microbatches[{i}].items[{j}].trajectory")
    if len(message.trajectories.trajectory_ids) != sum(counts):
        raise InvalidArgument(f"has {len(message.trajectories.trajectory_ids)} trajectories for {sum(counts)} items",
                              field=f"{prefix}trajectories.trajectory_ids")
    return metas_from_batch(message.trajectories, f"{prefix}trajectories", first, stop)


def _rank_items(mb: plan_pb2.RankMicroBatch, metas: Sequence[TrajectoryMeta]) -> tuple[RankItem, ...]:
    return tuple(
        RankItem(item.trajectory_index, meta, item.padded_tokens, item.first_reference, item.reference_encodings)
        for item, meta in zip(mb.items, metas, strict=True)
    )


def rank_items_from_proto(message: plan_pb2.RankAssignment, index: int) -> tuple[RankItem, ...]:
    """Micro-batch ``index``'s items."""
    first = sum(len(mb.items) for mb in message.microbatches[:index])
    mb = message.microbatches[index]
    return _rank_items(mb, _item_metas(message, first, first + len(mb.items), "rank_assignment."))


def cp_microbatch_from_proto(message: plan_pb2.RankAssignment, index: int, cp_rank: int) -> MicroBatchAssignment:
    """Micro-batch ``index`` of a DP rank's part, as CP rank ``cp_rank`` receives it."""
    mb = message.microbatches[index]
    path = f"rank_assignment.microbatches[{index}]"
    items = rank_items_from_proto(message, index)
    return MicroBatchAssignment(
        index=mb.index, last=mb.last, num_loss_tokens=mb.num_loss_tokens,
        items=within(path, lambda: cp_items(items, cp=message.cp, cp_rank=cp_rank,
                                            label_fields=frozenset(message.label_fields))),
    )


def rank_assignment_from_proto(message: plan_pb2.RankAssignment) -> RankAssignment:
    counts = [len(mb.items) for mb in message.microbatches]
    offsets = [0, *accumulate(counts)]
    metas = within("rank_assignment", lambda: _item_metas(message, 0, offsets[-1], ""))
    return within("rank_assignment", lambda: RankAssignment(
        consumer=within("consumer", lambda: consumer_from_proto(message.consumer)),
        minibatch_loss_tokens=message.minibatch_loss_tokens,
        cp=message.cp,
        label_fields=frozenset(message.label_fields),
        microbatches=tuple(
            RankMicroBatch(index=mb.index, last=mb.last, num_loss_tokens=mb.num_loss_tokens,
                           items=_rank_items(mb, metas[offsets[i]:offsets[i + 1]]))
            for i, mb in enumerate(message.microbatches)
        ),
    ))


def consumer_assignment_from_rank_proto(message: plan_pb2.RankAssignment, consumer: ConsumerId) -> ConsumerAssignment:
    """Backbone ``consumer``'s whole part, cut from its DP rank's."""
    check_rank_message(message, consumer)
    return rank_assignment_from_proto(message).for_cp_rank(consumer.cp_rank)
