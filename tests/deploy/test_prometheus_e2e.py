"""A real Prometheus server (Debian's `prometheus`) scrapes the live admission service, answers a PromQL query
with a KnitTrans metric, and loads and evaluates the repository's alert rules."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from tests.deploy.live_services import LiveStack, Process, free_loopback_port, spawn
from tests.deploy.tools import RULES, system_tool

FIRST_SCRAPE_DEADLINE_S = 15.0
START_ATTEMPTS = 3  # a free port can be taken by someone else before Prometheus binds it
# The labels a Kubernetes scrape attaches, which the rules aggregate and join on.
TARGET_LABELS = {"namespace": "knittrans-dev", "pod": "knittrans-admission-0"}

T = TypeVar("T")


@dataclass
class PrometheusServer:
    process: Process
    url: str

    def get(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}{path}{query}", timeout=5) as response:
            body = json.loads(response.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.get("/api/v1/query", query=expr)
        assert data["resultType"] == "vector", data
        return data["result"]


def poll(what: str, attempt: Callable[[], T | None], server: PrometheusServer) -> T:
    """Retry until ``attempt`` returns a value; fail after the first-scrape deadline."""
    deadline = time.monotonic() + FIRST_SCRAPE_DEADLINE_S
    while True:
        result = attempt()
        if result is not None:
            return result
        if not server.process.alive():
            raise AssertionError(f"prometheus exited:\n{server.process.tail()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {FIRST_SCRAPE_DEADLINE_S:.0f} s:\n{server.process.tail()}")
        time.sleep(0.2)


def write_config(directory: Path, metrics_port: int) -> Path:
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [
            {
                "job_name": "knittrans-admission",
                "static_configs": [{"targets": [f"127.0.0.1:{metrics_port}"], "labels": TARGET_LABELS}],
            }
        ],
    }
    path = directory / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def ready(server: PrometheusServer) -> bool | None:
    try:
        with urllib.request.urlopen(f"{server.url}/-/ready", timeout=2) as response:
            return True if response.status == 200 else None
    except (urllib.error.URLError, ConnectionError):
        return None


@pytest.fixture(scope="module")
def prometheus(live_stack: LiveStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    binary = system_tool("prometheus")
    directory = tmp_path_factory.mktemp("prometheus")
    config = write_config(directory, live_stack.admission.metrics_port)
    for attempt in range(START_ATTEMPTS):
        port = free_loopback_port()
        process = spawn(
            f"prometheus-{attempt}",
            [
                binary, f"--config.file={config}", f"--storage.tsdb.path={directory / f'data-{attempt}'}",
                f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn",
            ],
            env={"PATH": "/usr/bin:/bin"},
            directory=directory,
        )
        server = PrometheusServer(process=process, url=f"http://127.0.0.1:{port}")
        try:
            poll("ready Prometheus", lambda server=server: ready(server), server)
        except AssertionError:
            process.stop()
            if "address already in use" in process.tail() and attempt + 1 < START_ATTEMPTS:
                continue
            raise
        try:
            yield server
        finally:
            process.stop()
        return


def test_prometheus_scrapes_the_admission_service_and_answers_promql(
    prometheus: PrometheusServer, live_stack: LiveStack
) -> None:
    expr = 'knittrans_admission_reports_total{job="knittrans-admission", outcome="accepted"}'
    result = poll("sample of knittrans_admission_reports_total", lambda: prometheus.query(expr) or None, prometheus)
    (sample,) = result
    assert sample["metric"]["__name__"] == "knittrans_admission_reports_total"
    assert {k: sample["metric"][k] for k in TARGET_LABELS} == TARGET_LABELS
    assert float(sample["value"][1]) == live_stack.traffic.accepted
    (up,) = prometheus.query('up{job="knittrans-admission"}')
    assert up["value"][1] == "1"
    (target,) = prometheus.get("/api/v1/targets", state="active")["activeTargets"]
    assert target["health"] == "up", target


def test_prometheus_loads_and_evaluates_the_alert_rules(prometheus: PrometheusServer) -> None:
    expected = {
        group["name"]: {rule["alert"] for rule in group["rules"]}
        for group in yaml.safe_load(RULES.read_text())["groups"]
    }

    def evaluated_groups() -> list[dict[str, Any]] | None:
        groups = prometheus.get("/api/v1/rules", type="alert")["groups"]
        evaluated = all(rule["health"] != "unknown" for group in groups for rule in group["rules"])
        return groups if groups and evaluated else None

    groups = poll("evaluation of every alert rule", evaluated_groups, prometheus)
    assert {g["name"]: {r["name"] for r in g["rules"]} for g in groups} == expected
    assert {g["file"] for g in groups} == {str(RULES)}
    failing = {r["name"]: r.get("lastError") for g in groups for r in g["rules"] if r["health"] != "ok"}
    assert not failing, f"rules that fail to evaluate against the live series: {failing}"
    # Nothing is wrong with the live service, so nothing fires; Down alerts for absent jobs match nothing.
    firing = prometheus.query('ALERTS{alertstate="firing"}')
    assert not firing, firing
