"""Wiring of one admission service process: ledger, journal, store, servicer and gRPC server."""

from __future__ import annotations

import asyncio
import gc
import logging
from dataclasses import dataclass
from functools import partial

from prometheus_client import CollectorRegistry

from knittrans.admission.service.job_lease import HeldJob, claim_job
from knittrans.admission.service.journal import Journal, open_journal
from knittrans.admission.service.ledger import AdmissionLedger, LedgerSettings
from knittrans.admission.service.metrics import AdmissionMetrics
from knittrans.admission.service.servicer import AdmissionServicer
from knittrans.admission.service.settings import AdmissionServiceSettings
from knittrans.serving.heap import freeze_startup_heap
from knittrans.serving.server import RunningServer, start_server
from knittrans.store.factory import open_store
from knittrans.store.protocol import UnitStore
from knittrans.v1 import admission_service_pb2, admission_service_pb2_grpc

logger = logging.getLogger(__name__)

SERVICE_NAME = admission_service_pb2.DESCRIPTOR.services_by_name["AdmissionService"].full_name

# Collector thresholds for a service process (see tune_garbage_collector).
GC_THRESHOLDS = (100_000, 20, 100)


@dataclass
class AdmissionService:
    settings: AdmissionServiceSettings
    servicer: AdmissionServicer
    server: RunningServer
    journal: Journal
    store: UnitStore | None
    held_job: HeldJob

    @property
    def address(self) -> str:
        return self.server.address

    async def stop(self, grace: float | None = None) -> None:
        await self.servicer.close()
        await self.server.stop(self.settings.server.grace_seconds if grace is None else grace)
        await self.journal.close()
        if self.store is not None:
            await asyncio.to_thread(self.store.close)
        await self.held_job.release()


def tune_garbage_collector() -> None:
    """Fit Python's cyclic garbage collector to a long-running service process; call it once, after start-up.

    The ledger keeps a few containers per reported trajectory and an ingest batch allocates tens of thousands of
    objects, so with the default thresholds (a young collection every 700 allocations) collections ran dozens of
    times per report and full collections traversed the whole ledger: about a sixth of ingest time, and pauses of
    tens of milliseconds on the report-to-assignment path. Freezing the start-up heap takes it out of every
    collection; the young generation is collected at the end of each report call
    (gc_pacing.collect_young_objects), and the thresholds here are only a backstop, so the whole heap is
    collected rarely. The ledger holds no reference cycles, so reference counting frees it as before.
    """
    freeze_startup_heap()
    gc.set_threshold(*GC_THRESHOLDS)


def delete_and_wait(store: UnitStore, keys: list[str]) -> None:
    """Delete released units and return once they are gone for every client (see ``UnitStore.wait_removed``)."""
    store.delete_many(keys)
    store.wait_removed(keys)


async def start_admission_service(settings: AdmissionServiceSettings) -> AdmissionService:
    # First: the journal and the store are the job's, and only the job's holder may change them.
    held_job = await claim_job(settings.state, job=settings.job, ttl_seconds=settings.lease_ttl_seconds,
                               timeout_seconds=settings.redis_timeout_seconds)
    held_job.start()  # renewed from now on: recovering a long journal may take longer than the lease's expiry
    try:
        return await _start_holding(settings, held_job)
    except BaseException:
        await held_job.release()
        raise


async def _start_holding(settings: AdmissionServiceSettings, held_job: HeldJob) -> AdmissionService:
    registry = CollectorRegistry()
    ledger = AdmissionLedger(
        LedgerSettings(
            engine=settings.engine,
            topology=settings.topology,
            label_fields=settings.label_fields,
            initial_version=settings.initial_version,
            max_report_batch=settings.max_report_batch,
            schema=settings.schema,
            retention=settings.retention,
        )
    )
    metrics = AdmissionMetrics(registry, settings.engine.sources)
    if settings.engine.staleness_bound is not None:
        metrics.staleness_bound.set(settings.engine.staleness_bound)
    journal = open_journal(settings.state, job=settings.job, timeout_seconds=settings.redis_timeout_seconds)
    store = open_store(settings.store, job=settings.job) if settings.store else None
    servicer = AdmissionServicer(
        ledger=ledger,
        journal=journal,
        metrics=metrics,
        job=settings.job,
        delete_keys=partial(delete_and_wait, store) if store is not None else None,
        delete_batch_size=settings.delete_batch_size,
        mutation_wait_seconds=settings.mutation_wait_seconds,
        snapshot_every=settings.snapshot_every_records,
        unreported_unit_ttl_seconds=settings.unreported_unit_ttl_seconds,
        unfinished_step_warning_seconds=settings.unfinished_step_warning_seconds,
    )
    await servicer.recover()

    def add_services(server) -> list[str]:
        admission_service_pb2_grpc.add_AdmissionServiceServicer_to_server(servicer, server)
        return [SERVICE_NAME]

    server = await start_server(settings.server, add_services=add_services, registry=registry)
    servicer.start_background()
    return AdmissionService(settings=settings, servicer=servicer, server=server, journal=journal, store=store,
                            held_job=held_job)
