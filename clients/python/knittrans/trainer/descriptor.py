"""The typed descriptor of a packed micro-batch in shared memory, shared by the reorg sidecar (which writes it)
and :class:`~knittrans.trainer.TrainerClient` (which reads it). No torch here.

A micro-batch lives in one shared-memory segment; each tensor is raw little-endian bytes at a 64-byte-aligned
offset. The descriptor travels as protobuf (``knittrans.v1.MicroBatchDescriptor``); the bytes never leave
shared memory.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import cached_property, partial

from knittrans.errors import InvalidArgument
from knittrans.packed.tensors import PackedEncodingUse, TensorSpec
from knittrans.plan import EncodingAssignment
from knittrans.plan.proto import encoding_assignment_from_proto
from knittrans.types import UnitKey
from knittrans.v1 import plan_pb2
from knittrans.v1 import reorg_service_pb2 as pb
from knittrans.values import MetadataValue, TrajectoryValues
from knittrans.wire import within
from knittrans.wire.enums import DTYPE_FROM_PROTO, DTYPE_TO_PROTO
from knittrans.wire.values import values_from_proto, values_to_proto


@dataclass(frozen=True, kw_only=True)
class MiniBatchFailure:
    """Why a sidecar could not read or pack a micro-batch: the trajectory and the unit to blame (empty when the
    failure names none) and what went wrong."""

    trajectory_id: str = ""
    unit_key: str = ""
    reason: str

    def __post_init__(self) -> None:
        if not self.reason:
            raise InvalidArgument("is required", field="reason")


@dataclass(frozen=True, kw_only=True)
class MicroBatchDescriptor:
    """Everything a trainer rank needs to use one published micro-batch (DESIGN.md §6)."""

    ticket: int
    incarnation: str
    sequence: int
    train_batch_index: int
    minibatch_index: int
    num_minibatches: int
    train_version: int
    microbatch_index: int
    num_microbatches: int
    last_in_minibatch: bool
    minibatch_loss_tokens: int
    microbatch_loss_tokens: int
    segment: str
    slot: int
    used_bytes: int
    tensors: tuple[TensorSpec, ...]
    role: str
    dp_rank: int
    cp_rank: int
    cp: int
    tp: int
    trajectory_ids: tuple[str, ...] = ()
    trajectory_indices: tuple[int, ...] = ()
    encodings: tuple[PackedEncodingUse, ...] = ()
    # Encoder consumers: the inputs with their routes, kept as messages and decoded on first use (routes are many).
    encoder_input_messages: tuple[plan_pb2.EncodingAssignment, ...] = ()
    assigned_at: float = 0.0  # wall clock: the sidecar had the assignment
    published_at: float = 0.0  # wall clock: the micro-batch was published
    # Set when the sidecar could not read or pack this micro-batch: no tensors, and the last of its mini-batch.
    failure: MiniBatchFailure | None = None
    # Backbone: per packed item, its trajectory's metadata (name, value), sorted by name; empty when none has any.
    item_metadata: tuple[tuple[tuple[str, MetadataValue], ...], ...] = ()
    # Bumped each time the sidecar restarted delivery because a TP rank restarted mid-mini-batch: what a rank
    # holds of an older round was withdrawn, and its current mini-batch comes again from micro-batch 0.
    delivery_round: int = 0

    def __post_init__(self) -> None:
        for name in ("tensors", "trajectory_ids", "trajectory_indices", "encodings", "encoder_input_messages",
                     "item_metadata"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if self.ticket < 1:
            raise InvalidArgument("must be at least 1", field="ticket")
        if not 0 <= self.microbatch_index < max(self.num_microbatches, 1):
            raise InvalidArgument(
                f"must be in [0, {self.num_microbatches}), got {self.microbatch_index}", field="microbatch_index"
            )
        names = [t.name for t in self.tensors]
        if len(names) != len(set(names)):
            raise InvalidArgument("tensor names must be unique", field="tensors")
        spans = sorted((t.offset, t.end) for t in self.tensors if t.byte_length)
        for (_, end), (start, _) in itertools.pairwise(spans):
            if start < end:
                raise InvalidArgument("tensors overlap", field="tensors")
        if spans and spans[-1][1] > self.used_bytes:
            raise InvalidArgument("a tensor ends past used_bytes", field="used_bytes")
        if len(self.item_metadata) not in (0, len(self.trajectory_ids)):
            raise InvalidArgument("needs one entry per trajectory id", field="item_metadata")
        if len(self.trajectory_indices) not in (0, len(self.trajectory_ids)):
            raise InvalidArgument("needs one index per trajectory id", field="trajectory_indices")
        if self.failure is not None and (self.tensors or not self.last_in_minibatch):
            raise InvalidArgument("a failed micro-batch has no tensors and ends its mini-batch", field="failure")

    @cached_property
    def encoder_inputs(self) -> tuple[EncodingAssignment, ...]:
        """Encoder consumers: the unique inputs of this encoder micro-batch, in tensor order, with their routes."""
        return tuple(encoding_assignment_from_proto(e, f"encoder_inputs[{i}]")
                     for i, e in enumerate(self.encoder_input_messages))

    @property
    def key(self) -> tuple[int, int]:
        """(sequence, micro-batch index): the same micro-batch keeps its key across sidecar restarts."""
        return (self.sequence, self.microbatch_index)

    def tensor(self, name: str) -> TensorSpec:
        for spec in self.tensors:
            if spec.name == name:
                return spec
        raise InvalidArgument(f"no tensor {name!r}; have {[t.name for t in self.tensors]}", field="name")

    # ---- protobuf --------------------------------------------------------------------------------------------

    def to_proto(self) -> pb.MicroBatchDescriptor:
        return pb.MicroBatchDescriptor(
            ticket=self.ticket,
            incarnation=self.incarnation,
            sequence=self.sequence,
            train_batch_index=self.train_batch_index,
            minibatch_index=self.minibatch_index,
            num_minibatches=self.num_minibatches,
            train_version=self.train_version,
            microbatch_index=self.microbatch_index,
            num_microbatches=self.num_microbatches,
            last_in_minibatch=self.last_in_minibatch,
            minibatch_loss_tokens=self.minibatch_loss_tokens,
            microbatch_loss_tokens=self.microbatch_loss_tokens,
            segment=self.segment,
            slot=self.slot,
            used_bytes=self.used_bytes,
            tensors=[
                pb.TensorDescriptor(
                    name=t.name, dtype=DTYPE_TO_PROTO[t.dtype], shape=t.shape, offset=t.offset,
                    byte_length=t.byte_length,
                )
                for t in self.tensors
            ],
            encodings=[
                pb.PackedEncodingUse(
                    encoding_id=u.encoding_id, key=u.key, packed_start=u.packed_start, packed_end=u.packed_end,
                    row_start=u.row_start, trajectory_id=u.trajectory_id, reference=u.reference,
                )
                for u in self.encodings
            ],
            encoder_inputs=self.encoder_input_messages,
            trajectory_ids=self.trajectory_ids,
            trajectory_indices=self.trajectory_indices,
            role=self.role,
            dp_rank=self.dp_rank,
            cp_rank=self.cp_rank,
            cp=self.cp,
            tp=self.tp,
            assigned_at=self.assigned_at,
            published_at=self.published_at,
            delivery_round=self.delivery_round,
            failure=None if self.failure is None else pb.MiniBatchFailure(
                trajectory_id=self.failure.trajectory_id, unit_key=self.failure.unit_key, reason=self.failure.reason),
            item_metadata=[values_to_proto(TrajectoryValues(metadata=item)) for item in self.item_metadata],
        )

    @staticmethod
    def from_proto(message: pb.MicroBatchDescriptor) -> MicroBatchDescriptor:
        tensors = []
        for i, t in enumerate(message.tensors):
            if t.dtype not in DTYPE_FROM_PROTO:
                raise InvalidArgument("unknown or unspecified dtype", field=f"tensors[{i}].dtype")
            spec = within(
                f"tensors[{i}]",
                partial(TensorSpec, name=t.name, dtype=DTYPE_FROM_PROTO[t.dtype], shape=tuple(t.shape),
                        offset=t.offset),
            )
            if spec.byte_length != t.byte_length:
                raise InvalidArgument("does not match dtype and shape", field=f"tensors[{i}].byte_length")
            tensors.append(spec)
        encodings = tuple(
            within(
                f"encodings[{i}]",
                partial(
                    PackedEncodingUse, encoding_id=u.encoding_id, key=UnitKey(u.key), packed_start=u.packed_start,
                    packed_end=u.packed_end, row_start=u.row_start, trajectory_id=u.trajectory_id,
                    reference=u.reference,
                ),
            )
            for i, u in enumerate(message.encodings)
        )
        return MicroBatchDescriptor(
            ticket=message.ticket,
            incarnation=message.incarnation,
            sequence=message.sequence,
            train_batch_index=message.train_batch_index,
            minibatch_index=message.minibatch_index,
            num_minibatches=message.num_minibatches,
            train_version=message.train_version,
            microbatch_index=message.microbatch_index,
            num_microbatches=message.num_microbatches,
            last_in_minibatch=message.last_in_minibatch,
            minibatch_loss_tokens=message.minibatch_loss_tokens,
            microbatch_loss_tokens=message.microbatch_loss_tokens,
            segment=message.segment,
            slot=message.slot,
            used_bytes=message.used_bytes,
            tensors=tuple(tensors),
            role=message.role,
            dp_rank=message.dp_rank,
            cp_rank=message.cp_rank,
            cp=message.cp,
            tp=message.tp,
            trajectory_ids=tuple(message.trajectory_ids),
            trajectory_indices=tuple(message.trajectory_indices),
            encodings=encodings,
            encoder_input_messages=tuple(message.encoder_inputs),
            assigned_at=message.assigned_at,
            published_at=message.published_at,
            delivery_round=message.delivery_round,
            failure=within("failure", lambda: MiniBatchFailure(
                trajectory_id=message.failure.trajectory_id, unit_key=message.failure.unit_key,
                reason=message.failure.reason)) if message.HasField("failure") else None,
            item_metadata=tuple(within(f"item_metadata[{k}]", partial(values_from_proto, m)).metadata
                                for k, m in enumerate(message.item_metadata)),
        )
