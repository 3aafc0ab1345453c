"""The accounting history: an embedded SQLite database (one file), so that the history outlives
Kafka's retention (fleet.jobs.v1 forgets a job a week after its end).

SQLite, not DuckDB: on the 30-day report of a 2,000-node cluster both are far inside the minute
the report may take (3.8 s and 2.0 s: benchmarks/accounting_store.py, figures in
benchmarks/README.md), while SQLite ships with Python and takes many small transactions (the stage
commits every poll) well.

The tables hold what the figures need, not the raw messages:
- runs: one row per run of a job (a requeued job runs again under the same id, with a new start),
  its end, size and progress marks (first and last step, last checkpoint); `bad` names why a run
  is kept out of the figures (an end before its start, a run longer than any job may run) and is
  NULL otherwise; `end_given_ts` is the end record's own time (a copy of it is the same end);
- run_nodes: the nodes of each run (for the attribution's join with the findings);
- findings: one row per finding id, with its window of being open and the cause it names;
- finding_levels: when each finding was first emitted at each severity, so that a failure is
  blamed on what a finding was by the end of the run's window, not on what it became later (its
  row keeps the worst it reached). Added after schema 2 without changing it, as node_service: a
  store without it judges a finding by its worst severity;
- drains: the Slurm adapter's results (drain and resume, executed or not);
- nodes: the census of reporting nodes (a job naming a node never seen is a data-quality line);
- node_service: the changes of Slurm's view of each node (the adapter's slurm_node records) between
  in service and out of it (drained or down), so that a drain lifted by hand ends where the view
  shows it: a row per change, not per record (the view is sent again every few minutes), and
  node_view_last, each node's latest view (a drain read after later views ends at it). Added
  after schema 2 without changing it: a writer creates them, a store without them has no views;
- pending_steps: progress of jobs whose run has not been seen yet (steps can overtake job/1), per
  job and reporting node, so that the run's nodes can judge it when the run comes;
- quality: data-quality counts per kind and day, with a few examples;
- offsets: the next offset of every partition read, written in the same transaction as the data
  it produced, so that a restarted stage resumes exactly where its last commit left it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 2  # 2: pending_steps per (job, node); runs.end_given_ts
READABLE_VERSIONS = ("1", "2")  # the report reads neither table nor column that 2 changed
QUALITY_EXAMPLES = 5  # examples kept per data-quality kind and day: a flood adds to a count, not rows
SAME_RUN_S = 1.0  # start times this close are one run (collectors/slurm_jobs: SAME_RUN_S)
MAX_RUN_S = 7 * 86400.0  # Slurm's longest job here (the paper's clusters: 7 days)
# Findings open longer than this are indexed apart (findings_lasting): the attribution's join looks
# a run's findings up by their opening within this of its window, and the lasting ones by their end,
# so that neither the node's older findings nor its later ones are scanned (history.py)
LASTING_FINDING_S = 86400.0

DDL = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY,
    job TEXT NOT NULL,
    start_ts REAL NOT NULL,
    end_ts REAL,
    state TEXT NOT NULL,
    end_state TEXT,
    exit_code INTEGER,
    n_nodes INTEGER NOT NULL,
    gpus INTEGER NOT NULL,
    gpus_known INTEGER NOT NULL,
    first_step_ts REAL,
    last_step_ts REAL,
    ckpt_ts REAL,
    ckpt_step INTEGER,
    ckpt_write_s REAL,
    bad TEXT,
    end_given_ts REAL,  -- ts of the end record itself (end_ts may be the broker time: a clock ahead)
    UNIQUE (job, start_ts)
);
CREATE INDEX IF NOT EXISTS runs_end ON runs (end_ts);
CREATE INDEX IF NOT EXISTS runs_open ON runs (job) WHERE end_ts IS NULL;
CREATE TABLE IF NOT EXISTS run_nodes (run INTEGER NOT NULL, node TEXT NOT NULL, PRIMARY KEY (run, node))
    WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS run_nodes_node ON run_nodes (node);
CREATE TABLE IF NOT EXISTS findings (
    id TEXT PRIMARY KEY,
    node TEXT NOT NULL,
    gpu INTEGER,
    kind TEXT NOT NULL,
    rule TEXT,
    severity TEXT NOT NULL,
    summary TEXT NOT NULL,
    first_seen REAL NOT NULL,
    last_ts REAL NOT NULL,
    resolved_ts REAL,
    domain TEXT,
    component TEXT,
    priority INTEGER
);
CREATE INDEX IF NOT EXISTS findings_node ON findings (node, first_seen);
CREATE INDEX IF NOT EXISTS findings_lasting ON findings (node, coalesce(resolved_ts, 1e300))
    WHERE coalesce(resolved_ts, 1e300) - first_seen > {lasting};
CREATE TABLE IF NOT EXISTS drains (
    request_id TEXT PRIMARY KEY,
    node TEXT NOT NULL,
    action TEXT NOT NULL,
    outcome TEXT NOT NULL,
    ts REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS drains_node ON drains (node, ts);
CREATE TABLE IF NOT EXISTS finding_levels (
    id TEXT NOT NULL, severity TEXT NOT NULL, ts REAL NOT NULL, PRIMARY KEY (id, severity)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS node_service (node TEXT NOT NULL, ts REAL NOT NULL, in_service INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS node_service_node ON node_service (node, ts);
CREATE TABLE IF NOT EXISTS node_view_last (
    node TEXT PRIMARY KEY, in_service INTEGER NOT NULL, ts REAL NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS nodes (node TEXT PRIMARY KEY, first_seen REAL NOT NULL, last_seen REAL NOT NULL);
CREATE TABLE IF NOT EXISTS quality (
    what TEXT NOT NULL, day INTEGER NOT NULL, count INTEGER NOT NULL, PRIMARY KEY (what, day)
);
CREATE TABLE IF NOT EXISTS quality_examples (what TEXT NOT NULL, day INTEGER NOT NULL, example TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS quality_examples_what ON quality_examples (what, day);
CREATE TABLE IF NOT EXISTS offsets (
    topic TEXT NOT NULL, partition INTEGER NOT NULL, next_offset INTEGER NOT NULL,
    PRIMARY KEY (topic, partition)
);
"""
# progress waiting for its run, per job and node (schema 1 kept it per job: Store._upgrade_from_1)
PENDING_DDL = """
CREATE TABLE IF NOT EXISTS pending_steps (
    job TEXT NOT NULL,
    node TEXT NOT NULL,
    first_ts REAL NOT NULL,
    last_ts REAL NOT NULL,
    ckpt_ts REAL,
    ckpt_step INTEGER,
    ckpt_write_s REAL,
    PRIMARY KEY (job, node)
);
"""
DDL = DDL.format(lasting=LASTING_FINDING_S) + PENDING_DDL


