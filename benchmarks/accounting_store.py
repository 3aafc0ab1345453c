"""The accounting stage's speed, and the store's engine chosen by the report's speed.

1. A 30-day history of a 2,000-node RSC-1-like cluster (collectors/sim/workload.py: about 210k
   runs, their failures with a critical finding each, background warnings, drains) is applied by
   the stage's own code (Accounting.apply on polled-record batches of 5,000, as `fleetwatch
   account` applies them) into SQLite: records/s.
   Applied in ten slices of time order, each timed: whether applying slows as the store grows.
   Beside it, what this cluster sends (its history's records over the period, mean and busiest
   minute): run with --nodes 16000 for the issue's cluster.
2. Step reports (step/1, every rank of the training jobs) through the same code: steps/s, against
   what the cluster's ranks send (every GPU a rank, a step every 5 s: 25,600/s at 16,000 nodes).
3. The report over the 30 days (report.build: attribution join, figures) on SQLite, and on
   DuckDB loaded with the same tables: seconds each (the issue's bar: under a minute); and the
   whole `fleetwatch report --out DIR` command on the SQLite store (its plots, Markdown and HTML).

    python -m benchmarks.accounting_store [--nodes 2000 --days 30] [--json]

DuckDB (`pip install duckdb`, a dev dependency) is only this comparison's.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from fleetwatch import schemas, signing, topics
from fleetwatch.bus import Record
from fleetwatch.collectors.sim.workload import Workload, WorkloadConfig, draw, node_name
from fleetwatch.detectors.findings import make_finding
from fleetwatch.pipeline.reliability import report
from fleetwatch.pipeline.reliability.ingest import Ingest
from fleetwatch.pipeline.reliability.stage import Accounting
from fleetwatch.pipeline.reliability.store import Store

CENSUS_KEY = b"c" * 32
DRAIN_KEY = b"d" * 32
BATCH = 5000
FINDING_OF = {  # the finding a failure of each component shows as (detect's kinds)
    "ib_link": ("ib_link", {}),
    "filesystem_mount": ("mount", {}),
    "gpu_memory": ("ecc", {}),
    "pcie": ("pcie", {}),
    "nvlink": ("nvlink", {}),
    "driver": ("xid", {"cause": "driver", "worst_xid": 119}),
}


def messages(w: Workload, warnings_per_node_day: float = 0.5) -> Iterator[tuple[float, str, bytes, bytes]]:
    """(time, topic, key, value) of the history, in time order."""
    out = [(ts, topics.JOBS, job.encode(), orjson.dumps(m)) for ts, job, m in w.job_messages()]
    rng = np.random.default_rng(w.cfg.seed + 1)
    for i in range(len(w)):
        comp = w.component[i]
        if comp in FINDING_OF:
            kind, ev = FINDING_OF[comp]
            node = node_name(int(w.failed_node[i]))
            ts = float(w.fault_ts[i])
            # open at the fault, resolved ten minutes later (the node repaired or replaced)
            for at, resolved in ((ts, False), (ts + 600, True)):
                f = make_finding(
                    node=node,
                    kind=kind,
                    rule="bench",
                    severity="critical",
                    score=1.0,
                    summary=f"{kind} on {node}",
                    evidence=ev,
                    first_seen=ts,
                    ts=at,
                    resolved=resolved,
                )
                out.append((at, topics.FINDINGS, node.encode(), orjson.dumps(signing.signed(f, CENSUS_KEY))))
    # background warnings that fail nothing, opened and resolved ten minutes later
    k = rng.poisson(warnings_per_node_day * w.cfg.nodes * w.cfg.days)
    for ts, n in zip(
        w.cfg.start + rng.uniform(0, w.cfg.days * 86400, k), rng.integers(0, w.cfg.nodes, k), strict=True
    ):
        node = node_name(int(n))
        for at, resolved in ((float(ts), False), (float(ts) + 600, True)):
            f = make_finding(
                node=node,
                kind="thermal",
                rule="bench",
                severity="warning",
                score=0.5,
                summary="warm",
                evidence={},
                first_seen=float(ts),
                ts=at,
                resolved=resolved,
            )
            out.append((at, topics.FINDINGS, node.encode(), orjson.dumps(signing.signed(f, CENSUS_KEY))))
    out.sort(key=lambda m: m[0])
    yield from out


def records(msgs: list[tuple[float, str, bytes, bytes]]) -> list[Record]:
    return [
        Record(topic, 0, i, key, value, int(ts * 1000) + 1000, topic in topics.BROKER_TIMED)
        for i, (ts, topic, key, value) in enumerate(msgs)
    ]


def apply_all(acc: Accounting, recs: list[Record]) -> float:
    t0 = time.perf_counter()
    for i in range(0, len(recs), BATCH):
        acc.apply(recs[i : i + BATCH], recs[min(i + BATCH, len(recs)) - 1].timestamp_ms / 1000)
    return time.perf_counter() - t0


def apply_by_tenth(acc: Accounting, recs: list[Record]) -> list[float]:
    """Apply the history in ten slices of time order, each timed: records/s as the store grows."""
    cuts = np.linspace(0, len(recs), 11).astype(int)
    return [(b - a) / apply_all(acc, recs[a:b]) for a, b in itertools.pairwise(cuts) if b > a]


def sent_per_s(msgs: list[tuple[float, str, bytes, bytes]], days: float) -> tuple[float, float]:
    """What the cluster sends: (mean records/s over the period, its busiest minute's records/s)."""
    ts = np.array([m[0] for m in msgs])
    per_minute = np.bincount(((ts - ts.min()) // 60).astype(np.int64))
    return len(msgs) / (days * 86400), float(per_minute.max()) / 60


def step_records(n: int, jobs: int, t0: float) -> list[Record]:
    out = []
    for i in range(n):
        job = f"j{i % jobs}"
        m = {
            "schema": schemas.STEP,
            "job": job,
            # a job's ranks on its own eight nodes (the stage counts a step from another node apart)
            "node": f"gpu{(i % jobs) * 8 + (i // jobs) % 8:05d}",
            "rank": i % 64,
            "step": i // jobs,
            "step_time_s": 1.5,
            "wait_time_s": 0.1,
            "ts": t0 + i * 0.001,
        }
        if i % 5000 == 0:
            m.update(checkpoint_step=i // jobs, checkpoint_ts=t0 + i * 0.001 - 1, checkpoint_write_s=30.0)
        out.append(
            Record(topics.STEPS, 0, i, job.encode(), orjson.dumps(m), int((t0 + i * 0.001) * 1000), True)
        )
    return out


class DuckStore:
    """The store's tables in DuckDB, read through the one method the report uses."""

    def __init__(self, sqlite: Store, work: Path) -> None:
        import duckdb

        self.db = duckdb.connect()
        t0 = time.perf_counter()
        for table in ("runs", "run_nodes", "findings", "finding_levels", "drains", "node_service", "nodes",
                      "quality", "quality_examples"):  # fmt: skip
            cur = sqlite.db.execute(f"SELECT * FROM {table}")
            names = [d[0] for d in cur.description]
            path = work / f"{table}.csv"
            with open(path, "w", newline="") as f:
                wr = csv.writer(f)
                wr.writerow(names)
                wr.writerows(cur)
            ddl = sqlite.db.execute("SELECT sql FROM sqlite_master WHERE name = ?", (table,)).fetchone()[0]
            self.db.execute(
                # SQLite's REAL is 8 bytes, DuckDB's 4: DOUBLE keeps every time to the microsecond
                ddl.replace("WITHOUT ROWID", "")
                .replace("INTEGER PRIMARY KEY", "BIGINT PRIMARY KEY")
                .replace(" REAL", " DOUBLE")
            )
            self.db.execute(
                f"INSERT INTO {table} SELECT * FROM read_csv(?, header = true, nullstr = '')", [str(path)]
            )
        self.load_s = time.perf_counter() - t0

    def rows(self, sql: str, params: Any = ()) -> list[tuple[Any, ...]]:
        return self.db.execute(sql, list(params)).fetchall()


def timed_report(store: Any, since: float, until: float) -> tuple[float, dict[str, Any]]:
    t0 = time.perf_counter()
    r = report.build(store, since, until)
    return time.perf_counter() - t0, r


def timed_cli_report(work: Path, since: float, until: float) -> float:
    """`fleetwatch report --out DIR` as an SRE runs it on the store: the process, the figures, the
    plots and the Markdown and HTML files."""
    cmd = [sys.executable, "-m", "fleetwatch.cli", "report", "--db", str(work / "acc.sqlite"),
           "--since", str(since), "--until", str(until), "--out", str(work / "report")]  # fmt: skip
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, timeout=600)
    took = time.perf_counter() - t0
    if not (work / "report" / "report.html").is_file():
        raise SystemExit("fleetwatch report --out wrote no report.html")
    return took


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=2000)
    ap.add_argument("--days", type=float, default=30.0)
    ap.add_argument("--steps", type=int, default=200_000, help="step reports to time")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    w = draw(WorkloadConfig(nodes=args.nodes, days=args.days))
    msgs = list(messages(w))
    recs = records(msgs)
    out: dict[str, Any] = {"nodes": args.nodes, "days": args.days, "runs": len(w), "records": len(recs)}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        store = Store(work / "acc.sqlite")
        acc = Accounting(store, Ingest(store), CENSUS_KEY, DRAIN_KEY, None)
        t0 = time.perf_counter()
        by_tenth = apply_by_tenth(acc, recs)
        applied_s = time.perf_counter() - t0
        out["apply_s"] = round(applied_s, 2)
        out["apply_records_per_s"] = round(len(recs) / applied_s)
        # the first and last tenth of the history: whether applying slows as the store grows
        out["apply_records_per_s_first_last_tenth"] = [round(by_tenth[0]), round(by_tenth[-1])]
        mean_sent, busiest = sent_per_s(msgs, args.days)
        out["cluster_sends_records_per_s"] = {
            "mean": round(mean_sent, 2),
            "busiest_minute": round(busiest, 2),
        }
        steps = step_records(args.steps, 400, w.cfg.start)
        step_s = apply_all(acc, steps)
        out["steps_per_s"] = round(len(steps) / step_s)
        # every GPU a rank reporting a step every 5 s: the step reports this cluster would send
        out["cluster_sends_steps_per_s"] = args.nodes * w.cfg.gpus_per_node / 5
        since, until = w.cfg.start, w.cfg.start + args.days * 86400 + 1
        sqlite_s, r_sqlite = timed_report(store, since, until)
        out["report_sqlite_s"] = round(sqlite_s, 2)
        out["report_cli_out_s"] = round(timed_cli_report(work, since, until), 2)
        try:
            duck = DuckStore(store, work)
        except ImportError:
            out["report_duckdb_s"] = None
            out["duckdb"] = "not installed (pip install duckdb)"
        else:
            duck_s, r_duck = timed_report(duck, since, until)
            out["duckdb_load_s"] = round(duck.load_s, 2)
            out["report_duckdb_s"] = round(duck_s, 2)
            same = {
                k: r_sqlite[k] == r_duck[k] for k in ("taxonomy", "r_f_per_1000_node_days", "mttf_by_gpus")
            }
            out["same_figures"] = all(same.values())
        out["r_f_measured"] = r_sqlite["r_f_per_1000_node_days"]["total"]
        out["r_f_true"] = round(w.true_r_f, 3)
        store.close()
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k:32} {v}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
