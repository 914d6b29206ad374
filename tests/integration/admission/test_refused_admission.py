"""An admission that the engine's own state refuses is never journaled (DESIGN.md §3: the state checks every
decision it applies). The service journals each decision before applying it, so a refused one in the journal
would fail every restart's replay. The engine bug is injected (the guard's forced picks take one unit more than
the mini-batch holds, as a real bug once did after a relaxed mini-batch); everything else is real: the service
on port 0, its Redis journal, a restart on the same journal."""

from __future__ import annotations

import asyncio
import dataclasses
import importlib

import pytest

from knittrans.admission.engine.guard import plan_forced_picks
from knittrans.admission.service.app import start_admission_service
from knittrans.client.admission import AdmissionClient, ReportOutcome
from knittrans.launch.redis import start_redis

from .builders import make_meta, service_settings
from .test_journal_outages import journal_admissions

JOB = "refused"
# The package exports the function ``decide`` under the module's name: reach the module itself.
DECIDE_MODULE = importlib.import_module("knittrans.admission.engine.decide")


def over_picking(**arguments):  # type: ignore[no-untyped-def]
    """The real forced picks, topped up from the pool to one unit more than the mini-batch holds."""
    picks, _ = plan_forced_picks(**arguments)
    extra = arguments["size"] + 1 - sum(picks)
    for index, available in enumerate(arguments["available"]):
        taken = min(extra, available - picks[index])
        picks[index] += taken
        extra -= taken
    return picks, 0


async def test_a_refused_admission_stops_admission_unjournaled_and_a_restart_admits_what_was_acknowledged(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    redis_server = start_redis(tmp_path / "redis")
    try:
        settings = service_settings(state=redis_server.url, job=JOB)
        metas = [make_meta(i, source="AB"[i % 2]) for i in range(8)]
        monkeypatch.setattr(DECIDE_MODULE, "plan_forced_picks", over_picking)
        running = await start_admission_service(settings)
        try:
            def report() -> tuple[list[ReportOutcome], object]:
                with AdmissionClient(running.address) as client:
                    outcomes = [r.outcome for r in client.report(metas)]
                    return outcomes, client.status()

            outcomes, status = await asyncio.to_thread(report)
            assert outcomes == [ReportOutcome.ACCEPTED] * 8  # acknowledged, whatever admission does
            assert status.admitted_total == 0 and status.pool_size == 8
            assert "refuses the engine's admission of mini-batch 1" in status.blocking_detail
            assert journal_admissions(redis_server.url, JOB) == []
        finally:
            await running.stop(0)

        monkeypatch.undo()  # the engine fixed; the journal as the first service left it
        restarted = await start_admission_service(dataclasses.replace(settings))
        try:
            def status_after_restart():  # type: ignore[no-untyped-def]
                with AdmissionClient(restarted.address) as client:
                    return client.status()

            status = await asyncio.to_thread(status_after_restart)
            assert status.admitted_total == 8 and status.pool_size == 0
            assert "refuses" not in status.blocking_detail
            assert len(journal_admissions(redis_server.url, JOB)) == 2
        finally:
            await restarted.stop(0)
    finally:
        redis_server.stop()
