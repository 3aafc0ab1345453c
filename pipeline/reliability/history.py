"""The runs that ended in a time range, attributed, as numpy columns: what every figure reads.

Loading is one query per table; attribution joins the failed runs with the cause findings open in
their window on their nodes (one indexed query) and applies attribution.attribute(). Text columns
are object arrays; times are float seconds, NaN where unknown.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fleetwatch.pipeline.reliability.attribution import SEVERITY_RANK, Candidate, Window, attribute
from fleetwatch.pipeline.reliability.store import LASTING_FINDING_S, Store, has_table
from fleetwatch.pipeline.reliability.taxonomy import FAILED_ENDS, NODE_ENDS

_FAILURES = tuple(sorted(FAILED_ENDS | NODE_ENDS))
_IDS_PER_QUERY = 500  # finding ids per IN list (SQLite's bound parameters: 999 in older builds)
# A finding open in a run's window [end - before, end + after]: opened by its close, resolved (or
# not) after it opened. Found in two disjoint parts, each an indexed range of the node's findings,
# so that the cost is the findings near the window, not the node's whole history before or after
# it: those opened at most LASTING_FINDING_S before the window (findings_node, by opening), and
# those opened earlier, which lasted longer than that (findings_lasting, partial: by their end).
_CAUSE_RUNS = f"""SELECT r.id, f.id, f.severity, f.domain, f.component, f.priority, f.first_seen, f.node
    FROM runs r JOIN run_nodes n ON n.run = r.id JOIN findings f ON f.node = n.node
    WHERE r.end_ts >= ? AND r.end_ts < ? AND r.bad IS NULL
      AND r.end_state IN ({",".join("?" * len(_FAILURES))})
      AND f.domain IS NOT NULL AND coalesce(f.resolved_ts, 1e300) >= r.end_ts - ?"""
_CAUSES_SQL = f"""{_CAUSE_RUNS}
      AND f.first_seen >= r.end_ts - ? - {LASTING_FINDING_S} AND f.first_seen <= r.end_ts + ?
    UNION ALL
    {_CAUSE_RUNS}
      AND f.first_seen < r.end_ts - ? - {LASTING_FINDING_S}
      AND coalesce(f.resolved_ts, 1e300) - f.first_seen > {LASTING_FINDING_S}"""


def _levels(store: Store, ids: set[str]) -> dict[str, list[tuple[float, str]]]:
    """Each finding's first emission at each severity (finding_levels), where the store keeps them
    (one written before them does not)."""
    if not ids or not has_table(store, "finding_levels"):
        return {}
    out: dict[str, list[tuple[float, str]]] = {}
    ordered = sorted(ids)
    for k in range(0, len(ordered), _IDS_PER_QUERY):
        chunk = ordered[k : k + _IDS_PER_QUERY]
        marks = ",".join("?" * len(chunk))
        for fid, sev, ts in store.rows(
            f"SELECT id, severity, ts FROM finding_levels WHERE id IN ({marks})", chunk
        ):
            out.setdefault(fid, []).append((float(ts), sev))
    return out


def severity_by(levels: list[tuple[float, str]] | None, when: float, worst: str) -> str:
    """A finding's severity by `when`: the most severe it had been emitted at by then; the one it
    was first emitted at where even that came later (its first_seen, given by detect, is earlier
    than its first emission); its worst where the store kept no levels."""
    if not levels:
        return worst
    reached = [sev for ts, sev in levels if ts <= when]
    if not reached:
        return min(levels)[1]
    return max(reached, key=lambda s: SEVERITY_RANK.get(s, -1))


def _causes_params(since: float, until: float, window: Window) -> tuple[float | str, ...]:
    runs = (since, until, *_FAILURES, window.before_s)
    return (*runs, window.before_s, window.after_s, *runs, window.before_s)


@dataclass
class History:
    since: float
    until: float
    window: Window
    run_id: np.ndarray  # int64
    job: np.ndarray  # object
    start: np.ndarray
    end: np.ndarray
    end_state: np.ndarray  # object
    n_nodes: np.ndarray  # int64
    gpus: np.ndarray  # int64
    first_step: np.ndarray
    last_step: np.ndarray
    ckpt: np.ndarray
    ckpt_write_s: np.ndarray
    category: np.ndarray  # object: taxonomy.CATEGORIES
    component: np.ndarray  # object or None
    evidence: list[list[str]] = field(default_factory=list)
    # node each failure is blamed on (the winning finding's node; a single-node job's node), or None
    blamed_node: np.ndarray = field(default_factory=lambda: np.array([], dtype=object))
    single_node: np.ndarray = field(default_factory=lambda: np.array([], dtype=object))  # node of 1-node runs

    @property
    def runtime_s(self) -> np.ndarray:
        return np.maximum(self.end - self.start, 0.0)

    @property
    def infra_failure(self) -> np.ndarray:
        return (self.category == "hardware") | (self.category == "system_software")

    def __len__(self) -> int:
        return len(self.run_id)


def _floats(rows: list[tuple], i: int) -> np.ndarray:
    return np.array([r[i] for r in rows], dtype=np.float64)  # None becomes NaN


def load(store: Store, since: float, until: float, window: Window) -> History:
    rows = store.rows(
        """SELECT id, job, start_ts, end_ts, end_state, n_nodes, gpus, first_step_ts, last_step_ts,
                  ckpt_ts, ckpt_write_s
           FROM runs WHERE end_ts >= ? AND end_ts < ? AND bad IS NULL ORDER BY end_ts, id""",
        (since, until),
    )
    n = len(rows)
    h = History(
        since=since,
        until=until,
        window=window,
        run_id=np.array([r[0] for r in rows], dtype=np.int64),
        job=np.array([r[1] for r in rows], dtype=object),
        start=_floats(rows, 2),
        end=_floats(rows, 3),
        end_state=np.array([r[4] for r in rows], dtype=object),
        n_nodes=np.array([r[5] for r in rows], dtype=np.int64),
        gpus=np.array([r[6] for r in rows], dtype=np.int64),
        first_step=_floats(rows, 7),
        last_step=_floats(rows, 8),
        ckpt=_floats(rows, 9),
        ckpt_write_s=_floats(rows, 10),
        category=np.empty(n, dtype=object),
        component=np.empty(n, dtype=object),
    )
    index = {int(rid): i for i, rid in enumerate(h.run_id)}
    # the cause findings open in each failed run's window, on the run's nodes
    pairs = store.rows(_CAUSES_SQL, _causes_params(since, until, window))
    levels = _levels(store, {row[1] for row in pairs})
    finding_node: dict[str, str] = {}
    candidates = []
    for run, fid, worst, domain, comp, prio, first, node in pairs:
        i = index[run]
        # what the finding was by the window's end, not what it became after (an escalation hours
        # later blamed every failure it had been seen beside as a warning)
        sev = severity_by(levels.get(fid), float(h.end[i]) + window.after_s, worst)
        candidates.append(Candidate(i, fid, sev, domain, comp, prio, first))
        finding_node[fid] = node
    attributions = attribute(list(h.end_state), candidates, window)
    h.category[:] = [a.category for a in attributions]
    h.component[:] = [a.component for a in attributions]
    h.evidence = [a.evidence for a in attributions]
    # the node of each single-node run, for the lemon signals
    single = store.rows(
        """SELECT r.id, n.node FROM runs r JOIN run_nodes n ON n.run = r.id
           WHERE r.end_ts >= ? AND r.end_ts < ? AND r.bad IS NULL AND r.n_nodes = 1""",
        (since, until),
    )
    h.single_node = np.full(n, None, dtype=object)
    for run, node in single:
        h.single_node[index[run]] = node
    h.blamed_node = np.array(
        [finding_node[a.evidence[0]] if a.evidence else None for a in attributions], dtype=object
    )
    lone = (h.blamed_node == None) & (h.n_nodes == 1)  # noqa: E711 (elementwise on an object array)
    h.blamed_node[lone] = h.single_node[lone]
    return h
