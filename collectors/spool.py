"""A bounded, crash-safe, on-disk FIFO of messages waiting for the broker.

The node agent writes every sample here first and deletes it only once Kafka has
acknowledged it, so a broker outage (or an agent restart) loses nothing while the spool
stays under its byte bound. Above the bound the OLDEST samples are dropped: during a long
outage the newest telemetry is the most useful, and the drop count is kept (and exported).

The disk may refuse a write even under the bound: the filesystem is full, a write fails with an
I/O error, another process holds the file locked, the file is damaged. None of that stops the
agent: on a full disk (or a failed write) the oldest samples are dropped, a small batch at a
time, until the new one fits; what the disk still refuses waits in memory (bounded: the oldest
there go first), is sent all the same, and goes to disk once the disk takes writes again. Every
drop is counted by reason, a failing spool is logged once per episode (not per sample), and it
recovers by itself. A path that cannot hold a spool at all (a read-only directory, a file where the
directory should be, a file that is not a SQLite database) is refused at open with a one-line
`SpoolUnusable`.

SQLite (stdlib) gives atomic appends and deletes and survives a crash mid-write without a
hand-rolled segment format. One agent process owns one spool file.
"""

from __future__ import annotations

import logging
import os
import secrets
import sqlite3
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS spool (
    id    INTEGER PRIMARY KEY AUTOINCREMENT,
    key   BLOB,
    value BLOB NOT NULL,
    size  INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v INTEGER NOT NULL);
