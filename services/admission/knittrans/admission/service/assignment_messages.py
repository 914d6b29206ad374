"""The serialised assignment messages of one admitted mini-batch, built once and shared by its streams.

A backbone consumer's message is its DP rank's (``RankAssignment``), the same bytes for every CP rank of it; an
encoder consumer's is its own. For a large mini-batch, the first stream that asks starts one build of every
planned message off the loop, encoders first (backbone consumers wait on their encodings), then DP rank after DP
rank; each message is handed to its streams as soon as it is serialised. A small mini-batch's messages are built
on the loop, each when its first stream asks, so that no stream waits for the others' messages to be built. The
bytes go out as they are (the server boundary passes ``bytes`` through its serializer). Nothing here repeats the
admitted trajectory ids: a stream that asks for them (``include_trajectory_ids``) gets them added to its own copy.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import Executor

from knittrans.admission.service.assignments import MiniBatchDispatch
from knittrans.admission.service.ledger import AdmittedMiniBatch
from knittrans.admission.service.route_wire import framed
from knittrans.types import BACKBONE_ROLE, ConsumerId, Topology
from knittrans.v1 import admission_pb2, plan_pb2
from knittrans.v1 import admission_service_pb2 as pb

logger = logging.getLogger(__name__)


def message_key(consumer: ConsumerId) -> ConsumerId:
    """Whose message ``consumer``'s stream carries: a backbone consumer's DP rank's, an encoder consumer's own."""
    if consumer.encoder_name is None:
        return ConsumerId(role=consumer.role, dp_rank=consumer.dp_rank)
    return consumer


def planned_keys(topology: Topology, role: str = BACKBONE_ROLE) -> list[ConsumerId]:
    """Every message of a mini-batch for the consumers of ``role`` (``topology`` is the one they see), in build
    order: encoder consumers first, then DP ranks."""
    keys = [ConsumerId(role=f"encoder:{e.name}", dp_rank=d) for e in topology.encoders for d in range(e.dp)]
    keys.extend(ConsumerId(role=role, dp_rank=d) for d in range(topology.backbone.dp))
    return keys


def assignment_bytes(
    minibatch: AdmittedMiniBatch, dispatch: MiniBatchDispatch, admission: admission_pb2.MiniBatchAdmission,
    key: ConsumerId,
) -> bytes:
    """The serialised ``WatchAssignmentsResponse`` of message ``key`` (see :func:`message_key`)."""
    head = pb.WatchAssignmentsResponse(sequence=minibatch.sequence, admission=admission,
                                       global_loss_tokens=dispatch.minibatch_loss_tokens).SerializeToString()
    # The parts are serialised on their own and framed as the response's fields (a parser takes fields in any
    # order): copying a built part into its parent message copied every element again.
    if key.encoder_name is None:
        return head + framed(_RANK_ASSIGNMENT, _rank_bytes(dispatch, key.dp_rank))
    return head + framed(_ASSIGNMENT, dispatch.assignment(key).SerializeToString())


_RANK_ASSIGNMENT = pb.WatchAssignmentsResponse.DESCRIPTOR.fields_by_name["rank_assignment"].number
_ASSIGNMENT = pb.WatchAssignmentsResponse.DESCRIPTOR.fields_by_name["assignment"].number
_TRAJECTORIES = plan_pb2.RankAssignment.DESCRIPTOR.fields_by_name["trajectories"].number


def _rank_bytes(dispatch: MiniBatchDispatch, dp_rank: int) -> bytes:
    fields = dispatch.rank_fields(dp_rank)
    batch = fields.pop("trajectories", None)
    data = plan_pb2.RankAssignment(**fields).SerializeToString()
    return data if batch is None else data + framed(_TRAJECTORIES, batch.SerializeToString())


def with_trajectory_ids(data: bytes, minibatch: AdmittedMiniBatch) -> pb.WatchAssignmentsResponse:
    """A stream's copy of a message with every admitted trajectory id in its admission."""
    response = pb.WatchAssignmentsResponse.FromString(data)
    response.admission.trajectory_ids.extend(minibatch.admission.trajectory_ids)
    return response


