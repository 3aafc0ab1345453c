"""The reliability report's content: every figure over [since, until), as one JSON-able dict.

`fleetwatch report` (report_cli.py) prints it (--json) or renders it (render.py). The keys the
contract names (docs/contract.md, "fleetwatch report"): r_f_per_1000_node_days, mttf_by_gpus,
ettr, lemons, lost_gpu_hours_by_cause, data_quality; and taxonomy, failures_by_day.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from fleetwatch.pipeline.reliability import figures
from fleetwatch.pipeline.reliability.attribution import Window
from fleetwatch.pipeline.reliability.figures import FigureConfig
from fleetwatch.pipeline.reliability.history import History, load
from fleetwatch.pipeline.reliability.store import MAX_RUN_S, Store, has_table

StepNamed = Callable[[str], None]  # told what the report computes next (the progress bar)


def build(
    store: Store,
    since: float,
    until: float,
    window: Window | None = None,
    cfg: FigureConfig | None = None,
    progress: StepNamed | None = None,
) -> dict[str, Any]:
    window = window or Window()
    cfg = cfg or FigureConfig()
    step = progress or (lambda _what: None)
    t0 = time.monotonic()
    step("loading and attributing runs")
    h = load(store, since, until, window)
    step("failure rate and MTTF")
    rf = figures.failure_rate(h, cfg, large_only=True)
    rf_all = figures.failure_rate(h, cfg, large_only=False)
    # the projection and the ETTR model use r_f per node-day; with no large jobs, the all-sizes rate
    rate = rf["total"] if rf["total"] is not None else rf_all["total"]
    r_f_node_day = (rate or 0.0) / 1000
    step("ETTR and lost time")
    loss = figures.losses(h, cfg)
    drains = _drains(store, until)
    drained = figures.drained_node_seconds(drains, since, until)
    step("lemon nodes")
    executed = {n: [ts for ts, a in ev if a == "drain" and since <= ts < until] for n, ev in drains.items()}
    executed = {n: v for n, v in executed.items() if v}
    out = {
        "since": since,
        "until": until,
        "attribution_window": {
            "before_s": window.before_s,
            "after_s": window.after_s,
            "min_severity": window.min_severity,
        },
        "taxonomy": figures.taxonomy(h),
        "failures_by_day": figures.failures_by_day(h),
        "r_f_per_1000_node_days": {**rf, "all_sizes": rf_all},
        "mttf_by_gpus": figures.mttf_by_gpus(h, r_f_node_day, cfg),
        "ettr": figures.ettr(h, loss, r_f_node_day, cfg),
        "lost_gpu_hours_by_cause": figures.lost_gpu_hours(h, loss, drained, cfg),
        "lemons": figures.lemons(
            h,
            _xids(store, since, until),
            executed,
            _lemon_findings(store, since, until),
            _nodes_seen(store, since, until),
            cfg,
        ),
        "data_quality": data_quality(store, h, since, until),
    }
    out["failures"] = _failure_rows(store, h)
    out["compute_s"] = round(time.monotonic() - t0, 3)
    return out


def _drains(store: Store, until: float) -> dict[str, list[tuple[float, str]]]:
    """Per node, its executed drains and resumes ("drain", "resume"), and the times Slurm's view
    showed it back in service ("returned": a drain lifted by hand ends there), before `until`."""
    out: dict[str, list[tuple[float, str]]] = {}
    for node, ts, action in store.rows(
        "SELECT node, ts, action FROM drains WHERE outcome = 'executed' AND ts < ? ORDER BY ts", (until,)
    ):
        out.setdefault(node, []).append((ts, action))
    # a store written before the view was kept has no such table (store.py)
    if has_table(store, "node_service"):
        for node, ts in store.rows(
            "SELECT node, ts FROM node_service WHERE in_service = 1 AND ts < ? ORDER BY ts", (until,)
        ):
            if node in out:  # only a drained node's return matters
                out[node].append((ts, "returned"))
    return out


def _xids(store: Store, since: float, until: float) -> dict[str, int]:
    rows = store.rows(
        "SELECT node, count(*) FROM findings WHERE kind = 'xid' AND first_seen >= ? AND first_seen < ? "
        "GROUP BY node",
        (since, until),
    )
    return dict(rows)


def _lemon_findings(store: Store, since: float, until: float) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for node, fid in store.rows(
        "SELECT node, id FROM findings WHERE kind = 'lemon' AND first_seen < ? "
        "AND coalesce(resolved_ts, 1e300) >= ?",
        (until, since),
    ):
        out.setdefault(node, []).append(fid)
    return out


def _nodes_seen(store: Store, since: float, until: float) -> int:
    """The lemon test's population: the nodes seen in the range, the census's that reported in it
    and those of the runs in it (that ran in it, or are open and started at most MAX_RUN_S before
    it). Where there is a census, only nodes it knows: a job/1 can name any node, and a population
    of invented names would lower the fleet's rate and make a real node a lemon."""
    census = store.rows("SELECT count(*) FROM nodes")[0][0]
    known = "AND n.node IN (SELECT node FROM nodes)" if census else ""
    return int(
        store.rows(
            f"""SELECT count(*) FROM (
                    SELECT node FROM nodes WHERE first_seen < ? AND last_seen >= ?
                    UNION
                    SELECT n.node FROM runs r JOIN run_nodes n ON n.run = r.id
                    WHERE r.end_ts >= ? AND r.start_ts < ? AND r.bad IS NULL {known}
                    UNION
                    SELECT n.node FROM runs r JOIN run_nodes n ON n.run = r.id
                    WHERE r.end_ts IS NULL AND r.start_ts >= ? AND r.start_ts < ? {known}
                ) AS seen""",
            (until, since, since, until, since - MAX_RUN_S, until),
        )[0][0]
    )


