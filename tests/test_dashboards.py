"""The Grafana dashboards (dashboards/json/) without a Grafana server (none is packaged here):
generated output is committed and current, JSON type-checks against @grafana/schema, panel ids
are unique and the grid is sane, every query uses the provisioned datasource and defined template
variables, and every metric a query names is one the code defines. That the code really EXPORTS
those names is proven against a real scrape in tests/test_metrics_scrape.py.

The PromQL helpers here (metric_names, dashboard_queries, exported_names) are shared with
test_metrics_scrape.py and test_prometheus_rules.py.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
DASH_DIR = REPO / "dashboards"
JSON_DIR = DASH_DIR / "json"
PROVISIONING = DASH_DIR / "provisioning"
DS_REF = {"type": "prometheus", "uid": "${datasource}"}
EXPECTED = {"fleet-overview.json", "node-gpu.json", "jobs-stragglers.json", "pipeline-health.json"}
# Series Prometheus makes itself for every target: allowed in queries though no fleetwatch code defines them.
PROMETHEUS_BUILTINS = {"up"}
GRAFANA_BUILTINS = {"__rate_interval", "__interval", "__interval_ms", "__range", "__range_s", "__all"}

# ----------------------------------------------------------------------------- PromQL helpers

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


# ----------------------------------------------------------------------------- tests


@pytest.fixture(scope="module")
def dashboards() -> dict[str, dict[str, Any]]:
    d = load_dashboards()
    assert set(d) == EXPECTED, f"dashboards/json holds {sorted(d)}, expected {sorted(EXPECTED)}"
    return d


def test_metric_name_extraction() -> None:
    # The tokenizer the name checks rely on: functions, labels, keywords, durations, numbers and
    # Grafana variables are not metric names; every selected series is.
    expr = (
        'histogram_quantile(0.99, sum by (le, kind) (rate(a_bucket{cluster=~"$cluster", x="y(z)"}'
        "[$__rate_interval]))) > 1e3 and on (cluster) b offset 10m unless c:rec == bool 0.999"
        ' or count(up{job=~"fleetwatch-.*"} == 0) or vector(0)'
    )
    assert metric_names(expr) == {"a_bucket", "b", "c:rec", "up"}
    assert variable_metric_names('label_values(m{cluster=~"$cluster"}, exported_job)') == {"m"}
    assert variable_metric_names("label_values(cluster)") == set()


def test_generated_json_is_current(dashboards: dict[str, dict[str, Any]]) -> None:
    # The JSON is generated by dashboards/generate.py; a hand edit would be lost on the next run.
    spec = importlib.util.spec_from_file_location("dash_generate", DASH_DIR / "generate.py")
    assert spec and spec.loader
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    rendered = gen.render()
    assert set(rendered) == set(dashboards)
    stale = [n for n, text in rendered.items() if (JSON_DIR / n).read_text() != text]
    assert not stale, f"out of date, run python3 dashboards/generate.py: {stale}"


def test_dashboards_are_well_formed(dashboards: dict[str, dict[str, Any]]) -> None:
    uids = [d["uid"] for d in dashboards.values()]
    assert len(set(uids)) == len(uids), f"duplicate dashboard uids {uids}"
    for name, d in dashboards.items():
        assert 36 <= d["schemaVersion"] <= 41, f"{name}: schemaVersion {d['schemaVersion']}"
        assert d["title"] and d["uid"] and len(d["uid"]) <= 40, name
        panels = list(all_panels(d))
        ids = [p["id"] for p in panels]
        assert len(set(ids)) == len(ids), f"{name}: duplicate panel ids {sorted(ids)}"
        cells: dict[tuple[int, int], int] = {}
        for p in panels:
            g = p["gridPos"]
            assert g["x"] >= 0 and g["w"] > 0 and g["x"] + g["w"] <= 24, f"{name}: panel {p['id']} {g}"
            for x in range(g["x"], g["x"] + g["w"]):
                for y in range(g["y"], g["y"] + g["h"]):
                    assert (x, y) not in cells, f"{name}: panels {cells[x, y]} and {p['id']} overlap"
                    cells[x, y] = p["id"]
            if p["type"] != "row":
                assert p.get("targets"), f"{name}: panel {p['id']} {p['title']!r} has no query"
                assert {t["refId"] for t in p["targets"]} == {
                    chr(65 + i) for i in range(len(p["targets"]))
                }, f"{name}: panel {p['id']} refIds"


def test_datasources_are_consistent(dashboards: dict[str, dict[str, Any]]) -> None:
    # Every query goes through the `datasource` variable, whose default is the provisioned uid.
    prov = yaml.safe_load((PROVISIONING / "datasources" / "prometheus.yml").read_text())
    (ds,) = prov["datasources"]
    assert ds["type"] == "prometheus" and ds["access"] == "proxy"
    for name, d in dashboards.items():
        (var,) = [v for v in d["templating"]["list"] if v["type"] == "datasource"]
        assert var["name"] == "datasource" and var["query"] == "prometheus"
        assert var["current"]["value"] == ds["uid"], f"{name}: default datasource is not the provisioned one"
        for p in all_panels(d):
            if p["type"] == "row":
                continue
            assert p["datasource"] == DS_REF, f"{name}: panel {p['id']} datasource {p['datasource']}"
            for t in p["targets"]:
                assert t["datasource"] == DS_REF, f"{name}: panel {p['id']} target {t['refId']}"
        for v in d["templating"]["list"]:
            if v["type"] == "query":
                assert v["datasource"] == DS_REF, f"{name}: variable {v['name']}"


def test_template_variables_are_defined_and_used(dashboards: dict[str, dict[str, Any]]) -> None:
    required = {
        "fleet-overview.json": {"cluster", "node"},
        "node-gpu.json": {"cluster", "node", "gpu", "signal"},
        "jobs-stragglers.json": {"cluster", "job", "node"},
        "pipeline-health.json": {"cluster"},
    }
    ref = re.compile(r"\$\{?(\w+)|\[\[(\w+)\]\]")
    for name, d in dashboards.items():
        defined = {v["name"] for v in d["templating"]["list"]}
        assert required[name] <= defined, f"{name}: missing variables {required[name] - defined}"
        texts = [e for _, e in dashboard_queries(d)]
        texts += [p.get("title", "") for p in all_panels(d)]
        texts += [p.get("repeat", "") and f"${p['repeat']}" for p in all_panels(d)]
        texts += [t.get("legendFormat", "") for p in all_panels(d) for t in p.get("targets", [])]
        referenced = {a or b for t in texts for a, b in ref.findall(t)}
        undefined = referenced - defined - GRAFANA_BUILTINS
        assert not undefined, f"{name}: undefined template variables {undefined}"
        unused = defined - referenced - {"datasource"}
        assert not unused, f"{name}: variables nothing uses {unused}"
        for where, expr in dashboard_queries(d):
            # Multi-cluster Grafana: every selector filters on the cluster target label.
            if where != "variable cluster":
                for sel in re.findall(r"\{[^}]*\}", expr):
                    assert 'cluster=~"$cluster"' in sel, (
                        f"{name}: {where}: selector {sel} lacks the cluster filter"
                    )
        for v in d["templating"]["list"]:
            if v["type"] == "query":
                q = variable_query(v)
                assert re.fullmatch(r"label_values\(.+, \w+\)", q), f"{name}: variable {v['name']}: {q}"


def test_every_query_names_a_metric_the_code_defines(dashboards: dict[str, dict[str, Any]]) -> None:
    defined = exported_names()
    assert "fleetwatch_worker_messages_total" in defined, "the metric definitions were not found"
    used = dashboard_metric_names(dashboards)
    assert len(used) >= 30
    unknown = {n: sorted(ds) for n, ds in used.items() if n not in defined and n not in PROMETHEUS_BUILTINS}
    assert not unknown, f"queries name metrics no fleetwatch code defines: {unknown}"
    # The histogram panels query the series Prometheus stores, not the bare histogram name.
    for n in used:
        assert defined.get(n) != "Histogram" or n.endswith(("_bucket", "_sum", "_count")), n


def test_provisioning_points_at_the_dashboards() -> None:
    prov = yaml.safe_load((PROVISIONING / "dashboards" / "fleetwatch.yml").read_text())
    (provider,) = prov["providers"]
    assert provider["type"] == "file"
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    mounts = compose["services"]["grafana"]["volumes"]
    assert f"./dashboards/json:{provider['options']['path']}:ro" in mounts, mounts
    assert "./dashboards/provisioning:/etc/grafana/provisioning:ro" in mounts, mounts


def _typecheck(src: Path) -> subprocess.CompletedProcess[str]:
    node = shutil.which("node")
    if node is None:
        pytest.fail("node not found: the dashboard type check needs Node.js (apt-get install nodejs npm)")
    if not (DASH_DIR / "node_modules" / "@grafana" / "schema").is_dir():
        pytest.fail(
            "dashboards/node_modules missing: run (cd dashboards && npm ci), as scripts/install.sh does"
        )
    return subprocess.run(
        [node, str(DASH_DIR / "typecheck.mjs"), str(src)], capture_output=True, text=True, timeout=120
    )


def test_dashboards_typecheck_against_grafana_schema(tmp_path: Path) -> None:
    r = _typecheck(JSON_DIR)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "4 dashboards" in r.stdout
    # ... and the check bites: a wrong type, a misspelt field and a bad enum value are all errors.
    d = json.loads((JSON_DIR / "pipeline-health.json").read_text())
    d["panels"][1]["gridPos"]["w"] = "8"
    d["panels"][2]["tragets"] = d["panels"][2].pop("targets")
    d["panels"][3]["fieldConfig"]["defaults"]["color"]["mode"] = "rainbow"
    (tmp_path / "broken.json").write_text(json.dumps(d, indent=2))
    r = _typecheck(tmp_path)
    assert r.returncode != 0
    out = r.stdout + r.stderr
    assert "Type 'string' is not assignable to type 'number'" in out, out
    assert "'\"tragets\"' does not exist" in out, out
    assert '"rainbow"' in out, out
