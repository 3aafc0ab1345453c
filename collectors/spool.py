"""A bounded, crash-safe, on-disk FIFO of messages waiting for the broker.

The node agent writes every sample here first and deletes it only once Kafka has
acknowledged it, so a broker outage (or an agent restart) loses nothing while the spool
stays under its byte bound. Above the bound the OLDEST samples are dropped: during a long
outage the newest telemetry is the most useful, and the drop count is kept (and exported).

SQLite (stdlib) gives atomic appends and deletes and survives a crash mid-write without a
hand-rolled segment format. One agent process owns one spool file.
"""

from __future__ import annotations

import secrets
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path

_SCHEMA = """
CREATE TABLE IF NOT EXISTS spool (
    id    INTEGER PRIMARY KEY AUTOINCREMENT,
    key   BLOB,
    value BLOB NOT NULL,
    size  INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v INTEGER NOT NULL);
"""


@dataclass(frozen=True, slots=True)
class SpooledRecord:
    id: int
    key: bytes | None
    value: bytes


class Spool:
    def __init__(self, path: str | Path, max_bytes: int) -> None:
        if max_bytes <= 0:
            raise ValueError(f"spool bound must be > 0 bytes, got {max_bytes}")
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        # Autocommit mode; each statement is its own transaction unless we open one.
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        # NORMAL: durable against process crashes; a power cut may lose the last few samples.
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        # The spool's instance: the agent's seq is ordered only within one spool's life, so a new
        # spool (a reinstall, a lost disk) starts a new sequence under a new id. Kept as a signed
        # 64-bit integer in the integer-typed meta table, read back as 16 hex characters.
        self._db.execute(
            "INSERT OR IGNORE INTO meta (k, v) VALUES ('instance', ?)",
            (secrets.randbits(64) - 2**63,),
        )
        self.instance = f"{self.get_meta('instance') + 2**63:016x}"
        self._bytes, self._count = self._db.execute(
            "SELECT COALESCE(SUM(size), 0), COUNT(*) FROM spool"
        ).fetchone()

    # ------------------------------------------------------------ queue operations

    def append(self, key: bytes | None, value: bytes) -> int:
        """Add a record at the tail; returns how many old records were dropped to stay bounded."""
        size = len(value) + (len(key) if key else 0)
        with self._lock:
            self._db.execute("INSERT INTO spool (key, value, size) VALUES (?, ?, ?)", (key, value, size))
            self._bytes += size
            self._count += 1
            return self._enforce_bound()

    def peek(self, after_id: int = 0, limit: int = 500) -> list[SpooledRecord]:
        """The oldest records with id > after_id, in order."""
        with self._lock:
            rows = self._db.execute(
                "SELECT id, key, value FROM spool WHERE id > ? ORDER BY id LIMIT ?", (after_id, limit)
            ).fetchall()
        return [SpooledRecord(i, k, v) for i, k, v in rows]

    def ack(self, up_to_id: int) -> None:
        """Delete every record with id <= up_to_id (the broker has them)."""
        with self._lock:
            size, n = self._db.execute(
                "SELECT COALESCE(SUM(size), 0), COUNT(*) FROM spool WHERE id <= ?", (up_to_id,)
            ).fetchone()
            self._db.execute("DELETE FROM spool WHERE id <= ?", (up_to_id,))
            self._bytes -= size
            self._count -= n

    def _enforce_bound(self) -> int:
        if self._bytes <= self.max_bytes:
            return 0
        dropped = 0
        self._db.execute("BEGIN")
        try:
            while self._bytes > self.max_bytes and self._count > 1:
                # Drop in chunks of ~1% so a full spool does not pay one DELETE per sample.
                chunk = max(1, self._count // 100)
                size, n, last = self._db.execute(
                    "SELECT COALESCE(SUM(size), 0), COUNT(*), MAX(id) FROM "
                    "(SELECT id, size FROM spool ORDER BY id LIMIT ?)",
                    (chunk,),
                ).fetchone()
                self._db.execute("DELETE FROM spool WHERE id <= ?", (last,))
                self._bytes -= size
                self._count -= n
                dropped += n
            self._add_meta("dropped", dropped)
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        return dropped

    # ------------------------------------------------------------ small persistent counters

    def _add_meta(self, k: str, delta: int) -> None:
        self._db.execute(
            "INSERT INTO meta (k, v) VALUES (?, ?) ON CONFLICT(k) DO UPDATE SET v = v + excluded.v",
            (k, delta),
        )

    def get_meta(self, k: str, default: int = 0) -> int:
        with self._lock:
            row = self._db.execute("SELECT v FROM meta WHERE k = ?", (k,)).fetchone()
        return default if row is None else int(row[0])

    def set_meta(self, k: str, v: int) -> None:
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO meta (k, v) VALUES (?, ?)", (k, v))

    # ------------------------------------------------------------ introspection

    def __len__(self) -> int:
        return self._count

    @property
    def bytes(self) -> int:
        return self._bytes

    @property
    def dropped_total(self) -> int:
        return self.get_meta("dropped")

    def close(self) -> None:
        with self._lock:
            self._db.close()
