"""The single server boundary: bearer-token check, request decoding, RPC latency metrics and error translation.

Every KnitTrans server installs exactly one :class:`BoundaryInterceptor`. Handlers raise
:class:`~knittrans.errors.KnitTransError` subclasses; this is the one place that turns them into gRPC
statuses (with the offending field in the ``knittrans-field`` trailer) so no handler touches status codes.

gRPC would decode a request before any interceptor code runs, so a body that is not protobuf would end as
UNKNOWN with a logged traceback, for anyone who can connect. The boundary therefore takes the raw bytes and
decodes them itself, after the token check (a request stream message by message, as the servicer iterates it;
``context.read()`` would bypass that and return raw bytes).
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from grpc import aio
from prometheus_client import CollectorRegistry, Counter, Histogram

from knittrans.errors import FIELD_TRAILER, InvalidArgument, KnitTransError
from knittrans.serving.security import HEALTH_SERVICE_PREFIX, token_matches

logger = logging.getLogger(__name__)

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class RpcMetrics:
    """Per-server RPC metrics, registered on the server's own registry (no process-global state)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.latency = Histogram(
            "knittrans_rpc_latency_seconds", "Server-side RPC latency.", ["service", "method"],
            registry=registry, buckets=LATENCY_BUCKETS,
        )
        self.errors = Counter(
            "knittrans_rpc_errors_total", "RPCs that ended with a non-OK status.", ["service", "method", "code"],
            registry=registry,
        )


def _split_method(full_method: str) -> tuple[str, str]:
    service, _, method = full_method.lstrip("/").rpartition("/")
    return service, method


class BoundaryInterceptor(aio.ServerInterceptor):
    def __init__(self, *, token: str, metrics: RpcMetrics) -> None:
        self._token = token
        self._metrics = metrics

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:  # unknown method: let gRPC answer UNIMPLEMENTED, and keep metric labels bounded
            return handler
        method = handler_call_details.method
        needs_token = bool(self._token) and not method.startswith(HEALTH_SERVICE_PREFIX)
        authorised = not needs_token or token_matches(handler_call_details.invocation_metadata, self._token)
        return _wrap(handler, method, authorised, self._metrics)


def _decoder(deserializer: Callable[[bytes], Any] | None, method: str) -> Callable[[bytes], Any]:
    if deserializer is None:
        return lambda raw: raw

    def decode(raw: bytes) -> Any:
        try:
            return deserializer(raw)
        except Exception as exc:  # whatever the generated parser raises, the bytes were not this message
            # One line, no traceback: the caller is authenticated, but its input is not our bug.
            logger.warning("undecodable request to %s: %s", method, exc)
            raise InvalidArgument(f"the request body is not a valid message: {exc}") from None

    return decode


def _encoder(serializer: Callable[[Any], bytes] | None) -> Callable[[Any], bytes] | None:
    """The handler's serializer, passing ``bytes`` through: a response serialised once can go to many streams."""
    if serializer is None:
        return None

    def encode(response: Any) -> bytes:
        return response if isinstance(response, bytes) else serializer(response)

    return encode


async def _decoded_stream(requests: AsyncIterator[bytes], decode: Callable[[bytes], Any]) -> AsyncIterator[Any]:
    async for raw in requests:
        yield decode(raw)


def _wrap(
    handler: grpc.RpcMethodHandler, method: str, authorised: bool, metrics: RpcMetrics
) -> grpc.RpcMethodHandler:
    service, name = _split_method(method)
    decode = _decoder(handler.request_deserializer, method)

    def decoded(raw: Any) -> Any:
        return _decoded_stream(raw, decode) if handler.request_streaming else decode(raw)
    latency = metrics.latency.labels(service, name)

    def record(started: float, code: grpc.StatusCode) -> None:
        latency.observe(time.perf_counter() - started)
        if code is not grpc.StatusCode.OK:
            metrics.errors.labels(service, name, code.name).inc()

    async def fail(context: aio.ServicerContext, exc: BaseException) -> grpc.StatusCode:
        if isinstance(exc, KnitTransError):
            trailer = ((FIELD_TRAILER, exc.field),) if exc.field else ()
            context.set_trailing_metadata(trailer)
            code = grpc.StatusCode[exc.status_code]
            context.set_code(code)
            context.set_details(str(exc))
            return code
        logger.exception("unhandled error in %s", method)
        context.set_code(grpc.StatusCode.INTERNAL)
        context.set_details("internal error; see the server log")
        return grpc.StatusCode.INTERNAL

    def deny(context: aio.ServicerContext) -> grpc.StatusCode:
        context.set_code(grpc.StatusCode.UNAUTHENTICATED)
        context.set_details("missing or wrong bearer token")
        return grpc.StatusCode.UNAUTHENTICATED

    def final_code(context: aio.ServicerContext) -> grpc.StatusCode:
        code = context.code()
        return code if isinstance(code, grpc.StatusCode) else grpc.StatusCode.OK

    if not handler.response_streaming:
        inner: Callable[..., Awaitable[Any]] = (
            handler.stream_unary if handler.request_streaming else handler.unary_unary
        )

        async def unary_response(request: Any, context: aio.ServicerContext) -> Any:
            started = time.perf_counter()
            if not authorised:
                record(started, deny(context))
                return None
            try:
                response = await inner(decoded(request), context)
            except aio.AbortError:
                record(started, final_code(context))
                raise
            except Exception as exc:  # the boundary: everything becomes a status
                record(started, await fail(context, exc))
                return None
            record(started, final_code(context))
            return response

        factory = (
            grpc.stream_unary_rpc_method_handler if handler.request_streaming else grpc.unary_unary_rpc_method_handler
        )
        return factory(unary_response, None, handler.response_serializer)

    inner_stream = handler.stream_stream if handler.request_streaming else handler.unary_stream

    async def stream_response(request: Any, context: aio.ServicerContext) -> AsyncIterator[Any]:
        started = time.perf_counter()
        if not authorised:
            record(started, deny(context))
            return
        try:
            produced = inner_stream(decoded(request), context)
            if inspect.isasyncgen(produced):
                async for item in produced:
                    yield item
            else:
                await produced
        except aio.AbortError:
            record(started, final_code(context))
            raise
        except Exception as exc:
            record(started, await fail(context, exc))
            return
        record(started, final_code(context))

    factory = (
        grpc.stream_stream_rpc_method_handler if handler.request_streaming else grpc.unary_stream_rpc_method_handler
    )
    return factory(stream_response, None, _encoder(handler.response_serializer))
