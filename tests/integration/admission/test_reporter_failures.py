"""The batching reporter's sender thread meets an error that is not the service's answer: its admission client
was closed under it, or the client raised what no client should. The reports it was sending were not
acknowledged, so the next call must raise, as for any failed report: not hang (the first case did, the thread
dead), not return as if they were acknowledged (the second did), and the thread must go on with what comes
next. A call on a closed admission client raises FailedPrecondition, not grpc's ValueError."""

from __future__ import annotations

import asyncio
import threading
import uuid
from pathlib import Path

import numpy as np
import pytest

from knittrans.admission.service.app import start_admission_service
from knittrans.client.admission import AdmissionClient
from knittrans.client.aio import AsyncAdmissionClient
from knittrans.client.reporter import BatchingReporter
from knittrans.errors import FailedPrecondition, KnitTransError
from knittrans.rollout import RolloutClient
from knittrans.store.factory import open_store
from knittrans.types import VersionSegment

from .builders import service_settings


def submit(rollout: RolloutClient, name: str) -> None:
    rollout.submit({"input_ids": np.arange(16, dtype=np.int32)}, trajectory_id=name, sample_id=name, source="A",
                   rollout_step=0, segments=(VersionSegment(version=0, num_tokens=16),), loss_mask_field=None)


def within(seconds: float, call) -> BaseException | None:
    """What ``call()`` raised (None: it returned), failing the test if it has not ended after ``seconds``."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
            outcome.append(None)
        except BaseException as error:
            outcome.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=seconds)
    assert outcome, f"still waiting after {seconds} s"
    return outcome[0]


@pytest.mark.parametrize("accepted_before", [False, True], ids=["first-report", "later-report"])
async def test_a_reporter_whose_client_was_closed_raises_at_the_next_call_instead_of_hanging(
        tmp_path: Path, accepted_before: bool) -> None:
    running = await start_admission_service(service_settings(store=f"file://{tmp_path / 'units'}",
                                                             job=f"t{uuid.uuid4().hex[:6]}"))

    def scenario() -> None:
        store = open_store(f"file://{tmp_path / 'units'}")
        client = AdmissionClient(running.address)
        reporter = BatchingReporter(client)
        rollout = RolloutClient(store, namespace="job", reporter=reporter)
        if accepted_before:
            submit(rollout, "t0")  # waits for the first answer
            reporter.flush()
        client.close()
        error = within(30, lambda: (submit(rollout, "t1"), reporter.flush()))
        assert isinstance(error, KnitTransError), error
        assert "closed" in str(error)
        # The sender thread is still there: what comes next fails the same way, never hangs.
        error = within(30, lambda: (submit(rollout, "t2"), reporter.flush()))
        assert isinstance(error, KnitTransError), error
        assert within(30, reporter.close) is None  # both failures were raised already: nothing is left to wait for
        store.close()

    try:
        await asyncio.to_thread(scenario)
    finally:
        await running.stop(0)


class FailsOnce(AdmissionClient):
    """A real client whose next report raises an error no client should raise (a bug's stand-in), once."""

    fail_next = False

    def report(self, *args, **kwargs):
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("injected fault")
        return super().report(*args, **kwargs)


async def test_an_unexpected_error_in_the_sender_thread_is_raised_at_the_next_call_and_the_thread_goes_on(
        tmp_path: Path) -> None:
    running = await start_admission_service(service_settings(store=f"file://{tmp_path / 'units'}",
                                                             job=f"t{uuid.uuid4().hex[:6]}"))

    def scenario() -> None:
        store = open_store(f"file://{tmp_path / 'units'}")
        with FailsOnce(running.address) as client:
            reporter = BatchingReporter(client)
            rollout = RolloutClient(store, namespace="job", reporter=reporter)
            submit(rollout, "t0")
            client.fail_next = True
            error = within(10, lambda: (submit(rollout, "t1"), reporter.flush()))
            assert isinstance(error, KnitTransError) and "injected fault" in str(error), error
            assert within(10, lambda: (submit(rollout, "t2"), reporter.flush())) is None
            assert within(10, reporter.close) is None
            status = client.status()
            assert status.pool_size + status.admitted_total == 2  # t0 and t2; t1's report never reached it
        store.close()

    try:
        await asyncio.to_thread(scenario)
    finally:
        await running.stop(0)


async def test_a_call_on_a_closed_client_raises_failed_precondition_in_both_clients(tmp_path: Path) -> None:
    running = await start_admission_service(service_settings(store=f"file://{tmp_path / 'units'}",
                                                             job=f"t{uuid.uuid4().hex[:6]}"))
    try:
        aio_client = AsyncAdmissionClient(running.address)
        assert (await aio_client.status()).pool_size == 0
        await aio_client.close()
        with pytest.raises(FailedPrecondition, match="closed") as failure:
            await aio_client.status()
        assert failure.value.field == "client"

        def blocking() -> None:
            client = AdmissionClient(running.address)
            client.status()
            client.close()
            with pytest.raises(FailedPrecondition, match="closed"):
                client.status()

        await asyncio.to_thread(blocking)
    finally:
        await running.stop(0)
