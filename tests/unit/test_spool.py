"""The agent's on-disk spool: FIFO, acknowledged deletes, bound, persistence."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetwatch.collectors.spool import Spool


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
        dropped += s.append(b"k", f"{i:08d}".encode().ljust(100, b"."))
    assert s.bytes <= s.max_bytes
    assert dropped == 10 == s.dropped_total
    values = [r.value[:8] for r in s.peek(limit=100)]
    # the newest samples survive, still in order
    assert values == [f"{i:08d}".encode() for i in range(10, 60)]


def test_rejects_nonpositive_bound(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="bound"):
        Spool(tmp_path / "s.sqlite", max_bytes=0)
