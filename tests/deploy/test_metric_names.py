"""Every metric the dashboard and the alert rules query is one that docs/metrics.md catalogues.

The live comparison (scraping running services) reuses the helpers of tests/deploy/promql_refs.py.
"""

from __future__ import annotations

import json

import pytest
import yaml

from tests.deploy.promql_refs import (
    PROMETHEUS_SERIES,
    Query,
    catalogued_families,
    dashboard_queries,
    exposed_series,
    metric_names_in_promql,
    referenced_series,
    rule_queries,
)
from tests.deploy.tools import DASHBOARD, METRICS_DOC, RULES


def catalogue() -> dict[str, str]:
    return exposed_series(catalogued_families(METRICS_DOC.read_text()))


def uncatalogued(queries: list[Query]) -> dict[str, set[str]]:
    known = catalogue().keys() | PROMETHEUS_SERIES
    return {name: places for name, places in referenced_series(queries).items() if name not in known}


def test_dashboard_queries_only_catalogued_metrics() -> None:
    queries = dashboard_queries(json.loads(DASHBOARD.read_text()))
    assert len(queries) > 10
    assert not uncatalogued(queries)


def test_alert_rules_query_only_catalogued_metrics() -> None:
    queries = rule_queries(yaml.safe_load(RULES.read_text()))
    assert queries
    assert not uncatalogued(queries)


def test_an_uncatalogued_or_bare_histogram_name_is_reported() -> None:
    queries = [
        Query(where="typo", expr="rate(knittrans_admission_report_total[5m])"),
        Query(where="bare histogram", expr="knittrans_admission_wait_seconds > 1"),
        Query(where="fine", expr="rate(knittrans_admission_wait_seconds_count[5m])"),
    ]
    assert uncatalogued(queries) == {
        "knittrans_admission_report_total": {"typo"},
        "knittrans_admission_wait_seconds": {"bare histogram"},
    }


def test_catalogue_parses_every_table_row() -> None:
    families = catalogued_families(METRICS_DOC.read_text())
    assert families["knittrans_admission_blocking"] == "gauge"
    assert families["knittrans_admission_reports_total"] == "counter"
    assert families["knittrans_rpc_latency_seconds"] == "histogram"
    rows = [line for line in METRICS_DOC.read_text().splitlines() if line.startswith("| `knittrans_")]
    assert len(families) == len(rows)
    series = exposed_series(families)
    assert series["knittrans_rpc_latency_seconds_bucket"] == "knittrans_rpc_latency_seconds"
    assert "knittrans_rpc_latency_seconds" not in series


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        (
            'sum by (reason) (knittrans_admission_blocking{reason!="none", job="x"}) == 1',
            {"knittrans_admission_blocking"},
        ),
        (
            "histogram_quantile(0.99, sum by (le) (rate(knittrans_rpc_latency_seconds_bucket[$__rate_interval])))",
            {"knittrans_rpc_latency_seconds_bucket"},
        ),
        ("a / on (pod) group_left () b offset 5m unless absent(up{job='j'})", {"a", "b", "up"}),
        ('max_over_time({__name__="c", le="1"}[1h:5m]) > bool -(d)', {"c", "d"}),
        ('label_replace(e, "dst", "$1", "src", "(.*)") and topk(3, f) or vector(1)', {"e", "f"}),
        ("sum(increase(g[$__range])) / sum(rate(h[${__rate_interval}]))", {"g", "h"}),
    ],
)
def test_metric_names_are_read_from_the_parsed_expression(expr: str, names: set[str]) -> None:
    assert metric_names_in_promql(expr) == names


def test_a_regex_name_matcher_is_rejected() -> None:
    with pytest.raises(ValueError, match="__name__"):
        metric_names_in_promql('{__name__=~"knittrans_.*"}')


def test_template_variable_queries_are_included() -> None:
    dashboard = {
        "panels": [],
        "templating": {
            "list": [
                {"type": "query", "name": "ns", "query": {"query": "label_values(knittrans_reorg_slots, namespace)"}},
                {"type": "query", "name": "any", "query": "label_values(namespace)"},
                {"type": "datasource", "name": "datasource", "query": "prometheus"},
            ]
        },
    }
    assert referenced_series(dashboard_queries(dashboard)) == {"knittrans_reorg_slots": {"variable ns"}}
