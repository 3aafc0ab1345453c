"""What the drain adapter reads besides its requests (an adversarial probe's finds): its journal
damaged (power loss on a disk that lies about its flushes) is one line at start naming the file and
what to do, not a traceback, nor a crash at the request whose row the damage holds after every
restart; Slurm's output in another encoding than UTF-8 is read, not fatal."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetwatch.alerts.journal import Journal, JournalDamaged
from fleetwatch.alerts.slurm import SlurmClient, ours


def _journal(path: Path, rows: int = 300) -> None:
    j = Journal(path)
    for i in range(rows):
        j.begin(
            f"{i:032x}", f"gpu{i:03d}", "drain", 1.0, "test", comment_before="", request_signature="s" * 64
        )
    j.db.close()


@pytest.mark.parametrize("damage", ["truncated", "garbled page"])
def test_a_damaged_journal_is_one_clear_error_at_start(tmp_path: Path, damage: str) -> None:
    path = tmp_path / "journal.sqlite"
    _journal(path)
    (tmp_path / "journal.sqlite-wal").unlink(missing_ok=True)
    data = bytearray(path.read_bytes())
    if damage == "truncated":
        data = data[: len(data) // 2]
    else:
        page = 4096
        data[page * 2 : page * 3] = b"\xa5" * page
    path.write_bytes(bytes(data))
    with pytest.raises(JournalDamaged, match=r"is damaged .*move it aside"):
        Journal(path)


def test_a_node_reason_that_is_not_utf8_is_read_not_fatal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An admin's `Reason=défaut` in Latin-1 on any node: sinfo's output was read as strict UTF-8,
    and the UnicodeDecodeError stopped the adapter at each of its 30 s node reads, at every restart."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("sinfo", "scontrol"):
        exe = bin_dir / tool
        exe.write_bytes(b"#!/bin/sh\nprintf 'gpu01\\036drained\\036gpu\\036d\\351faut\\036\\n'\n")
        exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    [(info, _features)] = SlurmClient().node_states()
    assert (info.name, info.state, info.reason) == ("gpu01", "drained", "d\ufffdfaut")


@pytest.mark.parametrize(
    ("reason", "is_ours"),
    [
        ("fleetwatch: XID 79 [fw:6546dc87dbb1]", True),
        ("fleetwatch: validation failed: dcgmi diag -r 1: GPU 3 [fw:0123456789ab]", True),
        ("fleetwatch false positive? keep drained, RMA pending - alice", False),  # a human's
        ("fleetwatch: XID 79", False),  # no request's token
        ("RMA 4711 [fw:6546dc87dbb1]", False),
        ("fleetwatch: XID 79 [fw:6546DC87DBB1]", False),
    ],
)
def test_only_a_reason_fleetwatch_wrote_counts_as_its_drain(reason: str, is_ours: bool) -> None:
    """A resume lifts, and a drain overwrites, only fleetwatch's own drains: `startswith("fleetwatch")`
    took a human's reason that begins with the word for one (an adversarial probe's find)."""
    assert ours(reason) is is_ours
