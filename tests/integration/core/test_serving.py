"""The shared server boundary, through a real gRPC server on port 0: token, health, errors, metrics."""

import urllib.request
from datetime import timedelta

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry

from knittrans.client.connection import ConnectionSettings, call, open_channel
from knittrans.errors import InvalidArgument, Unauthenticated
from knittrans.serving.server import start_server
from knittrans.serving.settings import AuthSettings, ServerSettings
from knittrans.types import ConsumerId
from knittrans.v1 import topology_pb2

SERVICE = "test.Echo"
METHOD = f"/{SERVICE}/Check"


def add_echo(server: grpc.aio.Server) -> list[str]:
    """A tiny service whose handler validates its input through a domain type."""

    async def check(request: topology_pb2.ConsumerId, context) -> topology_pb2.ConsumerId:
        ConsumerId(role=request.role, dp_rank=request.dp_rank, cp_rank=request.cp_rank)
        return request

    handler = grpc.unary_unary_rpc_method_handler(
        check, request_deserializer=topology_pb2.ConsumerId.FromString,
        response_serializer=topology_pb2.ConsumerId.SerializeToString,
    )
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(SERVICE, {"Check": handler})])
    return [SERVICE]


@pytest.fixture
async def running():
    settings = ServerSettings(auth=AuthSettings(token="s3cret"))
    server = await start_server(settings, add_services=add_echo, registry=CollectorRegistry())
    yield server
    await server.stop(0)


def stub(channel: grpc.Channel):
    return channel.unary_unary(METHOD, request_serializer=topology_pb2.ConsumerId.SerializeToString,
                               response_deserializer=topology_pb2.ConsumerId.FromString)


async def test_token_health_errors_and_metrics(running) -> None:
    import asyncio

    def exercise() -> None:
        good = ConnectionSettings(target=running.address, token="s3cret")
        with open_channel(good) as channel:
            ok = call(stub(channel), topology_pb2.ConsumerId(role="backbone", dp_rank=1),
                      deadline=timedelta(seconds=5), metadata=good.call_metadata())
            assert ok.dp_rank == 1
            with pytest.raises(InvalidArgument) as info:
                call(stub(channel), topology_pb2.ConsumerId(role="decoder"), deadline=timedelta(seconds=5),
                     metadata=good.call_metadata())
            assert info.value.field == "role"
            # Kubernetes probes call the health service without credentials.
            health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert health.status == health_pb2.HealthCheckResponse.SERVING
        no_token = ConnectionSettings(target=running.address)
        bad_token = ConnectionSettings(target=running.address, token="x")
        for wrong in (no_token, bad_token):
            with open_channel(wrong) as channel, pytest.raises(Unauthenticated):
                call(stub(channel), topology_pb2.ConsumerId(role="backbone"), deadline=timedelta(seconds=5),
                     metadata=wrong.call_metadata())

    await asyncio.to_thread(exercise)
    text = await asyncio.to_thread(lambda: urllib.request.urlopen(running.metrics_url, timeout=5).read().decode())
    assert 'knittrans_rpc_latency_seconds_count{method="Check",service="test.Echo"} 4.0' in text
    assert 'knittrans_rpc_errors_total{code="INVALID_ARGUMENT",method="Check",service="test.Echo"} 1.0' in text
    assert 'code="UNAUTHENTICATED"' in text
