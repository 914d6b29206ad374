"""`AsyncTrainerClient`: :class:`~knittrans.trainer.TrainerClient` for training loops that run in an event loop.

::

    async with AsyncTrainerClient(TrainerSettings(sidecar=socket, admission=admission)) as client:
        async for mini in client.mini_batches():
            async for micro in mini:
                loss = model(micro["input_ids"], ...)
            optimizer.step()

With ``client.mini_batches(passes=n)`` each mini-batch is ``async for``-ed n times (``ppo_epochs``; see
:class:`~knittrans.trainer.MiniBatch`).

It is the sync client, driven from coroutines: the same prefetch and release threads stage micro-batches in the
same way, and the same iterators decide what is taken, released, drained and reported, so both clients deliver
the same mini-batches with the same guarantees (see :mod:`knittrans.trainer.client`). Each step of an iterator
(waiting for a micro-batch, a progress report to the admission service) runs on one thread of this client, so
the event loop is never blocked, and the loop's thread then waits on its own CUDA stream for the staged copy.
A micro-batch's tensors stay valid until the ``async for`` moves past it.

Cancelling the task that iterates ends the iteration (a micro-batch that was being waited for is dropped): close
the client afterwards.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Generator, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from knittrans.steps import RestorePoint, StepId
from knittrans.trainer.batches import MicroBatch, MiniBatch, MiniBatchContext
from knittrans.trainer.client import TrainerClient
from knittrans.trainer.progress import ProgressReporter
from knittrans.trainer.settings import TrainerSettings, TrainerStats
from knittrans.types import ConsumerId
from knittrans.v1 import reorg_service_pb2 as pb

T = TypeVar("T")


class AsyncTrainerClient:
    """A training rank's client of its reorg sidecar, for ``async for`` (see the module docstring)."""

    def __init__(
        self,
        settings: TrainerSettings,
        *,
        progress: ProgressReporter | None = None,
        restored_step: StepId | RestorePoint | None = None,
    ) -> None:
        self._client = TrainerClient(settings, progress=progress, restored_step=restored_step)
        # One thread steps the iterators: their steps never run concurrently, and always on the same thread.
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"knittrans-aio-tp{settings.tp_rank}")
        self._closed = False

    @property
    def sync(self) -> TrainerClient:
        """The sync client this one drives (its settings, its stats)."""
        return self._client

    @property
    def settings(self) -> TrainerSettings:
        return self._client.settings

    @property
    def stats(self) -> TrainerStats:
        return self._client.stats

    async def call(self, function: Callable[[], T]) -> T:
        """``function()`` on the client's thread, after the iterator steps before it."""
        return await asyncio.wrap_future(self._thread.submit(function))

    def call_later(self, function: Callable[[], object]) -> None:
        """``function()`` on the client's thread, after the steps before it, without waiting for it; nothing once
        the client is closed (an iterator finalised after :meth:`close` has nothing left to release)."""
        if not self._closed:
            self._thread.submit(function)

    async def step(self, iterator: Iterator[T]) -> T | None:
        """The iterator's next item (None at its end), taken on the client's thread."""
        return await self.call(lambda: next(iterator, None))

    async def mini_batches(self, *, passes: int = 1) -> AsyncIterator[AsyncMiniBatch]:
        """Mini-batches in order until the sidecar's assignment source ends (never, for a live job); like
        :meth:`TrainerClient.mini_batches`, the next one is taken once the previous one is drained and its
        optimizer step reported. ``passes``: ``async for`` each mini-batch that many times (``ppo_epochs``)."""
        minis = self._client.mini_batches(passes=passes)
        try:
            while (mini := await self.step(minis)) is not None:
                yield AsyncMiniBatch(mini, self)
        finally:
            self.call_later(lambda: _close(minis))  # after a step still under way, never concurrently with it

    async def status(self, *, timeout: float = 5.0) -> pb.GetReorgStatusResponse:
        return await asyncio.to_thread(self._client.status, timeout=timeout)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        # Not on the client's thread: a step may be blocked there until the prefetcher is stopped.
        await asyncio.to_thread(self._client.close)
        self._thread.shutdown(wait=False)

    async def __aenter__(self) -> AsyncTrainerClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncMiniBatch:
    """One mini-batch: ``async for`` it ``passes`` times for its micro-batches, in consumption order. The sync
    :class:`~knittrans.trainer.MiniBatch` it drives is :attr:`sync` (for its plan, encoding uses, ...)."""

    def __init__(self, mini: MiniBatch, client: AsyncTrainerClient) -> None:
        self._mini = mini
        self._client = client

    @property
    def sync(self) -> MiniBatch:
        return self._mini

    @property
    def sequence(self) -> int:
        return self._mini.sequence

    @property
    def train_batch_index(self) -> int:
        return self._mini.train_batch_index

    @property
    def minibatch_index(self) -> int:
        return self._mini.minibatch_index

    @property
    def num_minibatches(self) -> int:
        return self._mini.num_minibatches

    @property
    def train_version(self) -> int:
        return self._mini.train_version

    @property
    def step(self) -> StepId:
        """Which optimizer step this is (train batch, mini-batch, policy version): store it with a checkpoint."""
        return self._mini.step

    @property
    def num_microbatches(self) -> int:
        return self._mini.num_microbatches

    @property
    def passes(self) -> int:
        """How many times this mini-batch is iterated (``mini_batches(passes=...)``)."""
        return self._mini.passes

    @property
    def global_loss_tokens(self) -> int:
        """Loss tokens of the whole mini-batch over every rank: divide summed token losses by this."""
        return self._mini.global_loss_tokens

    @property
    def consumer(self) -> ConsumerId:
        return self._mini.consumer

    @property
    def last_of_train_batch(self) -> bool:
        return self._mini.last_of_train_batch

    async def context(self) -> MiniBatchContext:
        """What the sidecar retains about this mini-batch (fetched on first use)."""
        return await self._client.call(lambda: self._mini.context)

    def __aiter__(self) -> AsyncIterator[MicroBatch]:
        return self._micro_batches(iter(self._mini))  # iter() refuses a pass beyond ``passes`` at once

    async def _micro_batches(self, micros: Iterator[MicroBatch]) -> AsyncIterator[MicroBatch]:
        try:
            while (micro := await self._client.step(micros)) is not None:
                self._client.sync.ready_on_this_thread(micro)
                yield micro
        finally:
            self._client.call_later(lambda: _close(micros))  # releases a micro-batch the loop left early

    async def complete(self) -> None:
        """Report now that this mini-batch's optimizer step is done (otherwise done when the next is taken)."""
        await self._client.call(self._mini.complete)


def _close(iterator: Iterator[object]) -> None:
    if isinstance(iterator, Generator):  # the sync client's iterators are generators: close runs their clean-up
        iterator.close()
