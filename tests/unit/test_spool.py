"""The agent's on-disk spool: FIFO, acknowledged deletes, bound, persistence."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from fleetwatch.collectors.spool import Spool, SpoolUnusable
from tests.helpers.paths import REPO


def _fill(spool: Spool, n: int, size: int = 100) -> None:
    for i in range(n):
        spool.append(b"k", f"{i:08d}".encode().ljust(size, b"."))


def test_fifo_order_and_ack(tmp_path: Path) -> None:
    s = Spool(tmp_path / "s.sqlite", max_bytes=1 << 20)
    _fill(s, 10)
    recs = s.peek(limit=4)
    assert [r.value[:8] for r in recs] == [f"{i:08d}".encode() for i in range(4)]
    s.ack(recs[1].id)
    assert len(s) == 8
    assert s.peek(limit=1)[0].value[:8] == b"00000002"
    # peek after an id continues from there without acknowledging anything
    assert s.peek(after_id=recs[3].id, limit=1)[0].value[:8] == b"00000004"
    assert len(s) == 8


def test_survives_reopen(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite"
    s = Spool(path, max_bytes=1 << 20)
    _fill(s, 5)
    s.ack(s.peek(limit=2)[-1].id)
    s.set_meta("next_seq", 42)
    s.close()
    s2 = Spool(path, max_bytes=1 << 20)
    assert len(s2) == 3
    assert s2.bytes == 3 * 101
    assert [r.value[:8] for r in s2.peek()] == [b"00000002", b"00000003", b"00000004"]
    assert s2.get_meta("next_seq") == 42


def test_bound_drops_oldest_and_counts(tmp_path: Path) -> None:
    s = Spool(tmp_path / "s.sqlite", max_bytes=50 * 101)
    _fill(s, 50)
    assert s.dropped_total == 0 and len(s) == 50
    dropped = 0
    for i in range(50, 60):
        dropped += s.append(b"k", f"{i:08d}".encode().ljust(100, b".")).get("bound", 0)
    assert s.bytes <= s.max_bytes
    assert dropped == 10 == s.dropped_total
    values = [r.value[:8] for r in s.peek(limit=100)]
    # the newest samples survive, still in order
    assert values == [f"{i:08d}".encode() for i in range(10, 60)]


def test_rejects_nonpositive_bound(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="bound"):
        Spool(tmp_path / "s.sqlite", max_bytes=0)


# A spool on a disk that fills: the file-size limit (RLIMIT_FSIZE, no root needed) makes SQLite's
# writes past it fail for real (SQLITE_FULL or SQLITE_IOERR_WRITE, as ENOSPC would; Python ignores
# SIGXFSZ). The limit is set in a child process so the test runner keeps writing its own files.
_FULL_DISK = """
import json, logging, resource, sys
from fleetwatch.collectors.spool import Spool

logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
path, limit = sys.argv[1], int(sys.argv[2])
s = Spool(path, max_bytes=1 << 30)
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
full = {}
for seq in range(200, 500):
    for reason, n in s.append(b"k", f"{seq:08d}".encode().ljust(1000, b"."), {"next_seq": seq + 1}).items():
        full[reason] = full.get(reason, 0) + n
failing = s.failing
held_when_full = len(s)
resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
room = {}
for seq in range(500, 800):
    for reason, n in s.append(b"k", f"{seq:08d}".encode().ljust(1000, b"."), {"next_seq": seq + 1}).items():
        room[reason] = room.get(reason, 0) + n
seqs = [int(r.value[:8]) for r in s.peek(limit=10_000)]
print(json.dumps(dict(full=full, room=room, failing=failing, failing_after=s.failing, seqs=seqs,
                      held_when_full=held_when_full, next_seq=s.get_meta("next_seq"),
                      dropped_total=s.dropped_total)))
