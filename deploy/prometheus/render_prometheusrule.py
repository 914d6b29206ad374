"""Write deploy/k8s/base/monitoring/prometheusrule.yaml: the groups of rules.yaml in a PrometheusRule.

rules.yaml stays the source of truth because promtool reads only plain rule files; a test fails when the
PrometheusRule has drifted from it. Run from anywhere: ``python deploy/prometheus/render_prometheusrule.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
RULES = HERE / "rules.yaml"
PROMETHEUS_RULE = HERE.parent / "k8s" / "base" / "monitoring" / "prometheusrule.yaml"
HEADER = (
    "# Generated from deploy/prometheus/rules.yaml by deploy/prometheus/render_prometheusrule.py; do not edit.\n"
    "# Add the label your Prometheus selects rules by (kube-prometheus-stack: `release: <helm release>`)\n"
    "# in an overlay.\n"
)


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings as literal blocks, long ones folded, sequences indented: it reads like the source."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    if "\n" in value:
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|")
    if len(value) > 80:
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=">")
    return dumper.represent_scalar("tag:yaml.org,2002:str", value)


_BlockDumper.add_representer(str, _represent_str)


def prometheus_rule(rules: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "knittrans",
            "labels": {"app.kubernetes.io/name": "knittrans", "app.kubernetes.io/component": "monitoring"},
        },
        "spec": {"groups": rules["groups"]},
    }


def render() -> str:
    rules = yaml.safe_load(RULES.read_text())
    body = yaml.dump(prometheus_rule(rules), Dumper=_BlockDumper, sort_keys=False, width=100, indent=2)
    return HEADER + body


def main() -> int:
    PROMETHEUS_RULE.write_text(render())
    print(f"wrote {PROMETHEUS_RULE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
