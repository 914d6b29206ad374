"""Several consumers' sources over one node stream (``NodeAssignmentFeed``) against the real admission service,
journaled in a real Redis: each consumer gets its assignments in order with no gap and no repeat, across a
service restart; one consumer going back to an earlier sequence (a trainer restored a checkpoint) gets them again
from there, while the other goes on without a repeat."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from knittrans.admission.service.app import start_admission_service
from knittrans.client.admission import AdmissionClient
from knittrans.client.aio import AsyncAdmissionClient
from knittrans.client.connection import ConnectionSettings
from knittrans.errors import InvalidArgument
from knittrans.reorg.assignments import AdmissionAssignmentSource, WatchSettings
from knittrans.reorg.node_feed import NodeAssignmentFeed
from knittrans.types import ConsumerId

from .test_reorg_assignment_stream import journaled_service, meta

FIRST, SECOND = ConsumerId(role="backbone", dp_rank=0, cp_rank=0), ConsumerId(role="backbone", dp_rank=0, cp_rank=1)


async def take(events, count: int) -> list[int]:
    return [(await asyncio.wait_for(anext(events), 20)).sequence for _ in range(count)]


async def test_consumers_sharing_a_node_stream_resume_and_rewind_on_their_own(redis_server) -> None:
    settings, address = journaled_service(redis_server.url, "n")
    connection = ConnectionSettings(target=address)

    def report(indices: range) -> None:
        with AdmissionClient(address) as client:
            client.report([meta(i) for i in indices])

    watch = WatchSettings(initial_backoff=timedelta(milliseconds=20), max_backoff=timedelta(milliseconds=200))
    service = await start_admission_service(settings)
    feed = NodeAssignmentFeed(AsyncAdmissionClient(connection), [FIRST, SECOND], watch.retry)
    first = AdmissionAssignmentSource(connection, FIRST, watch, feed=feed)
    second = AdmissionAssignmentSource(connection, SECOND, watch, feed=feed)
    try:
        for source in (first, second):
            assert (await source.register()).acknowledged_sequence == 0
        first_events, second_events = first.__aiter__(), second.__aiter__()
        await asyncio.to_thread(report, range(4))  # two mini-batches of two
        assert await take(first_events, 2) == [1, 2]
        assert await take(second_events, 2) == [1, 2]
        await first.acknowledge(1)

        await service.stop(0)  # the node stream breaks; the feed keeps reconnecting
        service = await start_admission_service(settings)  # recovers from the Redis journal
        await asyncio.to_thread(report, range(4, 8))
        assert await take(first_events, 2) == [3, 4]
        assert await take(second_events, 2) == [3, 4]

        # The first consumer goes back to after 1 (as the sidecar does for a restored checkpoint).
        await first_events.aclose()
        first.restart_after(1)
        first_events = first.__aiter__()
        assert await take(first_events, 3) == [2, 3, 4]
        await asyncio.to_thread(report, range(8, 10))
        assert await take(second_events, 1) == [5]  # no repeat of 2..4 for the other one
        assert await take(first_events, 1) == [5]
        await first_events.aclose()
        await second_events.aclose()
    finally:
        await first.close()
        await second.close()
        await feed.close()
        await service.stop(0)


async def test_a_node_stream_the_service_refuses_fails_every_hosted_consumer_naming_the_field(redis_server) -> None:
    """A refusal is not retried: each hosted consumer's reader raises it (its sidecar's pipeline then fails, and
    the process exits for its supervisor to restart), here for a consumer the topology does not plan."""
    settings, address = journaled_service(redis_server.url, "r")
    watch = WatchSettings(initial_backoff=timedelta(milliseconds=20), max_backoff=timedelta(milliseconds=200))
    unplanned = ConsumerId(role="backbone", dp_rank=0, cp_rank=5)
    service = await start_admission_service(settings)
    feed = NodeAssignmentFeed(AsyncAdmissionClient(ConnectionSettings(target=address)), [FIRST, unplanned],
                              watch.retry)
    try:
        feed.registered(FIRST, 0)
        feed.registered(unplanned, 0)
        for consumer in (FIRST, unplanned):
            with pytest.raises(InvalidArgument) as raised:
                await asyncio.wait_for(anext(feed.messages(consumer, 0)), 20)
            assert raised.value.field == "consumers[1].cp_rank", raised.value
    finally:
        await feed.close()
        await service.stop(0)
