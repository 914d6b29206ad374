"""Which metrics the Grafana dashboard and the alert rules query, and which ones docs/metrics.md catalogues.

Reusable by any test that compares metric names: the static check against the catalogue, and the live
check against what running services export. Queries are parsed as PromQL (promql-parser), so label names,
functions and keywords are never mistaken for metrics.

Names are *series* names as they appear in the exposition format: a histogram family ``x_seconds`` is
queried as ``x_seconds_bucket``, ``x_seconds_sum`` and ``x_seconds_count``; a counter keeps its ``_total``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import promql_parser

# Series that Prometheus itself attaches to every target.
PROMETHEUS_SERIES = frozenset({"up", "scrape_duration_seconds", "scrape_samples_scraped", "scrape_series_added"})

# Grafana's interval macros stand where PromQL wants a duration; any duration parses the same way.
_GRAFANA_DURATION_MACROS = re.compile(
    r"\$(?:__rate_interval|__interval_ms|__interval|__range_s|__range_ms|__range)"
    r"|\$\{(?:__rate_interval|__interval|__range)\}"
)
_LABEL_VALUES = re.compile(r"^\s*label_values\((?P<args>.*)\)\s*$", re.DOTALL)
_QUERY_RESULT = re.compile(r"^\s*query_result\((?P<expr>.*)\)\s*$", re.DOTALL)
_CATALOGUE_ROW = re.compile(
    r"^\|\s*`(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)`\s*\|\s*(?P<type>counter|gauge|histogram|summary)\s*\|"
)
_HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


@dataclass(frozen=True, kw_only=True)
class Query:
    """One PromQL expression and where it was found, for error messages."""

    where: str
    expr: str


def metric_names_in_promql(expr: str) -> frozenset[str]:
    """The metric names an expression selects (by name or by a ``__name__="..."`` matcher)."""
    tree = promql_parser.parse(_GRAFANA_DURATION_MACROS.sub("5m", expr))
    return frozenset(_selected_names(tree))


def _selected_names(node: Any) -> Iterator[str]:
    if isinstance(node, promql_parser.VectorSelector):
        if node.name:
            yield node.name
        for matcher in node.matchers.matchers:
            if matcher.name == "__name__":
                if matcher.op != promql_parser.MatchOp.Equal:
                    raise ValueError(f"a regex or negative __name__ matcher selects unknown metrics: {matcher}")
                yield matcher.value
        return
    children: list[Any] = []
    if isinstance(node, promql_parser.MatrixSelector):
        children = [node.vector_selector]
    elif isinstance(node, promql_parser.BinaryExpr):
        children = [node.lhs, node.rhs]
    elif isinstance(node, promql_parser.AggregateExpr):
        children = [node.expr, node.param]
    elif isinstance(node, promql_parser.Call):
        children = list(node.args)
    elif isinstance(node, (promql_parser.ParenExpr, promql_parser.UnaryExpr, promql_parser.SubqueryExpr)):
        children = [node.expr]
    elif not isinstance(node, (promql_parser.NumberLiteral, promql_parser.StringLiteral)):
        raise TypeError(f"unexpected PromQL node {type(node).__name__}")
    for child in children:
        if child is not None:
            yield from _selected_names(child)


def rule_queries(rules: Mapping[str, Any]) -> list[Query]:
    """Every ``expr`` of a Prometheus rule file (or a PrometheusRule's spec)."""
    return [
        Query(where=f"rule {rule.get('alert') or rule.get('record')}", expr=str(rule["expr"]))
        for group in rules["groups"]
        for rule in group["rules"]
    ]


def dashboard_queries(dashboard: Mapping[str, Any]) -> list[Query]:
    """Every Prometheus query of a Grafana dashboard: panel targets (rows included) and template variables."""
    queries: list[Query] = []
    for panel in _panels(dashboard.get("panels", [])):
        for target in panel.get("targets", []):
            if "expr" in target:
                where = f"panel {panel.get('title')!r} target {target.get('refId')}"
                queries.append(Query(where=where, expr=target["expr"]))
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") != "query":
            continue
        query = variable.get("query")
        text = query.get("query", "") if isinstance(query, Mapping) else str(query or "")
        expr = _variable_expr(text)
        if expr is not None:
            queries.append(Query(where=f"variable {variable.get('name')}", expr=expr))
    return queries


def _panels(panels: Iterable[Mapping[str, Any]]) -> Iterator[Mapping[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))


def _variable_expr(text: str) -> str | None:
    """The PromQL inside a Grafana Prometheus variable query, or None when it names no metric."""
    if (match := _LABEL_VALUES.match(text)) is not None:
        args = match.group("args")
        if "," not in args:
            return None  # label_values(label) lists a label over all series
        return args.rsplit(",", 1)[0]
    if (match := _QUERY_RESULT.match(text)) is not None:
        return match.group("expr")
    raise ValueError(f"unsupported Grafana variable query: {text!r}")


def referenced_series(queries: Iterable[Query]) -> dict[str, set[str]]:
    """Series name -> the places that query it."""
    found: dict[str, set[str]] = {}
    for query in queries:
        try:
            names = metric_names_in_promql(query.expr)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{query.where}: cannot parse {query.expr!r}: {exc}") from exc
        for name in names:
            found.setdefault(name, set()).add(query.where)
    return found


def catalogued_families(metrics_markdown: str) -> dict[str, str]:
    """Metric family name -> type, from the tables of docs/metrics.md."""
    families: dict[str, str] = {}
    for line in metrics_markdown.splitlines():
        if (match := _CATALOGUE_ROW.match(line.strip())) is not None:
            families[match.group("name")] = match.group("type")
    return families


def exposed_series(families: Mapping[str, str]) -> dict[str, str]:
    """Series name as scraped -> its family, for catalogued families (a histogram has no bare series)."""
    series: dict[str, str] = {}
    for family, kind in families.items():
        if kind in ("histogram", "summary"):
            suffixes = _HISTOGRAM_SUFFIXES if kind == "histogram" else ("", "_sum", "_count")
            for suffix in suffixes:
                series[family + suffix] = family
        else:
            series[family] = family
    return series
