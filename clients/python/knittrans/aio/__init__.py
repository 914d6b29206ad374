"""The SDK's asyncio face (DESIGN.md §10, "Async"): the clients for code that runs in an event loop.

- :class:`AsyncAdmissionClient`: the admission service on grpc.aio; the sync
  :class:`~knittrans.client.admission.AdmissionClient` runs its coroutines on a blocking transport, and the reorg
  sidecars use it too.
- :class:`AsyncRolloutClient`: ``await submit(...)`` from an sglang/vLLM-style asyncio server; the store's
  blocking calls run in an executor. It shares its splitting and its I/O steps with
  :class:`~knittrans.rollout.RolloutClient` (:mod:`knittrans.submission`).
- :class:`AsyncTrainerClient`: ``async for`` over mini-batches and their micro-batches; it drives the sync
  :class:`~knittrans.trainer.TrainerClient` from one worker thread.

One set of retry rules for all of them, sync and async: :data:`UNARY_RETRY` (back-off and deadline) while a call
fails with one of :data:`RETRYABLE_CODES`; one :class:`Registration` type.

Importing this package needs no torch; iterating micro-batches does.
"""

from knittrans.aio.rollout import AsyncMetadataReporter, AsyncRolloutClient
from knittrans.aio.trainer import AsyncMiniBatch, AsyncTrainerClient
from knittrans.client.aio import AsyncAdmissionClient
from knittrans.client.connection import RETRYABLE_CODES, UNARY_RETRY, ConnectionSettings
from knittrans.client.model import Registration
from knittrans.retry import RetryPolicy

__all__ = [
    "RETRYABLE_CODES",
    "UNARY_RETRY",
    "AsyncAdmissionClient",
    "AsyncMetadataReporter",
    "AsyncMiniBatch",
    "AsyncRolloutClient",
    "AsyncTrainerClient",
    "ConnectionSettings",
    "Registration",
    "RetryPolicy",
]
