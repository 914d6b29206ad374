"""``TrainerClient``: a training rank's view of its reorg sidecar (DESIGN.md §2 step 6, §6).

::

    client = TrainerClient(TrainerSettings(sidecar="unix:/tmp/knittrans-job/reorg-backbone-dp0-cp1.sock",
                                           tp_rank=tp_rank, global_rank=rank,
                                           admission=ConnectionSettings(target="admission:50051")))
    for mini in client.mini_batches():
        for micro in mini:
            loss = model(micro["input_ids"], position_ids=micro["position_ids"], ...)
            (loss_sum(loss, micro["labels"], micro["loss_mask"]) / mini.global_loss_tokens).backward()
        optimizer.step()

``labels`` is the next token (−100 where there is none) and every per-target field, ``loss_mask`` included, is
label-aligned: the sidecar shifted those the rollout submitted token-aligned (``FieldAlignment``). So the logits
at packed position t meet ``labels[t]`` as they are, and ``(labels != -100) & (loss_mask != 0)`` summed over all
ranks and micro-batches is exactly ``mini.global_loss_tokens`` (docs/integration.md, "Alignment").

Each micro-batch's tensors view the sidecar's shared memory (zero copy; on CUDA, a staged GPU copy). They are
valid until the iterator moves past the micro-batch: the slot is released then and the sidecar reuses it.

A background thread prefetches the next micro-batches (long-polling ``NextMicroBatch``): on CPU it maps the
slot in and builds the tensor views; with CUDA it copies the slot into pinned memory and on to the GPU with a
CUDA event. ``mode="eager"`` (the ablation) materialises the whole mini-batch before yielding it, copying each
micro-batch out of its slot.

When a mini-batch is finished (the loop asks for the next one, or :meth:`MiniBatch.complete`), TP rank 0 of the
consumer reports its optimizer step to the admission service, and global rank 0 reports ``AdvanceVersion``
after the last mini-batch of a train batch. A sidecar that stops answering raises :class:`~knittrans.errors.
Unavailable` within ``sidecar_timeout_seconds``; the client never hangs on a dead sidecar.

A mini-batch some consumer cannot read (a unit lost from the store, or stored with another size than its header
says) raises :class:`~knittrans.errors.MiniBatchFailed` from its micro-batch iterator before any micro-batch
of it, on every TP rank of every consumer, naming the trajectory and the unit (``error.trajectory_id``,
``error.unit_key``): the sidecars verify each mini-batch against the store and publish it only once the
admission service's verdict says every consumer verified its part. A failure found only when reading or packing
after that (bytes damaged behind the store's back) raises on that sidecar's TP ranks only, possibly after
micro-batches of the mini-batch were yielded; those must not be stepped on. Either way the training loop may
catch the error, skip the optimizer step and go on with ``mini_batches()``: the client still reports the
mini-batch done to the admission service (its units are released once every consumer is past it, and the
version advances after the last mini-batch of a train batch). The admission service's status lists the failure.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

import grpc

from knittrans.client.connection import ConnectionSettings, error_from_rpc, open_channel
from knittrans.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    KnitTransError,
    MiniBatchFailed,
    Unavailable,
)
from knittrans.packed.layout import item_offsets, packed_encoding_uses
from knittrans.plan import ConsumerAssignment, EncodingAssignment, Plan
from knittrans.plan.proto import assignment_from_proto, plan_from_proto
from knittrans.retry import Backoff, RetryPolicy
from knittrans.trainer.descriptor import MicroBatchDescriptor, PackedEncodingUse
from knittrans.trainer.progress import AdmissionProgressReporter, ProgressReporter
from knittrans.types import ConsumerId
from knittrans.v1 import reorg_service_pb2 as pb
from knittrans.v1 import reorg_service_pb2_grpc

logger = logging.getLogger(__name__)

# A sidecar that stops cancels the calls in flight (CANCELLED): like UNAVAILABLE, the sidecar is gone for now, and
# it is an error only once it has not answered for sidecar_timeout_seconds. (Our own cancellations end the fetch
# loop before this is consulted.)
_RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)
_SIDECAR_RETRY = RetryPolicy(initial=0.02, cap=0.5)  # while the sidecar does not answer (restarting?)


class DeliveryMode(StrEnum):
    ITER = "iter"  # yield micro-batches as they are ready (prefetching the next ones)
    EAGER = "eager"  # materialise the whole mini-batch first (ablation of consumption-driven delivery)


@dataclass(frozen=True, kw_only=True)
class TrainerSettings:
    sidecar: str  # "unix:/path/to.sock" (or a bare path)
    tp_rank: int = 0
    global_rank: int = 0
    mode: DeliveryMode = DeliveryMode.ITER
    prefetch: int = 2  # micro-batches staged ahead of the one in use
    device: str = "auto"  # "auto" (CUDA when available), "cpu", "cuda:N"
    poll_seconds: float = 5.0  # one long poll of NextMicroBatch
    sidecar_timeout_seconds: float = 15.0  # an unreachable sidecar raises Unavailable after this long
    wait_timeout_seconds: float = 0.0  # > 0: raise DeadlineExceeded when no micro-batch comes for this long
    admission: ConnectionSettings | None = None  # progress reports go here; None: nobody is told
    report_progress: bool = True
    advance_version: bool | None = None  # None: global rank 0 does

    def __post_init__(self) -> None:
        if not self.sidecar:
            raise InvalidArgument("must name the sidecar's socket, unix:/path", field="sidecar")
        if not isinstance(self.mode, DeliveryMode):
            object.__setattr__(self, "mode", DeliveryMode(self.mode))
        for name in ("tp_rank", "global_rank"):
            if getattr(self, name) < 0:
                raise InvalidArgument("must not be negative", field=name)
        if self.prefetch < 1:
            raise InvalidArgument("must be at least 1", field="prefetch")
        for name in ("poll_seconds", "sidecar_timeout_seconds"):
            if getattr(self, name) <= 0:
                raise InvalidArgument("must be positive", field=name)
        if self.wait_timeout_seconds < 0:
            raise InvalidArgument("must not be negative", field="wait_timeout_seconds")

    @property
    def target(self) -> str:
        return self.sidecar if self.sidecar.startswith("unix:") else f"unix:{self.sidecar}"

    @property
    def advances_version(self) -> bool:
        return self.global_rank == 0 if self.advance_version is None else self.advance_version


@dataclass
class _Staged:
    descriptor: MicroBatchDescriptor
    tensors: dict[str, Any]
    event: Any = None  # CUDA event of the staged copy
    released: bool = False
    waited: float = 0.0  # how long the training loop waited for it to be staged
    failure: MiniBatchFailed | None = None  # the sidecar could not deliver it: raised in its place


def failure_error(descriptor: MicroBatchDescriptor) -> MiniBatchFailed:
    """The typed error for a failure the sidecar published in place of a micro-batch."""
    failure = descriptor.failure
    assert failure is not None
    return MiniBatchFailed(
        f"mini-batch {descriptor.sequence} (train batch {descriptor.train_batch_index}, mini-batch "
        f"{descriptor.minibatch_index}) could not be delivered to {descriptor.role} dp {descriptor.dp_rank} cp "
        f"{descriptor.cp_rank}: micro-batch {descriptor.microbatch_index}, trajectory {failure.trajectory_id!r}, "
        f"unit {failure.unit_key!r}: {failure.reason}",
        trajectory_id=failure.trajectory_id, unit_key=failure.unit_key, sequence=descriptor.sequence,
        train_batch_index=descriptor.train_batch_index, minibatch_index=descriptor.minibatch_index,
    )


@dataclass
class TrainerStats:
    micro_batches: int = 0
    mini_batches: int = 0
    waited_seconds: float = 0.0  # exposed wait of the training loop, summed
    skipped_after_restart: int = 0  # re-published micro-batches skipped after a sidecar restart
    restarts_seen: int = 0
    waits: list[float] = field(default_factory=list)  # per micro-batch (per mini-batch in eager mode)


_END = object()


class MicroBatch:
    """One packed micro-batch: ``micro["input_ids"]`` and friends (see :mod:`knittrans.reorg.packing`)."""

    def __init__(self, staged: _Staged) -> None:
        self._staged = staged

    @property
    def descriptor(self) -> MicroBatchDescriptor:
        return self._staged.descriptor

    @property
    def tensors(self) -> dict[str, Any]:
        return self._staged.tensors

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

    take_next_of: Callable[[int], _Staged]  # the next staged micro-batch, which must be of this sequence
    ready_for_use: Callable[[_Staged], None]  # wait until its tensors may be read on the training stream
    release: Callable[[_Staged], None]  # free its slot in the sidecar's ring (once; again is a no-op)
    complete: Callable[[MiniBatch], None]  # report the mini-batch's optimizer step (once)
    context: Callable[[int], MiniBatchContext]  # what the sidecar retains about a mini-batch


class MiniBatch:
    """One mini-batch: iterate it once for its micro-batches, in consumption order."""

    def __init__(self, feed: MiniBatchFeed, first: _Staged, rest: list[_Staged] | None = None) -> None:
        self._feed = feed
        self._first = first
        self._eager = rest
        self._started = False
        self._done = False
        self._current: _Staged | None = None
        self._last_seen: MicroBatchDescriptor | None = None
        self.completed = False
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
                staged = self._feed.take_next_of(self.sequence)
            self._done = True
        finally:
            if self._current is not None:  # the loop left early: the views die with the iterator
                self._feed.release(self._current)
                self._current = None

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
            except MiniBatchFailed:  # nobody looked at it; the next mini-batch is what matters now
                pass
            return
        if self._current is not None:  # the iterator is suspended on it (the loop stopped without closing it)
            self._feed.release(self._current)
            self._current = None
        last = self._last_seen.last_in_minibatch if self._last_seen is not None else False
        while not last:
            staged = self._feed.take_next_of(self.sequence)
            self._feed.release(staged)
            last = staged.descriptor.last_in_minibatch
        self._done = True

    def complete(self) -> None:
        """Report now that this mini-batch's optimizer step is done (otherwise done when the next is taken)."""
        self._feed.complete(self)


