"""The Grafana dashboard is well formed, shows what the issue asks for, and ships in a ConfigMap."""

from __future__ import annotations

import json

import pytest

from tests.deploy.k8s_objects import only
from tests.deploy.promql_refs import dashboard_queries, metric_names_in_promql
from tests.deploy.tools import DASHBOARD, render

# Each view the issue asks for, and the series whose presence shows it is on the dashboard.
REQUIRED_VIEWS = {
    "admission timeline": {"knittrans_admission_blocking", "knittrans_admission_admitted_minibatches_total"},
    "pool per source against the quotas": {"knittrans_admission_pool_trajectories", "knittrans_admission_quota_target"},
    "staleness": {"knittrans_admission_staleness_versions_bucket", "knittrans_admission_staleness_bound_versions"},
    "bytes read against bytes needed": {"knittrans_reorg_bytes_read_total", "knittrans_reorg_bytes_needed_total"},
    "exposed wait": {"knittrans_reorg_trainer_wait_seconds_bucket"},
    "RPC latency": {"knittrans_rpc_latency_seconds_bucket"},
}


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def panels(dashboard: dict) -> list[dict]:
    return [p for p in dashboard["panels"] if p["type"] != "row"]


def test_dashboard_has_identity_and_a_prometheus_datasource_variable(dashboard: dict) -> None:
    assert dashboard["uid"] and dashboard["title"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"


def test_panel_ids_are_unique_and_panels_tile_without_overlap(dashboard: dict) -> None:
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    occupied: set[tuple[int, int]] = set()
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert 0 <= grid["x"] and grid["x"] + grid["w"] <= 24, panel["title"]
        cells = {
            (x, y) for x in range(grid["x"], grid["x"] + grid["w"]) for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not cells & occupied, f"panel {panel['title']!r} overlaps another"
        occupied |= cells


def test_every_panel_queries_prometheus_through_the_datasource_variable(dashboard: dict) -> None:
    for panel in panels(dashboard):
        assert panel["title"] and panel.get("description"), panel["id"]
        assert panel["targets"], panel["title"]
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
            assert metric_names_in_promql(target["expr"]), f"{panel['title']}: {target['expr']}"


def test_dashboard_shows_every_required_view(dashboard: dict) -> None:
    queried = set().union(*(metric_names_in_promql(q.expr) for q in dashboard_queries(dashboard)))
    missing = {view: series - queried for view, series in REQUIRED_VIEWS.items() if series - queried}
    assert not missing, missing


@pytest.mark.parametrize("overlay", ["overlays/dev", "overlays/prod"])
def test_dashboard_ships_in_a_config_map_for_the_grafana_sidecar(overlay: str) -> None:
    config_map = only(render(overlay), "ConfigMap", "knittrans-grafana-dashboard")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["data"]["knittrans.json"] == DASHBOARD.read_text()
