"""A server stream from the admission service that reconnects: while the service restarts, with back-off."""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import TypeVar

from grpc import aio

from knittrans.client.connection import RETRYABLE_CODES, error_from_rpc
from knittrans.errors import Unavailable
from knittrans.retry import Backoff, RetryPolicy

logger = logging.getLogger(__name__)

T = TypeVar("T")


async def reconnecting(open_stream: Callable[[], AsyncGenerator[T, None]], retry: RetryPolicy, what: str,
                       position: Callable[[], int]) -> AsyncIterator[T]:
    """Every response of the streams ``open_stream`` opens, one after the other: a stream that ends or breaks
    with a retryable code is opened again (``open_stream`` resumes it from where its reader got, ``position``
    says where that is, for the log) after a back-off that a response resets; a stream that cannot be opened
    again within ``retry``'s deadline raises."""
    backoff = Backoff(retry, start_now=False)
    while True:
        stream = open_stream()
        try:
            async for response in stream:
                backoff.reset()
                yield response
            logger.info("the %s ended (service shutting down?); reconnecting", what)
            if not await backoff.sleep_async():
                raise Unavailable(f"the admission service keeps closing the {what}")
        except aio.AioRpcError as error:
            if error.code() not in RETRYABLE_CODES:
                raise error_from_rpc(error) from None
            logger.info("%s broke (%s); reconnecting after sequence %d", what, error.code().name, position())
            if not await backoff.sleep_async():
                raise error_from_rpc(error) from None
        finally:
            await stream.aclose()
