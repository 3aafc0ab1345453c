"""What each message does to the accounting history, with the data-quality rules.

A job/1 message opens, updates or ends a run. A run is (job, start): slurm-jobs names the start
(`start_ts`); a message without one (the simulator, replays) belongs to the job's open run, or
starts one at its own `ts`. Re-reading a message changes nothing: a second identical end is a
no-op, so a restarted stage that reads a topic again counts no job twice. A run whose first record
listed no nodes (job/1 allows an empty list) takes the nodes and GPUs of a later record of it (its
end).

Data-quality lines (counted per day with examples, shown in the report; never a crash, never a
silent skew of the figures):
- `end_before_start`: the run is kept out of the figures;
- `run_too_long`: a record of a run more than `LONGEST_RUN_S` after its start (a `start_ts` of 0,
  a start from another run): its runtime cannot be right, so the run is kept out of the figures
  rather than capped (a capped runtime would be a guess counted as a measurement);
- `duplicate_end`: a run ended again differently (its state, or its own `ts`: a copy of the same
  end delivered again, the broker's time bounding each copy differently, is the same end); the
  first end stands;
- `end_without_start`: an end for a job with no run seen and no start given; not counted;
- `never_started`: an end with no nodes (cancelled while pending); not a run;
- `clock_ahead`: a job or step time ahead of the broker's time by more than
  `max_ahead_s`: the broker's time is used instead (a job's `start_ts` is counted but kept: it
  names the run, which the job's other records, taken at other times, must name the same);
- `clock_behind`: a job or step time more than `max_behind_s` before the broker took
  it: a clock far behind, or records published late (a publisher that was down, a backfill). Its
  own time is kept: it may be the true one;
- `steps_of_unknown_job`: progress of a job no run was seen for, dropped after `pending_s`;
- `steps_not_in_job`: a step report from a node its run does not list (training code can name any
  job: detect refuses such steps as `not_in_job`); not applied. Steps that waited for their run are
  judged when it comes (counted once per node then). A run whose job/1 listed no nodes yet takes
  every step;
- `no_end`: a run open longer than `max_run_s` (the report's line; the run stays open);
- `unknown_nodes`: a run naming a node the census never saw (the report's line; counted in).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fleetwatch.pipeline.reliability.store import MAX_RUN_S, Progress, Store
from fleetwatch.pipeline.reliability.taxonomy import end_state_of, finding_cause
from fleetwatch.slurm_state import out_of_service

ENDED = frozenset({"finished", "failed"})
STEP_SLACK_S = 60.0  # a step reported this long after its run's end still belongs to it
# The longest a run's records may come after its start: Slurm's longest job, and an hour for a job
# that ends a little after its time limit (KillWait, OverTimeLimit)
LONGEST_RUN_S = MAX_RUN_S + 3600.0


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
            open_run = self.store.open_run(db, job)
            if open_run is not None:
                self._place(db, open_run[0], m, nodes)  # a progress update of the run already open
                return
            last = self.store.latest_ended(db, job)
            if last is not None and last["start_ts"] <= ts <= last["end_ts"]:
                return  # a message of a run that has ended, read again
            start = ts
        run = self.store.run(db, job, start)
        if run is not None:
            self._place(db, run["id"], m, nodes)
            return
        bad = None
        if ts - start > LONGEST_RUN_S:
            bad = "run_too_long"
            self._count_too_long(db, job, start, ts)
        self._new_run(db, m, job, start, nodes, bad)

    def _gpus(self, m: Mapping[str, Any], nodes: list[str]) -> tuple[int, bool]:
        if "gpus" in m:
            return int(sum(m["gpus"])), True
        return len(nodes) * self.cfg.gpus_per_node, False

    def _new_run(
        self,
        db: sqlite3.Connection,
        m: Mapping[str, Any],
        job: str,
        start: float,
        nodes: list[str],
        bad: str | None,
    ) -> int:
        gpus, known = self._gpus(m, nodes)
        run_id = self.store.insert_run(db, job, start, m["state"], nodes, gpus, known, bad)
        self._claim_waiting(db, job, run_id, start, nodes)
        return run_id

    def _place(self, db: sqlite3.Connection, run_id: int, m: Mapping[str, Any], nodes: list[str]) -> None:
        """A run whose records so far listed no nodes takes this record's (job/1 allows an empty
        list): with none, its node-days would be 0 and its MTTF projection a division by 0."""
        if nodes:
            gpus, known = self._gpus(m, nodes)
            self.store.place_run(db, run_id, nodes, gpus, known)

    def _count_too_long(self, db: sqlite3.Connection, job: str, start: float, ts: float) -> None:
        self.store.count_quality(
            db, "run_too_long", ts, f"job {job}: record at {ts:.0f}, {(ts - start) / 86400:.1f} d after start"
        )

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
        given = float(m["ts"])  # the record's own time: a copy of it, bounded otherwise, is the same end
        if not nodes:
            self.store.count_quality(db, "never_started", ts, f"job {job} ended {end_state} with no nodes")
            return
        if start is None:
            open_run = self.store.open_run(db, job)
            if open_run is None:
                last = self.store.latest_ended(db, job)
                if last is not None and _same_end(last, given, end_state):
                    return  # the same end read again
                if last is not None:
                    self._count_duplicate(db, job, end_state, ts, last)
                    return
                self.store.count_quality(
                    db, "end_without_start", ts, f"job {job} ended {end_state}, no start seen"
                )
                return
            start = open_run[1]
        run = self.store.run(db, job, start)
        if run is not None and run["end_ts"] is not None:
            if not _same_end(run, given, end_state):
                self._count_duplicate(db, job, end_state, ts, run)
            return
        if run is None:
            run_id, bad = self._new_run(db, m, job, start, nodes, None), None
        else:
            run_id, bad = run["id"], run["bad"]  # a run found too long at its start is counted once
            self._place(db, run_id, m, nodes)
        if bad is None and ts < start:
            bad = "end_before_start"
            self.store.count_quality(db, bad, ts, f"job {job}: end {ts:.0f} before start {start:.0f}")
        elif bad is None and ts - start > LONGEST_RUN_S:
            bad = "run_too_long"
            self._count_too_long(db, job, start, ts)
        self.store.end_run(db, run_id, ts, m["state"], end_state, m.get("exit_code"), bad, given)

    def _count_duplicate(
        self, db: sqlite3.Connection, job: str, end_state: str, ts: float, first: Mapping[str, Any]
    ) -> None:
        self.store.count_quality(
            db,
            "duplicate_end",
            ts,
            f"job {job}: {end_state} at {ts:.0f} after {first['end_state']} at {first['end_ts']:.0f}",
        )

    # ------------------------------------------------------------------ step/1

    def progress(
        self, db: sqlite3.Connection, job: str, nodes: Sequence[str], steps: Sequence[Progress]
    ) -> None:
        """A job's step reports of one batch (one Progress each, from the node beside it): each goes
        to the run it belongs to, the latest that started by its time and had not ended a minute
        before it, if its node is one of the run's; reports that belong to no run seen yet wait
        (pending_steps), merged per node."""
        runs = self.store.runs_of(db, job)
        names, node = np.unique(np.array(nodes, dtype=str), return_inverse=True)  # node: index in names
        ts = np.array([p.last_ts for p in steps], dtype=np.float64)
        starts = np.array([r[1] for r in runs], dtype=np.float64)
        ends = np.array([np.inf if r[2] is None else r[2] for r in runs], dtype=np.float64)
        at = np.searchsorted(starts, ts, side="right") - 1  # vectorised: a batch holds many reports
        placed = at >= 0
        placed[placed] = ts[placed] <= ends[at[placed]] + STEP_SLACK_S
        taken = placed.copy()
        for i in np.unique(at[placed]).tolist():
            run_id, _start, _end, n_nodes = runs[i]
            if not n_nodes:
                continue  # its job/1 listed no nodes yet: nothing to judge by
            mine = placed & (at == i)
            member = np.zeros(len(names), dtype=bool)
            found = self.store.members(db, run_id, names[np.unique(node[mine])].tolist())
            member[np.searchsorted(names, sorted(found))] = True
            foreign = mine & ~member[node]
            self._not_in_job(db, job, names[node[foreign]], ts[foreign])
            taken &= ~foreign
        marks = _Marks(steps)
        for i, p in marks.merged(np.flatnonzero(taken), at[taken]):
            run_id, start = runs[i][0], runs[i][1]
            self.store.add_progress(db, run_id, p.starting(start))
        waiting = np.flatnonzero(~placed)
        if len(waiting):
            parked = marks.merged(waiting, node[waiting])
            self.store.park_progress(db, job, [(str(names[k]), p) for k, p in parked])

    def _not_in_job(self, db: sqlite3.Connection, job: str, nodes: np.ndarray, ts: np.ndarray) -> None:
        if len(nodes):
            self.store.count_quality(
                db,
                "steps_not_in_job",
                float(ts.max()),
                f"step of job {job} from {nodes[0]}, not one of its run's nodes",
                len(nodes),
            )

    def _claim_waiting(
        self, db: sqlite3.Connection, job: str, run_id: int, start: float, nodes: Sequence[str]
    ) -> None:
        """A new run takes the progress that waited for it from its own nodes (any node while it
        lists none); what came from other nodes is counted and dropped."""
        waiting = self.store.take_pending(db, job, start)
        if not waiting:
            return
        node = np.array([n for n, _ in waiting], dtype=str)
        marks = _Marks([p for _, p in waiting])
        ok = np.isin(node, np.array(nodes, dtype=str)) if nodes else np.ones(len(node), dtype=bool)
        self._not_in_job(db, job, node[~ok], marks.last[~ok])
        for _, p in marks.merged(np.flatnonzero(ok), np.zeros(int(ok.sum()), dtype=np.int64)):
            self.store.add_progress(db, run_id, p.starting(start))

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
        if r["action"] == "drain" and r["outcome"] == "executed":
            self.store.note_drain(db, r["node"], float(r["ts"]))

    def slurm_view(self, db: sqlite3.Connection, v: Mapping[str, Any]) -> None:
        """Slurm's view of a node (the adapter's slurm_node/1): in service, or out of it (drained,
        draining, down, failed or in maintenance, whoever did it: the adapter's own validation
        lifts its drain inside a maintenance reservation while it tests). An executed drain ends at
        its resume or at the first view after it that shows the node in service (lifted by hand:
        it counted as drained for ever). A state the adapter could not name ("unknown") says
        neither. Dated by the adapter's clock, as its drain results are: the two are compared."""
        state = v["state"]
        if state == "unknown":
            return
        out = out_of_service(state) or bool(v["maintenance"])
        self.store.note_service(db, v["node"], float(v["ts"]), not out)

    def node(self, db: sqlite3.Connection, n: Mapping[str, Any]) -> None:
        self.store.upsert_node(db, n["node"], float(n["first_seen"]), float(n["last_seen"]))


