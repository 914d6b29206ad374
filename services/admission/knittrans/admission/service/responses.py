"""The admission service's RPC responses, built from what the ledger holds and what a call did; nothing here
changes state."""

from __future__ import annotations

from collections.abc import Sequence

from knittrans.admission.engine.decisions import BlockingReason
from knittrans.admission.service.ingest.report import CONFLICT, Classified
from knittrans.admission.service.ledger import AdmissionLedger, Verdict
from knittrans.admission.service.records import blocking_to_proto
from knittrans.types import ConsumerId
from knittrans.v1 import admission_service_pb2 as pb
from knittrans.wire import consumer_to_proto

_CONFLICT_REASON = "a different trajectory with this id was already acknowledged"
_VERDICTS = {Verdict.PENDING: pb.MINI_BATCH_VERDICT_PENDING, Verdict.OK: pb.MINI_BATCH_VERDICT_OK,
             Verdict.FAILED: pb.MINI_BATCH_VERDICT_FAILED}


def outcome_counts(report: Classified) -> dict[int, int]:
    """How many of the report's trajectories got each outcome."""
    counts: dict[int, int] = {}
    for outcome in report.outcomes:
        counts[outcome] = counts.get(outcome, 0) + 1
    return counts


def report_response(report: Classified) -> pb.ReportTrajectoriesResponse:
    """Per trajectory its outcome: results for a report of messages; outcomes and conflicts for a batch."""
    ids = report.columns.trajectory_ids
    outcomes = report.outcomes
    if report.batch is None:
        return pb.ReportTrajectoriesResponse(results=[
            {"trajectory_id": trajectory_id, "outcome": outcome,
             "reason": _CONFLICT_REASON if outcome == CONFLICT else ""}
            for trajectory_id, outcome in zip(ids, outcomes, strict=True)
        ])
    conflicts = [
        {"trajectory_id": ids[i], "outcome": outcome, "reason": _CONFLICT_REASON}
        for i, outcome in enumerate(outcomes) if outcome == CONFLICT
    ] if CONFLICT in outcomes else []
    return pb.ReportTrajectoriesResponse(outcomes=outcomes, conflicts=conflicts)


def verdict_response(
    verdict: Verdict, failure: pb.ConsumerFailure | None, unverified: Sequence[ConsumerId]
) -> pb.WaitMiniBatchVerdictResponse:
    """The verdict, the failure that decided a FAILED one, and who has yet to verify a PENDING one."""
    waiting_for = [consumer_to_proto(c) for c in unverified] if verdict is Verdict.PENDING else []
    return pb.WaitMiniBatchVerdictResponse(verdict=_VERDICTS[verdict], failure=failure, waiting_for=waiting_for)


def status_response(ledger: AdmissionLedger, *, failure: str, now: float) -> pb.GetStatusResponse:
    """The engine's progress and the service's counters; ``failure`` is why admission stopped, if it did."""
    status = ledger.engine.status()
    reason, detail, since = ledger.blocking()
    if failure:
        detail = f"admission stopped: {failure}"
    blocked = 0.0 if since is None or reason is BlockingReason.NONE else max(0.0, now - since)
    return pb.GetStatusResponse(
        sources=[
            pb.SourceStatus(source=s.source, pool=s.ready, admitted=s.admitted, quota=s.quota,
                            target=s.target, slack=s.slack)
            for s in status.sources
        ],
        train_batch_index=status.train_batch_index,
        minibatch_index=status.minibatches_admitted,
        num_minibatches=status.num_minibatches,
        policy_version=ledger.version,
        blocking_reason=blocking_to_proto(reason),
        blocking_detail=detail,
        blocked_seconds=blocked,
        pool_size=status.pool_size,
        admitted_total=ledger.admitted_total,
        dropped_stale=ledger.dropped_stale,
        released_minibatches=ledger.released_minibatches,
        failed_minibatches=len(ledger.failed_sequences),
        recent_failures=list(ledger.recent_failures),
    )
