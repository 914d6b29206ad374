"""One sidecar process for several consumers (``knittrans reorg serve --consumers ...``): a node's sidecars.

Each hosted consumer is a full sidecar of its own (its ring, its Unix socket, its pipeline, its lease, its
unit-store client: the bytes a sidecar reports it moved are its store client's, and a shared client would count
every hosted consumer's reads in each), as if it ran alone, but they share one admission client, and their
assignments come over one node stream (:mod:`knittrans.reorg.node_feed`). The process stops when it is
signalled or when any of its pipelines fails (a supervisor restarts it, and every consumer resumes from its
acknowledged sequence).
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import replace
from pathlib import Path

from knittrans.client.aio import AsyncAdmissionClient
from knittrans.reorg.assignments import AdmissionAssignmentSource, WatchSettings
from knittrans.reorg.endpoint import RunningReorg, start_reorg
from knittrans.reorg.node_feed import NodeAssignmentFeed
from knittrans.reorg.settings import ReorgSettings
from knittrans.store.factory import open_store
from knittrans.types import ConsumerId

logger = logging.getLogger(__name__)


def hosted_settings(settings: ReorgSettings, consumer: ConsumerId, first: bool) -> ReorgSettings:
    """A hosted consumer's own settings: the first keeps the configured metrics and health ports, the others
    take free metrics ports and serve no health port (one process, one probe)."""
    own = settings.for_consumer(consumer)
    if first:
        return own
    server = own.server
    metrics = replace(server.metrics, port=0) if server.metrics.port > 0 else server.metrics
    return replace(own, server=replace(server, metrics=metrics, health_port=-1))


async def serve_node(settings: ReorgSettings, stop: asyncio.Event, watch: WatchSettings, *,
                     ready_file: Path | None = None) -> int:
    hosted = settings.hosted_consumers
    connection = settings.admission.connection()
    feed = NodeAssignmentFeed(AsyncAdmissionClient(connection, deadline=watch.deadline, retry=watch.retry), hosted,
                              watch.retry)
    sources = [AdmissionAssignmentSource(connection, consumer, watch, feed=feed) for consumer in hosted]
    running: list[RunningReorg] = []
    try:
        if not settings.job:  # the admission service's job, as a single sidecar learns it
            registration = await sources[0].register()
            settings = replace(settings, job=registration.job or "default")
            logger.info("serving job %r (the admission service's)", settings.job)
        for i, (consumer, source) in enumerate(zip(hosted, sources, strict=True)):
            store = await asyncio.to_thread(open_store, settings.store, job=settings.job)
            try:
                started = await start_reorg(hosted_settings(settings, consumer, i == 0), source=source, store=store)
            except BaseException:
                store.close()
                raise
            running.append(started)
    except BaseException:
        await _stop_all(running, settings.server.grace_seconds)
        await feed.close()
        raise
    if ready_file is not None:
        _write_ready(ready_file, running)
    logger.info("hosting %d consumers over one assignment stream: %s", len(running),
                ", ".join(str(r.sidecar.consumer) for r in running))
    stopping = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({stopping, *(r.pipeline for r in running)}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
        failed = [r for r in running if r.pipeline.done() and not r.pipeline.cancelled() and r.pipeline.exception()]
        await _stop_all(running, settings.server.grace_seconds)
        await feed.close()
    for r in failed:
        logger.error("the sidecar of %s stopped because its pipeline failed: %s", r.sidecar.consumer,
                     r.pipeline.exception())
    return 1 if failed else 0


async def _stop_all(running: list[RunningReorg], grace: float) -> None:
    await asyncio.gather(*(r.stop(grace=grace) for r in running), return_exceptions=True)


def _write_ready(path: Path, running: list[RunningReorg]) -> None:
    ready = {"sidecars": [{"consumer": str(r.sidecar.consumer), "address": r.address,
                           "metrics_port": r.server.metrics_port, "metrics_url": r.server.metrics_url,
                           "incarnation": r.sidecar.incarnation} for r in running]}
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(ready))
    temporary.replace(path)