"""
# Text meta values (the journal's cursor) have a table of their own, made by the first write of one
# (in that write's transaction: a spool opened on a full disk is not refused for it). A spool of an
# earlier release gains it then, and an earlier release ignores it: spools stay readable both ways.
_META_TEXT = "CREATE TABLE IF NOT EXISTS meta_text (k TEXT PRIMARY KEY, v TEXT NOT NULL)"
MAX_META_TEXT = 4096  # characters of a text meta value (a journal cursor is about 150)

Meta = dict[str, int | str]  # what append() stores with a record: integers in meta, strings in meta_text

# Why a sample was dropped (the agent's fleetwatch_agent_spool_dropped_total{reason}).
BOUND = "bound"  # the spool is over --spool-max-mib
DISK_FULL = "disk_full"  # the filesystem refused writes (SQLITE_FULL, SQLITE_IOERR)
SPOOL_ERROR = "spool_error"  # the spool file refused them (locked, read-only, damaged)
DROP_REASONS = (BOUND, DISK_FULL, SPOOL_ERROR)

# SQLite's primary result codes (https://sqlite.org/rescode.html) for a disk that has no room or
# failed a write: making room by dropping old samples can help. Any other refusal cannot be
# helped from inside the file.
_SQLITE_IOERR, _SQLITE_FULL = 10, 13
_MAKE_ROOM_TRIES = 16  # batches dropped to make room for one sample before it waits in memory
_DELETE_BATCH = 64  # records per DELETE: a full disk has no room for a big transaction's journal
MEMORY_BYTES = 16 << 20  # records the disk refused wait in memory up to this
_BUSY_TIMEOUT_S = 0.5  # another process holding the file: keep this sample in memory, don't stall


class SpoolUnusable(ValueError):
    """The spool path cannot hold a spool; the message is one line naming the path and why."""


class _Damaged(Exception):
    """A spool file (its header is SQLite's) that SQLite finds damaged: set aside, not refused."""


SQLITE_HEADER = b"SQLite format 3\x00"


def _reason(e: BaseException) -> str:
    code = getattr(e, "sqlite_errorcode", None)
    if code is not None and code & 0xFF in (_SQLITE_FULL, _SQLITE_IOERR):
        return DISK_FULL
    return SPOOL_ERROR


def _header(path: Path) -> bytes:
    """The file's first 16 bytes: SQLite's header says it was a database (a spool, damaged) and
    not another program's file, which is refused instead."""
    try:
        with open(path, "rb") as f:
            return f.read(len(SQLITE_HEADER))
    except OSError:
        return b""


@dataclass(frozen=True, slots=True)
class SpooledRecord:
    id: int
    key: bytes | None
    value: bytes


class Spool:
    def __init__(self, path: str | Path, max_bytes: int, memory_bytes: int = MEMORY_BYTES) -> None:
        if max_bytes <= 0:
            raise ValueError(f"spool bound must be > 0 bytes, got {max_bytes}")
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.memory_bytes = min(memory_bytes, max_bytes)
        self._lock = threading.Lock()
        self.set_aside: Path | None = None  # where a damaged spool file was moved at start
        try:
            self._db = self._open(self.path)
        except _Damaged as e:
            self._set_aside(str(e))
            self._db = self._open(self.path)
        # Acknowledged records whose DELETE the disk refused: hidden from peek and the counts, and
        # deleted with the next write that succeeds.
        self._purge_to = 0
        self._failing: str | None = None  # the reason writes fail now (logged once per episode)
        self._full_bytes = 0  # what the spool held when the disk first refused
        self._busy = False  # the last write found the file locked by another process
        self._episode_drops = 0
        self.dropped: Counter[str] = Counter()  # this process's drops by reason
        self._dropped_before = self._read_meta("dropped")  # by earlier processes
        self._bytes, self._count = self._db.execute(
            "SELECT COALESCE(SUM(size), 0), COUNT(*) FROM spool"
        ).fetchone()
        # Records the disk refused, waiting in memory: (id, key, value, size), ids after the disk's.
        self._mem: deque[tuple[int, bytes | None, bytes, int]] = deque()
        self._mem_bytes = 0
        # Ids are never reused (AUTOINCREMENT's sequence, and explicit ids after it).
        self._last_id = max(
            [
                self._db.execute("SELECT COALESCE(MAX(id), 0) FROM spool").fetchone()[0],
                *(r[0] for r in self._db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'spool'")),
            ]
        )
        # The spool's instance: the agent's seq is ordered only within one spool's life, so a new
        # spool (a reinstall, a lost disk) starts a new sequence under a new id. Kept as a signed
        # 64-bit integer in the integer-typed meta table, read back as 16 hex characters.
        self.instance = f"{self._read_meta('instance') + 2**63:016x}"

    def _set_aside(self, why: str) -> None:
        """A crash or a power loss on a disk that lies about its flushes, a bad sector: the node must
        not stay dark until someone deletes the file. It is kept for a post-mortem (the newest copy
        only: a disk that keeps failing must not fill up), a new spool starts (a new instance:
        consumers order its seq anew), and what it held is lost, said once."""
        for older in self.path.parent.glob(f"{self.path.name}.damaged-*"):
            older.unlink(missing_ok=True)
        self.set_aside = self.path.with_name(f"{self.path.name}.damaged-{int(time.time())}")
        for suffix in ("", "-journal"):
            src = Path(f"{self.path}{suffix}")
            if src.exists():
                os.replace(src, Path(f"{self.set_aside}{suffix}"))
        log.error(
            "spool %s is damaged (%s): set aside as %s, a new spool started", self.path, why, self.set_aside
        )

    def _restart_damaged(self, e: sqlite3.DatabaseError) -> bool:
        """The file turned out damaged while running (a read hit a bad page): set it aside and go on
        in a new one, the records waiting in memory kept, ids going on from the last one (the
        forwarder's place stays valid). False where SQLite does not say the file is damaged."""
        if getattr(e, "sqlite_errorname", "") not in ("SQLITE_CORRUPT", "SQLITE_NOTADB"):
            return False
        self._db.close()
        self._set_aside(" ".join(str(e).split())[:200])
        self._db = self._open(self.path)
        self.instance = f"{self._read_meta('instance') + 2**63:016x}"
        self._purge_to = 0
        self._bytes, self._count = self._mem_bytes, len(self._mem)
        self._leave_failing()
        return True

    @staticmethod
    def _open(path: Path) -> sqlite3.Connection:
        """Open (or create) the spool, or raise SpoolUnusable with the reason in one line."""
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            why = (
                "is not a directory" if isinstance(e, FileExistsError) else f"cannot be created: {e.strerror}"
            )
            raise SpoolUnusable(f"spool directory {path.parent} {why}") from None
        db = None
        try:
            # Autocommit mode; each statement is its own transaction unless we open one.
            db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=_BUSY_TIMEOUT_S)
            # A rollback journal kept at its size (PERSIST), not WAL: on a full disk a WAL can
            # neither grow nor be checkpointed into a database file that cannot grow, so not even
            # a DELETE gets through; a persisted journal reuses its own blocks, and the DELETE of
            # the oldest samples frees pages in place for the next ones.
            db.execute("PRAGMA journal_mode=PERSIST")
            db.execute("PRAGMA synchronous=FULL")
            # a damaged page is found now, not by the first read of it (every restart's)
            (verdict,) = db.execute("PRAGMA quick_check(1)").fetchone()
            if verdict != "ok":
                raise sqlite3.DatabaseError(verdict)
            db.executescript(_SCHEMA)
            db.execute(
                "INSERT OR IGNORE INTO meta (k, v) VALUES ('instance', ?)", (secrets.randbits(64) - 2**63,)
            )
            # A write even when the spool exists: a read-only file or directory is found now, not
            # at the first sample. A full disk is not a reason to refuse: the agent runs on it.
            try:
                db.execute("INSERT OR REPLACE INTO meta (k, v) VALUES ('opened', 1)")
            except sqlite3.OperationalError as e:
                if _reason(e) != DISK_FULL:
                    raise
            return db
        except (sqlite3.Error, OSError) as e:
            if db is not None:
                db.close()
            name = getattr(e, "sqlite_errorname", "")
            damaged = name in ("SQLITE_NOTADB", "SQLITE_CORRUPT") or (
                isinstance(e, sqlite3.DatabaseError) and not name  # quick_check's report
            )
            if damaged and _header(path) == SQLITE_HEADER:
                raise _Damaged(" ".join(str(e).split())[:200]) from None
            if name in ("SQLITE_NOTADB", "SQLITE_CORRUPT"):
                why = "is not a SQLite database (or is damaged)"
            elif name.startswith("SQLITE_CANTOPEN"):
                why = "cannot be created or opened for writing (is its directory writable?)"
            elif name.startswith("SQLITE_READONLY"):
                why = "is read-only"
            else:
                why = f"cannot be written: {e}"
            raise SpoolUnusable(f"spool {path} {why}") from None

    # ------------------------------------------------------------ queue operations

    def append(self, key: bytes | None, value: bytes, meta: Meta | None = None) -> dict[str, int]:
        """Add a record at the tail, with `meta` (e.g. the next seq) in the same transaction.

        Returns the records dropped by this call, by reason: the oldest ones to stay under the
        bound or to make room on a full disk (or in memory, below). Never raises for what the disk
        does. A record the disk will not take even after dropping old ones waits in memory (the
        forwarder sends it all the same), bounded by `memory_bytes`, and goes to disk once the disk
        takes writes again.
        """
        size = len(value) + (len(key) if key else 0)
        drops: Counter[str] = Counter()
        with self._lock:
            self._last_id += 1
            # Every record passes through memory on its way to disk: one path whether the disk
            # takes it at once or only later, and the order is kept either way.
            self._mem.append((self._last_id, key, value, size))
            self._mem_bytes += size
            self._bytes += size
            self._count += 1
            self._busy = False
            if self._flush_memory(meta or {}, drops):
                self._purge_some()
            elif not self._busy:  # (a locked file would make each of these wait its timeout)
                self._persist_seq_best_effort(meta or {})
            self._enforce_bounds(drops)
            self._count_drops(drops)
        return {k: n for k, n in drops.items() if n}

    def _store(
        self, records: list[tuple[int, bytes | None, bytes, int]], meta: Meta, drops: Counter[str]
    ) -> bool:
        """Write records to disk; on a full disk drop the oldest ones to make room. False if the
        disk would not take them."""
        for attempt in range(_MAKE_ROOM_TRIES):
            try:
                self._insert(records, meta)
            except sqlite3.DatabaseError as e:
                if isinstance(e, sqlite3.ProgrammingError | sqlite3.InterfaceError):
                    raise  # a bug, not the disk
                reason = _reason(e)
                self._busy = getattr(e, "sqlite_errorname", "").startswith(("SQLITE_BUSY", "SQLITE_LOCKED"))
                self._enter_failing(reason, e)
                # Room is what a full disk lacks: the oldest samples give it back. Nothing else
                # (a lock, a damaged file) is helped by deleting.
                if reason != DISK_FULL or not self._drop_oldest(drops):
                    return False
                continue
            if attempt == 0:
                self._maybe_recovered()
            return True
        return False

    def _insert(self, records: list[tuple[int, bytes | None, bytes, int]], meta: Meta) -> None:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            self._db.executemany("INSERT INTO spool (id, key, value, size) VALUES (?, ?, ?, ?)", records)
            self._write_meta(meta)
            self._db.execute("COMMIT")
        except BaseException:
            self._rollback()
            raise

    def _flush_memory(self, meta: Meta, drops: Counter[str]) -> bool:
        """Move the records waiting in memory to disk, oldest first, `meta` with the last batch;
        False if some remain."""
        held = len(self._mem) > 1  # more than the record just appended: the disk had refused some
        while self._mem:
            n = min(_DELETE_BATCH * 8, len(self._mem))
            batch = [self._mem[i] for i in range(n)]
            if not self._store(batch, meta if n == len(self._mem) else {}, drops):
                return False
            for _ in batch:
                self._mem_bytes -= self._mem.popleft()[3]
        if held:  # the disk took back what memory held: it has room again, unless that room is
            # only what the drops of a full disk freed (bigger samples than the ones dropped made
            # the episode end and start again at once, one warning each time)
            self._maybe_recovered()
        return True

    def _persist_seq_best_effort(self, meta: Meta) -> None:
        # A record kept in memory may still be sent: its seq must not be reused after a restart. An
        # update of one existing row needs no new room, so a full disk usually still takes it.
        try:
            self._write_meta(meta)
        except sqlite3.DatabaseError:
            self._rollback()

    def _write_meta(self, meta: Meta) -> None:
        for k, v in meta.items():
            if isinstance(v, str):
                self._db.execute(_META_TEXT)
                self._db.execute("INSERT OR REPLACE INTO meta_text (k, v) VALUES (?, ?)", (k, v))
            else:
                self._db.execute("INSERT OR REPLACE INTO meta (k, v) VALUES (?, ?)", (k, v))

    def _rollback(self) -> None:
        # SQLite may already have rolled back after SQLITE_FULL or IOERR; ROLLBACK may then fail.
        if self._db.in_transaction:
            try:
                self._db.execute("ROLLBACK")
            except sqlite3.Error:
                log.debug("rollback failed", exc_info=True)

    def _drop_oldest(self, drops: Counter[str], reason: str = DISK_FULL) -> bool:
        """Delete the oldest records on disk, a small batch (a full disk has no room for the journal
        of a big one); False when there is none or the disk refuses."""
        n = min(_DELETE_BATCH, max(1, (self._count - len(self._mem)) // 100))
        try:
            size, count, last = self._db.execute(
                "SELECT COALESCE(SUM(size), 0), COUNT(*), MAX(id) FROM "
                "(SELECT id, size FROM spool WHERE id > ? ORDER BY id LIMIT ?)",
                (self._purge_to, n),
            ).fetchone()
            if not count:
                return False
            self._db.execute("DELETE FROM spool WHERE id > ? AND id <= ?", (self._purge_to, last))
        except sqlite3.DatabaseError:
            self._rollback()
            return False
        self._bytes -= size
        self._count -= count
        drops[reason] += count
        return True

    def _hide_oldest(self, drops: Counter[str], reason: str) -> bool:
        """Drop the oldest records on disk without writing: hidden now, deleted later."""
        try:
            size, count, last = self._db.execute(
                "SELECT COALESCE(SUM(size), 0), COUNT(*), MAX(id) FROM "
                "(SELECT id, size FROM spool WHERE id > ? ORDER BY id LIMIT ?)",
                (self._purge_to, max(1, (self._count - len(self._mem)) // 100)),
            ).fetchone()
        except sqlite3.DatabaseError:
            return False
        if not count:
            return False
        self._purge_to = last
        self._bytes -= size
        self._count -= count
        drops[reason] += count
        return True

    def _purge_some(self) -> None:
        """Delete (a batch of) the records already acknowledged or dropped but still on disk."""
        if not self._purge_to:
            return
        try:
            first = self._db.execute("SELECT MIN(id) FROM spool").fetchone()[0]
            if first is None or first > self._purge_to:
                self._purge_to = 0
                return
            # ids are dense enough that a range of _DELETE_BATCH ids is at most that many rows
            upto = min(self._purge_to, first + _DELETE_BATCH - 1)
            self._db.execute("DELETE FROM spool WHERE id <= ?", (upto,))
        except sqlite3.DatabaseError:
            self._rollback()
            return
        if upto >= self._purge_to:
            self._purge_to = 0

    def peek(self, after_id: int = 0, limit: int = 500) -> list[SpooledRecord]:
        """The oldest records with id > after_id, in order: on disk, then in memory (the disk's
        are skipped while it cannot be read)."""
        with self._lock:
            rows: list[tuple[int, bytes | None, bytes]] = []
            try:
                rows = self._db.execute(
                    "SELECT id, key, value FROM spool WHERE id > ? ORDER BY id LIMIT ?",
                    (max(after_id, self._purge_to), limit),
                ).fetchall()
            except sqlite3.DatabaseError as e:
                if isinstance(e, sqlite3.ProgrammingError | sqlite3.InterfaceError):
                    raise
                if self._restart_damaged(e):  # what it held is lost; what waits in memory goes out
                    rows = []
                else:
                    self._enter_failing(SPOOL_ERROR, e)
                busy = getattr(e, "sqlite_errorname", "").startswith(("SQLITE_BUSY", "SQLITE_LOCKED"))
                if busy and self._count > len(self._mem):
                    # the disk's records are older than memory's and only locked for now: sending
                    # memory's would ack past them, and the next DELETE would lose them unsent
                    return []
            for rec_id, key, value, _size in self._mem:
                if len(rows) >= limit:
                    break
                if rec_id > after_id:
                    rows.append((rec_id, key, value))
        return [SpooledRecord(i, k, v) for i, k, v in rows]

    def ack(self, up_to_id: int) -> None:
        """Delete every record with id <= up_to_id (the broker has them).

        A disk that refuses the DELETE does not make them unacknowledged: they are hidden and
        deleted later, a batch at a time.
        """
        with self._lock:
            while self._mem and self._mem[0][0] <= up_to_id:
                size = self._mem.popleft()[3]
                self._mem_bytes -= size
                self._bytes -= size
                self._count -= 1
            if up_to_id <= self._purge_to:
                return
            try:
                size, n = self._db.execute(
                    "SELECT COALESCE(SUM(size), 0), COUNT(*) FROM spool WHERE id > ? AND id <= ?",
                    (self._purge_to, up_to_id),
                ).fetchone()
            except sqlite3.DatabaseError as e:
                if isinstance(e, sqlite3.ProgrammingError | sqlite3.InterfaceError):
                    raise
                self._enter_failing(SPOOL_ERROR, e)
                return
            self._bytes -= size
            self._count -= n
            try:
                self._db.execute("DELETE FROM spool WHERE id <= ?", (up_to_id,))
                self._purge_to = 0
            except sqlite3.DatabaseError as e:
                if isinstance(e, sqlite3.ProgrammingError | sqlite3.InterfaceError):
                    raise
                self._rollback()
                self._purge_to = up_to_id
                self._enter_failing(_reason(e), e)

    def _enforce_bounds(self, drops: Counter[str]) -> None:
        # Memory first: records the disk refused wait there, the newest kept, within memory_bytes.
        while self._mem_bytes > self.memory_bytes and len(self._mem) > 1:
            size = self._mem.popleft()[3]
            self._mem_bytes -= size
            self._bytes -= size
            self._count -= 1
            drops[self._failing or SPOOL_ERROR] += 1
        # Then the spool's bound, over disk and memory: the oldest go first, on disk if any.
        while self._bytes > self.max_bytes and self._count > 1:
            if not (self._drop_oldest(drops, BOUND) or self._hide_oldest(drops, BOUND)):
                if len(self._mem) <= 1:
                    break
                size = self._mem.popleft()[3]
                self._mem_bytes -= size
                self._bytes -= size
                self._count -= 1
                drops[BOUND] += 1

    # ------------------------------------------------------------ failure episodes, drop counts

    def _enter_failing(self, reason: str, e: BaseException) -> None:
        if self._failing is None:
            log.warning(
                "spool %s refuses writes (%s: %s): the oldest samples make room or new ones wait in "
                "memory, drops counted as reason=%s, until it takes them again",
                self.path,
                getattr(e, "sqlite_errorname", type(e).__name__),
                e,
                reason,
            )
            self._failing = reason
            self._full_bytes = self._bytes
            self._episode_drops = 0

    def _maybe_recovered(self) -> None:
        """After a write that needed no room: end the episode once space has evidently returned.

        On a full disk the spool keeps writing into the room its drops free, so one good write
        says nothing; holding clearly more than when the disk refused does.
        """
        if self._failing is None:
            return
        if self._failing != DISK_FULL or self._bytes > self._full_bytes * 1.05 + 65536:
            self._leave_failing()

    def _leave_failing(self) -> None:
        if self._failing is not None:
            log.warning(
                "spool %s has room again (%d samples dropped while it had none)",
                self.path,
                self._episode_drops,
            )
            self._failing = None

    def _count_drops(self, drops: Counter[str]) -> None:
        n = sum(drops.values())
        if not n:
            return
        self.dropped.update(drops)
        self._episode_drops += drops[DISK_FULL] + drops[SPOOL_ERROR]
        if self._busy:
            return
        try:  # best effort: a disk that refuses samples refuses this too
            self._db.execute(
                "INSERT INTO meta (k, v) VALUES ('dropped', ?) "
                "ON CONFLICT(k) DO UPDATE SET v = v + excluded.v",
                (n,),
            )
        except sqlite3.DatabaseError:
            self._rollback()

    # ------------------------------------------------------------ small persistent counters

    def _read_meta(self, k: str, default: int = 0) -> int:
        """A meta value as the spool wrote it: an integer in 0..2**62 (the instance: a signed
        64-bit one); anything else is a spool this agent did not write, refused at start."""
        row = self._db.execute("SELECT v FROM meta WHERE k = ?", (k,)).fetchone()
        if row is None:
            return default
        v = row[0]
        lo, hi = (-(2**63), 2**63 - 1) if k == "instance" else (0, 2**62)
        if type(v) is not int or not lo <= v <= hi:
            raise SpoolUnusable(f"spool {self.path}: its meta {k!r} is not an integer in {lo}..{hi}")
        return v

    def get_meta(self, k: str, default: int = 0) -> int:
        with self._lock:
            return self._read_meta(k, default)

    def set_meta(self, k: str, v: int) -> None:
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO meta (k, v) VALUES (?, ?)", (k, v))

    def get_meta_text(self, k: str, default: str | None = None) -> str | None:
        """A text meta value (append's string values): a string of at most MAX_META_TEXT
        characters; anything else is a spool this agent did not write, refused."""
        with self._lock:
            try:
                row = self._db.execute("SELECT v FROM meta_text WHERE k = ?", (k,)).fetchone()
            except sqlite3.OperationalError as e:
                if "no such table" not in str(e):
                    raise
                row = None  # a spool that never held a text value (or of an earlier release)
        if row is None:
            return default
        if type(row[0]) is not str or len(row[0]) > MAX_META_TEXT:
            raise SpoolUnusable(f"spool {self.path}: its meta {k!r} is not a text of at most {MAX_META_TEXT}")
        return row[0]

    # ------------------------------------------------------------ introspection

    def __len__(self) -> int:
        return self._count

    @property
    def bytes(self) -> int:
        return self._bytes

    @property
    def failing(self) -> str | None:
        """The reason the spool refuses writes now, or None."""
        return self._failing

    @property
    def dropped_total(self) -> int:
        """Samples dropped over this spool's life (the persisted count and this process's)."""
        return self._dropped_before + sum(self.dropped.values())

    def close(self) -> None:
        with self._lock:
            self._db.close()