def _same_end(run: Mapping[str, Any], given: float, end_state: str) -> bool:
    """Whether an end record's own time and state are the stored end's (a run ended before
    end_given_ts was kept compares its end_ts, as it did then)."""
    own = run["end_given_ts"] if run["end_given_ts"] is not None else run["end_ts"]
    return bool(run["end_state"] == end_state and own == given)


class _Marks:
    """Step reports as columns, to merge many groups of them at once."""

    def __init__(self, marks: Sequence[Progress]) -> None:
        self.marks = marks
        self.first = np.array([p.first_ts for p in marks], dtype=np.float64)
        self.last = np.array([p.last_ts for p in marks], dtype=np.float64)
        self.ckpt = np.array([-1.0 if p.ckpt_ts is None else p.ckpt_ts for p in marks], dtype=np.float64)

    def merged(self, idx: np.ndarray, keys: np.ndarray) -> list[tuple[int, Progress]]:
        """The marks `idx` merged per key, as Progress.merge would one by one (the latest
        checkpoint's, the first of equals): (key, merged) by key."""
        if not len(idx):
            return []
        order = np.lexsort((idx, -self.ckpt[idx], keys))  # by key, latest checkpoint first
        i, k = idx[order], keys[order]
        heads = np.flatnonzero(np.r_[True, k[1:] != k[:-1]])
        first = np.minimum.reduceat(self.first[i], heads).tolist()
        last = np.maximum.reduceat(self.last[i], heads).tolist()
        out = []
        for g, h in enumerate(heads.tolist()):  # per group, not per mark
            best = self.marks[int(i[h])]
            p = Progress(first[g], last[g], best.ckpt_ts, best.ckpt_step, best.ckpt_write_s)
            out.append((int(k[h]), p))
        return out


def _unique_nodes(nodes: Sequence[str], gpus: Sequence[int] | None) -> tuple[list[str], list[int] | None]:
    """A job's nodes once each (a node listed twice would count its node-days twice), their GPUs
    summed."""
    if len(set(nodes)) == len(nodes):
        return list(nodes), None if gpus is None else list(gpus)
    out: dict[str, int] = {}
    for i, n in enumerate(nodes):
        out[n] = out.get(n, 0) + (gpus[i] if gpus is not None else 0)
    return list(out), None if gpus is None else list(out.values())
