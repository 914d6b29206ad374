"""Protobuf forms of a backbone DP rank's part (``RankAssignment``, proto/knittrans/v1/plan.proto).

A sidecar decodes one micro-batch at a time (:func:`cp_microbatch_from_proto`), straight into its own CP rank's
items: the only per-item objects it builds are the ones the packer reads. Conversions from messages name the field
of any invalid value.
"""

from __future__ import annotations

from functools import partial

from knittrans.errors import InvalidArgument, within
from knittrans.plan.assignment import ConsumerAssignment, MicroBatchAssignment
from knittrans.plan.rank import RankAssignment, RankItem, RankMicroBatch, check_cp_rank, cp_items
from knittrans.types import ConsumerId
from knittrans.v1 import plan_pb2
from knittrans.wire import consumer_from_proto, consumer_to_proto, trajectory_from_proto, trajectory_to_proto


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


def rank_items_from_proto(message: plan_pb2.RankMicroBatch, path: str) -> tuple[RankItem, ...]:
    return tuple(
        RankItem(item.trajectory_index,
                 within(f"{path}.items[{j}].trajectory", partial(trajectory_from_proto, item.trajectory)),
                 item.padded_tokens, item.first_reference, item.reference_encodings)
        for j, item in enumerate(message.items)
    )


def cp_microbatch_from_proto(message: plan_pb2.RankAssignment, index: int, cp_rank: int) -> MicroBatchAssignment:
    """Micro-batch ``index`` of a DP rank's part, as CP rank ``cp_rank`` receives it."""
    mb = message.microbatches[index]
    path = f"rank_assignment.microbatches[{index}]"
    items = rank_items_from_proto(mb, path)
    return MicroBatchAssignment(
        index=mb.index, last=mb.last, num_loss_tokens=mb.num_loss_tokens,
        items=within(path, lambda: cp_items(items, cp=message.cp, cp_rank=cp_rank,
                                            label_fields=frozenset(message.label_fields))),
    )


def rank_assignment_from_proto(message: plan_pb2.RankAssignment) -> RankAssignment:
    return within("rank_assignment", lambda: RankAssignment(
        consumer=within("consumer", lambda: consumer_from_proto(message.consumer)),
        minibatch_loss_tokens=message.minibatch_loss_tokens,
        cp=message.cp,
        label_fields=frozenset(message.label_fields),
        microbatches=tuple(
            RankMicroBatch(index=mb.index, last=mb.last, num_loss_tokens=mb.num_loss_tokens,
                           items=rank_items_from_proto(mb, f"microbatches[{i}]"))
            for i, mb in enumerate(message.microbatches)
        ),
    ))


def consumer_assignment_from_rank_proto(message: plan_pb2.RankAssignment, consumer: ConsumerId) -> ConsumerAssignment:
    """Backbone ``consumer``'s whole part, cut from its DP rank's."""
    check_rank_message(message, consumer)
    return rank_assignment_from_proto(message).for_cp_rank(consumer.cp_rank)
