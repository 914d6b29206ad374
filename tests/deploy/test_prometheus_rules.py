"""The alert rules pass promtool, their unit tests fire every alert, and the PrometheusRule carries them."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import yaml

from knittrans.admission.service.metrics import STALENESS_BUCKETS
from tests.deploy.k8s_objects import only
from tests.deploy.tools import (
    DEPLOY_DOC,
    PROMETHEUS,
    PROMETHEUS_RULE,
    RULES,
    RULES_TEST,
    load_script,
    render,
    run,
    system_tool,
)

# The five conditions, each with the alert that covers it.
REQUIRED_ALERTS = {
    "admission blocked too long, with the reason": "KnitTransAdmissionBlockedTooLong",
    "a quota violated": "KnitTransQuotaViolated",
    "admitted staleness above the bound": "KnitTransAdmittedStalenessAboveBound",
    "a sidecar's exposed wait too high": "KnitTransSidecarExposedWaitHigh",
    "the admission service down": "KnitTransAdmissionDown",
    "a sidecar down": "KnitTransReorgSidecarDown",
}


def alerts() -> dict[str, dict]:
    rules = yaml.safe_load(RULES.read_text())
    return {rule["alert"]: rule for group in rules["groups"] for rule in group["rules"] if "alert" in rule}


def heading_anchors(markdown: str) -> set[str]:
    """GitHub's anchors for the headings of a Markdown file."""
    anchors = set()
    for line in markdown.splitlines():
        if match := re.match(r"^#{1,6}\s+(.*)$", line):
            text = re.sub(r"[^\w\- ]", "", match.group(1).strip().lower())
            anchors.add(text.replace(" ", "-"))
    return anchors


def test_promtool_check_rules_passes() -> None:
    result = run([system_tool("promtool"), "check", "rules", RULES])
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_unit_tests_pass() -> None:
    result = run([system_tool("promtool"), "test", "rules", RULES_TEST])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_unit_tests_catch_a_changed_threshold(tmp_path: Path) -> None:
    """The unit tests are sharp: raising the blocked-for threshold makes them fail."""
    shutil.copy(RULES_TEST, tmp_path / RULES_TEST.name)
    text = RULES.read_text()
    assert ") > 600" in text
    (tmp_path / RULES.name).write_text(text.replace(") > 600", ") > 6000"))
    result = run([system_tool("promtool"), "test", "rules", tmp_path / RULES_TEST.name])
    assert result.returncode != 0
    assert "KnitTransAdmissionBlockedTooLong" in result.stdout + result.stderr


def test_required_alerts_exist() -> None:
    missing = {need: name for need, name in REQUIRED_ALERTS.items() if name not in alerts()}
    assert not missing, missing


def test_every_alert_is_fired_by_a_unit_test() -> None:
    tests = yaml.safe_load(RULES_TEST.read_text())["tests"]
    fired = {case["alertname"] for test in tests for case in test.get("alert_rule_test", []) if case.get("exp_alerts")}
    assert set(alerts()) == fired


def test_blocked_alert_is_tested_with_its_reason_label() -> None:
    tests = yaml.safe_load(RULES_TEST.read_text())["tests"]
    expected = [
        alert["exp_labels"]
        for test in tests
        for case in test.get("alert_rule_test", [])
        if case["alertname"] == "KnitTransAdmissionBlockedTooLong"
        for alert in case.get("exp_alerts", [])
    ]
    assert expected and all("reason" in labels for labels in expected)


def test_every_alert_has_a_severity_summary_description_and_runbook_in_the_docs() -> None:
    anchors = heading_anchors(DEPLOY_DOC.read_text())
    for name, rule in alerts().items():
        assert rule["labels"]["severity"] in {"critical", "warning"}, name
        annotations = rule["annotations"]
        assert annotations["summary"] and annotations["description"], name
        document, _, anchor = annotations["runbook_url"].partition("#")
        assert document == "docs/deploy.md", name
        assert anchor == name.lower(), name
        assert anchor in anchors, f"docs/deploy.md has no section for {name}"


def test_prometheus_rule_is_rendered_from_the_rule_file() -> None:
    renderer = load_script(PROMETHEUS / "render_prometheusrule.py")
    assert PROMETHEUS_RULE.read_text() == renderer.render(), (
        "deploy/k8s/base/monitoring/prometheusrule.yaml is stale: run python deploy/prometheus/render_prometheusrule.py"
    )
    rendered = only(render("overlays/prod"), "PrometheusRule")
    assert rendered["spec"] == yaml.safe_load(RULES.read_text())


def test_staleness_unit_test_uses_the_services_integer_buckets() -> None:
    """The staleness alert is exact only with integer buckets; its unit test must use the real ones."""
    assert all(float(b).is_integer() for b in STALENESS_BUCKETS)
    assert set(range(17)) <= set(STALENESS_BUCKETS)
    pattern = re.compile(r'knittrans_admission_staleness_versions_bucket\{[^}]*le="([0-9.]+)"')
    cases = 0
    for test in yaml.safe_load(RULES_TEST.read_text())["tests"]:
        used = sorted({float(m.group(1)) for s in test["input_series"] if (m := pattern.search(s["series"]))})
        if not used:
            continue
        cases += 1
        # A unit test may leave out buckets below or above the ones its observations land in, never one
        # in between: the 1.0 quantile is the upper bound of the first bucket that holds every observation.
        assert used == [float(b) for b in STALENESS_BUCKETS if used[0] <= b <= used[-1]], test["name"]
    assert cases >= 2
