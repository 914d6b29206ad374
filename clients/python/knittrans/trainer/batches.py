"""What the training loop iterates: a :class:`MiniBatch` yields its :class:`MicroBatch` es in consumption order,
drawing them from the client that yields it through a :class:`MiniBatchFeed`, so neither calls into the other's
internals."""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
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
    owned: bool = False  # the tensors are this process's memory (a copy), not views of the slot
    rounds_before: int = 0  # delivery rounds the client had learnt of when it was staged


class MicroBatch:
    """One packed micro-batch: ``micro["input_ids"]`` and friends (see :mod:`knittrans.reorg.packing`)."""

    __slots__ = ("_staged",)

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

    def sequence_rows(self) -> list[slice]:
        """Each trajectory's packed rows, in :attr:`trajectory_ids` order, without the padding that may follow it:
        what to slice a per-token output with before attaching it (docs/roles.md). Whole sequences need cp 1; a
        rank of cp > 1 holds two zigzag chunks of each sequence."""
        if self.descriptor.cp > 1:
            raise FailedPrecondition(f"this rank holds chunks of its sequences (cp {self.descriptor.cp}), not whole "
                                     "ones", field="cp")
        starts, lengths = self["cu_seqlens"].tolist(), self["seq_lengths"].tolist()
        return [slice(start, start + length) for start, length in zip(starts[:-1], lengths, strict=True)]

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
    own: Callable[[Staged], None] = lambda staged: None  # copy its tensors out of the slot (unless they are)
    # A delivery round began after the one count given (the rounds the client had learnt of when micro-batch 0
    # was staged: Staged.rounds_before).
    restarted_since: Callable[[int], bool] = lambda rounds_before: False


