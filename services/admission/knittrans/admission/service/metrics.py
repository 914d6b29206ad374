"""The admission service's Prometheus metrics (names and labels as in docs/metrics.md).

Label values are bounded: sources come from the config, reasons and outcomes from closed enumerations.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from knittrans.admission.engine.decisions import BlockingReason, DropReason

if TYPE_CHECKING:  # the ledger imports the engine and the wire codecs; metrics only reads it
    from knittrans.admission.service.ledger import AdmissionLedger

WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
# Staleness is a whole number of versions. One bucket per integer up to 16 makes the 1.0 quantile the exact
# largest staleness, so the alert on admitted staleness above the bound is exact for any bound up to 16.
STALENESS_BUCKETS = (*range(17), 24, 32)
REPORT_OUTCOMES = ("accepted", "duplicate", "conflict", "invalid")


class AdmissionMetrics:
    def __init__(self, registry: CollectorRegistry, sources: Iterable[str]) -> None:
        self._violations_exported = 0  # the ledger's count already added to the quota-violation counter
        self.sources = tuple(sources)
        self.reports = Counter(
            "knittrans_admission_reports_total", "Trajectory reports received, by outcome.", ["outcome"],
            registry=registry,
        )
        self.pool = Gauge(
            "knittrans_admission_pool_trajectories", "Ready, accepted trajectories in the pool.", ["source"],
            registry=registry,
        )
        self.quota_target = Gauge(
            "knittrans_admission_quota_target", "Final quota of the source in the current train batch.", ["source"],
            registry=registry,
        )
        self.quota_slack = Gauge(
            "knittrans_admission_quota_slack", "Rollout-side count (pool + admitted) minus the final quota.",
            ["source"], registry=registry,
        )
        self.admitted_minibatches = Counter(
            "knittrans_admission_admitted_minibatches_total", "Mini-batches admitted.", registry=registry
        )
        self.admitted_trajectories = Counter(
            "knittrans_admission_admitted_trajectories_total", "Trajectories admitted.", ["source"], registry=registry
        )
        self.wait_seconds = Histogram(
            "knittrans_admission_wait_seconds", "Time from the previous admission (or train-batch start) to each.",
            registry=registry, buckets=WAIT_BUCKETS,
        )
        self.dropped = Counter(
            "knittrans_admission_dropped_total", "Trajectories dropped without admission.", ["reason"],
            registry=registry,
        )
        self.staleness = Histogram(
            "knittrans_admission_staleness_versions", "Staleness of admitted trajectories, in versions.",
            registry=registry, buckets=STALENESS_BUCKETS,
        )
        self.staleness_bound = Gauge(
            "knittrans_admission_staleness_bound_versions", "The configured staleness bound.", registry=registry
        )
        self.blocking = Gauge(
            "knittrans_admission_blocking", "1 for the current blocking reason, 0 for the others.", ["reason"],
            registry=registry,
        )
        self.blocked_seconds = Gauge(
            "knittrans_admission_blocked_seconds", "How long the current wait has lasted.", registry=registry
        )
        self.train_batch_index = Gauge(
            "knittrans_admission_train_batch_index", "Index of the train batch being admitted.", registry=registry
        )
        self.minibatch_index = Gauge(
            "knittrans_admission_minibatch_index", "Mini-batches admitted so far in this train batch.",
            registry=registry,
        )
        self.policy_version = Gauge(
            "knittrans_admission_policy_version", "The current policy version.", registry=registry
        )
        self.quota_violations = Counter(
            "knittrans_admission_quota_violations_total", "Train batches completed below a source quota.",
            registry=registry,
        )
        self.released_units = Counter(
            "knittrans_admission_released_units_total", "Units deleted from the store after release.",
            registry=registry,
        )
        self.failed_minibatches = Counter(
            "knittrans_admission_failed_minibatches_total",
            "Admitted mini-batches that a consumer could not read or pack (it skipped them).", registry=registry,
        )
        self.unfinished_step_seconds = Gauge(
            "knittrans_admission_unfinished_step_seconds",
            "Seconds since the first consumer reported its optimizer step on the oldest mini-batch that other "
            "consumers still owe theirs (0: none).", registry=registry,
        )
        for outcome in REPORT_OUTCOMES:
            self.reports.labels(outcome)
        for reason in DropReason:
            self.dropped.labels(reason.value)
        for source in self.sources:
            self.pool.labels(source)
            self.admitted_trajectories.labels(source)
        self.set_blocking(BlockingReason.NONE, 0.0)

    def set_blocking(self, reason: BlockingReason, seconds: float) -> None:
        for candidate in BlockingReason:
            self.blocking.labels(candidate.value).set(1.0 if candidate is reason else 0.0)
        self.blocked_seconds.set(seconds)

    def refresh(self, ledger: AdmissionLedger, *, now: float) -> None:
        """Export the ledger's state: the pool, quotas, what admission waits for, and new quota violations."""
        status = ledger.engine.status()
        for source in status.sources:
            self.pool.labels(source.source).set(source.ready)
            self.quota_target.labels(source.source).set(source.quota)
            self.quota_slack.labels(source.source).set(source.slack)
        reason, _, since = ledger.blocking()
        blocked = 0.0 if since is None or reason is BlockingReason.NONE else max(0.0, now - since)
        self.set_blocking(reason, blocked)
        self.train_batch_index.set(status.train_batch_index)
        self.minibatch_index.set(status.minibatches_admitted)
        self.policy_version.set(ledger.version)
        unfinished = ledger.unfinished_steps()
        first_step_at = unfinished[0].first_step_at if unfinished else None
        self.unfinished_step_seconds.set(0.0 if first_step_at is None else max(0.0, now - first_step_at))
        if ledger.quota_violations > self._violations_exported:
            self.quota_violations.inc(ledger.quota_violations - self._violations_exported)
            self._violations_exported = ledger.quota_violations
