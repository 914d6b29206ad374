"""The sidecar's local endpoint: ``knittrans.v1.ReorgService`` on a Unix-domain socket, plus the start-up and
shutdown of a whole sidecar (:func:`start_reorg`)."""

from __future__ import annotations

import asyncio
import logging
import os
import stat
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from grpc import aio
from prometheus_client import CollectorRegistry

from knittrans.errors import InvalidArgument, NotFound
from knittrans.job import FileLease
from knittrans.plan.proto import plan_to_proto
from knittrans.reorg.assignments import AssignmentSource
from knittrans.reorg.metrics import ReorgMetrics
from knittrans.reorg.ring import SharedMemoryRing
from knittrans.reorg.rounds import BEFORE_FIRST_STEP_INDICES
from knittrans.reorg.settings import ReorgSettings
from knittrans.reorg.sidecar import Sidecar, incarnation_tag, new_incarnation
from knittrans.serving.server import RunningServer, start_server
from knittrans.serving.settings import ServerSettings
from knittrans.shm import owner_lease_path
from knittrans.store.protocol import UnitStore
from knittrans.trainer.descriptor import MicroBatchDescriptor
from knittrans.types import ConsumerId, Topology
from knittrans.v1 import reorg_service_pb2 as pb
from knittrans.v1 import reorg_service_pb2_grpc

logger = logging.getLogger(__name__)

DEFAULT_POLL_SECONDS = 30.0
# Answer "nothing yet" this long before the caller's deadline, so a long poll never ends in DEADLINE_EXCEEDED.
DEADLINE_MARGIN_SECONDS = 0.25


class ReorgServicer(reorg_service_pb2_grpc.ReorgServiceServicer):
    def __init__(self, sidecar: Sidecar) -> None:
        self._sidecar = sidecar

    def _check_tp(self, tp_rank: int) -> None:
        if tp_rank >= self._sidecar.tp:
            raise InvalidArgument(f"must be in [0, {self._sidecar.tp})", field="tp_rank")

    @staticmethod
    def _wait_budget(context: aio.ServicerContext) -> float:
        remaining = context.time_remaining()
        if remaining is None:
            return DEFAULT_POLL_SECONDS
        return max(min(remaining - DEADLINE_MARGIN_SECONDS, DEFAULT_POLL_SECONDS), remaining / 2, 0.0)

    async def NextMicroBatch(self, request: pb.NextMicroBatchRequest, context: aio.ServicerContext):
        self._check_tp(request.tp_rank)
        await self._sidecar.trainer_called(request.tp_rank, request.session, _restored(request))
        ring = self._sidecar.ring
        after = self._after(request.after_ticket, request.incarnation)
        descriptor = await ring.next_after(after, request.tp_rank, timeout=self._wait_budget(context))
        where = {"incarnation": self._sidecar.incarnation, "delivery_round": self._sidecar.delivery_round}
        if descriptor is not None:
            return pb.NextMicroBatchResponse(descriptor=descriptor.to_proto(), **where)
        return pb.NextMicroBatchResponse(end_of_stream=ring.finished and ring.peek(after, request.tp_rank) is None,
                                         **where)

    def _after(self, after_ticket: int, incarnation: str) -> int:
        """Tickets of another incarnation mean nothing here: serve such a caller from the start."""
        return after_ticket if incarnation == self._sidecar.incarnation else 0

    async def StreamMicroBatches(
        self, request: pb.StreamMicroBatchesRequest, context: aio.ServicerContext
    ) -> AsyncIterator[pb.StreamMicroBatchesResponse]:
        self._check_tp(request.tp_rank)
        await self._sidecar.trainer_called(request.tp_rank, request.session, _restored(request))
        ring = self._sidecar.ring
        after = self._after(request.after_ticket, request.incarnation)
        while True:
            descriptor = await ring.next_after(after, request.tp_rank, timeout=DEFAULT_POLL_SECONDS)
            if descriptor is not None:
                yield pb.StreamMicroBatchesResponse(descriptor=descriptor.to_proto())
                after = descriptor.ticket
            elif ring.finished and ring.peek(after, request.tp_rank) is None:
                return

    async def ReleaseMicroBatch(self, request: pb.ReleaseMicroBatchRequest, context: aio.ServicerContext):
        self._check_tp(request.tp_rank)
        if request.incarnation and request.incarnation != self._sidecar.incarnation:
            return pb.ReleaseMicroBatchResponse(slot_freed=False)  # a ticket of a previous run of the sidecar
        freed = await self._sidecar.release(request.ticket, request.tp_rank, waited_seconds=request.waited_seconds)
        return pb.ReleaseMicroBatchResponse(slot_freed=freed)

    async def GetMiniBatch(self, request: pb.GetMiniBatchRequest, context: aio.ServicerContext):
        event = self._sidecar.context(request.sequence)
        if event is None:
            raise NotFound(f"mini-batch {request.sequence} is not retained by this sidecar", field="sequence")
        admission = event.admission.to_proto()
        if not admission.trajectory_ids:
            admission.trajectory_ids.extend(await self._sidecar.admitted_trajectory_ids(event.sequence))
        response = pb.GetMiniBatchResponse(
            sequence=event.sequence,
            admission=admission,
            global_loss_tokens=event.global_loss_tokens,
            assignment=event.assignment_proto(),
        )
        if event.plan is not None:
            response.plan.CopyFrom(plan_to_proto(event.plan))
        return response

    async def GetReorgStatus(self, request: pb.GetReorgStatusRequest, context: aio.ServicerContext):
        sidecar = self._sidecar
        counters = sidecar.counters
        return pb.GetReorgStatusResponse(
            role=sidecar.consumer.role,
            dp_rank=sidecar.consumer.dp_rank,
            cp_rank=sidecar.consumer.cp_rank,
            tp=sidecar.tp,
            slots=sidecar.ring.slots,
            slots_occupied=sidecar.ring.occupied,
            published=counters.published,
            bytes_read=counters.bytes_read,
            bytes_needed=counters.bytes_needed,
            job=sidecar.job,
            incarnation=sidecar.incarnation,
            read_calls=counters.read_calls,
            acknowledged_sequence=counters.acknowledged_sequence,
            drained=sidecar.ring.drained,
            delivery_round=sidecar.delivery_round,
        )


