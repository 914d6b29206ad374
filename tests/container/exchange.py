"""A short report → assignment exchange with an admission service running the dev overlay's job."""

from __future__ import annotations

import urllib.request
from collections import Counter
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from knittrans.client.admission import AdmissionClient, ReportOutcome
from knittrans.client.connection import ConnectionSettings
from knittrans.client.model import Assignment
from knittrans.types import ConsumerId
from tests.integration.admission.builders import make_meta

# The dev overlay's example job: two sources, 256 trajectories a train batch in 4 mini-batches of 64.
DEV_SOURCES = ("math", "code")
REPORTED = 128


@dataclass(frozen=True, kw_only=True)
class Exchange:
    reported: frozenset[str]
    accepted: int
    admitted_total: int
    first_assignments: dict[ConsumerId, Assignment]

    def trained_per_trajectory(self) -> Counter[str]:
        """How many backbone consumers were given each trajectory of the first mini-batch to train."""
        return Counter(
            item.trajectory.trajectory_id
            for assignment in self.first_assignments.values()
            for microbatch in assignment.assignment.microbatches
            for item in microbatch.items
        )


def report_and_watch(address: str, token: str) -> Exchange:
    """Report trajectories from both sources, then read every backbone DP rank's first assignment."""
    with AdmissionClient(ConnectionSettings(target=address, token=token)) as client:
        metas = [make_meta(i, source=DEV_SOURCES[i % 2]) for i in range(REPORTED)]
        results = client.report(metas)
        accepted = sum(r.outcome is ReportOutcome.ACCEPTED for r in results)
        admitted_total = client.status().admitted_total
        first_rank = ConsumerId(role="backbone", dp_rank=0, cp_rank=0)
        backbone = client.register_consumer(first_rank).topology.backbone
        consumers = [
            ConsumerId(role="backbone", dp_rank=d, cp_rank=c) for d in range(backbone.dp) for c in range(backbone.cp)
        ]
        first_assignments = {}
        for consumer in consumers:
            client.register_consumer(consumer)
            first_assignments[consumer] = next(client.watch_assignments(consumer))
    return Exchange(
        reported=frozenset(m.trajectory_id for m in metas),
        accepted=accepted,
        admitted_total=admitted_total,
        first_assignments=first_assignments,
    )


def scrape(address: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a /metrics page, keyed by name and sorted labels."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