def _failure_rows(store: Store, h: History, limit: int = 200) -> list[dict[str, Any]]:
    """The latest infrastructure failures with their evidence (finding ids and summaries)."""
    rows = []
    idx = np.flatnonzero(h.infra_failure)[-limit:].tolist()
    for i in reversed(idx):
        ev = h.evidence[i]
        summaries = (
            dict(store.rows(f"SELECT id, summary FROM findings WHERE id IN ({','.join('?' * len(ev))})", ev))
            if ev
            else {}
        )
        rows.append(
            {
                "job": str(h.job[i]),
                "end": float(h.end[i]),
                "end_state": str(h.end_state[i]),
                "gpus": int(h.gpus[i]),
                "category": str(h.category[i]),
                "component": h.component[i],
                "node": h.blamed_node[i],
                "evidence": [{"finding": f, "summary": summaries.get(f, "")} for f in ev],
            }
        )
    return rows


def data_quality(store: Store, h: History, since: float, until: float) -> list[dict[str, Any]]:
    lines: dict[str, dict[str, Any]] = {}
    day0, day1 = int(since // 86400), math.ceil(until / 86400) - 1  # the days the range touches
    for what, count in store.rows(
        "SELECT what, sum(count) FROM quality WHERE day >= ? AND day <= ? GROUP BY what", (day0, day1)
    ):
        lines[what] = {"what": what, "count": int(count), "examples": []}
    for what, example in store.rows(
        "SELECT what, example FROM quality_examples WHERE day >= ? AND day <= ?", (day0, day1)
    ):
        if what in lines and len(lines[what]["examples"]) < 5:
            lines[what]["examples"].append(example)
    # runs open longer than any job may run: their end was never seen
    open_since = (until - MAX_RUN_S, since - MAX_RUN_S)
    stale = store.rows(
        "SELECT count(*) FROM runs WHERE end_ts IS NULL AND start_ts < ? AND start_ts >= ?", open_since
    )[0][0]
    if stale:
        examples = store.rows(
            "SELECT job FROM runs WHERE end_ts IS NULL AND start_ts < ? AND start_ts >= ? "
            "ORDER BY start_ts LIMIT 5",
            open_since,
        )
        lines["no_end"] = {"what": "no_end", "count": int(stale), "examples": [j for (j,) in examples]}
    unknown = store.rows(
        """SELECT count(DISTINCT r.id) FROM runs r JOIN run_nodes n ON n.run = r.id
           WHERE r.end_ts >= ? AND r.end_ts < ?
             AND NOT EXISTS (SELECT 1 FROM nodes c WHERE c.node = n.node)""",
        (since, until),
    )[0][0]
    census = store.rows("SELECT count(*) FROM nodes")[0][0]
    if unknown and census:  # with no census at all (a store fed by jobs only), every node is "unknown"
        lines["unknown_nodes"] = {"what": "unknown_nodes", "count": int(unknown), "examples": []}
    return sorted(lines.values(), key=lambda line: line["what"])
