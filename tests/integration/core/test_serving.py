"""The shared server boundary, through a real gRPC server on port 0: token, health, errors, metrics."""

import asyncio
import logging
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


GARBAGE = b"\xff\xff\xff\xff"  # not a protobuf message of any type: a field tag whose varint never ends


def _garbage_call(address: str, method: str, *, token: str, streaming: bool) -> grpc.RpcError:
    """Send bytes that do not decode, as any client that can connect could, and return the status it got."""
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    with grpc.insecure_channel(address) as channel:
        if streaming:
            call_ = channel.unary_stream(method)(GARBAGE, timeout=10, metadata=metadata)
            with pytest.raises(grpc.RpcError) as info:
                list(call_)
        else:
            with pytest.raises(grpc.RpcError) as info:
                channel.unary_unary(method)(GARBAGE, timeout=10, metadata=metadata)
    return info.value


def _tracebacks(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()]


async def test_an_undecodable_request_is_refused_before_and_after_the_token_check(running, caplog) -> None:
    caplog.set_level(logging.DEBUG)

    def exercise() -> None:
        for token in ("", "wrong"):
            anonymous = _garbage_call(running.address, METHOD, token=token, streaming=False)
            assert anonymous.code() is grpc.StatusCode.UNAUTHENTICATED
        known = _garbage_call(running.address, METHOD, token="s3cret", streaming=False)
        assert known.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "knittrans.v1.ConsumerId" in known.details()

    await asyncio.to_thread(exercise)
    assert _tracebacks(caplog) == []
    assert any("knittrans.v1.ConsumerId" in r.getMessage() for r in caplog.records), "counted and logged once"
    text = await asyncio.to_thread(lambda: urllib.request.urlopen(running.metrics_url, timeout=5).read().decode())
    assert 'knittrans_rpc_errors_total{code="INVALID_ARGUMENT",method="Check",service="test.Echo"} 1.0' in text
    assert 'knittrans_rpc_errors_total{code="UNAUTHENTICATED",method="Check",service="test.Echo"} 2.0' in text


async def test_the_plaintext_health_port_refuses_undecodable_requests_too(caplog) -> None:
    caplog.set_level(logging.DEBUG)
    settings = ServerSettings(auth=AuthSettings(token="s3cret"), health_port=0)
    server = await start_server(settings, add_services=add_echo, registry=CollectorRegistry())
    try:
        for address in (server.address, f"127.0.0.1:{server.health_port}"):
            # Health needs no token (kubelet probes have none), so the bytes are decoded and refused.
            error = await asyncio.to_thread(
                _garbage_call, address, "/grpc.health.v1.Health/Check", token="", streaming=False)
            assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
            error = await asyncio.to_thread(
                _garbage_call, address, "/grpc.health.v1.Health/Watch", token="", streaming=True)
            assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
    finally:
        await server.stop(0)
    assert _tracebacks(caplog) == []


async def test_a_request_stream_is_decoded_message_by_message_after_the_token_check() -> None:
    """No KnitTrans RPC streams requests yet; the boundary must still decode such streams itself."""

    async def total(requests, context) -> topology_pb2.ConsumerId:
        return topology_pb2.ConsumerId(role="backbone", dp_rank=sum([r.dp_rank async for r in requests]))

    def add_sum(server: grpc.aio.Server) -> list[str]:
        handler = grpc.stream_unary_rpc_method_handler(
            total, request_deserializer=topology_pb2.ConsumerId.FromString,
            response_serializer=topology_pb2.ConsumerId.SerializeToString,
        )
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("test.Sum", {"Total": handler})])
        return ["test.Sum"]

    server = await start_server(ServerSettings(auth=AuthSettings(token="s3cret")), add_services=add_sum,
                                registry=CollectorRegistry())

    def exercise() -> None:
        good = topology_pb2.ConsumerId(dp_rank=2).SerializeToString()
        with grpc.insecure_channel(server.address) as channel:
            rpc = channel.stream_unary("/test.Sum/Total")
            token = (("authorization", "Bearer s3cret"),)
            answer = topology_pb2.ConsumerId.FromString(rpc(iter([good, good]), timeout=10, metadata=token))
            assert answer.dp_rank == 4
            cases = (((), grpc.StatusCode.UNAUTHENTICATED), (token, grpc.StatusCode.INVALID_ARGUMENT))
            for metadata, expected in cases:
                with pytest.raises(grpc.RpcError) as info:
                    rpc(iter([good, GARBAGE]), timeout=10, metadata=metadata)
                assert info.value.code() is expected

    try:
        await asyncio.to_thread(exercise)
    finally:
        await server.stop(0)
