"""PromQL and dashboard helpers shared by the dashboard, Prometheus rule and scrape tests: the
metric names an expression selects, every query of the Grafana dashboards (dashboards/json/), and
the series names the code's prometheus_client metrics export (read from the source), and the
pipeline's alert rules (services/prometheus/rules/)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import yaml

from tests.helpers.paths import REPO

DASH_DIR = REPO / "dashboards"
JSON_DIR = DASH_DIR / "json"
# Series Prometheus makes itself for every target: allowed in queries though no fleetwatch code defines them.
PROMETHEUS_BUILTINS = {"up"}
RULES = REPO / "services" / "prometheus" / "rules" / "fleetwatch-pipeline.yml"  # the pipeline's alert rules

_PROMQL_KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset",
    "and", "or", "unless", "inf", "nan",
}  # fmt: skip
_STRING = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`')
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects: identifiers that are not function or aggregation
    calls, keywords, label names (inside {...} or a by/on/... list), durations, number exponents or
    Grafana variables. Histogram series keep their _bucket/_sum/_count suffix, as Prometheus
    stores them so."""
    s = _STRING.sub('""', expr)  # first: strings may hold { } [ ] ( )
    s = re.sub(r"\{[^}]*\}", " ", s)  # label matchers
    s = re.sub(r"\[[^\]]*\]", " ", s)  # range selectors, subqueries ($__rate_interval lives here)
    s = _GROUPING.sub(" ", s)  # grouping label lists: sum by (le, kind) (...)
    names = set()
    for m in _IDENT.finditer(s):
        tok, before = m.group(), s[m.start() - 1] if m.start() else " "
        if tok in _PROMQL_KEYWORDS or before in "$.0123456789":  # var, 1e3, 0.999, 10m
            continue
        if s[m.end() :].lstrip().startswith("("):  # rate(, sum(, histogram_quantile(
            continue
        names.add(tok)
    return names


def variable_metric_names(query: str) -> set[str]:
    """Metric names of a Grafana Prometheus variable query: label_values(SELECTOR, label),
    label_values(label), query_result(EXPR), or plain PromQL."""
    m = re.fullmatch(r"\s*label_values\((.*),\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)\s*", query)
    if m:
        return metric_names(m.group(1))
    if re.fullmatch(r"\s*label_values\(\s*[A-Za-z_][A-Za-z0-9_]*\s*\)\s*", query):
        return set()
    m = re.fullmatch(r"\s*query_result\((.*)\)\s*", query)
    return metric_names(m.group(1) if m else query)


def load_dashboards() -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text()) for p in sorted(JSON_DIR.glob("*.json"))}


def all_panels(dash: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for p in dash.get("panels", []):
        yield p
        yield from p.get("panels", [])  # panels inside collapsed rows


def variable_query(var: dict[str, Any]) -> str:
    q = var.get("query", "")
    return q.get("query", "") if isinstance(q, dict) else q


def dashboard_queries(dash: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target and every query variable of a dashboard."""
    out = [
        (f"panel {p['id']} {p['title']!r} target {t['refId']}", t["expr"])
        for p in all_panels(dash)
        for t in p.get("targets", [])
    ]
    out += [
        (f"variable {v['name']}", variable_query(v))
        for v in dash["templating"]["list"]
        if v["type"] == "query"
    ]
    return out


def dashboard_metric_names(dashboards: dict[str, dict[str, Any]]) -> dict[str, set[str]]:
    """metric name -> the dashboards that use it."""
    used: dict[str, set[str]] = {}
    for name, dash in dashboards.items():
        for where, expr in dashboard_queries(dash):
            names = variable_metric_names(expr) if where.startswith("variable") else metric_names(expr)
            for n in names:
                used.setdefault(n, set()).add(name)
    return used


# prometheus_client metrics (Counter("name", ...)) and custom-collector families
# (GaugeMetricFamily("name", ...), read at scrape time, as pipeline/fleet_metrics.py does).
_DEFINITION = re.compile(
    r"\b(Counter|Gauge|Histogram|Summary)(?:MetricFamily)?\(\s*\"([A-Za-z_:][A-Za-z0-9_:]*)\""
)


def exported_names() -> dict[str, str]:
    """Series names the code's prometheus_client metrics expose -> the metric's kind, read from
    the source (every .py outside tests/). Counters are exposed with a _total suffix (added when
    the name lacks it), histograms as _bucket/_sum/_count."""
    out: dict[str, str] = {}
    for path in REPO.rglob("*.py"):
        rel = path.relative_to(REPO)
        if rel.parts[0] in {"tests", "build", "dashboards"} or ".venv" in rel.parts:
            continue
        for kind, name in _DEFINITION.findall(path.read_text(errors="replace")):
            if kind == "Counter":
                out[name if name.endswith("_total") else f"{name}_total"] = kind
            elif kind in {"Histogram", "Summary"}:
                for suffix in ("_sum", "_count", *(("_bucket",) if kind == "Histogram" else ())):
                    out[name + suffix] = kind
            else:
                out[name] = kind
    return out


def rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return [r for g in doc["groups"] for r in g["rules"]]