class MiniBatch:
    """One mini-batch: iterate it ``passes`` times (``TrainerClient.mini_batches(passes=...)``) for its
    micro-batches, in consumption order, the same ones every time.

    Several passes never read the store again: pass 0 takes the micro-batches from the sidecar and keeps them
    (their tensors copied out of their slots, the copy made by the prefetch thread; the last micro-batch's slot
    is held instead, so the sidecar counts this rank as partway through the mini-batch until its last pass);
    passes 1.. yield what was kept. A delivery round that starts during any pass (a TP rank of the consumer
    restarted) raises :class:`~knittrans.errors.MiniBatchRestarted`: the mini-batch comes again, from pass 0."""

    def __init__(self, feed: MiniBatchFeed, first: Staged, rest: list[Staged] | None = None, *,
                 passes: int = 1) -> None:
        if not isinstance(passes, int) or isinstance(passes, bool) or passes < 1:
            raise InvalidArgument(f"must be a positive integer, got {passes!r}", field="passes")
        self._feed = feed
        self._descriptor = first.descriptor
        self._rounds_before = first.rounds_before
        # Micro-batch 0 until pass 0 takes it (eager: for good). Not kept after that, so that, like every other
        # micro-batch, it is freed by whoever drops it last (the release thread), not when the loop drops this.
        self._first: Staged | None = first
        self._eager = rest
        self.passes = passes
        self._passes_begun = 0
        self._active: Iterator[MicroBatch] | None = None  # the iterator of the pass under way
        self._kept: list[Staged] = []  # pass 0's micro-batches, for the later passes
        self._held: Staged | None = None  # the last micro-batch, its slot held until the last pass
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
        return self._descriptor

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

    @property
    def pass_index(self) -> int:
        """The pass under way (or the last one begun): 0 .. passes - 1."""
        return max(self._passes_begun - 1, 0)

    def __iter__(self) -> Iterator[MicroBatch]:
        if self.restarted:
            raise FailedPrecondition("this mini-batch was restarted: it comes again from mini_batches()")
        if self._passes_begun >= self.passes:
            raise FailedPrecondition(f"a mini-batch is iterated {self.passes} time(s); ask mini_batches(passes=N) "
                                     "for more passes", field="passes")
        self._close_active()
        self._passes_begun += 1
        self._started = True
        if self._eager is not None:
            self._active = self._eager_pass()
        elif self._passes_begun == 1:
            self._active = self._micro_batches()
        else:
            self._active = self._later_pass()
        return self._active

    def _close_active(self) -> None:
        """End the iterator of an earlier pass the loop left (its clean-up releases what it was on)."""
        active, self._active = self._active, None
        if isinstance(active, Generator):
            active.close()

    def _eager_pass(self) -> Iterator[MicroBatch]:
        assert self._eager is not None and self._first is not None
        for staged in [self._first, *self._eager]:
            if staged.failure is not None:
                self._done = True
                raise staged.failure
            yield MicroBatch(staged)
        self._pass_done()

    def _micro_batches(self) -> Iterator[MicroBatch]:
        staged, self._first = self._first, None
        assert staged is not None  # pass 0 runs once
        try:
            while True:
                if staged.failure is not None:  # the last of the mini-batch: nothing follows it
                    self._last_seen = staged.descriptor
                    self._feed.release(staged)
                    self._finish()
                    raise staged.failure
                self._current = staged
                self._last_seen = staged.descriptor
                self._keep(staged)
                self._feed.ready_for_use(staged)
                yield MicroBatch(staged)
                self._let_go(staged)
                self._current = None
                if staged.descriptor.last_in_minibatch:
                    break
                staged = self._take_next()
            self._pass_done()
        finally:
            if self._current is not None:  # the loop left early: the views die with the iterator
                self._let_go(self._current)
                self._current = None

    def _later_pass(self) -> Iterator[MicroBatch]:
        self._take_rest()  # pass 0 was left early: its remaining micro-batches are taken (and kept) now
        for staged in self._kept:
            self._check_not_restarted()
            self._feed.ready_for_use(staged)
            yield MicroBatch(staged)
        self._pass_done()

    def _keep(self, staged: Staged) -> None:
        if self.passes == 1:
            return
        if not staged.descriptor.last_in_minibatch:
            self._feed.own(staged)
        self._kept.append(staged)

    def _let_go(self, staged: Staged) -> None:
        """Done with ``staged`` in pass 0: free its slot, unless it is the last one and passes follow."""
        if self.passes > 1 and staged.descriptor.last_in_minibatch and not self._done:
            self._held = staged
        else:
            self._feed.release(staged)

    def _take_rest(self) -> None:
        staged: Staged | None = self._first if self._last_seen is None else None  # pass 0 never began
        assert staged is not None or self._last_seen is not None
        while True:
            if staged is None:
                if self._last_seen is not None and self._last_seen.last_in_minibatch:
                    return
                staged = self._take_next()
            self._last_seen = staged.descriptor
            if staged.failure is not None:
                self._feed.release(staged)
                self._finish()
                raise staged.failure
            self._keep(staged)
            self._let_go(staged)
            staged = None

    def _check_not_restarted(self) -> None:
        if self._feed.restarted_since(self._rounds_before):
            self.restarted = True
            self._finish()
            raise MiniBatchRestarted(
                f"mini-batch {self.sequence} was restarted in pass {self.pass_index}: a TP rank of this consumer "
                "restarted; drop its partial gradient, it comes again from pass 0",
                sequence=self.sequence, train_batch_index=self.train_batch_index,
                minibatch_index=self.minibatch_index)

    def _pass_done(self) -> None:
        if self._passes_begun >= self.passes:  # the last pass ended (earlier ones may have been left early)
            self._finish()

    def _finish(self) -> None:
        """The mini-batch is over here: free the held slot (the sidecar may now acknowledge it), drop the copies."""
        self._done = True
        held, self._held = self._held, None
        if held is not None:
            self._feed.release(held)
        self._kept = []

    def _take_next(self) -> Staged:
        try:
            return self._feed.take_next_of(self.sequence)
        except MiniBatchRestarted as error:
            error.train_batch_index, error.minibatch_index = self.train_batch_index, self.minibatch_index
            self.restarted = True
            self._finish()
            raise

    def drain(self) -> None:
        """Consume (and release) what the training loop did not iterate, so the next mini-batch lines up; passes
        the loop did not iterate are dropped.

        :meth:`TrainerClient.mini_batches` does this before it takes the next mini-batch."""
        self._close_active()
        if self._done:
            return
        if self._eager is not None:  # everything was taken (and released) before the mini-batch was yielded
            self._finish()
            return
        if not self._started:
            self.passes = 1  # nobody looks at it: take it once, keeping nothing
            try:
                for _ in self:
                    pass
            except (MiniBatchFailed, MiniBatchRestarted):  # nobody looked at it; what comes next matters now
                pass
            return
        self._done = True  # from here on, nothing is kept or held
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
        self._finish()

    def complete(self) -> None:
        """Report now that this mini-batch's optimizer step is done (otherwise done when the next is taken). With
        several passes, only once the last pass was iterated to its end: the step is after the last pass."""
        if self.passes > 1 and not self._done:
            raise FailedPrecondition(f"mini-batch {self.sequence} is in pass {self.pass_index} of {self.passes}; "
                                     "its optimizer step comes after the last pass ends", field="passes")
        self._feed.complete(self)
