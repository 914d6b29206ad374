"""Each admitted mini-batch's plan, made once per verdict group and off the event loop unless it is small.

Planning a large mini-batch (gathering its rows and :func:`~knittrans.admission.planning.plan_columns`) takes
hundreds of milliseconds at thousands of trajectories. On the event loop it held back everything else: the report
that admitted the mini-batch was acknowledged only once the plan was made. Here, what the plan reads is taken from
the ledger on the loop (:meth:`AdmissionLedger.dispatch_planner`: where each trajectory's row is), and the plan is
made on the builder thread, the one that then builds the mini-batch's messages. Every stream that needs the plan
awaits the same future; the plan is kept on the mini-batch (unless it was released meanwhile) when it is made.
A small mini-batch is planned on the loop: a hand-off to the builder thread costs more than its plan.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Executor

from knittrans.admission.service.assignments import MiniBatchDispatch
from knittrans.admission.service.ledger import AdmissionLedger
from knittrans.admission.service.retention import AdmittedMiniBatch
from knittrans.admission.service.roles import group_of_role
from knittrans.types import TrajectoryId

logger = logging.getLogger(__name__)


class MiniBatchPlans:
    """The plans being made, as futures keyed by (sequence, verdict group); a made plan lives on its mini-batch."""

    def __init__(self, ledger: AdmissionLedger, builder: Executor, *, inline_trajectories: int) -> None:
        self._ledger = ledger
        self._builder = builder
        self._inline_trajectories = inline_trajectories
        self._making: dict[tuple[int, str], asyncio.Future[MiniBatchDispatch]] = {}

    def _inline(self, trajectory_ids: Sequence[TrajectoryId]) -> bool:
        return len(trajectory_ids) <= self._inline_trajectories

    def _submit(self, planner: Callable[[], MiniBatchDispatch]) -> asyncio.Future[MiniBatchDispatch]:
        future = asyncio.get_running_loop().run_in_executor(self._builder, planner)
        future.add_done_callback(_retrieve)
        return future

    def ahead(self, trajectory_ids: Sequence[TrajectoryId]) -> asyncio.Future[MiniBatchDispatch] | None:
        """Start planning a mini-batch of these live trajectories before its admission is applied (while its
        record is written); :meth:`adopt` it once applied. None when planning could not start (the streams plan
        again, and report the error)."""
        try:
            planner = self._ledger.planner(trajectory_ids)
            if not self._inline(trajectory_ids):
                return self._submit(planner)
            future: asyncio.Future[MiniBatchDispatch] = asyncio.get_running_loop().create_future()
            future.set_result(planner())
            return future
        except Exception:  # planning ahead must not stop the commit
            logger.debug("planning mini-batch ahead of its commit failed", exc_info=True)
            return None

    def adopt(self, minibatch: AdmittedMiniBatch, future: asyncio.Future[MiniBatchDispatch]) -> None:
        """Make ``future`` (from :meth:`ahead`) the backbone's plan of the just applied ``minibatch``."""
        self._track(minibatch, "", future)

    def start(self, minibatch: AdmittedMiniBatch) -> None:
        """Start making the backbone's plan of a just admitted large mini-batch, before any stream asks."""
        if self._inline(minibatch.trajectory_ids) or self._ledger.planned(minibatch) is not None \
                or (minibatch.sequence, "") in self._making:
            return
        try:
            planner = self._ledger.dispatch_planner(minibatch)
        except Exception:  # the admission is applied: its report is answered; the streams plan again and report it
            logger.debug("starting mini-batch %d's plan failed", minibatch.sequence, exc_info=True)
            return
        self._track(minibatch, "", self._submit(planner))

    async def dispatch(self, minibatch: AdmittedMiniBatch, role: str = "") -> MiniBatchDispatch:
        """The mini-batch's plan for the consumers of ``role`` (a ConsumerId.role), made once."""
        planned = self._ledger.planned(minibatch, role)
        if planned is not None:
            return planned
        group = group_of_role(role)
        future = self._making.get((minibatch.sequence, group))
        if future is None:
            if self._inline(minibatch.trajectory_ids):
                return self._ledger.dispatch(minibatch, role)
            future = self._submit(self._ledger.dispatch_planner(minibatch, role))  # reads the ledger: on the loop
            self._track(minibatch, group, future)
        # Shielded: a stream that goes away must not cancel the plan the other streams wait for.
        return await asyncio.shield(future)

    def _track(self, minibatch: AdmittedMiniBatch, group: str, future: asyncio.Future[MiniBatchDispatch]) -> None:
        key = (minibatch.sequence, group)
        if future.done():
            self._settle(key, minibatch, group, future)
            return
        self._making[key] = future
        future.add_done_callback(lambda done: self._settle(key, minibatch, group, done))

    def _settle(self, key: tuple[int, str], minibatch: AdmittedMiniBatch, group: str,
                future: asyncio.Future[MiniBatchDispatch]) -> None:
        if self._making.get(key) is future:
            del self._making[key]
        if future.cancelled() or future.exception() is not None:
            return  # the streams that waited report it; the next one to ask plans again
        if not minibatch.released and self._ledger.planned(minibatch, group) is None:
            minibatch.keep_dispatch(group, future.result())


def _retrieve(future: asyncio.Future) -> None:
    """Mark a plan's error as seen: the streams that awaited it report it, and none may have."""
    if not future.cancelled() and future.exception() is not None:
        logger.debug("planning a mini-batch failed", exc_info=future.exception())
