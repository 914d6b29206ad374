"""How the admission client's calls reach the service: on grpc.aio, or blocking on a plain grpc channel.

:class:`~knittrans.client.aio.AsyncAdmissionClient` builds each request and reads each response; a transport
only sends, under the client's one :class:`~knittrans.retry.RetryPolicy`. The blocking transport's coroutines
never suspend, so the sync :class:`~knittrans.client.admission.AdmissionClient` runs the async client's own
coroutines to completion in the caller's thread (:func:`~knittrans.blocking.run_to_completion`), with no event
loop and no thread hop: a report costs what a plain sync gRPC call costs.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

import grpc

from knittrans.blocking import run_to_completion
from knittrans.client.connection import ConnectionSettings, open_aio_channel, open_channel
from knittrans.errors import FailedPrecondition
from knittrans.retry import RetryPolicy, retry_call, retry_call_async
from knittrans.v1 import admission_service_pb2_grpc

logger = logging.getLogger(__name__)

__all__ = ["AioTransport", "BlockingTransport", "Transport", "run_to_completion"]


class Transport(Protocol):
    """Raises ``grpc.RpcError`` (the caller maps it to a :class:`~knittrans.errors.KnitTransError`)."""

    async def unary(self, method: str, request: Any, *, timeout: float) -> Any:
        """One idempotent call, retried while it fails with a retryable code."""

    def stream(self, method: str, request: Any) -> AsyncGenerator[Any, None]:
        """A server stream without deadline, cancelled when the iterator is closed; not retried."""

    async def close(self) -> None: ...


class _Retrying:
    def __init__(self, connection: ConnectionSettings, retry: RetryPolicy,
                 retry_codes: frozenset[grpc.StatusCode]) -> None:
        self._metadata = connection.call_metadata()
        self._retry = retry
        self._retry_codes = retry_codes
        self._closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise _closed_error()

    @contextmanager
    def _closing_raises_closed(self) -> Iterator[None]:
        """A call the client's closing cut short raises what a call after the close raises (grpc raises
        ValueError, or UsageError on grpc.aio, for a call on a closed channel)."""
        try:
            yield
        except (ValueError, grpc.aio.UsageError) as error:
            if self._closed:
                raise _closed_error() from error
            raise

    def _retryable(self, error: BaseException) -> bool:
        return isinstance(error, grpc.RpcError) and hasattr(error, "code") and error.code() in self._retry_codes

    @staticmethod
    def _log_retry(error: BaseException) -> None:
        code = error.code().name if hasattr(error, "code") else type(error).__name__
        logger.info("admission service call failed (%s), retrying", code)


class AioTransport(_Retrying):
    """grpc.aio: open it inside the event loop that will use it (an aio channel belongs to one loop)."""

    def __init__(self, connection: ConnectionSettings, retry: RetryPolicy,
                 retry_codes: frozenset[grpc.StatusCode]) -> None:
        super().__init__(connection, retry, retry_codes)
        self._channel = open_aio_channel(connection)
        self._stub = admission_service_pb2_grpc.AdmissionServiceStub(self._channel)

    async def unary(self, method: str, request: Any, *, timeout: float) -> Any:
        self._check_open()
        rpc = getattr(self._stub, method)

        async def attempt() -> Any:
            return await rpc(request, timeout=timeout, metadata=self._metadata)

        with self._closing_raises_closed():
            return await retry_call_async(attempt, policy=self._retry, retryable=self._retryable,
                                          on_retry=self._log_retry)

    async def stream(self, method: str, request: Any) -> AsyncGenerator[Any, None]:
        self._check_open()
        call = getattr(self._stub, method)(request, metadata=self._metadata)
        try:
            async for response in call:
                yield response
        finally:
            call.cancel()

    async def close(self) -> None:
        self._closed = True
        await self._channel.close()


class BlockingTransport(_Retrying):
    """A plain grpc channel; its coroutines block the calling thread and never suspend."""

    def __init__(self, connection: ConnectionSettings, retry: RetryPolicy,
                 retry_codes: frozenset[grpc.StatusCode]) -> None:
        super().__init__(connection, retry, retry_codes)
        self._channel = open_channel(connection)
        self._stub = admission_service_pb2_grpc.AdmissionServiceStub(self._channel)

    async def unary(self, method: str, request: Any, *, timeout: float) -> Any:
        self._check_open()
        rpc = getattr(self._stub, method)
        with self._closing_raises_closed():
            return retry_call(lambda: rpc(request, timeout=timeout, metadata=self._metadata), policy=self._retry,
                              retryable=self._retryable, on_retry=self._log_retry)

    async def stream(self, method: str, request: Any) -> AsyncGenerator[Any, None]:
        self._check_open()
        call = getattr(self._stub, method)(request, metadata=self._metadata)
        try:
            for response in call:
                yield response
        finally:
            call.cancel()

    async def close(self) -> None:
        self._closed = True
        self._channel.close()


def _closed_error() -> FailedPrecondition:
    return FailedPrecondition("the admission client is closed: open a new one", field="client")