def has_table(store: Any, name: str) -> bool:
    """Whether the store holds table `name` (one written before it was added does not), asked
    through `rows` alone, the report's one way in (DuckDB answers sqlite_master too)."""
    return bool(store.rows("SELECT name FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)))


class StoreError(RuntimeError):
    """The database cannot be used (another schema version, a file that is not SQLite)."""


@dataclass(frozen=True)
class Progress:
    """Step and checkpoint marks of one job, merged by min/max so that applying them twice is
    applying them once (a re-read topic counts nothing twice)."""

    first_ts: float
    last_ts: float
    ckpt_ts: float | None = None
    ckpt_step: int | None = None
    ckpt_write_s: float | None = None

    def starting(self, start: float) -> Progress:
        """The marks of a run that started at `start` (its first step no earlier)."""
        first = max(self.first_ts, start)
        return Progress(first, self.last_ts, self.ckpt_ts, self.ckpt_step, self.ckpt_write_s)

    def merge(self, other: Progress) -> Progress:
        later = other if (other.ckpt_ts or -1.0) > (self.ckpt_ts or -1.0) else self
        return Progress(
            min(self.first_ts, other.first_ts),
            max(self.last_ts, other.last_ts),
            later.ckpt_ts,
            later.ckpt_step,
            later.ckpt_write_s,
        )


class Store:
    def __init__(self, path: Path | str, *, create: bool = True) -> None:
        """create=False (a reader: `fleetwatch report`): the file must already be an accounting
        store of a schema this release reads (READABLE_VERSIONS), and nothing is written to it (no
        journal mode, no tables): before, its tables and version row were added to whatever --db
        named (an empty file, another program's database). A writer upgrades a store of schema 1."""
        self.path = str(path)
        try:
            self.db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            if not create:
                self._check_is_store()
                return
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.executescript(DDL)
            version = self.db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        except sqlite3.DatabaseError as e:
            raise StoreError(f"{self.path} is not a usable accounting database: {e}") from e
        if version is None:
            self.db.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        elif version[0] == "1":
            self._upgrade_from_1()
        elif version[0] != str(SCHEMA_VERSION):
            raise StoreError(
                f"{self.path} holds accounting schema {version[0]}; this release reads {SCHEMA_VERSION}"
            )

    def _upgrade_from_1(self) -> None:
        """Schema 1 to 2, in place: runs gain end_given_ts (NULL: compared by end_ts, as before);
        pending_steps becomes per (job, node). Schema 1 kept no node for waiting progress, so it
        cannot be judged against its run's nodes: it is dropped and counted as steps_of_unknown_job
        (at most the last `pending_s` of steps whose job/1 had not been read)."""
        with self.transaction() as db:
            db.execute("ALTER TABLE runs ADD COLUMN end_given_ts REAL")
            jobs, last = db.execute("SELECT count(*), max(last_ts) FROM pending_steps").fetchone()
            db.execute("DROP TABLE pending_steps")
            db.execute(PENDING_DDL)
            if jobs:
                what = f"{jobs} jobs' waiting steps dropped by the store's upgrade"
                self.count_quality(db, "steps_of_unknown_job", last, what, jobs)
            db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION),))

    def _check_is_store(self) -> None:
        try:
            found = self.db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        except sqlite3.DatabaseError:  # no meta table, or not a database at all
            found = None
        if found is None or found[0] not in READABLE_VERSIONS:
            self.db.close()
            if found is None:
                raise StoreError(f"{self.path} is not an accounting store (run `fleetwatch account`)")
            raise StoreError(
                f"{self.path} holds accounting schema {found[0]}; this release reads {SCHEMA_VERSION}"
            )

    def close(self) -> None:
        self.db.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield self.db
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    @contextmanager
    def reading(self) -> Iterator[None]:
        """One snapshot for a whole report (a deferred read transaction in WAL): the stage may
        commit meanwhile, and a run ending between two of the report's queries must not be in
        one and not the other."""
        self.db.execute("BEGIN")
        try:
            yield
        finally:
            self.db.execute("COMMIT")

    # ------------------------------------------------------------------ offsets

    def offsets(self) -> dict[tuple[str, int], int]:
        rows = self.db.execute("SELECT topic, partition, next_offset FROM offsets").fetchall()
        return {(t, p): o for t, p, o in rows}

    def save_offsets(self, db: sqlite3.Connection, offsets: Mapping[tuple[str, int], int]) -> None:
        db.executemany(
            "INSERT INTO offsets VALUES (?, ?, ?) ON CONFLICT (topic, partition) DO UPDATE SET "
            "next_offset = max(next_offset, excluded.next_offset)",
            [(t, p, o) for (t, p), o in offsets.items()],
        )

    # ------------------------------------------------------------------ runs

    def open_run(self, db: sqlite3.Connection, job: str) -> tuple[int, float] | None:
        """The job's latest run without an end: (id, start_ts)."""
        row = db.execute(
            "SELECT id, start_ts FROM runs WHERE job = ? AND end_ts IS NULL ORDER BY start_ts DESC LIMIT 1",
            (job,),
        ).fetchone()
        return None if row is None else (row[0], row[1])

    def run(self, db: sqlite3.Connection, job: str, start_ts: float) -> dict[str, Any] | None:
        """The job's run that started at `start_ts`, within SAME_RUN_S (slurm-jobs' ledger treats
        start times that close as one run: Slurm's are whole seconds)."""
        cur = db.execute(
            "SELECT * FROM runs WHERE job = ? AND start_ts BETWEEN ? AND ? "
            "ORDER BY abs(start_ts - ?) LIMIT 1",
            (job, start_ts - SAME_RUN_S, start_ts + SAME_RUN_S, start_ts),
        )
        row = cur.fetchone()
        if row is None:
            return None
        return dict(zip([d[0] for d in cur.description], row, strict=True))

    def latest_ended(self, db: sqlite3.Connection, job: str) -> dict[str, Any] | None:
        cur = db.execute(
            "SELECT * FROM runs WHERE job = ? AND end_ts IS NOT NULL ORDER BY start_ts DESC LIMIT 1", (job,)
        )
        row = cur.fetchone()
        return None if row is None else dict(zip([d[0] for d in cur.description], row, strict=True))

    def insert_run(
        self,
        db: sqlite3.Connection,
        job: str,
        start_ts: float,
        state: str,
        nodes: Sequence[str],
        gpus: int,
        gpus_known: bool,
        bad: str | None = None,
    ) -> int:
        cur = db.execute(
            "INSERT INTO runs (job, start_ts, state, n_nodes, gpus, gpus_known, bad) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (job, start_ts, state, len(nodes), gpus, int(gpus_known), bad),
        )
        run_id = int(cur.lastrowid or 0)
        db.executemany("INSERT OR IGNORE INTO run_nodes VALUES (?, ?)", [(run_id, n) for n in nodes])
        return run_id

    def place_run(
        self, db: sqlite3.Connection, run_id: int, nodes: Sequence[str], gpus: int, gpus_known: bool
    ) -> None:
        """Give a run listed with no nodes (a job/1 may list none) the nodes a later record lists;
        a run that has nodes keeps them."""
        placed = db.execute(
            "UPDATE runs SET n_nodes = ?, gpus = ?, gpus_known = ? WHERE id = ? AND n_nodes = 0",
            (len(nodes), gpus, int(gpus_known), run_id),
        ).rowcount
        if placed:
            db.executemany("INSERT OR IGNORE INTO run_nodes VALUES (?, ?)", [(run_id, n) for n in nodes])

    def end_run(
        self,
        db: sqlite3.Connection,
        run_id: int,
        end_ts: float,
        state: str,
        end_state: str,
        exit_code: int | None,
        bad: str | None,
        end_given_ts: float | None = None,
    ) -> None:
        """`end_given_ts`: the end record's own ts, where the history took another (default end_ts)."""
        given = end_ts if end_given_ts is None else end_given_ts
        db.execute(
            "UPDATE runs SET end_ts = ?, end_given_ts = ?, state = ?, end_state = ?, exit_code = ?, bad = ? "
            "WHERE id = ?",
            (end_ts, given, state, end_state, exit_code, bad, run_id),
        )

    def runs_of(self, db: sqlite3.Connection, job: str) -> list[tuple[int, float, float | None, int]]:
        """The job's runs: (id, start, end or None, number of nodes), by start."""
        return db.execute(
            "SELECT id, start_ts, end_ts, n_nodes FROM runs WHERE job = ? ORDER BY start_ts", (job,)
        ).fetchall()

    def members(self, db: sqlite3.Connection, run_id: int, nodes: Iterable[str]) -> set[str]:
        """Those of `nodes` that are the run's."""
        wanted = list(nodes)
        out: set[str] = set()
        for i in range(0, len(wanted), 500):  # under any SQLite's limit of bound parameters
            chunk = wanted[i : i + 500]
            out.update(
                n
                for (n,) in db.execute(
                    f"SELECT node FROM run_nodes WHERE run = ? AND node IN ({','.join('?' * len(chunk))})",
                    (run_id, *chunk),
                )
            )
        return out

    def add_progress(self, db: sqlite3.Connection, run_id: int, p: Progress) -> None:
        db.execute(
            """UPDATE runs SET
                first_step_ts = min(coalesce(first_step_ts, :first), :first),
                last_step_ts = max(coalesce(last_step_ts, :last), :last),
                ckpt_step = CASE WHEN :ckpt > coalesce(ckpt_ts, -1) THEN :step ELSE ckpt_step END,
                ckpt_write_s = CASE WHEN :ckpt > coalesce(ckpt_ts, -1) THEN :write ELSE ckpt_write_s END,
                ckpt_ts = CASE WHEN :ckpt > coalesce(ckpt_ts, -1) THEN :ckpt ELSE ckpt_ts END
            WHERE id = :id""",
            {
                "first": p.first_ts,
                "last": p.last_ts,
                "ckpt": p.ckpt_ts if p.ckpt_ts is not None else -1.0,
                "step": p.ckpt_step,
                "write": p.ckpt_write_s,
                "id": run_id,
            },
        )

    def park_progress(self, db: sqlite3.Connection, job: str, marks: Sequence[tuple[str, Progress]]) -> None:
        """Progress of a job with no run for it yet, per reporting node, merged as Progress.merge."""
        db.executemany(
            """INSERT INTO pending_steps VALUES (:job, :node, :first, :last, :ckpt, :step, :write)
               ON CONFLICT (job, node) DO UPDATE SET
                   first_ts = min(first_ts, excluded.first_ts),
                   last_ts = max(last_ts, excluded.last_ts),
                   ckpt_step = CASE WHEN coalesce(excluded.ckpt_ts, -1) > coalesce(ckpt_ts, -1)
                       THEN excluded.ckpt_step ELSE ckpt_step END,
                   ckpt_write_s = CASE WHEN coalesce(excluded.ckpt_ts, -1) > coalesce(ckpt_ts, -1)
                       THEN excluded.ckpt_write_s ELSE ckpt_write_s END,
                   ckpt_ts = CASE WHEN coalesce(excluded.ckpt_ts, -1) > coalesce(ckpt_ts, -1)
                       THEN excluded.ckpt_ts ELSE ckpt_ts END""",
            [
                {
                    "job": job,
                    "node": node,
                    "first": p.first_ts,
                    "last": p.last_ts,
                    "ckpt": p.ckpt_ts,
                    "step": p.ckpt_step,
                    "write": p.ckpt_write_s,
                }
                for node, p in marks
            ],
        )

    def take_pending(self, db: sqlite3.Connection, job: str, start_ts: float) -> list[tuple[str, Progress]]:
        """Remove and return the job's waiting progress that reaches `start_ts` (a run's start):
        (node, marks) per reporting node."""
        # no DELETE ... RETURNING: SQLite before 3.35 (Debian 11's) lacks it
        rows = db.execute(
            "SELECT node, first_ts, last_ts, ckpt_ts, ckpt_step, ckpt_write_s FROM pending_steps "
            "WHERE job = ? AND last_ts >= ?",
            (job, start_ts),
        ).fetchall()
        if rows:
            db.execute("DELETE FROM pending_steps WHERE job = ? AND last_ts >= ?", (job, start_ts))
        return [(r[0], Progress(*r[1:])) for r in rows]

    def expire_pending(self, db: sqlite3.Connection, older_than: float) -> int:
        """Drop waiting progress older than `older_than`; returns how many jobs had some."""
        jobs = db.execute(
            "SELECT count(DISTINCT job) FROM pending_steps WHERE last_ts < ?", (older_than,)
        ).fetchone()[0]
        if jobs:
            db.execute("DELETE FROM pending_steps WHERE last_ts < ?", (older_than,))
        return int(jobs)

    # ------------------------------------------------------------------ findings, drains, nodes

    def upsert_finding(self, db: sqlite3.Connection, f: Mapping[str, Any]) -> None:
        """One emission of a finding; the row keeps its first opening, latest time and, once it
        resolves, when; the most severe level it reached."""
        db.execute(
            """INSERT INTO findings VALUES (:id, :node, :gpu, :kind, :rule, :severity, :summary,
                   :first_seen, :ts, :resolved_ts, :domain, :component, :priority)
               ON CONFLICT (id) DO UPDATE SET
                   first_seen = min(first_seen, excluded.first_seen),
                   last_ts = max(last_ts, excluded.last_ts),
                   resolved_ts = CASE WHEN excluded.resolved_ts IS NOT NULL
                       THEN max(coalesce(resolved_ts, 0), excluded.resolved_ts) ELSE resolved_ts END,
                   severity = CASE WHEN (excluded.severity = 'critical')
                       OR (excluded.severity = 'warning' AND severity = 'info')
                       THEN excluded.severity ELSE severity END,
                   summary = CASE WHEN excluded.last_ts >= last_ts THEN excluded.summary ELSE summary END,
                   -- the cause follows the emissions: an XID burst keeps its id while a worse code
                   -- joins it (an application's XID 13, then XID 79)
                   domain = CASE WHEN excluded.domain IS NOT NULL
                       AND (domain IS NULL OR excluded.priority < priority) THEN excluded.domain
                       ELSE domain END,
                   component = CASE WHEN excluded.domain IS NOT NULL
                       AND (domain IS NULL OR excluded.priority < priority) THEN excluded.component
                       ELSE component END,
                   priority = CASE WHEN excluded.domain IS NOT NULL
                       AND (domain IS NULL OR excluded.priority < priority) THEN excluded.priority
                       ELSE priority END""",
            dict(f),
        )
        db.execute(
            "INSERT INTO finding_levels VALUES (:id, :severity, :ts) "
            "ON CONFLICT (id, severity) DO UPDATE SET ts = min(ts, excluded.ts)",
            {"id": f["id"], "severity": f["severity"], "ts": f["ts"]},
        )

    def upsert_drain(
        self, db: sqlite3.Connection, request_id: str, node: str, action: str, outcome: str, ts: float
    ) -> None:
        # A request's answers, as the adapter gives them: `executed` stands once given (a
        # redelivered request is answered `executed` again, later: the first time is when it was
        # done); `duplicate` and `deferred` (nothing done, asked again) never replace an answer; the
        # same answer again keeps its first time.
        db.execute(
            "INSERT INTO drains VALUES (?, ?, ?, ?, ?) ON CONFLICT (request_id) DO UPDATE SET "
            "outcome = CASE WHEN outcome = 'executed' OR excluded.outcome IN ('duplicate', 'deferred') "
            "THEN outcome ELSE excluded.outcome END, "
            "ts = CASE WHEN excluded.outcome = outcome THEN min(ts, excluded.ts) "
            "WHEN outcome = 'executed' OR excluded.outcome IN ('duplicate', 'deferred') THEN ts "
            "ELSE excluded.ts END",
            (request_id, node, action, outcome, ts),
        )

    def note_service(self, db: sqlite3.Connection, node: str, ts: float, in_service: bool) -> None:
        """Slurm's view of `node` at `ts`: a row where it differs from the node's last one (the
        records of one node come in order: one partition, keyed by the node), and a view in
        service after an executed drain of the node that came after the last row: the views may
        never have shown that drain (its record compacted away, the topic read from its start once
        the drain key was given, a publish that failed), and the drain ends here all the same."""
        last = self._last_service(db, node)
        changed = last is None or bool(last[0]) != in_service
        if not changed and in_service:
            changed = (
                db.execute(
                    "SELECT 1 FROM drains WHERE node = ? AND action = 'drain' AND outcome = 'executed' "
                    "AND ts > ? AND ts < ? LIMIT 1",
                    (node, last[1], ts),
                ).fetchone()
                is not None
            )
        if changed:
            db.execute("INSERT INTO node_service VALUES (?, ?, ?)", (node, ts, int(in_service)))
        db.execute("INSERT OR REPLACE INTO node_view_last VALUES (?, ?, ?)", (node, int(in_service), ts))

    def note_drain(self, db: sqlite3.Connection, node: str, ts: float) -> None:
        """An executed drain at `ts`, read after views of the node that came later (the stage may
        read the view topic ahead of the results'): where its latest view is in service and later
        than the drain, with no row after the drain, that view ends it (the first in-service view
        after the drain was not kept: a drain read late may count up to the views' lead)."""
        view = db.execute("SELECT in_service, ts FROM node_view_last WHERE node = ?", (node,)).fetchone()
        if view is None or not view[0] or view[1] <= ts:
            return
        last = self._last_service(db, node)
        if last is None or last[1] <= ts:
            db.execute("INSERT INTO node_service VALUES (?, ?, 1)", (node, view[1]))

    @staticmethod
    def _last_service(db: sqlite3.Connection, node: str) -> tuple[int, float] | None:
        """(in service, ts) of the node's latest node_service row, in the order they were kept."""
        return db.execute(
            "SELECT in_service, ts FROM node_service WHERE node = ? ORDER BY rowid DESC LIMIT 1", (node,)
        ).fetchone()

    def upsert_node(self, db: sqlite3.Connection, node: str, first_seen: float, last_seen: float) -> None:
        db.execute(
            "INSERT INTO nodes VALUES (?, ?, ?) ON CONFLICT (node) DO UPDATE SET "
            "first_seen = min(first_seen, excluded.first_seen), "
            "last_seen = max(last_seen, excluded.last_seen)",
            (node, first_seen, last_seen),
        )

    # ------------------------------------------------------------------ data quality

    def count_quality(self, db: sqlite3.Connection, what: str, ts: float, example: str, n: int = 1) -> None:
        day = int(ts // 86400) if ts == ts and abs(ts) < 1e15 else 0
        db.execute(
            "INSERT INTO quality VALUES (?, ?, ?) "
            "ON CONFLICT (what, day) DO UPDATE SET count = count + excluded.count",
            (what, day, n),
        )
        n = db.execute(
            "SELECT count(*) FROM quality_examples WHERE what = ? AND day = ?", (what, day)
        ).fetchone()
        if n[0] < QUALITY_EXAMPLES:
            db.execute("INSERT INTO quality_examples VALUES (?, ?, ?)", (what, day, example[:300]))

    # ------------------------------------------------------------------ reading for the figures

    def rows(self, sql: str, params: Iterable[Any] = ()) -> list[tuple[Any, ...]]:
        """A query's rows (the report's only way in: benchmarks/accounting_store.py runs the same
        report on another engine through this one method)."""
        return self.db.execute(sql, tuple(params)).fetchall()
