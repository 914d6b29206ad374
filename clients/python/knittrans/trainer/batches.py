"""What the training loop iterates: a :class:`MiniBatch` yields its :class:`MicroBatch` es in consumption order,
drawing them from the client that yields it through a :class:`MiniBatchFeed`, so neither calls into the other's
internals."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from knittrans.errors import FailedPrecondition, InvalidArgument, MiniBatchFailed, MiniBatchRestarted
from knittrans.packed.layout import item_offsets, packed_encoding_uses
from knittrans.packed.tensors import PackedEncodingUse
from knittrans.plan import ConsumerAssignment, EncodingAssignment, Plan
from knittrans.steps import StepId
from knittrans.trainer.descriptor import MicroBatchDescriptor
from knittrans.trainer.metadata import NonTensorBatch
from knittrans.types import ConsumerId


@dataclass
class Staged:
    """A micro-batch the prefetch thread staged, or the failure the sidecar published in its place; it holds its
    slot in the sidecar's ring until released."""

    descriptor: MicroBatchDescriptor
    tensors: dict[str, Any]
    event: Any = None  # CUDA event of the staged copy
    released: bool = False
    waited: float = 0.0  # how long the training loop waited for it to be staged
    failure: MiniBatchFailed | None = None  # the sidecar could not deliver it: raised in its place


class MicroBatch:
    """One packed micro-batch: ``micro["input_ids"]`` and friends (see :mod:`knittrans.reorg.packing`)."""

    def __init__(self, staged: Staged) -> None:
        self._staged = staged

    @property
    def descriptor(self) -> MicroBatchDescriptor:
        return self._staged.descriptor

    @property
    def tensors(self) -> dict[str, Any]:
        return self._staged.tensors

    @property
    def staged(self) -> Staged:
        return self._staged

    def __getitem__(self, name: str) -> Any:
        try:
            return self._staged.tensors[name]
        except KeyError:
            raise InvalidArgument(f"no tensor {name!r}; have {sorted(self._staged.tensors)}", field="name") from None

    def __contains__(self, name: object) -> bool:
        return name in self._staged.tensors

    def keys(self) -> list[str]:
        return list(self._staged.tensors)

    @property
    def index(self) -> int:
        return self.descriptor.microbatch_index

    @property
    def last(self) -> bool:
        return self.descriptor.last_in_minibatch

    @property
    def loss_tokens(self) -> int:
        """Loss tokens of this micro-batch over all CP ranks."""
        return self.descriptor.microbatch_loss_tokens

    @property
    def trajectory_ids(self) -> tuple[str, ...]:
        return self.descriptor.trajectory_ids

    @property
    def metadata(self) -> NonTensorBatch:
        """The items' metadata, one column per name aligned with :attr:`trajectory_ids` (verl's
        ``non_tensor_batch``; see :mod:`knittrans.trainer.metadata`)."""
        descriptor = self.descriptor
        return NonTensorBatch.of(descriptor.trajectory_ids, descriptor.item_metadata)

    @property
    def encodings(self) -> tuple[PackedEncodingUse, ...]:
        """Backbone: which encoding rows fill which packed positions."""
        return self.descriptor.encodings

    @property
    def encoder_inputs(self) -> tuple[EncodingAssignment, ...]:
        """Encoder: the unique inputs in ``inputs`` order, with their routes."""
        return self.descriptor.encoder_inputs

    @property
    def waited_seconds(self) -> float:
        return self._staged.waited

    @property
    def empty(self) -> bool:
        return not self.descriptor.trajectory_ids and not self.descriptor.encoder_input_messages


@dataclass(frozen=True, kw_only=True, eq=False)
class MiniBatchContext:
    """What the sidecar retains about a mini-batch: this consumer's whole assignment and, if the assignment
    source sent it, the full plan."""

    sequence: int
    global_loss_tokens: int
    assignment: ConsumerAssignment
    plan: Plan | None
    admitted_trajectory_ids: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class MiniBatchFeed:
    """What a :class:`MiniBatch` may ask of the client that yields it; the client hands in its own methods."""

    take_next_of: Callable[[int], Staged]  # the next micro-batch of this sequence; raises MiniBatchRestarted
    ready_for_use: Callable[[Staged], None]  # wait until its tensors may be read on the training stream
    release: Callable[[Staged], None]  # free its slot in the sidecar's ring (once; again is a no-op)
    complete: Callable[[MiniBatch], None]  # report the mini-batch's optimizer step (once)
    context: Callable[[int], MiniBatchContext]  # what the sidecar retains about a mini-batch


