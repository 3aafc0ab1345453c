"""The Slurm adapter's journal: what it did with each drain request, keyed by request_id (SQLite).

Two phases per request: `begin` records it as `executing` BEFORE scontrol runs and `finish`
records the outcome after. A restart finds an `executing` row only if it died in between; the
adapter then checks Slurm's state instead of blindly running the command again: `begin` also
keeps the node's Slurm Comment as it was before the command (`comment_before`), since the drain
writes the request id into that Comment in the same scontrol call (alerts/slurm_drainer.py). A
`deferred` row (nothing done: an operator's pause, a node people hold) keeps the signature of the
copy deferred: that copy delivered again gets the same answer, a copy act signed anew is handled
afresh. Any other row means the request was handled: a duplicate delivery (at-least-once Kafka, a
replaying act) is skipped. SQLite with synchronous=FULL: a row that `finish` returned for survives
a power cut.
"""

from __future__ import annotations

import sqlite3
import time
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS requests (
    request_id TEXT PRIMARY KEY,
    node TEXT NOT NULL,
    action TEXT NOT NULL,
    status TEXT NOT NULL,        -- executing | executed | rejected | failed | undetermined | deferred
    detail TEXT NOT NULL DEFAULT '',
    issued_at REAL,
    received_at REAL NOT NULL,
    done_at REAL,
    source TEXT NOT NULL DEFAULT '',  -- topic:partition:offset it came from
    comment_before TEXT,              -- the node's Slurm Comment before the command (NULL: unknown)
    request_signature TEXT,           -- a validated resume's: to answer it after a restart
    outcome TEXT                      -- what it was answered (the adapter's label): answered alike again
);
CREATE INDEX IF NOT EXISTS requests_node ON requests (node, received_at);
-- a validated resume's test verdict, written by the validation's thread before it is carried out:
-- a crash or a Slurm outage after the test carries out this verdict, never a second test
CREATE TABLE IF NOT EXISTS verdicts (
    request_id TEXT PRIMARY KEY,
    passed INTEGER NOT NULL,
    line TEXT NOT NULL
);
"""
# Journals written before comment_before existed gain the column (NULL in their old rows).
MIGRATIONS = {
    "comment_before": "ALTER TABLE requests ADD COLUMN comment_before TEXT",
    "request_signature": "ALTER TABLE requests ADD COLUMN request_signature TEXT",
    "outcome": "ALTER TABLE requests ADD COLUMN outcome TEXT",
}
_COLUMNS = "request_id, node, action, status, detail, comment_before, request_signature, outcome, issued_at"


class JournalDamaged(ValueError):
    """The journal file cannot be read as one (one line, status 2, at start)."""


@dataclass(frozen=True)
class Entry:
    request_id: str
    node: str
    action: str
    status: str
    detail: str
    comment_before: str | None = None
    request_signature: str | None = None
    # the adapter's label for the answer it gave (executed, stale, not_ours, ...); None in rows of
    # an earlier release
    outcome: str | None = None
    issued_at: float | None = None  # the request's (act's clock)


class Journal:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(str(path), isolation_level=None)  # autocommit; we commit per row
        try:
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=FULL")
            # a damaged page (power loss on a disk that lies about its flushes) is found here, at
            # start, in one line, not by the request whose row it holds at every restart
            (verdict,) = self.db.execute("PRAGMA quick_check(1)").fetchone()
            if verdict != "ok":
                raise sqlite3.DatabaseError(verdict)
            self.db.executescript(SCHEMA)
            have = {row[1] for row in self.db.execute("PRAGMA table_info(requests)")}
            for column, ddl in MIGRATIONS.items():
                if column not in have:
                    self.db.execute(ddl)
        except sqlite3.DatabaseError as e:
            self.db.close()
            why = " ".join(str(e).split())  # quick_check's report is several lines
            name = getattr(e, "sqlite_errorname", "")
            if name not in ("SQLITE_CORRUPT", "SQLITE_NOTADB", ""):  # "": quick_check's report
                # read-only, locked, an I/O error: the journal is fine, moving it aside would lose it
                raise JournalDamaged(f"the journal {path} cannot be opened: {why}") from None
            raise JournalDamaged(
                f"the journal {path} is damaged ({why}): move it aside and start again (a request "
                "delivered again is then judged as new, one older than --max-age refused as stale)"
            ) from None

    def save_verdict(self, request_id: str, passed: bool, line: str) -> None:
        """A validation's verdict, from its own thread (a connection of its own: SQLite's locking
        orders it with the main loop's writes), durable before it is carried out."""
        with closing(sqlite3.connect(str(self.path), timeout=30.0, isolation_level=None)) as db:
            db.execute("PRAGMA synchronous=FULL")
            db.execute(
                "INSERT OR REPLACE INTO verdicts (request_id, passed, line) VALUES (?, ?, ?)",
                (request_id, 1 if passed else 0, line),
            )

    def verdict(self, request_id: str) -> tuple[bool, str] | None:
        """The verdict a validation of this request reached, if one did (any thread)."""
        with closing(sqlite3.connect(str(self.path), timeout=30.0)) as db:
            row = db.execute(
                "SELECT passed, line FROM verdicts WHERE request_id = ?", (request_id,)
            ).fetchone()
        return None if row is None else (bool(row[0]), str(row[1]))

    def get(self, request_id: str) -> Entry | None:
        row = self.db.execute(
            f"SELECT {_COLUMNS} FROM requests WHERE request_id = ?", (request_id,)
        ).fetchone()
        return Entry(*row) if row else None

    def begin(
        self,
        request_id: str,
        node: str,
        action: str,
        issued_at: float | None,
        source: str,
        comment_before: str | None = None,
        request_signature: str | None = None,
    ) -> None:
        self.db.execute(
            "INSERT OR REPLACE INTO requests (request_id, node, action, status, issued_at, received_at,"
            " source, comment_before, request_signature) VALUES (?, ?, ?, 'executing', ?, ?, ?, ?, ?)",
            (request_id, node, action, issued_at, time.time(), source, comment_before, request_signature),
        )

    def finish(self, request_id: str, status: str, detail: str = "", outcome: str | None = None) -> None:
        """The request's end, with the answer it gets (`outcome`), in the same row: a crash before
        that answer reached Kafka answers it alike when the request is read again."""
        self.db.execute(
            "UPDATE requests SET status = ?, detail = ?, done_at = ?, outcome = ? WHERE request_id = ?",
            (status, detail[:500], time.time(), outcome, request_id),
        )

    def record(
        self,
        request_id: str,
        node: str,
        action: str,
        status: str,
        detail: str,
        issued_at: float | None,
        source: str,
        outcome: str | None = None,
    ) -> None:
        """One-phase record for requests that are refused without touching Slurm."""
        self.db.execute(
            "INSERT OR IGNORE INTO requests"
            " (request_id, node, action, status, detail, issued_at, received_at, done_at, source, outcome)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                request_id,
                node,
                action,
                status,
                detail[:500],
                issued_at,
                time.time(),
                time.time(),
                source,
                outcome,
            ),
        )

    def defer(
        self,
        request_id: str,
        node: str,
        action: str,
        detail: str,
        issued_at: float | None,
        source: str,
        request_signature: str,
    ) -> None:
        """A request not carried out now (nothing done), with the signature of the copy deferred; it
        replaces an `executing` row left by a crash, whose pre-image is not needed any more."""
        self.db.execute(
            "INSERT OR REPLACE INTO requests (request_id, node, action, status, detail, issued_at,"
            " received_at, done_at, source, request_signature, outcome)"
            " VALUES (?, ?, ?, 'deferred', ?, ?, ?, ?, ?, ?, 'deferred')",
            (
                request_id,
                node,
                action,
                detail[:500],
                issued_at,
                time.time(),
                time.time(),
                source,
                request_signature,
            ),
        )

    def forget(self, request_id: str) -> None:
        """Drop a request's row: a deferred one asked again is handled as new (nothing was done)."""
        self.db.execute("DELETE FROM requests WHERE request_id = ?", (request_id,))

    def executing(self, action: str) -> list[Entry]:
        """The requests of `action` begun and not finished."""
        rows = self.db.execute(
            f"SELECT {_COLUMNS} FROM requests WHERE status = 'executing' AND action = ? ORDER BY received_at",
            (action,),
        )
        return [Entry(*r) for r in rows]

    def entries(self, node: str | None = None) -> list[Entry]:
        q = f"SELECT {_COLUMNS} FROM requests"
        rows = (
            self.db.execute(q + " WHERE node = ? ORDER BY received_at", (node,))
            if node
            else self.db.execute(q + " ORDER BY received_at")
        )
        return [Entry(*r) for r in rows]

    def close(self) -> None:
        self.db.close()
