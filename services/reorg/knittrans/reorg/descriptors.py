"""The descriptor of a micro-batch a sidecar publishes (DESIGN.md §6): what its trainer ranks need to use it."""

from __future__ import annotations

import time
from dataclasses import dataclass

from knittrans.plan import EncoderMicroBatchAssignment, MicroBatchAssignment
from knittrans.reorg.assignments import AssignmentEvent
from knittrans.reorg.packing import PackLayout
from knittrans.reorg.ring import SlotLease
from knittrans.trainer.descriptor import MicroBatchDescriptor, MiniBatchFailure
from knittrans.types import ConsumerId
from knittrans.values import MetadataValue


@dataclass(frozen=True, kw_only=True)
class Describer:
    """Builds the descriptors of one sidecar incarnation's micro-batches."""

    incarnation: str
    consumer: ConsumerId
    cp: int
    tp: int

    def descriptor(
        self,
        ticket: int,
        *,
        event: AssignmentEvent,
        micro: MicroBatchAssignment | EncoderMicroBatchAssignment,
        position: int,
        count: int,
        layout: PackLayout,
        lease: SlotLease,
        assigned_at: float,
        delivery_round: int,
        failure: MiniBatchFailure | None = None,
    ) -> MicroBatchDescriptor:
        admission = event.admission
        backbone = isinstance(micro, MicroBatchAssignment)
        encoder_inputs = () if backbone or failure is not None or not event.num_units \
            else event.encoder_input_messages(position)
        return MicroBatchDescriptor(
            ticket=ticket,
            incarnation=self.incarnation,
            sequence=event.sequence,
            train_batch_index=admission.train_batch_index,
            minibatch_index=admission.minibatch_index,
            num_minibatches=admission.num_minibatches,
            train_version=admission.train_version,
            microbatch_index=position,
            num_microbatches=count,
            last_in_minibatch=position == count - 1 or failure is not None,
            minibatch_loss_tokens=event.global_loss_tokens,
            microbatch_loss_tokens=micro.num_loss_tokens if backbone else 0,
            segment=lease.segment,
            slot=lease.slot,
            used_bytes=layout.used_bytes,
            tensors=layout.tensors,
            role=self.consumer.role,
            dp_rank=self.consumer.dp_rank,
            cp_rank=self.consumer.cp_rank,
            cp=self.cp,
            tp=self.tp,
            trajectory_ids=tuple(i.trajectory.trajectory_id for i in micro.items) if backbone else (),
            trajectory_indices=tuple(i.trajectory_index for i in micro.items) if backbone else (),
            item_metadata=_item_metadata(micro) if backbone else (),
            encodings=layout.encodings,
            encoder_input_messages=encoder_inputs,
            assigned_at=assigned_at,
            published_at=time.time(),
            failure=failure,
            delivery_round=delivery_round,
        )


def _item_metadata(micro: MicroBatchAssignment) -> tuple[tuple[tuple[str, MetadataValue], ...], ...]:
    """Per item, its trajectory's metadata; nothing when no item has any (the usual case costs no bytes)."""
    items = tuple(item.trajectory.values.metadata for item in micro.items)
    return items if any(items) else ()