class MiniBatch:
    """One mini-batch: iterate it once for its micro-batches, in consumption order."""

    def __init__(self, feed: MiniBatchFeed, first: Staged, rest: list[Staged] | None = None) -> None:
        self._feed = feed
        self._first = first
        self._eager = rest
        self._started = False
        self._done = False
        self._current: Staged | None = None
        self._last_seen: MicroBatchDescriptor | None = None
        self.completed = False
        self.restarted = False  # a TP rank restarted mid-way: it comes again; never step on this one
        self._context: MiniBatchContext | None = None

    # ---- indices -----------------------------------------------------------------------------------------

    @property
    def descriptor(self) -> MicroBatchDescriptor:
        """The first micro-batch's descriptor (mini-batch fields are the same on all)."""
        return self._first.descriptor

    @property
    def sequence(self) -> int:
        return self.descriptor.sequence

    @property
    def train_batch_index(self) -> int:
        return self.descriptor.train_batch_index

    @property
    def minibatch_index(self) -> int:
        return self.descriptor.minibatch_index

    @property
    def num_minibatches(self) -> int:
        return self.descriptor.num_minibatches

    @property
    def train_version(self) -> int:
        return self.descriptor.train_version

    @property
    def step(self) -> StepId:
        """The optimizer step this mini-batch makes: a restored checkpoint names the last one it applied."""
        d = self.descriptor
        return StepId(train_batch_index=d.train_batch_index, minibatch_index=d.minibatch_index,
                      train_version=d.train_version)

    @property
    def num_microbatches(self) -> int:
        return self.descriptor.num_microbatches

    @property
    def global_loss_tokens(self) -> int:
        """Loss tokens of the whole mini-batch over every rank: divide summed token losses by this."""
        return self.descriptor.minibatch_loss_tokens

    @property
    def consumer(self) -> ConsumerId:
        d = self.descriptor
        return ConsumerId(role=d.role, dp_rank=d.dp_rank, cp_rank=d.cp_rank)

    @property
    def last_of_train_batch(self) -> bool:
        return self.minibatch_index == self.num_minibatches - 1

    # ---- context (fetched from the sidecar on first use) ---------------------------------------------------

    @property
    def context(self) -> MiniBatchContext:
        if self._context is None:
            self._context = self._feed.context(self.sequence)
        return self._context

    @property
    def assignment(self) -> ConsumerAssignment:
        return self.context.assignment

    @property
    def plan(self) -> Plan | None:
        return self.context.plan

    @property
    def encoder_inputs(self) -> tuple[EncodingAssignment, ...]:
        """Encoder consumers: every unique input of the mini-batch this rank encodes, in encoder micro-batch
        order, with its routes to the backbone consumers."""
        return tuple(e for mb in self.assignment.encoder_microbatches for e in mb.encodings)

    @property
    def encoding_uses(self) -> tuple[tuple[PackedEncodingUse, ...], ...]:
        """Backbone consumers: per micro-batch, the encoding rows it consumes at which packed positions."""
        assignment = self.assignment
        return tuple(packed_encoding_uses(mb, item_offsets(mb, assignment.cp)) for mb in assignment.microbatches)

    def encoding_schedule(
        self,
        encoder: str,
        *,
        backbone_rank: Callable[[int, int, int], int] | None = None,
        encoder_rank: Callable[[int], int] | None = None,
    ) -> Any:
        """The mini-batch's :class:`~knittrans.train.EncodingSchedule` for ``encoder`` (the same on every rank).
        Needs the full plan, which the assignment source must provide."""
        plan = self.plan
        if plan is None:
            raise FailedPrecondition("the sidecar has no full plan for this mini-batch (its assignment source "
                                     "did not send one), so the encoding schedule cannot be derived")
        from knittrans.train.plan_adapter import schedule_from_plan

        return schedule_from_plan(plan, encoder=encoder, backbone_rank=backbone_rank, encoder_rank=encoder_rank)

    # ---- iteration -------------------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[MicroBatch]:
        if self._started:
            raise FailedPrecondition("a mini-batch is iterated once")
        self._started = True
        return self._micro_batches()

    def _micro_batches(self) -> Iterator[MicroBatch]:
        if self._eager is not None:
            for staged in [self._first, *self._eager]:
                if staged.failure is not None:
                    self._done = True
                    raise staged.failure
                yield MicroBatch(staged)
            self._done = True
            return
        staged = self._first
        try:
            while True:
                if staged.failure is not None:  # the last of the mini-batch: nothing follows it
                    self._last_seen = staged.descriptor
                    self._feed.release(staged)
                    self._done = True
                    raise staged.failure
                self._current = staged
                self._last_seen = staged.descriptor
                self._feed.ready_for_use(staged)
                yield MicroBatch(staged)
                self._feed.release(staged)
                self._current = None
                if staged.descriptor.last_in_minibatch:
                    break
                staged = self._take_next()
            self._done = True
        finally:
            if self._current is not None:  # the loop left early: the views die with the iterator
                self._feed.release(self._current)
                self._current = None

    def _take_next(self) -> Staged:
        try:
            return self._feed.take_next_of(self.sequence)
        except MiniBatchRestarted as error:
            error.train_batch_index, error.minibatch_index = self.train_batch_index, self.minibatch_index
            self.restarted = self._done = True
            raise

    def drain(self) -> None:
        """Consume (and release) what the training loop did not iterate, so the next mini-batch lines up.

        :meth:`TrainerClient.mini_batches` does this before it takes the next mini-batch."""
        if self._done:
            return
        if self._eager is not None:  # everything was taken (and released) before the mini-batch was yielded
            self._done = True
            return
        if not self._started:
            try:
                for _ in self:
                    pass
            except (MiniBatchFailed, MiniBatchRestarted):  # nobody looked at it; what comes next matters now
                pass
            return
        if self._current is not None:  # the iterator is suspended on it (the loop stopped without closing it)
            self._feed.release(self._current)
            self._current = None
        last = self._last_seen.last_in_minibatch if self._last_seen is not None else False
        while not last:
            try:
                staged = self._take_next()
            except MiniBatchRestarted:
                return
            self._feed.release(staged)
            last = staged.descriptor.last_in_minibatch
        self._done = True

    def complete(self) -> None:
        """Report now that this mini-batch's optimizer step is done (otherwise done when the next is taken)."""
        self._feed.complete(self)