def _restored(request: pb.NextMicroBatchRequest | pb.StreamMicroBatchesRequest) -> tuple[int, int] | None:
    if not request.HasField("restored_step"):
        return None
    step = request.restored_step
    if step.before_first_step:
        if step.train_batch_index or step.minibatch_index:
            raise InvalidArgument("a state before the first step holds no train batch or mini-batch; leave both 0",
                                  field="restored_step.before_first_step")
        return BEFORE_FIRST_STEP_INDICES
    return (step.train_batch_index, step.minibatch_index)


# --------------------------------------------------------------------------------------------------------------


def _prepare_socket(path: str) -> None:
    """A private directory for the socket (only this user may connect), and no stale socket from a crash."""
    socket = Path(path)
    socket.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(socket.parent, 0o700)
    try:
        if stat.S_ISSOCK(socket.lstat().st_mode):
            socket.unlink()
    except FileNotFoundError:
        pass


@dataclass
class RunningReorg:
    """A started sidecar: its pipeline task and its endpoint."""

    sidecar: Sidecar
    server: RunningServer
    socket_path: str
    pipeline: asyncio.Task
    _store: UnitStore
    _source: AssignmentSource
    _close_store: bool
    _lease: FileLease

    @property
    def address(self) -> str:
        return f"unix:{self.socket_path}"

    @property
    def announcement(self) -> dict[str, object]:
        """What its ready file says: where trainers dial it, its metrics, its incarnation."""
        return {"address": self.address, "metrics_port": self.server.metrics_port,
                "metrics_url": self.server.metrics_url, "incarnation": self.sidecar.incarnation}

    async def stop(self, grace: float = 1.0) -> None:
        """Stop the pipeline and the endpoint, unlink every segment and the socket."""
        self.pipeline.cancel()
        try:
            await self.pipeline
        except BaseException as exc:
            if not isinstance(exc, asyncio.CancelledError):
                logger.info("pipeline ended with %r", exc)
        await self.server.stop(grace)
        if await self.sidecar.stop_reading(timeout=grace):
            await self.sidecar.ring.close()
            await self.sidecar.close()
            await self._source.close()
            if self._close_store:
                self._store.close()
        else:
            # Only the names go: the memory stays mapped, and registered, for the store call still writing into
            # it, until this process exits. The call itself may wait out the store's own time-out.
            logger.warning("a store call is still in flight %.1fs after the stop; leaving it to this process's exit",
                           grace)
            await self.sidecar.ring.close(unregister=False)
            await self._source.close()
        try:
            os.unlink(self.socket_path)
        except FileNotFoundError:
            pass
        self._lease.release()
        try:
            os.rmdir(os.path.dirname(self.socket_path))  # only if no other sidecar's socket is in it
        except OSError:
            pass


