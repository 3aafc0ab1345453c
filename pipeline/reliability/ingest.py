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
- `clock_ahead`: a job or step time ahead of the broker's time by more than
  `max_ahead_s`: the broker's time is used instead (a job's `start_ts` is counted but kept: it
  names the run, which the job's other records, taken at other times, must name the same);
- `clock_behind`: a job or step time more than `max_behind_s` before the broker took
  it: a clock far behind, or records published late (a publisher that was down, a backfill). Its
  own time is kept: it may be the true one;
- `steps_of_unknown_job`: progress of a job no run was seen for, dropped after `pending_s`;
- `no_end`: a run open longer than `max_run_s` (the report's line; the run stays open);
- `unknown_nodes`: a run naming a node the census never saw (the report's line; counted in).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fleetwatch.pipeline.reliability.store import Progress, Store
from fleetwatch.pipeline.reliability.taxonomy import end_state_of, finding_cause

ENDED = frozenset({"finished", "failed"})
STEP_SLACK_S = 60.0  # a step reported this long after its run's end still belongs to it


@dataclass(frozen=True)
class IngestConfig:
    gpus_per_node: int = 8  # a job/1 without `gpus` is taken to use every GPU of its nodes
    max_ahead_s: float = 300.0
    max_behind_s: float = 86400.0  # later than a day: no publisher retries that long
    pending_s: float = 3600.0


def clock_skew(ts: float, broker_ts: float | None, cfg: IngestConfig) -> str | None:
    """The data-quality line a record time earns against the broker's time for it, if any."""
    if broker_ts is None:
        return None
    if ts > broker_ts + cfg.max_ahead_s:
        return "clock_ahead"
    if ts < broker_ts - cfg.max_behind_s:
        return "clock_behind"
    return None


class Ingest:
    def __init__(self, store: Store, cfg: IngestConfig | None = None) -> None:
        self.store = store
        self.cfg = cfg or IngestConfig()

    def count_skew(self, db: sqlite3.Connection, skew: str, what: str, ts: float, broker_ts: float) -> None:
        """Count a clock_skew line for the time `ts` of `what` (a job's, a step's)."""
        sign = ">" if skew == "clock_ahead" else "<"
        self.store.count_quality(db, skew, broker_ts, f"{what}: ts {ts:.0f} {sign} broker {broker_ts:.0f}")

    def _time(self, db: sqlite3.Connection, what: str, ts: float, broker_ts: float | None, who: str) -> float:
        """`ts` as the history takes it: bounded by the broker's time, and counted where skewed."""
        skew = clock_skew(ts, broker_ts, self.cfg)
        if skew is None or broker_ts is None:
            return ts
        self.count_skew(db, skew, f"{what} {who}", ts, broker_ts)
        return broker_ts if skew == "clock_ahead" else ts

    # ------------------------------------------------------------------ job/1

    def job(self, db: sqlite3.Connection, m: Mapping[str, Any], broker_ts: float | None) -> None:
        job, state = m["job"], m["state"]
        nodes, gpus = _unique_nodes(m["nodes"], m.get("gpus"))
        m = {**m, "nodes": nodes, **({"gpus": gpus} if gpus is not None else {})}
        ts = self._time(db, "job", float(m["ts"]), broker_ts, job)
        # not bounded by this record's broker time: a run's start and end come in records the
        # broker took at different times, and must name the same run
        start = m.get("start_ts")
        if start is not None:
            start = float(start)
            # (where it is the record's own time, _time counted it: slurm-jobs' `started` records)
            if (
                start != float(m["ts"])
                and broker_ts is not None
                and clock_skew(start, broker_ts, self.cfg) == "clock_ahead"
            ):
                self.count_skew(db, "clock_ahead", f"job {job} start_ts (kept)", start, broker_ts)
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

    def progress(self, db: sqlite3.Connection, job: str, steps: list[Progress]) -> None:
        """A job's step reports of one batch (one Progress each): each goes to the run it belongs
        to, the latest that started by its time and had not ended a minute before it; reports
        that belong to no run seen yet wait (pending_steps), merged."""
        runs = self.store.runs_of(db, job)
        per_run: dict[int, Progress] = {}
        waiting: Progress | None = None
        starts = np.array([r[1] for r in runs], dtype=np.float64)
        ts = np.array([p.last_ts for p in steps], dtype=np.float64)
        at = np.searchsorted(starts, ts, side="right") - 1  # vectorised: a batch holds many reports
        for p, i in zip(steps, at.tolist(), strict=True):
            if i >= 0 and (runs[i][2] is None or p.last_ts <= runs[i][2] + STEP_SLACK_S):
                run_id, start = runs[i][0], runs[i][1]
                p = Progress(max(p.first_ts, start), p.last_ts, p.ckpt_ts, p.ckpt_step, p.ckpt_write_s)
                old = per_run.get(run_id)
                per_run[run_id] = p if old is None else old.merge(p)
            else:
                waiting = p if waiting is None else waiting.merge(p)
        for run_id, p in per_run.items():
            self.store.add_progress(db, run_id, p)
        if waiting is not None:
            self.store.park_progress(db, job, waiting)

    def expire(self, db: sqlite3.Connection, data_now: float) -> None:
        """Drop the parked progress of jobs no run appeared for within `pending_s` of the data's
        own time (not the wall clock: a stage catching up reads days-old steps)."""
        gone = self.store.expire_pending(db, data_now - self.cfg.pending_s)
        if gone:
            self.store.count_quality(
                db, "steps_of_unknown_job", data_now, f"{gone} jobs' steps with no run seen", gone
            )

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


def _unique_nodes(nodes: Sequence[str], gpus: Sequence[int] | None) -> tuple[list[str], list[int] | None]:
    """A job's nodes once each (a node listed twice would count its node-days twice), their GPUs
    summed."""
    if len(set(nodes)) == len(nodes):
        return list(nodes), None if gpus is None else list(gpus)
    out: dict[str, int] = {}
    for i, n in enumerate(nodes):
        out[n] = out.get(n, 0) + (gpus[i] if gpus is not None else 0)
    return list(out), None if gpus is None else list(out.values())
