"""One assignment stream for all the consumers a sidecar process hosts (``WatchNodeAssignments``).

A node's sidecars each held a stream of their own, and the admission service wrote each mini-batch's message once
per consumer: 320 writes for dp 64 × cp 4 and 64 encoder ranks, though the CP ranks of a DP rank get the same
bytes. A process that hosts several consumers (``knittrans reorg serve --consumers ...``) holds one stream for
all of them instead: the service sends each message once with the consumers it is for, and the feed hands it to
each of them. Each consumer's :class:`~knittrans.reorg.assignments.AdmissionAssignmentSource` reads its own
messages from the feed and checks them exactly as it checks its own stream's (in order, no gap, no repeat).

The stream starts once every hosted consumer has registered, after the lowest sequence any of them has received,
and resumes from there after a reconnect; a consumer that goes back (a trainer restored a checkpoint,
``restart_after``) makes the feed start over from its sequence, and the others skip what they already had.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Sequence

from knittrans.client.aio import AsyncAdmissionClient
from knittrans.errors import InvalidArgument, KnitTransError, Unavailable
from knittrans.reorg.reconnect import reconnecting
from knittrans.retry import RetryPolicy
from knittrans.types import ConsumerId
from knittrans.v1 import admission_service_pb2

logger = logging.getLogger(__name__)

Received = tuple[admission_service_pb2.WatchAssignmentsResponse, float]  # a message and when it arrived


class _Member:
    def __init__(self) -> None:
        self.position: int | None = None  # the last sequence it received; None until it registered
        self.queue: asyncio.Queue[Received | BaseException] = asyncio.Queue()


class NodeAssignmentFeed:
    """The node stream of ``consumers`` (each once), read through :meth:`messages` by each consumer's source."""

    def __init__(self, client: AsyncAdmissionClient, consumers: Sequence[ConsumerId], retry: RetryPolicy) -> None:
        if not consumers:
            raise InvalidArgument("names no consumer", field="consumers")
        if len(set(consumers)) != len(consumers):
            raise InvalidArgument("names a consumer twice", field="consumers")
        self.client = client
        self._consumers = tuple(consumers)
        self._members = {consumer: _Member() for consumer in consumers}
        self._retry = retry
        self._registered = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._streamed = 0  # the last sequence the stream passed on to every member

    def registered(self, consumer: ConsumerId, acknowledged: int) -> None:
        """``consumer`` registered; its stream starts after ``acknowledged``."""
        self._member(consumer).position = acknowledged
        if all(member.position is not None for member in self._members.values()):
            self._registered.set()

    async def messages(self, consumer: ConsumerId, after: int) -> AsyncIterator[Received]:
        """``consumer``'s messages with sequence above ``after``, in order (repeats possible after a restart of
        the stream: the reader skips what it had)."""
        member = self._member(consumer)
        while not member.queue.empty():  # what was queued for a reader that went away (a restart)
            member.queue.get_nowait()
        member.position = after
        if self._task is None or self._task.done() or after < self._streamed:
            self._start_over()  # first, after a failure, or this consumer went back: from the lowest position
        while True:
            item = await member.queue.get()
            if isinstance(item, BaseException):
                raise item
            yield item
            member.position = max(member.position or 0, item[0].sequence)

    def _member(self, consumer: ConsumerId) -> _Member:
        member = self._members.get(consumer)
        if member is None:
            raise InvalidArgument(f"{consumer} is not one of this feed's consumers", field="consumer")
        return member

    def _start_over(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self._task = asyncio.create_task(self._run(), name="node-assignments")

    async def _run(self) -> None:
        await self._registered.wait()
        try:
            responses = reconnecting(self._open, self._retry, "node assignment stream", lambda: self._streamed)
            async for response in responses:
                self._pass_on(response, time.time())
        except asyncio.CancelledError:
            raise
        except BaseException as error:  # every member's reader raises it, as its own stream's would
            failure = error if isinstance(error, KnitTransError) else Unavailable(f"node assignment stream: {error}")
            for member in self._members.values():
                member.queue.put_nowait(failure)

    def _open(self) -> AsyncGenerator[admission_service_pb2.WatchNodeAssignmentsResponse, None]:
        """The stream from the lowest position any consumer got to (the others skip what they had)."""
        after = min(member.position or 0 for member in self._members.values())
        self._streamed = after
        return self.client.watch_node_assignment_messages(self._consumers, after_sequence=after)

    def _pass_on(self, response: admission_service_pb2.WatchNodeAssignmentsResponse, received_at: float) -> None:
        members = [self._members[consumer] for consumer in self._consumers]
        for part in response.assignments:
            message = part.assignment
            for index in part.consumer_indices:
                if index >= len(members):
                    raise InvalidArgument(f"names consumer {index} of {len(members)}",
                                          field="assignments.consumer_indices")
                members[index].queue.put_nowait((message, received_at))
            self._streamed = max(self._streamed, message.sequence)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.client.close()