"""


def test_full_disk_drops_oldest_warns_once_and_recovers(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite"
    s = Spool(path, max_bytes=1 << 30)
    for seq in range(200):
        s.append(b"k", f"{seq:08d}".encode().ljust(1000, b"."), {"next_seq": seq + 1})
    s.close()
    limit = path.stat().st_size + 16 * 1024  # room for ~a dozen more samples, then the disk is full
    r = subprocess.run(
        [sys.executable, "-c", _FULL_DISK, str(path), str(limit)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    # Full: every new sample was taken, the oldest ones made room and were counted as disk_full.
    assert out["failing"] == "disk_full"
    assert out["full"]["disk_full"] >= 200 and set(out["full"]) == {"disk_full"}
    assert out["held_when_full"] + out["full"]["disk_full"] == 500
    # Room again: nothing more dropped, the spool grows, the episode is over.
    assert out["room"] == {} and out["failing_after"] is None
    # The newest samples survive, in order, up to the last one; seq persisted with its sample.
    seqs = out["seqs"]
    assert seqs == list(range(seqs[0], 800)) and seqs[0] > 200
    assert out["next_seq"] == 800 and out["dropped_total"] == out["full"]["disk_full"]
    # One warning for the episode, one when it ends: not one per sample.
    warnings = [line for line in r.stderr.splitlines() if line.startswith("WARNING")]
    assert len(warnings) == 2, r.stderr[-3000:]
    assert "refuses writes" in warnings[0] and "disk_full" in warnings[0]
    assert "has room again" in warnings[1]
    assert "Traceback" not in r.stderr


def test_locked_spool_keeps_samples_in_memory_in_order_and_recovers(tmp_path: Path) -> None:
    """Another process holding the spool locked (SQLITE_BUSY): writes are refused, never raised;
    new samples wait in memory, bounded (the oldest of them dropped, counted as spool_error), and
    are sent in order after the disk's; acknowledged records stay acknowledged; once the lock is
    gone the memory goes to disk, in order."""
    path = tmp_path / "s.sqlite"
    s = Spool(path, max_bytes=1 << 20, memory_bytes=10 * 101)
    _fill(s, 3)
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # a writer's lock: readers go on, writers are refused
    assert s.append(b"k", b"00000003".ljust(100, b".")) == {}
    assert s.failing == "spool_error"
    assert [r.value[:8] for r in s.peek()] == [f"{i:08d}".encode() for i in range(4)]
    s.ack(s.peek(limit=1)[0].id)  # the DELETE is refused too, the ack is kept
    drops = {}
    for i in range(4, 20):
        for reason, n in s.append(b"k", f"{i:08d}".encode().ljust(100, b".")).items():
            drops[reason] = drops.get(reason, 0) + n
    assert drops == {"spool_error": 7}  # 17 waited in memory, room for 10: the oldest 7 dropped
    seen = [r.value[:8] for r in s.peek(limit=100)]
    assert seen == [f"{i:08d}".encode() for i in (1, 2, *range(10, 20))] and len(s) == len(seen)
    other.execute("ROLLBACK")
    other.close()
    assert s.append(b"k", b"00000020".ljust(100, b".")) == {}
    assert s.failing is None and s.dropped == {"spool_error": 7}
    s.close()
    s2 = Spool(path, max_bytes=1 << 20)  # all on disk now, in order; the acknowledged one gone
    assert [r.value[:8] for r in s2.peek(limit=100)] == [f"{i:08d}".encode() for i in (1, 2, *range(10, 21))]


def test_a_spool_locked_even_for_reading_sends_nothing_past_its_unread_records(tmp_path: Path) -> None:
    """While another process holds the file exclusively, the disk's records cannot be read: the
    newer ones waiting in memory are not sent ahead of them (their ack would delete the unread
    ones unsent once the lock is gone); afterwards everything goes out, in order, none dropped."""
    path = tmp_path / "s.sqlite"
    s = Spool(path, max_bytes=1 << 20)
    _fill(s, 3)
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")  # readers are refused too
    assert s.append(b"k", b"00000003".ljust(100, b".")) == {}  # waits in memory
    assert s.peek() == []
    other.execute("ROLLBACK")
    other.close()
    sent = s.peek(limit=100)
    assert [r.value[:8] for r in sent] == [f"{i:08d}".encode() for i in range(4)]
    s.ack(sent[-1].id)
    assert len(s) == 0 and s.dropped == {}
    s.close()


def test_damaged_spool_file_never_raises_and_samples_still_go_out(tmp_path: Path) -> None:
    """A spool file damaged while the agent runs (SQLITE_CORRUPT/NOTADB on the next read or write):
    append refuses without raising (the sample waits in memory), the next read sets the file aside
    and starts a new one, and the sample in memory, then every new one, is handed out and
    acknowledged (the file's own records are lost, said once)."""
    path = tmp_path / "s.sqlite"
    s = Spool(path, max_bytes=1 << 20, memory_bytes=5 * 101)
    _fill(s, 50)
    with path.open("r+b") as f:  # overwrite everything after the magic string and page size
        f.seek(24)
        f.write(b"\xa5" * (path.stat().st_size - 24))
    assert s.append(b"k", b"new".ljust(100, b".")) == {}
    recs = s.peek()
    assert [r.value[:3] for r in recs] == [b"new"] and s.set_aside is not None
    s.ack(recs[0].id)
    assert s.peek(after_id=recs[0].id) == [] and len(s) == 0
    assert all(s.append(b"k", b"x" * 100) == {} for _ in range(8))  # the new file takes them
    assert [r.value[:1] for r in s.peek(after_id=recs[0].id)] == [b"x"] * 8 and s.failing is None
    s.close()


@pytest.mark.parametrize("case", ["file_as_dir", "dir_as_file", "not_sqlite", "under_proc"])
def test_unusable_spool_path_is_one_line(tmp_path: Path, case: str) -> None:
    if case == "file_as_dir":  # a file where the spool's directory should be
        (tmp_path / "d").write_text("x")
        path = tmp_path / "d" / "n.sqlite"
    elif case == "dir_as_file":
        path = tmp_path / "n.sqlite"
        path.mkdir()
    elif case == "not_sqlite":
        path = tmp_path / "n.sqlite"
        path.write_bytes(b"this is not a database\n" * 200)
    else:  # a directory no one may create files in, root included
        path = Path("/proc/self/fleetwatch-spool/n.sqlite")
    with pytest.raises(SpoolUnusable) as e:
        Spool(path, max_bytes=1 << 20)
    assert str(path.parent if case in ("file_as_dir", "under_proc") else path) in str(e.value)
    assert "\n" not in str(e.value)
    if case == "not_sqlite":
        assert path.read_bytes() == b"this is not a database\n" * 200  # left as it was


@pytest.mark.parametrize("damage", ["truncated", "garbled page"])
def test_a_spool_damaged_while_the_agent_was_down_is_set_aside_and_a_new_one_started(
    tmp_path: Path, damage: str
) -> None:
    """A crash or a power loss on a disk that lies about its flushes: the agent refused to start
    (status 1 or 2), and the node stayed dark until someone deleted the file (an adversarial
    probe's find). The file, whose header says it was a SQLite database, is kept aside for a
    post-mortem and a new spool (a new instance) starts; another program's file is still refused."""
    path = tmp_path / "n1.sqlite"
    old = Spool(path, max_bytes=64 << 20)
    _fill(old, 3000)
    instance = old.instance
    old.close()
    data = bytearray(path.read_bytes())
    if damage == "truncated":
        data = data[: (len(data) // 2 // 4096) * 4096]
    else:
        middle = len(data) // 4096 // 2 * 4096  # a leaf page of records
        data[middle : middle + 4096] = b"\xa5" * 4096
    path.write_bytes(bytes(data))
    s = Spool(path, max_bytes=64 << 20)
    assert s.set_aside is not None and s.set_aside.read_bytes() == bytes(data)
    assert s.instance != instance and len(s) == 0
    _fill(s, 2)
    assert [r.value[:8] for r in s.peek()] == [b"00000000", b"00000001"]
    s.close()


def test_a_spool_damaged_while_the_agent_runs_is_set_aside_and_sending_goes_on(tmp_path: Path) -> None:
    """A bad sector under a running agent's spool: appends went on (to the right-most page), but
    every read of the oldest records hit the damaged page, so nothing, old or new, was sent again
    and the spool grew past its bound (an adversarial probe's find). The first read that hits it
    sets the file aside; new records go out, their ids after the last (the forwarder's place)."""
    path = tmp_path / "n1.sqlite"
    s = Spool(path, max_bytes=600_000)
    _fill(s, 1500, size=300)
    last = s.peek(after_id=0, limit=2000)[-1].id
    pages = path.stat().st_size // 4096
    with open(path, "r+b") as f:
        for page in range(1, pages // 2):  # every page of the oldest half: the first read hits one
            f.seek(page * 4096)
            f.write(b"\xa5" * 4096)
        f.seek(24)  # the file change counter, as another writer bumps it: SQLite drops its cache
        counter = int.from_bytes(f.read(4), "big")
        f.seek(24)
        f.write((counter + 1).to_bytes(4, "big"))
    instance = s.instance
    assert s.peek(after_id=0, limit=10) == []  # the damaged file: set aside, what it held lost
    assert s.set_aside is not None and s.set_aside.exists() and s.instance != instance
    s.append(b"k", b"after")
    [rec] = s.peek(after_id=last, limit=10)
    assert rec.value == b"after" and rec.id > last and len(s) == 1 and s.failing is None
    s.close()
