"""``TrainerClient``: a training rank's view of its reorg sidecar (DESIGN.md §2 step 6, §6).

::

    client = TrainerClient(TrainerSettings(sidecar="unix:/tmp/knittrans-job/reorg-backbone-dp0-cp1.sock",
                                           tp_rank=tp_rank, global_rank=rank,
                                           admission=ConnectionSettings(target="admission:50051")))
    for mini in client.mini_batches():
        try:
            for micro in mini:
                loss = model(micro["input_ids"], position_ids=micro["position_ids"], ...)
                (loss_sum(loss, micro["labels"], micro["loss_mask"]) / mini.global_loss_tokens).backward()
        except MiniBatchRestarted:  # a TP rank restarted mid-way: the mini-batch comes again, whole
            optimizer.zero_grad()
            continue
        optimizer.step()  # mini.step (a StepId) names this step in checkpoints

``labels`` is the next token (−100 where there is none) and every per-target field, ``loss_mask`` included, is
label-aligned: the sidecar shifted those the rollout submitted token-aligned (``FieldAlignment``). So the logits
at packed position t meet ``labels[t]`` as they are, and ``(labels != -100) & (loss_mask != 0)`` summed over all
ranks and micro-batches is exactly ``mini.global_loss_tokens`` (docs/integration.md, "Alignment").

Each micro-batch's tensors view the sidecar's shared memory (zero copy; on CUDA, a staged GPU copy). They are
valid until the iterator moves past the micro-batch: the slot is released then and the sidecar reuses it.

Several passes over each mini-batch (PPO's ``ppo_epochs``): ``client.mini_batches(passes=n)``, then iterate
``mini`` n times; every pass yields the same micro-batches in the same order, and nothing is read from the store
again. The client keeps them: on CPU the prefetch thread copies each out of its slot (whose release then lets
the sidecar go on), on CUDA the staged GPU copy is kept (the mini-batch's part of this rank stays in GPU memory
until its last pass); the last micro-batch's slot is held until the last pass instead. The optimizer step is
reported after the last pass, and a TP rank's restart during any pass raises ``MiniBatchRestarted``: the
mini-batch comes again from pass 0. ::

    for mini in client.mini_batches(passes=ppo_epochs):
        try:
            for epoch in range(ppo_epochs):
                for micro in mini:
                    ...backward()
                optimizer.step()
        except MiniBatchRestarted:
            optimizer.zero_grad()
            continue

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

The mini-batch is the unit of delivery (DESIGN.md §9). A rank whose process restarts gets the mini-batch it
was in again from micro-batch 0, never the rest of it; its consumer's other TP ranks, if still running, get
:class:`~knittrans.errors.MiniBatchRestarted` from the micro-batch iterator of that mini-batch and then the
mini-batch again, whole (docs/failures.md). A restarted mini-batch is not reported done. ``mini.step`` (a
:class:`~knittrans.steps.StepId`) names the step for checkpoints; a process restored from a checkpoint passes
its step (``TrainerClient(settings, restored_step=step)``) and gets the mini-batches after it again, when the
admission service retains them (``retain_until_checkpoint``; global rank 0 reports checkpoints with
``AdmissionClient.report_checkpoint``). A job that restarts before its first checkpoint passes
``restored_step=BEFORE_FIRST_STEP``: else the mini-batches its earlier processes took but never checkpointed
(say, one whose failure a rank took just before it died) would not come again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc

from knittrans.attach import AttachResult, FieldAttacher
from knittrans.client.admission import AdmissionClient
from knittrans.client.connection import ConnectionSettings, error_from_rpc, open_channel
from knittrans.errors import DeadlineExceeded, FailedPrecondition, InvalidArgument, MiniBatchRestarted, Unavailable
from knittrans.plan.proto import assignment_from_proto, plan_from_proto
from knittrans.retry import retry_call
from knittrans.steps import RestorePoint, StepId
from knittrans.store.factory import open_store
from knittrans.trainer.batches import MicroBatch, MiniBatch, MiniBatchContext, MiniBatchFeed, Staged
from knittrans.trainer.prefetch import SIDECAR_RETRY, Prefetcher
from knittrans.trainer.progress import AdmissionProgressReporter, ProgressReporter
from knittrans.trainer.settings import DeliveryMode, TrainerSettings, TrainerStats
from knittrans.types import BACKBONE_ROLE, ConsumerId, Coverage, FieldAlignment
from knittrans.v1 import reorg_service_pb2 as pb
from knittrans.v1 import reorg_service_pb2_grpc

# The client's public names, wherever they are defined (this module is the documented import path).
__all__ = [
    "DeliveryMode",
    "MicroBatch",
    "MiniBatch",
    "MiniBatchContext",
    "MiniBatchFeed",
    "TrainerClient",
    "TrainerSettings",
    "TrainerStats",
]

logger = logging.getLogger(__name__)


class TrainerClient:
    """A training rank's client of its reorg sidecar (see the module docstring)."""

    def __init__(self, settings: TrainerSettings, *, progress: ProgressReporter | None = None,
                 restored_step: StepId | RestorePoint | None = None) -> None:
        """``restored_step``: this process restored a checkpoint holding every step up to this one (its
        ``mini.step``); the sidecar delivers the mini-batches after it again, the same ones in the same order.
        ``BEFORE_FIRST_STEP``: the job restarted without a checkpoint; it gets every mini-batch again from the
        job's first. Leave it None on a job's first start, and when a process restarts alone (its other TP ranks
        running on: the mini-batch it was in comes again by itself)."""
        if restored_step is not None and not isinstance(restored_step, StepId | RestorePoint):
            raise InvalidArgument("must be a StepId (the checkpoint's last mini.step) or BEFORE_FIRST_STEP",
                                  field="restored_step")
        self._restored_step = restored_step
        self._settings = settings
        self._channel = open_channel(ConnectionSettings(target=settings.target))
        self._stub = reorg_service_pb2_grpc.ReorgServiceStub(self._channel)
        if progress is None and settings.admission is not None and settings.report_progress:
            progress = AdmissionProgressReporter(settings.admission)
        self._progress = progress if settings.report_progress else None
        self._eager = settings.mode is DeliveryMode.EAGER
        self._prefetcher: Prefetcher | None = None
        self._feed: MiniBatchFeed | None = None
        self._stager: Any = None
        self._iterating = False
        self._field_attacher: FieldAttacher | None = None
        self.stats = TrainerStats()
        self.start()

    # ---- public --------------------------------------------------------------------------------------------

    @property
    def settings(self) -> TrainerSettings:
        return self._settings

    def start(self) -> None:
        """Start prefetching (the constructor does; idempotent)."""
        if self._prefetcher is not None:
            return
        from knittrans.trainer.staging import Stager  # imports torch

        self._stager = Stager(self._settings.device, materialise=self._eager, prefetch=self._settings.prefetch)
        self._prefetcher = prefetcher = Prefetcher(self._settings, self._stub, self._stager, self.stats,
                                                   interrupt=self._channel.close, restored_step=self._restored_step)
        self._feed = MiniBatchFeed(
            take_next_of=prefetcher.take_next_of, ready_for_use=self._ready_for_use, release=prefetcher.let_go,
            complete=self._complete, context=self.minibatch_context, own=prefetcher.own,
            restarted_since=prefetcher.restarted_since,
        )

    def mini_batches(self, *, passes: int = 1) -> Iterator[MiniBatch]:
        """Mini-batches in order until the sidecar's assignment source ends (never, for a live job).

        ``passes``: how many times the loop iterates each mini-batch (PPO's ``ppo_epochs``): ``for micro in
        mini`` that many times yields the same micro-batches in the same order, read from the store once. The
        mini-batch's optimizer step is reported after its last pass (see :class:`MiniBatch`)."""
        if not isinstance(passes, int) or isinstance(passes, bool) or passes < 1:
            raise InvalidArgument(f"must be a positive integer, got {passes!r}", field="passes")
        if self._iterating:
            raise FailedPrecondition("mini_batches() is already being iterated")
        self._iterating = True
        prefetcher, feed = self._prefetcher, self._feed
        assert prefetcher is not None and feed is not None  # the constructor started them
        if passes > 1:
            self._stager.copy_for_passes = True
            prefetcher.watch_rounds = True
        while True:
            first = prefetcher.take()
            if first is None:
                return
            rest = None
            if self._eager:
                rest = []
                last = first
                try:
                    while not last.descriptor.last_in_minibatch:
                        last = prefetcher.take_next_of(first.descriptor.sequence)
                        first.waited += last.waited
                        last.waited = 0.0
                        rest.append(last)
                except MiniBatchRestarted:  # nothing of it was yielded: take it again from its start
                    continue
            mini = MiniBatch(feed, first, rest, passes=passes)
            del first  # the mini-batch holds micro-batch 0 only until its pass 0 takes it: so must this frame
            yield mini
            mini.drain()
            if mini.restarted:
                continue
            self._complete(mini)
            prefetcher.completed_through = max(prefetcher.completed_through, mini.sequence)
            self.stats.mini_batches += 1

    def attach(
        self, batch: MiniBatch | MicroBatch, values: Mapping[str, Mapping[str, Any] | Sequence[Any]], *,
        coverage: Mapping[str, Coverage | str] | None = None,
        alignment: Mapping[str, FieldAlignment | str] | None = None,
    ) -> AttachResult | None:
        """Attach fields this trainer role computed to the trajectories of ``batch`` (docs/roles.md): ``values``
        maps each field to ``{trajectory id: per-trajectory tensor}``, or, for a micro-batch, to a list of
        tensors aligned with ``micro.trajectory_ids``. Each tensor's leading axis covers the trajectory's tokens
        (``coverage`` ``response``: only its response's), as the job's schema declares the field. The values are
        written to the store (``settings.store``) and reported to the admission service (``settings.admission``).
        TP rank 0 attaches; the others' calls return None (they would change nothing)."""
        descriptor = batch.descriptor
        role = ConsumerId(role=descriptor.role, dp_rank=0).role_name
        if role is None:
            raise FailedPrecondition(f"only a trainer role attaches fields; this rank is {descriptor.role!r}",
                                     field="role")
        if descriptor.cp > 1:
            raise FailedPrecondition("a role that attaches fields must have cp 1 for now (each rank then holds "
                                     "whole sequences)", field="cp")
        if self._settings.tp_rank != 0:
            return None
        by_trajectory = {name: per_trajectory(batch, name, value) for name, value in values.items()}
        return self._attacher(role).attach(descriptor.sequence, by_trajectory, coverage=coverage, alignment=alignment)

    def _attacher(self, role: str) -> FieldAttacher:
        if self._field_attacher is None:
            settings = self._settings
            if not settings.store or settings.admission is None:
                raise FailedPrecondition("attaching needs the unit store (store) and the admission service "
                                         "(admission) in the trainer's settings", field="store")
            self._field_attacher = FieldAttacher(role=role, store=open_store(settings.store),
                                                 reporter=AdmissionClient(settings.admission),
                                                 namespace=settings.namespace)
        return self._field_attacher

    def status(self, *, timeout: float = 5.0) -> pb.GetReorgStatusResponse:
        request = pb.GetReorgStatusRequest()
        response: pb.GetReorgStatusResponse = self._call(self._stub.GetReorgStatus, request, timeout)
        return response

    def minibatch_context(self, sequence: int, *, timeout: float = 10.0) -> MiniBatchContext:
        """The mini-batch's context from the sidecar; retried like the micro-batch stream while the sidecar (or
        the admission service it asks for the admitted trajectory ids) is restarting, for sidecar_timeout_seconds."""
        request = pb.GetMiniBatchRequest(sequence=sequence)
        response = retry_call(
            lambda: self._call(self._stub.GetMiniBatch, request, timeout),
            policy=replace(SIDECAR_RETRY, deadline=self._settings.sidecar_timeout_seconds),
            retryable=lambda error: isinstance(error, (Unavailable, DeadlineExceeded)),
        )
        return MiniBatchContext(
            sequence=response.sequence,
            global_loss_tokens=response.global_loss_tokens,
            assignment=assignment_from_proto(response.assignment),
            plan=plan_from_proto(response.plan) if response.HasField("plan") else None,
            admitted_trajectory_ids=tuple(response.admission.trajectory_ids),
        )

    def ready_on_this_thread(self, micro: MicroBatch) -> None:
        """Make this thread's current CUDA stream wait for the micro-batch's staged copy (a no-op on CPU). The
        iterator does it on the thread that iterates; code that uses the tensors on another thread (the asyncio
        client, :class:`~knittrans.aio.AsyncTrainerClient`) calls this there."""
        self._ready_for_use(micro.staged)

    @classmethod
    def from_env(cls, global_rank: int, *, role: str = "backbone", connection_file: str | Path | None = None,
                 wait_seconds: float = 60.0, restored_step: StepId | RestorePoint | None = None,
                 **settings: Any) -> TrainerClient:
        """The client of global trainer rank ``global_rank`` of the stack ``knittrans up`` runs: its sidecar and
        TP rank come from the connection file (:mod:`knittrans.connect`); ``restored_step`` as for the
        constructor; ``settings`` are further :class:`TrainerSettings` fields."""
        from knittrans.connect import trainer_client

        return trainer_client(global_rank, connection_file, role=role, wait_seconds=wait_seconds,
                              restored_step=restored_step, **settings)

    @property
    def restored_step(self) -> StepId | RestorePoint | None:
        """What this client was started with (see the constructor)."""
        return self._restored_step

    def close(self) -> None:
        if self._prefetcher is not None:
            self._prefetcher.stop()
        self._channel.close()
        if self._progress is not None:
            self._progress.close()
        if self._field_attacher is not None:
            self._field_attacher.close()
        if self._stager is not None:
            self._stager.close()

    def __enter__(self) -> TrainerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- helpers -----------------------------------------------------------------------------------------

    def _call(self, rpc: Callable[..., Any], request: Any, timeout: float) -> Any:
        try:
            return rpc(request, timeout=timeout)
        except grpc.RpcError as error:
            raise error_from_rpc(error) from None

    def _ready_for_use(self, staged: Staged) -> None:
        self._stager.ready(staged.tensors, staged.event)

    def _complete(self, mini: MiniBatch) -> None:
        if mini.completed or mini.restarted:
            return
        mini.completed = True
        if self._progress is None:
            return
        if self._settings.tp_rank == 0:
            self._progress.optimizer_step(mini.consumer, mini.sequence)
        if self._settings.advances_version and mini.last_of_train_batch and mini.consumer.role == BACKBONE_ROLE:
            version = self._progress.advance_version(mini.train_batch_index, mini.train_version + 1)
            logger.info("train batch %d done; policy version is now %d", mini.train_batch_index, version)


def per_trajectory(batch: MiniBatch | MicroBatch, name: str, value: Mapping[str, Any] | Sequence[Any]
                   ) -> Mapping[str, Any]:
    """A field's values by trajectory id: as given, or a micro-batch's list aligned with its trajectory ids."""
    if isinstance(value, Mapping):
        return value
    if not isinstance(batch, MicroBatch):
        raise InvalidArgument("a mini-batch's values map trajectory ids to tensors", field=f"values.{name}")
    ids = batch.trajectory_ids
    if len(value) != len(ids):
        raise InvalidArgument(f"has {len(value)} values for the micro-batch's {len(ids)} trajectories",
                              field=f"values.{name}")
    return dict(zip(ids, value, strict=True))