async def start_reorg(
    settings: ReorgSettings,
    *,
    source: AssignmentSource,
    store: UnitStore,
    registry: CollectorRegistry | None = None,
    close_store: bool = True,
) -> RunningReorg:
    """Register with the source, clean up after a crashed predecessor, and start the pipeline and endpoint."""
    registry = registry or CollectorRegistry()
    consumer = settings.consumer
    # Before anything of the owner's is touched: the ring removes a predecessor's segments and the socket is
    # replaced, which is right only once the lock proves that predecessor gone (a live one refuses this claim).
    # Before registering too, where the job is known: a refused sidecar never speaks for the holder's consumer.
    lease = _claim(settings) if settings.job else None
    try:
        registration = await source.register()
    except BaseException:
        if lease is not None:
            lease.release()
        raise
    job = registration.job or settings.job
    if not settings.job:  # the segments and the default socket are named after the admission service's job
        settings = replace(settings, job=job or "default")
        lease = _claim(settings)
    metrics = ReorgMetrics(registry, role=consumer.role)
    incarnation = new_incarnation()
    try:
        ring: SharedMemoryRing[MicroBatchDescriptor] = SharedMemoryRing(
            slots=settings.ring.slots,
            tp=_tp_of(registration.topology, consumer),
            prefix=settings.segment_prefix,
            tag=incarnation_tag(incarnation),
            initial_slot_bytes=settings.ring.initial_slot_bytes,
            on_segment_created=store.register_buffer,
            on_segment_removed=store.unregister_buffer,
            on_change=lambda: metrics.slots_occupied.set(ring.occupied),
        )
    except BaseException:
        lease.release()
        raise
    sidecar = Sidecar(
        consumer=consumer, registration=registration, source=source, store=store, ring=ring,
        pack=settings.packing, metrics=metrics, incarnation=incarnation,
        retained_minibatches=settings.retained_minibatches, read_retry_seconds=settings.read_retry_seconds,
    )
    if job != settings.job:
        logger.warning("the admission service names job %r, the config %r; segments use the config's", job,
                       settings.job)
    socket_path = settings.socket_path
    _prepare_socket(socket_path)
    server_settings = _with_socket(settings, socket_path)
    servicer = ReorgServicer(sidecar)

    def add_services(server: aio.Server) -> list[str]:
        reorg_service_pb2_grpc.add_ReorgServiceServicer_to_server(servicer, server)
        return [pb.DESCRIPTOR.services_by_name["ReorgService"].full_name]

    try:
        server = await start_server(server_settings, add_services=add_services, registry=registry)
    except BaseException:
        await ring.close()
        lease.release()
        raise
    os.chmod(socket_path, 0o600)
    pipeline = asyncio.create_task(_run_logged(sidecar), name=f"reorg-{consumer}")
    logger.info("reorg sidecar %s serving %s (tp=%d, %d slots, incarnation %s)", consumer, server.address,
                sidecar.tp, ring.slots, sidecar.incarnation)
    return RunningReorg(sidecar=sidecar, server=server, socket_path=socket_path, pipeline=pipeline, _store=store,
                        _source=source, _close_store=close_store, _lease=lease)


async def serve_until_stopped(running: Sequence[RunningReorg], stop: asyncio.Event, grace: float) -> int:
    """Serve until ``stop`` is set or a pipeline fails, then stop every sidecar; 1 if a pipeline failed (a
    supervisor restarts the process, and each consumer resumes from its acknowledged sequence), else 0."""
    stopping = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({stopping, *(r.pipeline for r in running)}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
        failed = [r for r in running if r.pipeline.done() and not r.pipeline.cancelled() and r.pipeline.exception()]
        await asyncio.gather(*(r.stop(grace=grace) for r in running), return_exceptions=True)
    for r in failed:
        logger.error("the sidecar of %s stopped because its pipeline failed: %s", r.sidecar.consumer,
                     r.pipeline.exception())
    return 1 if failed else 0


def _claim(settings: ReorgSettings) -> FileLease:
    return FileLease.claim(owner_lease_path(settings.job, settings.owner_name),
                           what=f"sidecar {settings.consumer} of job {settings.job!r}")


async def _run_logged(sidecar: Sidecar) -> None:
    try:
        await sidecar.run()
    except asyncio.CancelledError:
        raise
    except BaseException:
        logger.exception("the %s pipeline failed", sidecar.consumer)
        raise


def _tp_of(topology: Topology, consumer: ConsumerId) -> int:
    name = consumer.encoder_name
    return topology.encoder(name).tp if name else topology.backbone.tp


def _with_socket(settings: ReorgSettings, socket_path: str) -> ServerSettings:
    return replace(settings.server, unix_socket=socket_path)
