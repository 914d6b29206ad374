"""The sidecar's gRPC assignment source against the real admission service (journaled in a real Redis): it
resumes after the service restarts with no gap and no repeat, and a restarted sidecar resumes after what it
acknowledged."""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from datetime import timedelta

from knittrans.admission.engine import EngineConfig
from knittrans.admission.service.app import start_admission_service
from knittrans.admission.service.settings import AdmissionServiceSettings
from knittrans.client.admission import AdmissionClient
from knittrans.client.connection import ConnectionSettings
from knittrans.launch.ports import free_port
from knittrans.reorg.assignments import AdmissionAssignmentSource, WatchSettings
from knittrans.serving.settings import MetricsSettings, ServerSettings
from knittrans.types import (
    BackboneTopology,
    ConsumerId,
    DType,
    Topology,
    TrajectoryMeta,
    UnitHeader,
    UnitKind,
    UnitRef,
    VersionSegment,
)

CONSUMER = ConsumerId(role="backbone", dp_rank=0, cp_rank=1)


def meta(index: int, tokens: int = 64) -> TrajectoryMeta:
    header = UnitHeader(dtype=DType.INT32, shape=(tokens,), byte_length=4 * tokens, seq_axis=0,
                        content_hash=hashlib.blake2b(f"t{index}".encode(), digest_size=16).hexdigest())
    return TrajectoryMeta(
        trajectory_id=f"t{index}", sample_id=f"s{index}", source="A", rollout_step=0, num_tokens=tokens,
        num_loss_tokens=tokens, segments=(VersionSegment(version=0, num_tokens=tokens),),
        units=(UnitRef(key=f"j/t/t{index}/input_ids", field_name="input_ids", kind=UnitKind.TOKEN_FIELD,
                       header=header),),
    )


def journaled_service(redis_url: str, job_prefix: str) -> tuple[AdmissionServiceSettings, str]:
    """A service journaled in Redis on a fixed free port (a restarted one is dialled at the same address), mini-
    batches of two trajectories for dp 1 x cp 2; and its address."""
    port = free_port("127.0.0.1")
    settings = AdmissionServiceSettings(
        engine=EngineConfig(train_batch_size=8, num_minibatches=4, sources={"A": 0.5}),
        topology=Topology(backbone=BackboneTopology(dp=1, cp=2, max_tokens_per_microbatch=4096)),
        job=f"{job_prefix}{uuid.uuid4().hex[:8]}", state=redis_url,
        server=ServerSettings(host="127.0.0.1", port=port, metrics=MetricsSettings(port=-1)),
    )
    return settings, f"127.0.0.1:{port}"


async def test_the_stream_resumes_across_service_and_sidecar_restarts(redis_server) -> None:
    settings, address = journaled_service(redis_server.url, "s")

    def report(indices: range) -> None:
        with AdmissionClient(address) as client:
            client.report([meta(i) for i in indices])

    watch = WatchSettings(initial_backoff=timedelta(milliseconds=20), max_backoff=timedelta(milliseconds=200))
    service = await start_admission_service(settings)
    source = AdmissionAssignmentSource(ConnectionSettings(target=address), CONSUMER, watch)
    try:
        registration = await source.register()
        assert registration.acknowledged_sequence == 0
        await asyncio.to_thread(report, range(4))  # two mini-batches of two
        events = source.__aiter__()
        first = await asyncio.wait_for(anext(events), 10)
        await source.acknowledge(first.sequence)
        second = await asyncio.wait_for(anext(events), 10)
        assert (first.sequence, second.sequence) == (1, 2)
        assert second.assignment.consumer == CONSUMER and second.num_units >= 1

        await service.stop(0)  # the stream breaks; the source keeps reconnecting
        service = await start_admission_service(settings)  # recovers from the Redis journal
        await asyncio.to_thread(report, range(4, 8))
        rest = [await asyncio.wait_for(anext(events), 20) for _ in range(2)]
        assert [e.sequence for e in rest] == [3, 4]  # no gap, no repeat of 2

        # A restarted sidecar resumes after what it acknowledged: 2, 3 and 4 again.
        again = AdmissionAssignmentSource(ConnectionSettings(target=address), CONSUMER, watch)
        try:
            assert (await again.register()).acknowledged_sequence == 1
            replay = again.__aiter__()
            assert [(await asyncio.wait_for(anext(replay), 10)).sequence for _ in range(3)] == [2, 3, 4]
            await replay.aclose()
        finally:
            await again.close()
        await events.aclose()
    finally:
        await source.close()
        await service.stop(0)
