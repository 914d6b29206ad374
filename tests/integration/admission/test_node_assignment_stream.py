"""WatchNodeAssignments against the real service on port 0: for every consumer, the node stream carries exactly the
messages that consumer's own WatchAssignments stream carries, in the same order, each once, whatever order the
request names the consumers in; the oracle is the per-consumer streams themselves, read side by side. Both build
paths are covered: small mini-batches built on the loop, and large ones (over 256 trajectories) on the builder
thread, streamed as their messages are built."""

from __future__ import annotations

import asyncio
import random

import grpc
import pytest

from knittrans.admission.service.app import start_admission_service
from knittrans.client.admission import AdmissionClient
from knittrans.types import BackboneTopology, ConsumerId, EncoderTopology, Topology
from knittrans.v1 import admission_service_pb2 as pb
from knittrans.v1 import admission_service_pb2_grpc
from knittrans.wire import consumer_to_proto

from .builders import make_meta, service_settings

TOPOLOGY = Topology(backbone=BackboneTopology(dp=3, cp=2, max_tokens_per_microbatch=1024),
                    encoders=(EncoderTopology(name="vision", dp=2, max_cost_per_microbatch=64),))
CONSUMERS = [ConsumerId(role="backbone", dp_rank=d, cp_rank=c) for d in range(3) for c in range(2)] + \
    [ConsumerId(role="encoder:vision", dp_rank=d) for d in range(2)]
NUM_MINIBATCHES = 2


async def own_streams(stub, minibatches: int) -> dict[ConsumerId, list[pb.WatchAssignmentsResponse]]:
    async def one(consumer: ConsumerId) -> list[pb.WatchAssignmentsResponse]:
        call = stub.WatchAssignments(pb.WatchAssignmentsRequest(consumer=consumer_to_proto(consumer)))
        got = []
        async for response in call:
            got.append(response)
            if len(got) == minibatches:
                call.cancel()
                return got
        return got

    results = await asyncio.gather(*(one(c) for c in CONSUMERS))
    return dict(zip(CONSUMERS, results, strict=True))


async def node_stream(stub, consumers: list[ConsumerId], minibatches: int, after: int = 0
                      ) -> dict[ConsumerId, list[pb.WatchAssignmentsResponse]]:
    call = stub.WatchNodeAssignments(pb.WatchNodeAssignmentsRequest(
        consumers=[consumer_to_proto(c) for c in consumers], after_sequence=after))
    got: dict[ConsumerId, list[pb.WatchAssignmentsResponse]] = {c: [] for c in consumers}
    async for response in call:
        assert response.assignments, "a response carries at least one message"
        for part in response.assignments:
            assert part.consumer_indices, "a message is for at least one consumer"
            for index in part.consumer_indices:
                got[consumers[index]].append(part.assignment)
        if all(len(v) >= minibatches for v in got.values()):
            call.cancel()
            break
    return got


@pytest.mark.parametrize("per_minibatch", [7, 300], ids=["built-on-the-loop", "built-off-the-loop"])
async def test_each_consumer_gets_over_the_node_stream_what_its_own_stream_carries(per_minibatch: int) -> None:
    settings = service_settings(train_batch_size=per_minibatch * NUM_MINIBATCHES, num_minibatches=NUM_MINIBATCHES,
                                topology=TOPOLOGY)
    service = await start_admission_service(settings)
    address = service.server.address
    rng = random.Random(per_minibatch)
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = admission_service_pb2_grpc.AdmissionServiceStub(channel)
            shuffled = rng.sample(CONSUMERS, len(CONSUMERS))
            some = rng.sample(CONSUMERS, 3)  # a node hosting a few consumers, not whole DP ranks
            watches = [asyncio.ensure_future(own_streams(stub, NUM_MINIBATCHES)),
                       asyncio.ensure_future(node_stream(stub, shuffled, NUM_MINIBATCHES)),
                       asyncio.ensure_future(node_stream(stub, some, NUM_MINIBATCHES))]
            await asyncio.sleep(0.2)
            metas = [make_meta(i, source="AB"[i % 2], sample=i // 3, tokens=rng.randint(20, 900),
                               images=rng.randint(0, 3)) for i in range(per_minibatch * NUM_MINIBATCHES)]

            def report() -> None:
                with AdmissionClient(address) as client:
                    client.report(metas)

            await asyncio.to_thread(report)
            own, everyone, few = await asyncio.wait_for(asyncio.gather(*watches), 60)
            late = await asyncio.wait_for(node_stream(stub, shuffled, 1, after=1), 30)
    finally:
        await service.stop(0)
    for consumer in CONSUMERS:
        expected = own[consumer]
        assert [m.sequence for m in expected] == list(range(1, NUM_MINIBATCHES + 1))
        assert everyone[consumer] == expected, consumer
        assert late[consumer] == expected[1:], consumer
    for consumer in some:
        assert few[consumer] == own[consumer], consumer


async def test_a_bad_node_request_names_the_field_and_leaves_the_service_serving() -> None:
    service = await start_admission_service(service_settings(topology=TOPOLOGY))
    try:
        async with grpc.aio.insecure_channel(service.server.address) as channel:
            stub = admission_service_pb2_grpc.AdmissionServiceStub(channel)
            cases = {
                "consumers": [],
                "consumers[2]": [CONSUMERS[0], CONSUMERS[1], CONSUMERS[0]],
                "consumers[1].dp_rank": [CONSUMERS[0], ConsumerId(role="backbone", dp_rank=7, cp_rank=0)],
            }
            for field, consumers in cases.items():
                call = stub.WatchNodeAssignments(pb.WatchNodeAssignmentsRequest(
                    consumers=[consumer_to_proto(c) for c in consumers]))
                with pytest.raises(grpc.aio.AioRpcError) as raised:
                    async for _ in call:
                        pass
                assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT
                trailers = dict(raised.value.trailing_metadata() or ())
                assert trailers.get("knittrans-field") == field, (field, raised.value.details())
            status = await stub.GetStatus(pb.GetStatusRequest(), timeout=5)
            assert status is not None
    finally:
        await service.stop(0)
