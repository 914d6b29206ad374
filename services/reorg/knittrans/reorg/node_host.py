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
import logging
from dataclasses import replace
from pathlib import Path

from knittrans.client.aio import AsyncAdmissionClient
from knittrans.reorg.assignments import AdmissionAssignmentSource, WatchSettings
from knittrans.reorg.endpoint import RunningReorg, serve_until_stopped, start_reorg
from knittrans.reorg.node_feed import NodeAssignmentFeed
from knittrans.reorg.settings import ReorgSettings
from knittrans.serving.server import write_ready_file
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
        await asyncio.gather(*(r.stop(grace=settings.server.grace_seconds) for r in running),
                             return_exceptions=True)
        await feed.close()
        raise
    if ready_file is not None:
        write_ready_file(ready_file, {"sidecars": [{"consumer": str(r.sidecar.consumer), **r.announcement}
                                                   for r in running]})
    logger.info("hosting %d consumers over one assignment stream: %s", len(running),
                ", ".join(str(r.sidecar.consumer) for r in running))
    try:
        return await serve_until_stopped(running, stop, settings.server.grace_seconds)
    finally:
        await feed.close()