class MiniBatchMessages:
    """Every planned message of one mini-batch, as futures its streams await (see the module docstring)."""

    def __init__(self, minibatch: AdmittedMiniBatch, topology: Topology, role: str = BACKBONE_ROLE) -> None:
        self._keys = planned_keys(topology, role)
        self._futures: dict[ConsumerId, asyncio.Future[bytes]] = {}
        self._built_inline: dict[ConsumerId, bytes] = {}
        self._unbuilt = set(self._keys)
        admission = admission_pb2.MiniBatchAdmission()
        admission.CopyFrom(minibatch.admission)
        admission.ClearField("trajectory_ids")
        self._admission = admission

    async def get(
        self, minibatch: AdmittedMiniBatch, dispatch: MiniBatchDispatch, key: ConsumerId, builder: Executor | None
    ) -> bytes:
        """Message ``key``'s bytes. With a ``builder``, the first call starts the build of all of them on it;
        without one, each is built on the loop when it is first asked for."""
        if builder is None:
            return self._inline(minibatch, dispatch, key)
        future = self.future(minibatch, dispatch, key, builder)
        if future.done():  # most streams ask once their message is built: no wrapper future, no extra loop turn
            return future.result()
        # Shielded: a stream that goes away must not cancel the message its DP rank's other streams wait for.
        return await asyncio.shield(future)

    def future(self, minibatch: AdmittedMiniBatch, dispatch: MiniBatchDispatch, key: ConsumerId,
               builder: Executor) -> asyncio.Future[bytes]:
        """Message ``key``'s future, the build of every message started on ``builder`` if it was not."""
        if not self._futures:
            self._start(minibatch, dispatch, builder)
        future = self._futures.get(key)
        if future is None:  # not a planned message (cannot happen for a checked consumer): build it alone
            future = asyncio.get_running_loop().create_future()
            future.set_result(assignment_bytes(minibatch, dispatch, self._admission, key))
        return future

    def _inline(self, minibatch: AdmittedMiniBatch, dispatch: MiniBatchDispatch, key: ConsumerId) -> bytes:
        data = self._built_inline.get(key)
        if data is None:
            data = assignment_bytes(minibatch, dispatch, self._admission, key)
            if key in self._unbuilt:  # a planned message (an unplanned one, which cannot happen, is not kept)
                self._built_inline[key] = data
                self._unbuilt.discard(key)
                if not self._unbuilt:
                    dispatch.release_views()
        return data

    def _start(self, minibatch: AdmittedMiniBatch, dispatch: MiniBatchDispatch, builder: Executor) -> None:
        loop = asyncio.get_running_loop()
        self._futures = {key: loop.create_future() for key in self._keys}
        # The build holds the dispatch only while it runs; the futures then hold nothing but bytes.
        builder.submit(_build_all, minibatch, dispatch, self._admission, self._keys, _setter(self._futures, loop))


def _setter(
    futures: dict[ConsumerId, asyncio.Future[bytes]], loop: asyncio.AbstractEventLoop
) -> Callable[[ConsumerId, bytes | None, BaseException | None], None]:
    def settle(future: asyncio.Future[bytes], data: bytes | None, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(data)  # type: ignore[arg-type]

    def publish(key: ConsumerId, data: bytes | None, error: BaseException | None) -> None:
        loop.call_soon_threadsafe(settle, futures[key], data, error)

    return publish


def _build_all(
    minibatch: AdmittedMiniBatch,
    dispatch: MiniBatchDispatch,
    admission: admission_pb2.MiniBatchAdmission,
    keys: list[ConsumerId],
    publish: Callable[[ConsumerId, bytes | None, BaseException | None], None],
) -> None:
    for i, key in enumerate(keys):
        try:
            data = assignment_bytes(minibatch, dispatch, admission, key)
        except Exception as error:  # every stream that waits reports it; a later mini-batch is built anew
            logger.exception("building mini-batch %d's assignment for %s failed", minibatch.sequence, key)
            for rest in keys[i:]:
                publish(rest, None, error)
            return
        publish(key, data, None)
    dispatch.release_views()


class AssignmentMessages:
    """The messages of every live mini-batch: kept with its dispatch (until the mini-batch is released), built on
    ``builder`` off the event loop unless the mini-batch is small (a hand-off to the builder thread costs more
    than such a build, and report-to-assignment latency is what consumers wait on)."""

    def __init__(self, builder: Executor, *, inline_trajectories: int) -> None:
        self._builder = builder
        self._inline_trajectories = inline_trajectories
        self._messages: weakref.WeakKeyDictionary[MiniBatchDispatch, MiniBatchMessages] = weakref.WeakKeyDictionary()

    async def response(
        self, minibatch: AdmittedMiniBatch, dispatch: MiniBatchDispatch, consumer: ConsumerId, *,
        include_trajectory_ids: bool = False,
    ) -> bytes | pb.WatchAssignmentsResponse:
        """What ``consumer``'s stream sends for ``minibatch``: the shared bytes, or (asked for the trajectory ids)
        its own message."""
        messages = self._of(minibatch, dispatch)
        data = await messages.get(minibatch, dispatch, message_key(consumer), self._build_on(minibatch))
        return with_trajectory_ids(data, minibatch) if include_trajectory_ids else data

    async def ready_batches(
        self, minibatch: AdmittedMiniBatch, dispatch: MiniBatchDispatch, keys: Sequence[ConsumerId],
    ) -> AsyncIterator[list[tuple[ConsumerId, bytes]]]:
        """Messages ``keys`` (message keys, :func:`message_key`) of ``minibatch``, in batches: each time, all
        those built since the last batch (a node's stream sends each batch as one response)."""
        messages, builder = self._of(minibatch, dispatch), self._build_on(minibatch)
        if builder is None:
            yield [(key, await messages.get(minibatch, dispatch, key, None)) for key in keys]
            return
        waiting = {key: messages.future(minibatch, dispatch, key, builder) for key in keys}
        while waiting:
            done = [key for key, future in waiting.items() if future.done()]
            if not done:
                # asyncio.wait does not cancel what it waits for: a stream that goes away leaves the build alone.
                await asyncio.wait(waiting.values(), return_when=asyncio.FIRST_COMPLETED)
                continue
            yield [(key, waiting.pop(key).result()) for key in done]

    def _of(self, minibatch: AdmittedMiniBatch, dispatch: MiniBatchDispatch) -> MiniBatchMessages:
        messages = self._messages.get(dispatch)
        if messages is None:
            messages = self._messages[dispatch] = MiniBatchMessages(minibatch, dispatch.topology, dispatch.role)
        return messages

    def _build_on(self, minibatch: AdmittedMiniBatch) -> Executor | None:
        return None if len(minibatch.trajectory_ids) <= self._inline_trajectories else self._builder
