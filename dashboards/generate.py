"""Writes the Grafana dashboards under dashboards/json/ (run: python3 dashboards/generate.py).

The dashboards are generated rather than hand-edited so that panel ids, grid positions, the
datasource reference and the template-variable filters stay consistent across ~60 panels; the
JSON files are committed (Grafana provisioning reads them as they are) and
tests/unit/test_dashboards.py fails when they differ from what this script writes.

Conventions every query follows (tests/unit/test_dashboards.py checks them):
- datasource: the `datasource` template variable, whose default is the provisioned Prometheus
  (uid `fleetwatch-prometheus`, dashboards/provisioning/datasources/prometheus.yml);
- every selector filters on `cluster=~"$cluster"`: `cluster` is a TARGET label set in the
  Prometheus scrape config (services/prometheus/*.yml), since the workers themselves do not know
  which cluster they run in;
- the training job is the label `exported_job`: fleetwatch exports it as `job`, and Prometheus
  renames a scraped `job` to `exported_job` because `job` is its own target label (the scrape
  job, e.g. fleetwatch-detect);
- only metric names the code defines (prometheus_client Counter/Gauge/Histogram) or Prometheus
  itself (`up`) appear; tests/integration/test_metrics_scrape.py proves them against a real scrape.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "json"
SCHEMA_VERSION = 39
DS_UID = "fleetwatch-prometheus"
DS: dict[str, str] = {"type": "prometheus", "uid": "${datasource}"}
C = 'cluster=~"$cluster"'  # the filter every selector carries
RATE = "$__rate_interval"

Panel = dict[str, Any]


# ----------------------------------------------------------------------------- building blocks


def target(expr: str, legend: str = "", ref: str = "A", instant: bool = False, fmt: str = "") -> dict:
    t: dict[str, Any] = {"datasource": DS, "refId": ref, "expr": expr, "legendFormat": legend or "__auto"}
    if instant:
        t["instant"] = True
        t["range"] = False
    if fmt:
        t["format"] = fmt
    return t


def targets(*pairs: tuple[str, str], instant: bool = False, fmt: str = "") -> list[dict]:
    return [target(e, lg, chr(ord("A") + i), instant, fmt) for i, (e, lg) in enumerate(pairs)]


def thresholds(*steps: tuple[float | None, str]) -> dict:
    return {"mode": "absolute", "steps": [{"color": c, "value": v} for v, c in steps]}


def panel(
    kind: str,
    title: str,
    tgts: list[dict],
    w: int,
    h: int,
    *,
    desc: str = "",
    unit: str = "short",
    decimals: int | None = None,
    thr: dict | None = None,
    minv: float | None = None,
    maxv: float | None = None,
    custom: dict | None = None,
    options: dict | None = None,
    overrides: list[dict] | None = None,
    repeat: str = "",
    mappings: list[dict] | None = None,
    color: dict | None = None,
) -> Panel:
    defaults: dict[str, Any] = {"unit": unit}
    if decimals is not None:
        defaults["decimals"] = decimals
    if minv is not None:
        defaults["min"] = minv
    if maxv is not None:
        defaults["max"] = maxv
    defaults["thresholds"] = thr or thresholds((None, "green"))
    defaults["color"] = color or {"mode": "palette-classic" if kind == "timeseries" else "thresholds"}
    if custom:
        defaults["custom"] = custom
    if mappings:
        defaults["mappings"] = mappings
    p: Panel = {
        "type": kind,
        "title": title,
        "description": desc,
        "datasource": DS,
        "targets": tgts,
        "fieldConfig": {"defaults": defaults, "overrides": overrides or []},
        "options": options or {},
        "gridPos": {"h": h, "w": w, "x": 0, "y": 0},
    }
    if repeat:
        p["repeat"] = repeat
        p["repeatDirection"] = "h"
        p["maxPerRow"] = 2
    return p


def ts(
    title: str,
    tgts: list[dict],
    w: int = 12,
    h: int = 8,
    *,
    stack: bool = False,
    bars: bool = False,
    thr_line: bool = False,
    **kw: Any,
) -> Panel:
    """Time series; `thr_line` draws the thresholds as dashed lines (the detector's cut-offs)."""
    custom: dict[str, Any] = {
        "drawStyle": "bars" if bars else "line",
        "lineWidth": 1,
        "fillOpacity": 60 if bars else 10,
        "showPoints": "never",
        "spanNulls": False,
        "stacking": {"mode": "normal" if stack else "none", "group": "A"},
        "thresholdsStyle": {"mode": "dashed" if thr_line else "off"},
    }
    opts = {
        "legend": {
            "displayMode": "table",
            "placement": "right",
            "showLegend": True,
            "calcs": ["lastNotNull", "max"],
        },
        "tooltip": {"mode": "multi", "sort": "desc"},
    }
    return panel("timeseries", title, tgts, w, h, custom=custom, options=opts, **kw)


def stat(
    title: str, tgts: list[dict], w: int = 4, h: int = 4, *, text_mode: str = "auto", **kw: Any
) -> Panel:
    opts = {
        "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
        "colorMode": "background",
        "graphMode": "none",
        "textMode": text_mode,
        "justifyMode": "auto",
        "orientation": "auto",
    }
    return panel("stat", title, tgts, w, h, options=opts, **kw)


def bargauge(title: str, tgts: list[dict], w: int = 12, h: int = 8, **kw: Any) -> Panel:
    opts = {
        "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
        "orientation": "horizontal",
        "displayMode": "gradient",
        "showUnfilled": True,
        "minVizHeight": 10,
        "minVizWidth": 0,
        "valueMode": "color",
        "namePlacement": "auto",
        "sizing": "auto",
    }
    return panel("bargauge", title, tgts, w, h, options=opts, **kw)


def table(title: str, tgts: list[dict], w: int = 12, h: int = 8, **kw: Any) -> Panel:
    opts = {"showHeader": True, "cellHeight": "sm", "footer": {"show": False, "reducer": ["sum"]}}
    transformations = [{"id": "labelsToFields", "options": {"mode": "columns"}}]
    p = panel("table", title, tgts, w, h, options=opts, **kw)
    p["transformations"] = transformations
    return p


def row(title: str, repeat: str = "") -> Panel:
    r: Panel = {
        "type": "row",
        "title": title,
        "collapsed": False,
        "panels": [],
        "gridPos": {"h": 1, "w": 24, "x": 0, "y": 0},
    }
    if repeat:
        r["repeat"] = repeat
    return r


def layout(panels: list[Panel]) -> list[Panel]:
    """Numbers the panels 1.. and flows them left to right, top to bottom, 24 columns wide."""
    x = y = row_h = 0
    for i, p in enumerate(panels, start=1):
        p["id"] = i
        g = p["gridPos"]
        if p["type"] == "row" or x + g["w"] > 24:
            x, y, row_h = 0, y + row_h, 0
        g["x"], g["y"] = x, y
        x += g["w"]
        row_h = max(row_h, g["h"])
        if p["type"] == "row":
            x, y, row_h = 0, y + 1, 0
    return panels


# ----------------------------------------------------------------------------- template variables


def var_datasource() -> dict:
    return {
        "type": "datasource",
        "name": "datasource",
        "label": "Prometheus",
        "query": "prometheus",
        "current": {"selected": False, "text": "fleetwatch Prometheus", "value": DS_UID},
        "hide": 0,
        "refresh": 1,
        "regex": "",
        "options": [],
        "skipUrlSync": False,
    }


def var_query(
    name: str, label: str, query: str, *, multi: bool = True, include_all: bool = True, hide: int = 0
) -> dict:
    v: dict[str, Any] = {
        "type": "query",
        "name": name,
        "label": label,
        "datasource": DS,
        "query": {"query": query, "refId": f"{name}-var"},
        "refresh": 2,  # on time range change: nodes and jobs come and go
        "sort": 1,
        "regex": "",
        "multi": multi,
        "includeAll": include_all,
        "hide": hide,
        "options": [],
        "skipUrlSync": False,
    }
    if include_all:
        v["current"] = {"selected": True, "text": ["All"], "value": ["$__all"]}
        v["allValue"] = ".*"  # regex matchers below; Grafana's default would be an alternation of all values
    return v


CLUSTER = var_query("cluster", "Cluster", 'label_values(up{job=~"fleetwatch-.*"}, cluster)')
NODE = var_query("node", "Node", f"label_values(fleetwatch_node_health_score{{{C}}}, node)")
JOB = var_query("job", "Job", f"label_values(fleetwatch_job_node_slowdown{{{C}}}, exported_job)")


def dashboard(
    uid: str, title: str, desc: str, panels: list[Panel], variables: list[dict], refresh: str = "30s"
) -> dict:
    return {
        "uid": uid,
        "title": title,
        "description": desc,
        "tags": ["fleetwatch"],
        "timezone": "browser",
        "editable": True,
        "graphTooltip": 1,  # shared crosshair: line up a finding with the signal behind it
        "fiscalYearStartMonth": 0,
        "liveNow": False,
        "refresh": refresh,
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "time": {"from": "now-1h", "to": "now"},
        "timepicker": {},
        "weekStart": "",
        "links": [
            {
                "type": "dashboards",
                "tags": ["fleetwatch"],
                "title": "fleetwatch",
                "asDropdown": True,
                "includeVars": True,
                "keepTime": True,
                "icon": "external link",
                "targetBlank": False,
                "tooltip": "",
                "url": "",
            }
        ],
        "annotations": {
            "list": [
                {
                    "builtIn": 1,
                    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                    "enable": True,
                    "hide": True,
                    "iconColor": "rgba(0, 211, 255, 1)",
                    "name": "Annotations & Alerts",
                    "type": "dashboard",
                }
            ]
        },
        "templating": {"list": [var_datasource(), *variables]},
        "panels": layout(panels),
    }


HEALTH_THR = thresholds((None, "red"), (0.35, "orange"), (0.75, "yellow"), (0.95, "green"))
SEVERITY_COLORS = [
    {
        "matcher": {"id": "byName", "options": sev},
        "properties": [{"id": "color", "value": {"mode": "fixed", "fixedColor": col}}],
    }
    for sev, col in (("critical", "red"), ("warning", "orange"), ("info", "blue"))
]


def fixed_colors(*pairs: tuple[str, str]) -> list[dict]:
    """Overrides giving each named series (its legend) a fixed colour."""
    return [
        {
            "matcher": {"id": "byName", "options": name},
            "properties": [{"id": "color", "value": {"mode": "fixed", "fixedColor": col}}],
        }
        for name, col in pairs
    ]


def state_mapping(*states: tuple[int, str, str]) -> list[dict]:
    """A value mapping of a 0/1 gauge to words: (value, text, colour)."""
    return [
        {
            "type": "value",
            "options": {
                str(v): {"text": text, "color": col, "index": i} for i, (v, text, col) in enumerate(states)
            },
        }
    ]


# The reasons a drain is refused because people hold the node (alerts/slurm_nodes.py HELD_REASONS):
# their choice, nobody is paged. Shades of blue in "Drains refused by reason".
HELD_REASONS = ("maintenance", "down", "drained_by_other", "opted_out")


# ----------------------------------------------------------------------------- (a) fleet overview


def fleet_overview() -> dict:
    sel = f'{C}, node=~"$node"'
    panels = [
        row("Automatic drains"),
        stat(
            "Automatic drains",
            [
                target(f"max(fleetwatch_act_drains_paused{{{C}}})", "automatic drains", "A", instant=True),
                target(
                    f"max(fleetwatch_act_drains_paused_until_seconds{{{C}}}) * 1000 > 0",
                    "paused until",
                    "B",
                    instant=True,
                ),
            ],
            w=6,
            text_mode="value_and_name",
            thr=thresholds((None, "green"), (1, "orange")),
            mappings=state_mapping((0, "ACTIVE", "green"), (1, "PAUSED", "orange")),
            overrides=[
                {
                    "matcher": {"id": "byName", "options": "paused until"},
                    "properties": [
                        {"id": "unit", "value": "dateTimeAsIso"},
                        {"id": "color", "value": {"mode": "fixed", "fixedColor": "orange"}},
                    ],
                }
            ],
            desc="PAUSED: an operator's pause (fleetwatch pause --reason ... --for ...) holds every "
            "automatic drain and resume until the time shown, when it ends by itself; `fleetwatch "
            "resume-drains` lifts it early. Findings are still alerted (FleetwatchDrainsPaused says who "
            "paused and why); the drains held are refused 'paused' in Drains refused by reason. Drain "
            "what must be drained by hand meanwhile. ACTIVE: act drains within its budget.",
        ),
        stat(
            "act mode",
            targets((f"max by (instance) (fleetwatch_act_dry_run{{{C}}})", "{{instance}}"), instant=True),
            w=4,
            text_mode="value_and_name",
            thr=thresholds((None, "green"), (1, "orange")),
            mappings=state_mapping((0, "LIVE", "green"), (1, "DRY-RUN", "orange")),
            desc="One value per act process. LIVE: its drain and resume requests go to the Slurm "
            "adapter. DRY-RUN (act --dry-run): it decides and alerts as usual (alerts labelled "
            'dry_run="true"), but its requests are would-be, never executed, and its would-be drains '
            "count in the drain panels as if done (Drain and resume requests shows them apart). "
            "DRY-RUN where you expected LIVE: nothing is being drained; restart act without --dry-run.",
        ),
        stat(
            "Nodes held by people",
            targets((f"sum(max by (cluster) (fleetwatch_act_nodes_held{{{C}}}))", "held")),
            w=4,
            thr=thresholds((None, "green"), (1, "blue")),
            desc="Nodes people hold now: in a Slurm maintenance reservation, down, drained by someone "
            "else, or opted out. fleetwatch never drains them and leaves them out of the fleet the budget "
            "is sized on; their findings alert with the node's state and page nobody. Many you did not "
            "expect: check sinfo -R and scontrol show reservation.",
        ),
        stat(
            "Validations before resume (time range)",
            targets(
                (
                    f"sum by (outcome) (increase(fleetwatch_act_validations_total{{{C}}}[$__range]))",
                    "{{outcome}}",
                ),
                instant=True,
            ),
            w=6,
            text_mode="value_and_name",
            decimals=0,
            overrides=[
                {
                    "matcher": {"id": "byName", "options": "failed"},
                    "properties": [{"id": "thresholds", "value": thresholds((None, "green"), (1, "red"))}],
                }
            ],
            desc="Drained nodes the Slurm adapter tested (dcgmi diag, or the site's command) before "
            "lifting fleetwatch's drain, over the dashboard's time range. Passed: resumed. Failed: drained "
            "again, FleetwatchValidationFailed names the test and GPU; the node needs hands.",
        ),
        stat(
            "Resumed by hand (time range)",
            targets(
                (f"sum(increase(fleetwatch_act_resumed_by_hand_total{{{C}}}[$__range]))", "by hand"),
                instant=True,
            ),
            w=4,
            decimals=0,
            thr=thresholds((None, "green"), (1, "yellow")),
            desc="Nodes fleetwatch held drained that an operator put back in service by hand (Slurm "
            "shows them resumed), over the time range: their budget slot is freed, they skipped "
            "validation, and the same findings do not drain them again (only new evidence does).",
        ),
        row("Fleet health"),
        stat(
            "Nodes by state",
            targets((f"count by (state) (fleetwatch_node_state{{{sel}}} == 1)", "{{state}}")),
            w=6,
            text_mode="value_and_name",
            desc="Nodes in each state now (healthy, suspect: info/statistical findings, degraded: warning or "
            "worse), from the detect workers.",
            overrides=[
                {
                    "matcher": {"id": "byName", "options": s},
                    "properties": [{"id": "color", "value": {"mode": "fixed", "fixedColor": c}}],
                }
                for s, c in (("healthy", "green"), ("suspect", "yellow"), ("degraded", "red"))
            ],
        ),
        stat(
            "Drained by fleetwatch",
            targets((f"sum(fleetwatch_act_drain_budget_used{{{C}}})", "drained")),
            thr=thresholds((None, "green"), (1, "orange")),
            desc="Nodes fleetwatch has drained and not yet resumed (act workers).",
        ),
        stat(
            "Drain budget used",
            targets(
                (
                    f"sum(fleetwatch_act_drain_budget_used{{{C}}}) / "
                    f"clamp_min(sum(fleetwatch_act_drain_budget_nodes{{{C}}}), 1)",
                    "used",
                )
            ),
            unit="percentunit",
            thr=thresholds((None, "green"), (0.75, "orange"), (1, "red")),
            desc="Drained nodes over the nodes the budget allows (--drain-budget x fleet size). At 100% "
            "further drains are refused and only alerted.",
        ),
        stat(
            "Drain storm",
            targets((f"max(fleetwatch_act_storm_active{{{C}}})", "storm")),
            thr=thresholds((None, "green"), (1, "red")),
            mappings=[
                {
                    "type": "value",
                    "options": {"0": {"text": "no", "index": 0}, "1": {"text": "STORM", "index": 1}},
                }
            ],
            desc="1 while the act layer has declared a drain storm: many nodes at once means a shared cause, "
            "so it alerts instead of draining.",
        ),
        stat(
            "Open findings",
            targets((f"sum(fleetwatch_open_findings{{{C}}})", "open")),
            w=6,
            thr=thresholds((None, "green"), (1, "orange"), (20, "red")),
            desc="Findings the detect workers hold open (not yet resolved).",
        ),
        panel(
            "state-timeline",
            "Node health map",
            targets((f"min by (node) (fleetwatch_node_health_score{{{sel}}})", "{{node}}")),
            24,
            12,
            thr=HEALTH_THR,
            minv=0,
            maxv=1,
            decimals=2,
            custom={"fillOpacity": 80, "lineWidth": 0},
            options={
                "mergeValues": False,
                "showValue": "never",
                "alignValue": "left",
                "rowHeight": 0.9,
                "legend": {"displayMode": "list", "placement": "bottom", "showLegend": False},
                "tooltip": {"mode": "single", "sort": "none"},
            },
            desc="Health score per node over time: 1 healthy; an open warning takes it to ~0.6 and a "
            "critical to ~0.1. Use the node variable to narrow a large fleet.",
        ),
        table(
            "Least healthy nodes",
            targets(
                (f"bottomk(20, min by (node) (fleetwatch_node_health_score{{{sel}}}) < 1)", ""),
                instant=True,
                fmt="table",
            ),
            thr=HEALTH_THR,
            desc="Up to 20 nodes with a health score below 1 now.",
        ),
        bargauge(
            "Open findings by kind and severity",
            targets(
                (f"sum by (kind, severity) (fleetwatch_open_findings{{{C}}}) > 0", "{{kind}} {{severity}}"),
                instant=True,
            ),
            thr=thresholds((None, "orange"), (10, "red")),
        ),
        row("Findings"),
        ts(
            "Findings by kind",
            targets((f"sum by (kind) (increase(fleetwatch_findings_total{{{C}}}[{RATE}]))", "{{kind}}")),
            stack=True,
            bars=True,
            desc="Findings opened or escalated per interval, by detector kind.",
        ),
        ts(
            "Findings by severity",
            targets(
                (f"sum by (severity) (increase(fleetwatch_findings_total{{{C}}}[{RATE}]))", "{{severity}}")
            ),
            stack=True,
            bars=True,
            overrides=SEVERITY_COLORS,
        ),
        ts(
            "Findings resolved by kind",
            targets(
                (f"sum by (kind) (increase(fleetwatch_findings_resolved_total{{{C}}}[{RATE}]))", "{{kind}}")
            ),
            stack=True,
            bars=True,
            desc="Resolved findings: fleetwatch clears what recovers on its own.",
        ),
        ts(
            "Findings acted on by the action layer",
            targets(
                (
                    f"sum by (kind, severity) (increase(fleetwatch_act_findings_total{{{C}}}[{RATE}]))",
                    "{{kind}} {{severity}}",
                )
            ),
            stack=True,
            bars=True,
        ),
        row("Drains"),
        ts(
            "Drained nodes and drain budget",
            targets(
                (f"sum(fleetwatch_act_drain_budget_used{{{C}}})", "drained now"),
                (f"sum(fleetwatch_act_drain_budget_nodes{{{C}}})", "budget (nodes)"),
                (f"max(fleetwatch_act_fleet_size{{{C}}})", "fleet size"),
            ),
            w=8,
            desc="Drained nodes against the budget; the fleet size the budget is computed on.",
            overrides=[
                {
                    "matcher": {"id": "byName", "options": "fleet size"},
                    "properties": [
                        {"id": "custom.hideFrom", "value": {"viz": True, "legend": False, "tooltip": False}}
                    ],
                }
            ],
        ),
        ts(
            "Drain and resume requests",
            targets(
                (
                    f"sum by (action) (increase(fleetwatch_act_drain_requests_total{{{C}}}[{RATE}]) "
                    f"and on (cluster, instance) (fleetwatch_act_dry_run{{{C}}} == 0))",
                    "{{action}}",
                ),
                (
                    f"sum by (action) (increase(fleetwatch_act_drain_requests_total{{{C}}}[{RATE}]) "
                    f"and on (cluster, instance) (fleetwatch_act_dry_run{{{C}}} == 1))",
                    "{{action}} (dry-run, not executed)",
                ),
            ),
            w=8,
            bars=True,
            stack=True,
            desc="Signed drain/1 requests produced to scheduler.drain.v1; those of an act --dry-run "
            "(to scheduler.drain.dryrun.v1, which no adapter reads) are shown apart: would-be, never "
            "executed.",
        ),
        ts(
            "Drains refused by reason",
            targets(
                (
                    f"sum by (reason) (increase(fleetwatch_act_drains_refused_total{{{C}}}[{RATE}]))",
                    "{{reason}}",
                )
            ),
            w=8,
            bars=True,
            stack=True,
            overrides=fixed_colors(
                ("paused", "orange"),
                *zip(HELD_REASONS, ("blue", "light-blue", "dark-blue", "super-light-blue"), strict=True),
            ),
            desc="Drains refused, by reason. paused: an operator's pause holds them (they drain when it "
            "ends). maintenance, down, drained_by_other, opted_out (blue): people hold the node, "
            "nothing to do. storm: many nodes at once, look for a shared cause. budget: the drain budget "
            "is spent. job: the job already has a drained node. unknown_node: not in the census. "
            "adapter:<outcome>: the Slurm adapter refused or failed it. Any but the blue ones and "
            "paused leaves a node that should be drained in service: drain it by hand if it must go.",
        ),
        ts(
            "Resumes: validated and by hand",
            targets(
                (
                    f"sum by (outcome) (increase(fleetwatch_act_validations_total{{{C}}}[{RATE}]))",
                    "validation {{outcome}}",
                ),
                (f"sum(increase(fleetwatch_act_resumed_by_hand_total{{{C}}}[{RATE}]))", "resumed by hand"),
            ),
            w=8,
            bars=True,
            overrides=fixed_colors(
                ("validation passed", "green"), ("validation failed", "red"), ("resumed by hand", "yellow")
            ),
            desc="How drained nodes come back, per interval: validated by the Slurm adapter before "
            "fleetwatch's drain is lifted (passed: resumed; failed: drained again, "
            "FleetwatchValidationFailed), or resumed by an operator by hand (no validation).",
        ),
        ts(
            "Nodes held by people",
            targets((f"max by (cluster) (fleetwatch_act_nodes_held{{{C}}})", "{{cluster}}")),
            w=8,
            desc="Nodes in a Slurm maintenance reservation, down, drained by someone else or opted out: "
            "never drained by fleetwatch, not in the fleet the budget is sized on. A step up is a "
            "maintenance window or an outage.",
        ),
        ts(
            "Control and Slurm-node records refused",
            targets(
                (
                    f"sum by (reason) (increase(fleetwatch_act_control_refused_total{{{C}}}[{RATE}]))",
                    "control: {{reason}}",
                ),
                (
                    f"sum by (reason) (increase(fleetwatch_act_slurm_nodes_refused_total{{{C}}}[{RATE}]))",
                    "slurm_node: {{reason}}",
                ),
            ),
            w=8,
            bars=True,
            stack=True,
            desc="control/1 (a pause or resume-drains, fleet.control.v1) and slurm_node/1 "
            "(scheduler.nodes.v1) records act refused: malformed, bad_signature (not signed with the "
            "drain key), or clock_skew (issued more than 60 s ahead of the broker's time or act's "
            "clock). None changed anything, but bad_signature means someone without the key is "
            "writing to those topics: find out who; clock_skew on slurm_node means the Slurm "
            "adapter's host clock is ahead, and act is not seeing Slurm's view of those nodes; on "
            "control, a pause or lift from an operator's host whose clock is more than a minute "
            "ahead of the broker's: act did not obey it, fix that host's clock and issue it again.",
        ),
        ts(
            "Census: warm and new nodes",
            targets(
                (f"sum by (warmth) (fleetwatch_act_census_nodes{{{C}}})", "{{warmth}}"),
                (f"max(fleetwatch_act_census_recent_nodes{{{C}}})", "new in the burst window"),
                (f"max(fleetwatch_act_census_burst_threshold{{{C}}})", "burst threshold"),
            ),
            w=12,
            desc="The census act sizes the budget on: only warm nodes (steady telemetry for "
            "--census-warm-up) count. New names above the threshold are a burst (FleetwatchCensusNodeBurst).",
        ),
        ts(
            "Census records refused by reason",
            targets(
                (
                    f"sum by (reason) (increase(fleetwatch_act_census_refused_total{{{C}}}[{RATE}]))",
                    "{{reason}}",
                )
            ),
            w=12,
            bars=True,
            stack=True,
            desc="fleet.nodes.v1 records that did not verify with the census key (unsigned, bad_signature, "
            "malformed, unsigned_tombstone) or replayed older ones (stale). None changed the fleet.",
        ),
    ]
    return dashboard(
        "fleetwatch-fleet",
        "fleetwatch / Fleet overview",
        "Node health, findings and drains across the fleet.",
        panels,
        [CLUSTER, NODE],
    )


# ----------------------------------------------------------------------------- (b) node and GPU


def node_gpu() -> dict:
    node = var_query(
        "node",
        "Node",
        f"label_values(fleetwatch_node_health_score{{{C}}}, node)",
        multi=False,
        include_all=False,
    )
    gpu = var_query("gpu", "GPU", f'label_values(fleetwatch_gpu_signal{{{C}, node=~"$node"}}, gpu)')
    signal = var_query(
        "signal", "Signal", f'label_values(fleetwatch_gpu_signal{{{C}, node=~"$node"}}, signal)'
    )
    nsel = f'{C}, node=~"$node"'
    gsel = f'{nsel}, gpu=~"$gpu", signal=~"$signal"'
    score_thr = thresholds((None, "green"), (0.99, "orange"), (0.999, "red"))
    panels = [
        row("Node"),
        stat(
            "Health score",
            targets((f"min(fleetwatch_node_health_score{{{nsel}}})", "health")),
            thr=HEALTH_THR,
            decimals=2,
            minv=0,
            maxv=1,
        ),
        stat(
            "State",
            targets((f"max by (state) (fleetwatch_node_state{{{nsel}}}) == 1", "{{state}}")),
            text_mode="name",
            overrides=[
                {
                    "matcher": {"id": "byName", "options": s},
                    "properties": [{"id": "color", "value": {"mode": "fixed", "fixedColor": c}}],
                }
                for s, c in (("healthy", "green"), ("suspect", "yellow"), ("degraded", "red"))
            ],
        ),
        ts(
            "Health score over time",
            targets((f"min by (node) (fleetwatch_node_health_score{{{nsel}}})", "{{node}}")),
            w=16,
            h=4,
            thr=HEALTH_THR,
            minv=0,
            maxv=1,
            thr_line=True,
        ),
        row("GPU signal: $signal", repeat="signal"),
        ts(
            "$signal by GPU",
            targets((f"max by (gpu) (fleetwatch_gpu_signal{{{gsel}}})", "GPU {{gpu}}")),
            desc="Latest value of the signal per GPU, as the detectors saw it.",
        ),
        ts(
            "$signal anomaly score by GPU",
            targets((f"max by (gpu) (fleetwatch_gpu_anomaly_score{{{gsel}}})", "GPU {{gpu}}")),
            thr=score_thr,
            minv=0,
            maxv=1,
            decimals=4,
            thr_line=True,
            desc="Calibrated score in [0,1] of the GPU's signal against its sibling GPUs: "
            "P(score >= t) <= 1 - t "
            "on healthy data. The statistical detector flags a GPU at >= 0.999 held for 30 samples "
            "(detectors/gpu_stats.py); 0.99 is drawn for context.",
        ),
        row("Fleet context"),
        bargauge(
            "GPUs over the 0.999 anomaly threshold, fleet-wide, by signal",
            targets(
                (f"count by (signal) (fleetwatch_gpu_anomaly_score{{{C}}} >= 0.999)", "{{signal}}"),
                instant=True,
            ),
            thr=thresholds((None, "green"), (1, "orange"), (10, "red")),
            desc="Many GPUs unusual at once points at a shared cause (cooling, firmware, the job).",
        ),
        table(
            "Highest anomaly scores on this node",
            targets(
                (f"topk(10, max by (gpu, signal) (fleetwatch_gpu_anomaly_score{{{nsel}}}))", ""),
                instant=True,
                fmt="table",
            ),
            thr=score_thr,
            decimals=4,
        ),
    ]
    return dashboard(
        "fleetwatch-node",
        "fleetwatch / Node and GPU drill-down",
        "One node's health and the GPU signals behind its findings, with their anomaly scores.",
        panels,
        [CLUSTER, node, gpu, signal],
    )


# ----------------------------------------------------------------------------- (c) jobs and stragglers


def jobs() -> dict:
    jsel = f'{C}, exported_job=~"$job"'
    nsel = f'{jsel}, node=~"$node"'
    slow_thr = thresholds((None, "green"), (0.05, "yellow"), (0.10, "orange"), (0.333, "red"))
    node = var_query(
        "node", "Node", f'label_values(fleetwatch_job_node_slowdown{{{C}, exported_job=~"$job"}}, node)'
    )
    panels = [
        row("Step time against the job median"),
        ts(
            "Step time: $job",
            [
                target(f"max by (node) (fleetwatch_job_step_time_seconds{{{nsel}}})", "{{node}}", "A"),
                target(f"max(fleetwatch_job_step_time_median_seconds{{{jsel}}})", "job median", "B"),
            ],
            unit="s",
            repeat="job",
            overrides=[
                {
                    "matcher": {"id": "byName", "options": "job median"},
                    "properties": [
                        {"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}},
                        {"id": "custom.lineWidth", "value": 3},
                        {"id": "color", "value": {"mode": "fixed", "fixedColor": "white"}},
                    ],
                }
            ],
            desc="Each node's rolling median step time in the job, and the job's median of those (dashed). "
            "Peers waiting for a straggler are not blamed: the detector compares leave-one-out.",
        ),
        row("Slowdown"),
        bargauge(
            "Slowdown against the peer median, now",
            targets(
                (
                    f"max by (exported_job, node) (fleetwatch_job_node_slowdown{{{nsel}}})",
                    "{{exported_job}} / {{node}}",
                ),
                instant=True,
            ),
            unit="percentunit",
            thr=slow_thr,
            minv=0,
            h=10,
            desc="node step time / peer median - 1. 5%: the detector's minimum; 10%: ByteDance's "
            "'slow job' line; 33% = a 0.75 speed ratio, NVIDIA's straggler cut-off.",
        ),
        ts(
            "Slowdown over time",
            targets(
                (
                    f"max by (exported_job, node) (fleetwatch_job_node_slowdown{{{nsel}}})",
                    "{{exported_job}} / {{node}}",
                )
            ),
            h=10,
            unit="percentunit",
            thr=slow_thr,
            thr_line=True,
        ),
        table(
            "Top stragglers",
            targets(
                (
                    f"topk(15, max by (exported_job, node) (fleetwatch_job_node_slowdown{{{jsel}}}) > 0.05)",
                    "",
                ),
                instant=True,
                fmt="table",
            ),
            unit="percentunit",
            thr=slow_thr,
        ),
        ts(
            "Straggler and lemon findings",
            targets(
                (
                    "sum by (kind, severity) (increase(fleetwatch_findings_total"
                    f'{{{C}, kind=~"straggler|lemon"}}[{RATE}]))',
                    "{{kind}} {{severity}}",
                )
            ),
            bars=True,
            stack=True,
        ),
    ]
    return dashboard(
        "fleetwatch-jobs",
        "fleetwatch / Jobs and stragglers",
        "Per training job: each node's step time against the job median, and slowdowns.",
        panels,
        [CLUSTER, JOB, node],
    )


# ----------------------------------------------------------------------------- (d) pipeline health


def pipeline() -> dict:
    def q(quantile: float, metric: str, by: str) -> str:
        return f"histogram_quantile({quantile}, sum by (le, {by}) (rate({metric}_bucket{{{C}}}[{RATE}])))"

    panels = [
        row("Workers"),
        stat(
            "Targets up",
            targets((f'sum by (job) (up{{{C}, job=~"fleetwatch-.*"}})', "{{job}}")),
            w=8,
            text_mode="value_and_name",
            thr=thresholds((None, "red"), (1, "green")),
            desc="Scrape targets answering, per Prometheus job (fleetwatch-detect, -act, -agent, ...).",
        ),
        stat(
            "Targets down",
            targets((f'count(up{{{C}, job=~"fleetwatch-.*"}} == 0) or vector(0)', "down")),
            thr=thresholds((None, "green"), (1, "red")),
        ),
        stat(
            "Telemetry node-samples/s",
            targets((f"sum(rate(fleetwatch_detect_samples_total{{{C}}}[{RATE}]))", "samples/s")),
            thr=thresholds((None, "red"), (0.001, "green")),
        ),
        stat(
            "Consumer lag (messages)",
            targets((f"sum(fleetwatch_consumer_lag_messages{{{C}}})", "lag")),
            w=8,
            thr=thresholds((None, "green"), (1000, "orange"), (10000, "red")),
        ),
        ts(
            "Input throughput by topic (msg/s)",
            targets((f"sum by (topic) (rate(fleetwatch_worker_messages_total{{{C}}}[{RATE}]))", "{{topic}}")),
        ),
        ts(
            "Output by topic (msg/s)",
            targets((f"sum by (topic) (rate(fleetwatch_worker_outputs_total{{{C}}}[{RATE}]))", "{{topic}}")),
        ),
        ts(
            "Consumer lag by group and topic",
            targets(
                (f"sum by (group, topic) (fleetwatch_consumer_lag_messages{{{C}}})", "{{group}} {{topic}}")
            ),
            desc="End offset minus committed offset, summed over partitions.",
        ),
        ts(
            "Consumer lag by partition (top 10)",
            targets(
                (
                    f"topk(10, max by (group, topic, partition) (fleetwatch_consumer_lag_messages{{{C}}}))",
                    "{{group}} {{topic}}:{{partition}}",
                )
            ),
            desc="One hot partition means one hot key (a node or a job) or a stuck member.",
        ),
        ts(
            "Input partitions owned per worker",
            targets(
                (
                    f"sum by (group, instance) (fleetwatch_worker_partitions{{{C}}})",
                    "{{group}} {{instance}}",
                )
            ),
            stack=True,
            w=24,
            desc="Each member's input partitions (0 while it joins or restores state). A group whose "
            "members own none reads nothing: alert FleetwatchGroupOwnsNoPartitions.",
        ),
        row("Latency"),
        ts(
            "Batch latency (poll to commit)",
            targets(
                (q(0.5, "fleetwatch_worker_batch_seconds", "group"), "p50 {{group}}"),
                (q(0.99, "fleetwatch_worker_batch_seconds", "group"), "p99 {{group}}"),
            ),
            unit="s",
        ),
        ts(
            "Finding latency by kind (sample timestamp to finding produced)",
            targets(
                (q(0.5, "fleetwatch_finding_latency_seconds", "kind"), "p50 {{kind}}"),
                (q(0.99, "fleetwatch_finding_latency_seconds", "kind"), "p99 {{kind}}"),
            ),
            unit="s",
            desc="Includes the detectors' persistence windows (e.g. a straggler must persist 15 s).",
        ),
        panel(
            "heatmap",
            "Finding latency distribution",
            targets(
                (
                    f"sum by (le) (increase(fleetwatch_finding_latency_seconds_bucket{{{C}}}[{RATE}]))",
                    "{{le}}",
                ),
                fmt="heatmap",
            ),
            24,
            8,
            unit="s",
            options={
                "calculate": False,
                "yAxis": {"unit": "s"},
                "cellGap": 1,
                "color": {"mode": "scheme", "scheme": "Oranges", "exponent": 0.5, "steps": 64},
                "legend": {"show": True},
                "tooltip": {"mode": "single", "yHistogram": False},
                "rowsFrame": {"layout": "auto"},
            },
        ),
        row("Bad input"),
        ts(
            "Dead letters by reason",
            targets(
                (
                    f"sum by (reason, source_topic) (rate(fleetwatch_deadletter_total{{{C}}}[{RATE}]))",
                    "{{reason}} ({{source_topic}})",
                )
            ),
            desc="Messages moved to fleet.deadletter.v1 with their original bytes; the reason is in "
            "the headers.",
        ),
        ts(
            "Rejected input by reason",
            targets(
                (
                    f"sum by (group, topic, reason) (rate(fleetwatch_worker_rejected_total{{{C}}}[{RATE}]))",
                    "{{group}} {{topic}} {{reason}}",
                )
            ),
        ),
        ts(
            "Duplicate or out-of-order samples dropped",
            targets(
                (f"sum(rate(fleetwatch_detect_stale_samples_total{{{C}}}[{RATE}]))", "telemetry"),
                (
                    f"sum(rate(fleetwatch_detect_stale_job_records_total{{{C}}}[{RATE}]))",
                    "steps and features",
                ),
            ),
        ),
        ts(
            "State snapshots written and lost",
            targets(
                (
                    f"sum by (group, stage) (increase(fleetwatch_worker_snapshots_total{{{C}}}[{RATE}]))",
                    "{{group}} {{stage}}",
                ),
                (
                    f"sum by (group, stage, reason) "
                    f"(increase(fleetwatch_worker_state_lost_total{{{C}}}[{RATE}]))",
                    "lost: {{group}} {{stage}} ({{reason}})",
                ),
                (
                    f"sum by (group, callback) "
                    f"(increase(fleetwatch_bus_rebalance_errors_total{{{C}}}[{RATE}]))",
                    "failed {{callback}}: {{group}}",
                ),
                (
                    f"sum by (group) (increase(fleetwatch_bus_consumers_replaced_total{{{C}}}[{RATE}]))",
                    "consumer replaced: {{group}}",
                ),
            ),
            bars=True,
            desc="Snapshots written, restores that found a snapshot they could not use (the "
            "partition started cold), rebalance callbacks that raised (an assignment is then "
            "retried; a revoke leaves its input uncommitted), and consumers replaced after a fatal "
            "client error (a static member fenced: once after a broker restart; again and again, two "
            "members with one instance id).",
        ),
        row("Node agents"),
        ts(
            "Spool depth (samples waiting for Kafka)",
            targets((f"max by (instance) (fleetwatch_agent_spool_records{{{C}}})", "{{instance}}")),
            w=8,
        ),
        ts(
            "Samples dropped from full spools",
            targets(
                (
                    f"sum by (instance) (increase(fleetwatch_agent_spool_dropped_total{{{C}}}[{RATE}]))",
                    "{{instance}}",
                )
            ),
            w=8,
            bars=True,
            thr=thresholds((None, "green"), (1, "red")),
            desc="Lost telemetry: a broker outage outlasted the agent's on-disk spool bound.",
        ),
        ts(
            "Agents that cannot reach Kafka",
            targets((f"count(fleetwatch_agent_broker_up{{{C}}} == 0) or vector(0)", "unreachable")),
            w=8,
        ),
        ts(
            "Agent samples taken and acknowledged (samples/s)",
            targets(
                (f"sum(rate(fleetwatch_agent_samples_total{{{C}}}[{RATE}]))", "taken"),
                (f"sum(rate(fleetwatch_agent_sent_total{{{C}}}[{RATE}]))", "acknowledged by Kafka"),
            ),
        ),
        ts(
            "Collector errors by source and reason",
            targets(
                (
                    f"sum by (source, reason) (rate(fleetwatch_agent_source_errors_total{{{C}}}[{RATE}]))",
                    "{{source}} {{reason}}",
                )
            ),
            desc="Failed or timed-out NVML/host/network calls; a hang is itself a finding.",
        ),
        row("Alert delivery"),
        ts(
            "Alerts to Alertmanager (per interval)",
            targets(
                (f"sum(increase(fleetwatch_act_alerts_sent_total{{{C}}}[{RATE}]))", "sent"),
                (f"sum(increase(fleetwatch_act_alerts_failed_total{{{C}}}[{RATE}]))", "failed"),
                (f"sum(increase(fleetwatch_act_alerts_dropped_total{{{C}}}[{RATE}]))", "dropped"),
                (f"sum(increase(fleetwatch_act_alerts_evicted_total{{{C}}}[{RATE}]))", "evicted from queue"),
            ),
            bars=True,
            desc="Posts run on act's sender thread, beside the drain path. Evicted: queued re-sends "
            "pushed out of the full queue by changed alerts (they stay due and are queued again).",
        ),
        ts(
            "Alerts active and pending",
            targets(
                (f"sum(fleetwatch_act_alerts_active{{{C}}})", "active"),
                (f"sum(fleetwatch_act_alerts_pending{{{C}}})", "pending (not yet accepted)"),
                (f"sum(fleetwatch_act_alerts_queued{{{C}}})", "queued or in flight"),
            ),
        ),
    ]
    return dashboard(
        "fleetwatch-pipeline",
        "fleetwatch / Pipeline health",
        "Throughput, lag, latency and bad input of the fleetwatch pipeline itself.",
        panels,
        [CLUSTER],
        refresh="10s",
    )


# ----------------------------------------------------------------------------- (e) reliability


def reliability() -> dict:
    """The reliability accounting's live figures (`fleetwatch account`, docs/reliability.md): what
    SRE leads read; `fleetwatch report` has the same figures over any range, with plots."""
    r = "fleetwatch_reliability"
    window = f"max(fleetwatch_reliability_window_seconds{{{C}}}) / 86400"
    panels = [
        row("The cluster's reliability over the trailing window"),
        stat(
            "Failure rate r_f (per 1000 node-days)",
            targets(
                (f'max({r}_failure_rate_per_1000_node_days{{{C}, scope="large", component="all"}})', "r_f")
            ),
            w=6,
            decimals=2,
            thr=thresholds((None, "green"), (2.34, "yellow"), (6.5, "red")),
            desc="Infrastructure failures of jobs of more than 128 GPUs per 1000 node-days of their runtime "
            "(the paper's r_f; RSC-2 2.34, RSC-1 6.50). docs/reliability.md.",
        ),
        stat(
            "r_f 95% interval",
            targets(
                (f'max({r}_failure_rate_ci_per_1000_node_days{{{C}, bound="low"}})', "low"),
                (f'max({r}_failure_rate_ci_per_1000_node_days{{{C}, bound="high"}})', "high"),
            ),
            w=4,
            decimals=2,
            desc="Exact Poisson interval: a wide one means too few failures to say much yet.",
        ),
        stat(
            "Median ETTR (long jobs)",
            targets((f'max({r}_ettr{{{C}, quantile="0.5"}})', "median")),
            w=4,
            unit="percentunit",
            thr=thresholds((None, "red"), (0.8, "yellow"), (0.9, "green")),
            desc="Productive time over the time jobs of 24 h or more held their allocations.",
        ),
        stat(
            "Lemon nodes",
            targets((f"max({r}_lemon_nodes{{{C}}})", "lemons")),
            w=3,
            thr=thresholds((None, "green"), (1, "orange")),
        ),
        stat(
            "GPU-hours lost",
            targets((f"sum({r}_lost_gpu_hours{{{C}}})", "lost")),
            w=4,
            decimals=0,
            desc="Progress lost since the last checkpoint, restart overhead, and time nodes spent drained.",
        ),
        stat(
            "Window (days)",
            targets((window, "days")),
            w=3,
            decimals=0,
        ),
        row("Failures"),
        ts(
            "r_f by component",
            targets(
                (
                    f'max by (component) ({r}_failure_rate_per_1000_node_days{{{C}, scope="large"}})',
                    "{{component}}",
                )
            ),
            desc="Each component's share of r_f, as it evolved (each point: the trailing window then).",
        ),
        bargauge(
            "Infrastructure failures by component",
            targets((f"sum by (component) ({r}_infra_failures{{{C}}})", "{{component}}"), instant=True),
        ),
        bargauge(
            "Job ends by category",
            targets((f"sum by (category) ({r}_job_ends{{{C}}})", "{{category}}"), instant=True),
            desc="completed; user: the application's own failure; hardware and system_software: the "
            "infrastructure's (NODE_FAIL, or FAILED with a critical finding within 10 min before to 5 min "
            "after the end); other: cancelled, preempted, timed out.",
        ),
        row("Job mean time to failure by size"),
        bargauge(
            "Measured MTTF (hours) by GPUs",
            targets((f"max by (gpus) ({r}_mttf_hours{{{C}}})", "{{gpus}} GPUs"), instant=True),
            unit="h",
        ),
        bargauge(
            "Projected MTTF (hours): 1 / (nodes x r_f)",
            targets((f"max by (gpus) ({r}_projected_mttf_hours{{{C}}})", "{{gpus}} GPUs"), instant=True),
            unit="h",
        ),
        row("What failures cost"),
        bargauge(
            "GPU-hours lost by kind and cause",
            targets(
                (f"sum by (kind, cause) ({r}_lost_gpu_hours{{{C}}})", "{{kind}}: {{cause}}"), instant=True
            ),
            h=10,
        ),
        ts(
            "ETTR of long jobs (quantiles)",
            targets((f"max by (quantile) ({r}_ettr{{{C}}})", "q{{quantile}}")),
            unit="percentunit",
            h=10,
        ),
        row("The accounting stage"),
        ts(
            "Records applied and refused",
            targets(
                (
                    f"sum by (topic, outcome) (rate(fleetwatch_accounting_records_total{{{C}}}[{RATE}]))",
                    "{{topic}} {{outcome}}",
                )
            ),
            unit="reqps",
        ),
        ts(
            "Records behind, data quality",
            targets(
                (f"sum by (topic) (fleetwatch_accounting_behind_records{{{C}}})", "behind: {{topic}}"),
                (f"sum by (what) ({r}_data_quality{{{C}}})", "quality: {{what}}"),
            ),
        ),
        stat(
            "Figures age",
            targets((f"time() - max({r}_refreshed_timestamp_seconds{{{C}}})", "age")),
            w=6,
            unit="s",
            thr=thresholds((None, "green"), (900, "orange")),
            desc="Seconds since the live figures were computed (every 5 minutes by default).",
        ),
        stat(
            "Compute time",
            targets((f"max({r}_refresh_seconds{{{C}}})", "seconds")),
            w=6,
            unit="s",
        ),
    ]
    return dashboard(
        "fleetwatch-reliability",
        "fleetwatch / Reliability",
        "The cluster's failure rate, job MTTF by size, ETTR, lemons and lost GPU-hours (Kokolis et al.).",
        panels,
        [CLUSTER],
    )


DASHBOARDS = {
    "fleet-overview.json": fleet_overview,
    "node-gpu.json": node_gpu,
    "jobs-stragglers.json": jobs,
    "pipeline-health.json": pipeline,
    "reliability.json": reliability,
}


def render() -> dict[str, str]:
    return {name: json.dumps(build(), indent=2) + "\n" for name, build in DASHBOARDS.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if the committed JSON is out of date")
    args = ap.parse_args()
    stale = []
    for name, text in render().items():
        path = OUT / name
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            OUT.mkdir(exist_ok=True)
            path.write_text(text)
    if stale:
        print(f"out of date (run python3 dashboards/generate.py): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
