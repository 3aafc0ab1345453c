"""What each message does to the accounting history, with the data-quality rules.

A job/1 message opens, updates or ends a run. A run is (job, start): slurm-jobs names the start
(`start_ts`); a message without one (the simulator, replays) belongs to the job's open run, or
starts one at its own `ts`. Re-reading a message changes nothing: a second identical end is a
no-op, so a restarted stage that reads a topic again counts no job twice.

Data-quality lines (counted per day with examples, shown in the report; never a crash, never a
silent skew of the figures):
- `end_before_start`: the run is kept out of the figures;
- `duplicate_end`: a run ended again differently; the first end stands;
- `end_without_start`: an end for a job with no run seen and no start given; not counted;
- `never_started`: an end with no nodes (cancelled while pending); not a run;
- `clock_ahead`: a job, step or finding time ahead of the broker's time by more than
  `max_ahead_s`: the broker's time is used instead;
- `steps_of_unknown_job`: progress of a job no run was seen for, dropped after `pending_s`;
- `no_end`: a run open longer than `max_run_s` (the report's line; the run stays open);
- `unknown_nodes`: a run naming a node the census never saw (the report's line; counted in).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fleetwatch.pipeline.reliability.store import Progress, Store
from fleetwatch.pipeline.reliability.taxonomy import end_state_of, finding_cause

ENDED = frozenset({"finished", "failed"})


@dataclass(frozen=True)
class IngestConfig:
    gpus_per_node: int = 8  # a job/1 without `gpus` is taken to use every GPU of its nodes
    max_ahead_s: float = 300.0
    pending_s: float = 3600.0


class Ingest:
    def __init__(self, store: Store, cfg: IngestConfig | None = None) -> None:
        self.store = store
        self.cfg = cfg or IngestConfig()

    def _time(self, db: sqlite3.Connection, what: str, ts: float, broker_ts: float | None, who: str) -> float:
        if broker_ts is not None and ts > broker_ts + self.cfg.max_ahead_s:
            self.store.count_quality(
                db, "clock_ahead", broker_ts, f"{what} {who}: ts {ts:.0f} > broker {broker_ts:.0f}"
            )
            return broker_ts
        return ts

    # ------------------------------------------------------------------ job/1

    def job(self, db: sqlite3.Connection, m: Mapping[str, Any], broker_ts: float | None) -> None:
        job, state, nodes = m["job"], m["state"], list(m["nodes"])
        ts = self._time(db, "job", float(m["ts"]), broker_ts, job)
        start = m.get("start_ts")
        if start is not None:
            start = self._time(db, "job", float(start), broker_ts, job)
        if state in ENDED:
            self._end(db, m, job, nodes, ts, start)
            return
        if start is None:
            if self.store.open_run(db, job) is not None:
                return  # a progress update of the run already open
            last = self.store.latest_ended(db, job)
            if last is not None and last["start_ts"] <= ts <= last["end_ts"]:
                return  # a message of a run that has ended, read again
            start = ts
        if self.store.run(db, job, start) is None:
            gpus, known = self._gpus(m, nodes)
            self.store.insert_run(db, job, start, state, nodes, gpus, known)

    def _gpus(self, m: Mapping[str, Any], nodes: list[str]) -> tuple[int, bool]:
        if "gpus" in m:
            return int(sum(m["gpus"])), True
        return len(nodes) * self.cfg.gpus_per_node, False

    def _end(
        self,
        db: sqlite3.Connection,
        m: Mapping[str, Any],
        job: str,
        nodes: list[str],
        ts: float,
        start: float | None,
    ) -> None:
        end_state = end_state_of(m["state"], m.get("end_state"))
        if not nodes:
            self.store.count_quality(db, "never_started", ts, f"job {job} ended {end_state} with no nodes")
            return
        if start is None:
            open_run = self.store.open_run(db, job)
            if open_run is None:
                last = self.store.latest_ended(db, job)
                if last is not None and last["end_ts"] == ts and last["end_state"] == end_state:
                    return  # the same end read again
                if last is not None:
                    self.store.count_quality(
                        db,
                        "duplicate_end",
                        ts,
                        f"job {job}: {end_state} at {ts:.0f} "
                        f"after {last['end_state']} at {last['end_ts']:.0f}",
                    )
                    return
                self.store.count_quality(
                    db, "end_without_start", ts, f"job {job} ended {end_state}, no start seen"
                )
                return
            start = open_run[1]
        run = self.store.run(db, job, start)
        if run is None:
            gpus, known = self._gpus(m, nodes)
            run_id = self.store.insert_run(db, job, start, m["state"], nodes, gpus, known)
        elif run["end_ts"] is not None:
            if run["end_ts"] != ts or run["end_state"] != end_state:
                self.store.count_quality(
                    db,
                    "duplicate_end",
                    ts,
                    f"job {job}: {end_state} at {ts:.0f} after {run['end_state']} at {run['end_ts']:.0f}",
                )
            return
        else:
            run_id = run["id"]
        bad = None
        if ts < start:
            bad = "end_before_start"
            self.store.count_quality(db, bad, ts, f"job {job}: end {ts:.0f} before start {start:.0f}")
        self.store.end_run(db, run_id, ts, m["state"], end_state, m.get("exit_code"), bad)

    # ------------------------------------------------------------------ step/1

    def progress(self, db: sqlite3.Connection, job: str, p: Progress, now: float) -> None:
        """A job's steps of one batch, merged (stage.py aggregates them per job first)."""
        run_id = self.store.run_for_progress(db, job, p.last_ts)
        if run_id is None:
            self.store.park_progress(db, job, p)
            return
        self.store.add_progress(db, run_id, p)

    def expire(self, db: sqlite3.Connection, now: float) -> None:
        gone = self.store.expire_pending(db, now - self.cfg.pending_s)
        for _ in range(min(gone, 1)):
            self.store.count_quality(db, "steps_of_unknown_job", now, f"{gone} jobs' steps with no run seen")

    # ------------------------------------------------------------------ finding/1, drain_result/1, node/1

    def finding(self, db: sqlite3.Connection, f: Mapping[str, Any], broker_ts: float | None) -> None:
        ev = f["evidence"]
        rule = ev.get("rule") if isinstance(ev.get("rule"), str) else None
        cause = finding_cause(f["kind"], rule, ev)
        ts = self._time(db, "finding", float(f["ts"]), broker_ts, f["id"])
        self.store.upsert_finding(
            db,
            {
                "id": f["id"],
                "node": f["node"],
                "gpu": f.get("gpu"),
                "kind": f["kind"],
                "rule": rule,
                "severity": f["severity"],
                "summary": f["summary"],
                "first_seen": min(float(f["first_seen"]), ts),
                "ts": ts,
                "resolved_ts": ts if f["resolved"] else None,
                "domain": cause.domain if cause else None,
                "component": cause.component if cause else None,
                "priority": cause.priority if cause else None,
            },
        )

    def drain_result(self, db: sqlite3.Connection, r: Mapping[str, Any]) -> None:
        self.store.upsert_drain(db, r["request_id"], r["node"], r["action"], r["outcome"], float(r["ts"]))

    def node(self, db: sqlite3.Connection, n: Mapping[str, Any]) -> None:
        self.store.upsert_node(db, n["node"], float(n["first_seen"]), float(n["last_seen"]))
