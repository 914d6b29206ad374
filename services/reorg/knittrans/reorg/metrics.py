"""The reorg sidecar's Prometheus metrics (names and meanings in docs/metrics.md). ``role`` is the sidecar's
consumer role (``backbone`` or ``encoder:<name>``): one value per process, bounded by the topology."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_SECONDS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class ReorgMetrics:
    def __init__(self, registry: CollectorRegistry, *, role: str) -> None:
        self.bytes_read = Counter(
            "knittrans_reorg_bytes_read", "Bytes read from the unit store.", ["role"], registry=registry
        ).labels(role=role)
        self.bytes_needed = Counter(
            "knittrans_reorg_bytes_needed",
            "Bytes the plan needed (look-ahead included); equals bytes read when nothing is over-read.",
            ["role"], registry=registry,
        ).labels(role=role)
        self.read_seconds = Histogram(
            "knittrans_reorg_read_seconds", "Time to read one micro-batch's units.", ["role"],
            buckets=_SECONDS_BUCKETS, registry=registry,
        ).labels(role=role)
        self.pack_seconds = Histogram(
            "knittrans_reorg_pack_seconds", "Time to pack one micro-batch.", ["role"],
            buckets=_SECONDS_BUCKETS, registry=registry,
        ).labels(role=role)
        self.slots_occupied = Gauge(
            "knittrans_reorg_slots_occupied", "Shared-memory ring slots holding a published micro-batch.", ["role"],
            registry=registry,
        ).labels(role=role)
        self.slots = Gauge("knittrans_reorg_slots", "Ring size K.", ["role"], registry=registry).labels(role=role)
        self.trainer_wait_seconds = Histogram(
            "knittrans_reorg_trainer_wait_seconds",
            "Exposed latency: how long a trainer rank waited for its next micro-batch.", ["role"],
            buckets=_SECONDS_BUCKETS, registry=registry,
        ).labels(role=role)
        self.published = Counter(
            "knittrans_reorg_microbatches_published", "Micro-batches published into the ring.", ["role"],
            registry=registry,
        ).labels(role=role)
        self.verdict_wait_seconds = Histogram(
            "knittrans_reorg_verdict_wait_seconds",
            "How long publishing a mini-batch waited for its verification and the admission service's verdict.",
            ["role"], buckets=_SECONDS_BUCKETS, registry=registry,
        ).labels(role=role)
        self.failed_minibatches = Counter(
            "knittrans_reorg_failed_minibatches",
            "Mini-batches this sidecar could not read or pack (it published a failure and skipped them).", ["role"],
            registry=registry,
        ).labels(role=role)