class TrainerClient:
    """A training rank's client of its reorg sidecar (see the module docstring)."""

    def __init__(self, settings: TrainerSettings, *, progress: ProgressReporter | None = None) -> None:
        self._settings = settings
        self._channel = open_channel(ConnectionSettings(target=settings.target))
        self._stub = reorg_service_pb2_grpc.ReorgServiceStub(self._channel)
        if progress is None and settings.admission is not None and settings.report_progress:
            progress = AdmissionProgressReporter(settings.admission)
        self._progress = progress if settings.report_progress else None
        self._eager = settings.mode is DeliveryMode.EAGER
        self._queue: queue.Queue = queue.Queue(maxsize=0 if self._eager else settings.prefetch)
        self._stop = threading.Event()
        # Releases go out from a thread of their own: an RPC costs the training loop nothing.
        self._release_queue: queue.SimpleQueue = queue.SimpleQueue()
        self._releaser: threading.Thread | None = None
        self._fetcher: threading.Thread | None = None
        self._in_flight: Any = None  # the pending long poll, cancelled by close()
        self._stager: Any = None
        self._iterating = False
        self._feed = MiniBatchFeed(
            take_next_of=self._take_next_of, ready_for_use=self._ready_for_use, release=self._release,
            complete=self._complete, context=self.minibatch_context,
        )
        self.stats = TrainerStats()
        self.start()

    # ---- public --------------------------------------------------------------------------------------------

    @property
    def settings(self) -> TrainerSettings:
        return self._settings

    def start(self) -> None:
        """Start prefetching (the constructor does; idempotent)."""
        if self._fetcher is not None:
            return
        from knittrans.trainer.staging import Stager  # imports torch

        self._stager = Stager(self._settings.device, materialise=self._eager, prefetch=self._settings.prefetch)
        self._fetcher = threading.Thread(target=self._fetch_loop, name=f"knittrans-prefetch-tp{self._settings.tp_rank}",
                                         daemon=True)
        self._releaser = threading.Thread(target=self._release_loop,
                                          name=f"knittrans-release-tp{self._settings.tp_rank}", daemon=True)
        self._fetcher.start()
        self._releaser.start()

    def mini_batches(self) -> Iterator[MiniBatch]:
        """Mini-batches in order until the sidecar's assignment source ends (never, for a live job)."""
        if self._iterating:
            raise FailedPrecondition("mini_batches() is already being iterated")
        self._iterating = True
        while True:
            first = self._take()
            if first is None:
                return
            rest = None
            if self._eager:
                rest = []
                last = first
                while not last.descriptor.last_in_minibatch:
                    last = self._take_next_of(first.descriptor.sequence)
                    first.waited += last.waited
                    last.waited = 0.0
                    rest.append(last)
                self.stats.waits.append(first.waited)
            mini = MiniBatch(self._feed, first, rest)
            yield mini
            mini.drain()
            self._complete(mini)
            self.stats.mini_batches += 1

    def status(self, *, timeout: float = 5.0) -> pb.GetReorgStatusResponse:
        return self._call(self._stub.GetReorgStatus, pb.GetReorgStatusRequest(), timeout)

    def minibatch_context(self, sequence: int, *, timeout: float = 10.0) -> MiniBatchContext:
        response = self._call(self._stub.GetMiniBatch, pb.GetMiniBatchRequest(sequence=sequence), timeout)
        return MiniBatchContext(
            sequence=response.sequence,
            global_loss_tokens=response.global_loss_tokens,
            assignment=assignment_from_proto(response.assignment),
            plan=plan_from_proto(response.plan) if response.HasField("plan") else None,
            admitted_trajectory_ids=tuple(response.admission.trajectory_ids),
        )

    def close(self) -> None:
        self._stop.set()
        in_flight = self._in_flight
        if in_flight is not None:
            in_flight.cancel()
        if self._fetcher is not None:
            self._fetcher.join(timeout=self._settings.poll_seconds + 2)
        if self._releaser is not None:
            self._release_queue.put(None)
            self._releaser.join(timeout=self._settings.poll_seconds + 2)
        self._channel.close()
        if self._progress is not None:
            self._progress.close()
        if self._stager is not None:
            self._stager.close()

    def __enter__(self) -> TrainerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- the prefetch thread -----------------------------------------------------------------------------

    def _call(self, rpc: Callable[..., Any], request: Any, timeout: float) -> Any:
        try:
            return rpc(request, timeout=timeout)
        except grpc.RpcError as error:
            raise error_from_rpc(error) from None

    def _put(self, item: object) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

    def _fetch_loop(self) -> None:
        try:
            self._fetch()
        except BaseException as error:  # handed to the training loop, which raises it
            if not isinstance(error, KnitTransError):
                logger.exception("the prefetch thread failed")
            self._put(error)

    def _fetch(self) -> None:
        settings = self._settings
        incarnation = ""
        after = 0
        last_key: tuple[int, int] = (0, -1)
        unreachable = Backoff(replace(_SIDECAR_RETRY, deadline=settings.sidecar_timeout_seconds), start_now=False)
        idle_since = time.monotonic()
        while not self._stop.is_set():
            request = pb.NextMicroBatchRequest(tp_rank=settings.tp_rank, after_ticket=after, incarnation=incarnation)
            try:
                self._in_flight = self._stub.NextMicroBatch.future(request, timeout=settings.poll_seconds)
                if self._stop.is_set():
                    return
                response = self._in_flight.result()
            except grpc.FutureCancelledError:
                return
            except grpc.RpcError as error:
                if self._stop.is_set():
                    return
                if error.code() not in _RETRYABLE:
                    raise error_from_rpc(error) from None
                delay = unreachable.next_delay()
                if delay is None:
                    raise Unavailable(
                        f"reorg sidecar {settings.target} has not answered for {unreachable.failing_for():.1f}s "
                        f"({error.code().name}: {error.details()})", field="sidecar",
                    ) from None
                time.sleep(delay)
                continue
            unreachable.reset()
            if response.HasField("descriptor"):
                descriptor = MicroBatchDescriptor.from_proto(response.descriptor)
                if descriptor.incarnation != incarnation:
                    if incarnation:
                        logger.warning("reorg sidecar %s restarted (incarnation %s); skipping what was consumed",
                                       settings.target, descriptor.incarnation)
                        self.stats.restarts_seen += 1
                    incarnation = descriptor.incarnation
                after = descriptor.ticket
                if descriptor.key <= last_key:
                    self.stats.skipped_after_restart += 1
                    self._send_release(descriptor, waited=-1.0)
                    continue
                if descriptor.failure is not None:
                    failed = _Staged(descriptor=descriptor, tensors={}, failure=failure_error(descriptor))
                    if self._eager:
                        self._send_release(descriptor, waited=-1.0)
                        failed.released = True
                    last_key = descriptor.key
                    idle_since = time.monotonic()
                    if not self._put(failed):
                        return
                    continue
                try:
                    tensors, event = self._stager.stage(descriptor)
                except Unavailable as error:  # its segment vanished: the sidecar died; its successor re-publishes
                    logger.warning("%s; waiting for the sidecar to come back", error)
                    continue
                staged = _Staged(descriptor=descriptor, tensors=tensors, event=event)
                if self._eager:
                    self._send_release(descriptor, waited=-1.0)
                    staged.released = True
                last_key = descriptor.key
                idle_since = time.monotonic()
                if not self._put(staged):
                    return
            elif response.end_of_stream:
                self._put(_END)
                return
            elif settings.wait_timeout_seconds and time.monotonic() - idle_since > settings.wait_timeout_seconds:
                raise DeadlineExceeded(f"no micro-batch from {settings.target} for "
                                       f"{settings.wait_timeout_seconds:.1f}s", field="sidecar")

    # ---- handed to MiniBatch as its MiniBatchFeed ------------------------------------------------------

    def _take(self) -> _Staged | None:
        # The wait that counts is for a micro-batch that was not staged yet; taking one that was is not waiting
        # for data (even if this thread then waits a moment for the GIL).
        ready = not self._queue.empty()
        started = time.perf_counter()
        while True:
            try:
                item = self._queue.get(timeout=0.5)
                break
            except queue.Empty:
                if self._fetcher is not None and not self._fetcher.is_alive() and self._queue.empty():
                    raise Unavailable("the prefetch thread stopped", field="sidecar") from None
        if item is _END:
            return None
        if isinstance(item, BaseException):
            raise item
        waited = 0.0 if ready else time.perf_counter() - started
        item.waited = waited
        self.stats.micro_batches += 1
        self.stats.waited_seconds += waited
        if not self._eager:
            self.stats.waits.append(waited)
        return item

    def _take_next_of(self, sequence: int) -> _Staged:
        staged = self._take()
        if staged is None or staged.descriptor.sequence != sequence:
            raise FailedPrecondition(
                f"mini-batch {sequence} ended early: the sidecar "
                + ("ended its stream" if staged is None else f"moved on to {staged.descriptor.sequence}")
            )
        return staged

    def _ready_for_use(self, staged: _Staged) -> None:
        self._stager.ready(staged.tensors, staged.event)

    def _release(self, staged: _Staged) -> None:
        if staged.released:
            return
        staged.released = True
        self._send_release(staged.descriptor, waited=staged.waited)

    def _send_release(self, descriptor: MicroBatchDescriptor, *, waited: float) -> None:
        self._release_queue.put((descriptor.incarnation, descriptor.ticket, waited))

    def _release_loop(self) -> None:
        tp_rank = self._settings.tp_rank
        while (item := self._release_queue.get()) is not None:
            incarnation, ticket, waited = item
            request = pb.ReleaseMicroBatchRequest(request_id=f"{incarnation}/{ticket}/{tp_rank}", tp_rank=tp_rank,
                                                  ticket=ticket, waited_seconds=waited, incarnation=incarnation)
            try:
                self._stub.ReleaseMicroBatch(request, timeout=self._settings.poll_seconds)
            except grpc.RpcError as error:
                # A sidecar that is gone has no slot to free; the prefetch thread reports it if it stays gone.
                logger.debug("release of ticket %d failed: %s", ticket, error.code().name)

    def _complete(self, mini: MiniBatch) -> None:
        if mini.completed:
            return
        mini.completed = True
        if self._progress is None:
            return
        if self._settings.tp_rank == 0:
            self._progress.optimizer_step(mini.consumer, mini.sequence)
        if self._settings.advances_version and mini.last_of_train_batch:
            version = self._progress.advance_version(mini.train_batch_index, mini.train_version + 1)
            logger.info("train batch %d done; policy version is now %d", mini.train_batch_index, version)
