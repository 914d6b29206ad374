"""The metrics the dashboard and the alert rules query, and those docs/metrics.md catalogues, are exported by
running services: the dev overlay's admission service after real traffic, and the trainer-job example's reorg
sidecar (see tests/deploy/conftest.py and live_services.py)."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from knittrans.admission.service.metrics import STALENESS_BUCKETS
from tests.deploy.live_services import LiveStack
from tests.deploy.promql_refs import (
    PROMETHEUS_SERIES,
    catalogued_families,
    dashboard_queries,
    exposed_series,
    referenced_series,
    rule_queries,
)
from tests.deploy.tools import DASHBOARD, METRICS_DOC, RULES

# Which part of the catalogue each live process must export series for. The sidecar serves gRPC too, but only
# the admission service got traffic that produces every rpc series (errors included).
PREFIXES = {
    "admission": ("knittrans_admission_", "knittrans_rpc_"),
    "reorg": ("knittrans_reorg_",),
}


@dataclass(frozen=True, kw_only=True)
class Exposition:
    """What one /metrics page holds: series names, and family name -> type as the parser reads them."""

    series: frozenset[str]
    families: Mapping[str, str]
    text: str

    @classmethod
    def parse(cls, text: str) -> Exposition:
        parsed = list(text_string_to_metric_families(text))
        names = {family.name for family in parsed}
        # prometheus_client adds a `<family>_created` timestamp to counters and histograms; the text format
        # cannot say so, so the parser reads it as a family of its own.
        families = [f for f in parsed if not (f.name.endswith("_created") and f.name.removesuffix("_created") in names)]
        return cls(
            series=frozenset(sample.name for family in families for sample in family.samples),
            families={family.name: family.type for family in families},
            text=text,
        )

    def value(self, name: str, **labels: str) -> float:
        for family in text_string_to_metric_families(self.text):
            for sample in family.samples:
                if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                    return sample.value
        raise KeyError(f"no sample {name}{labels}")


@pytest.fixture(scope="module")
def expositions(live_stack: LiveStack) -> dict[str, Exposition]:
    return {
        "admission": Exposition.parse(live_stack.admission_metrics()),
        "reorg": Exposition.parse(live_stack.reorg_metrics),
    }


def queried_series() -> dict[str, set[str]]:
    queries = dashboard_queries(json.loads(DASHBOARD.read_text())) + rule_queries(yaml.safe_load(RULES.read_text()))
    return referenced_series(queries)


def catalogued(process: str) -> dict[str, str]:
    """Family -> type of the catalogue's metrics that ``process`` exports."""
    families = catalogued_families(METRICS_DOC.read_text())
    return {name: kind for name, kind in families.items() if name.startswith(PREFIXES[process])}


def parsed_family_name(name: str, kind: str) -> str:
    """The Python parser reports a counter family without its ``_total`` suffix."""
    return name.removesuffix("_total") if kind == "counter" else name


def test_every_series_the_dashboard_and_rules_query_is_exported_live(expositions: dict[str, Exposition]) -> None:
    exported = PROMETHEUS_SERIES.union(*(e.series for e in expositions.values()))
    missing = {name: sorted(places) for name, places in queried_series().items() if name not in exported}
    assert not missing, f"queried but not exported by the live services: {missing}"


def test_the_queries_cover_both_processes() -> None:
    """The comparison above is not vacuous: dashboard and rules query admission, rpc and reorg series."""
    names = queried_series()
    for prefixes in PREFIXES.values():
        for prefix in prefixes:
            assert any(name.startswith(prefix) for name in names), prefix


@pytest.mark.parametrize("process", sorted(PREFIXES))
def test_every_catalogued_metric_is_exported_with_its_type(process: str, expositions: dict[str, Exposition]) -> None:
    exposition = expositions[process]
    families = catalogued(process)
    assert families
    missing = sorted(set(exposed_series(families)) - exposition.series)
    assert not missing, f"catalogued in docs/metrics.md but not exported by the {process} process: {missing}"
    wrong_type = {
        name: (kind, exposition.families.get(parsed_family_name(name, kind)))
        for name, kind in families.items()
        if exposition.families.get(parsed_family_name(name, kind)) != kind
    }
    assert not wrong_type, f"type in docs/metrics.md vs exported: {wrong_type}"


@pytest.mark.parametrize("process", sorted(PREFIXES))
def test_every_exported_knittrans_metric_is_catalogued(process: str, expositions: dict[str, Exposition]) -> None:
    """Nothing undocumented; the sidecar is a gRPC server too, so it exports the rpc families as well."""
    documented = {
        parsed_family_name(name, kind): kind for name, kind in catalogued_families(METRICS_DOC.read_text()).items()
    }
    exported = {name: kind for name, kind in expositions[process].families.items() if name.startswith("knittrans_")}
    undocumented = sorted(name for name in exported if name not in documented)
    assert not undocumented, f"exported by the {process} process but not in docs/metrics.md: {undocumented}"
    wrong_type = {name: (documented[name], kind) for name, kind in exported.items() if documented[name] != kind}
    assert not wrong_type, f"type in docs/metrics.md vs exported: {wrong_type}"


def test_the_traffic_shows_in_the_admission_metrics(live_stack: LiveStack, expositions: dict[str, Exposition]) -> None:
    """The live scrape reflects real work, not only pre-registered zeros."""
    admission = expositions["admission"]
    traffic = live_stack.traffic
    assert admission.value("knittrans_admission_reports_total", outcome="accepted") == traffic.accepted > 0
    assert admission.value("knittrans_admission_dropped_total", reason="stale") == traffic.dropped_stale == 1
    assert admission.value("knittrans_admission_admitted_minibatches_total") >= 1
    assert admission.value("knittrans_admission_staleness_versions_count") == traffic.admitted_trajectories
    assert admission.value("knittrans_admission_staleness_bound_versions") == 1
    assert admission.value("knittrans_rpc_errors_total", method="ReportTrajectories", code="INVALID_ARGUMENT") == 1
    assert traffic.released_minibatches == 1
    # The service deletes a released mini-batch's units in the background, after the release: scrape again.
    deadline = time.monotonic() + 30
    deleted = admission.value("knittrans_admission_released_units_total")
    while deleted == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
        deleted = Exposition.parse(live_stack.admission_metrics()).value("knittrans_admission_released_units_total")
    assert deleted > 0


def test_staleness_buckets_are_the_integer_bounds(expositions: dict[str, Exposition]) -> None:
    text = expositions["admission"].text
    bounds = [
        sample.labels["le"]
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "knittrans_admission_staleness_versions_bucket"
    ]
    assert bounds == [f"{float(b)}" for b in STALENESS_BUCKETS] + ["+Inf"]
    assert [float(b) for b in bounds[:17]] == list(range(17))
