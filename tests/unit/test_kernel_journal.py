"""The kernel source's journal input: the real journalctl reading real journal files.

The journal files are written by systemd's own journal writer, systemd-journal-remote, from journal
export format (https://systemd.io/JOURNAL_EXPORT_FORMATS/): entries of the kernel's transport
(`_TRANSPORT=kernel`, `SYSLOG_IDENTIFIER=kernel`, `_BOOT_ID`, the kernel's clock in
`_SOURCE_MONOTONIC_TIMESTAMP`) whose messages are real NVIDIA driver lines from
tests/fixtures/kernel_log (each file cites where its lines come from; the times of the entries are
this test's). journalctl and systemd-journal-remote must be installed (scripts/install.sh installs
them): without them these tests fail, they do not skip.

Covered: a first read; a restart from the cursor the spool keeps, with entries appended between the
runs (nothing twice, nothing missed), through the agent and its spool; a new boot; a cursor whose
entry the journal no longer has, and one journalctl refuses; a message that is not UTF-8; a flood
read in bounded slices; a journalctl that hangs (killed at its deadline), a journal that is not
there, a journalctl that is not there; the spool's text meta value, and spools of earlier releases.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import struct
import subprocess
import time
from pathlib import Path

import pytest

from fleetwatch import schemas
from fleetwatch.cli import build_parser
from fleetwatch.collectors.agent import Agent, SourceRunner, source_factory, source_options
from fleetwatch.collectors.forwarder import SpoolForwarder
from fleetwatch.collectors.kernel_log.journal import JournalHung, JournalReader, boot_hex, cursor_boot
from fleetwatch.collectors.kernel_log.lines import LineReader
from fleetwatch.collectors.kernel_log.source import KernelLogSource
from fleetwatch.collectors.sources import SourceUnavailable
from fleetwatch.collectors.spool import Spool, SpoolUnusable

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kernel_log"
BOOT_A = "0cec5dfe-715f-4b50-8a6a-7591dd3ffb2e"
BOOT_B = "5b0e6f3c-2a41-4c0e-9d7e-13a5e2c4f001"
REALTIME_AT_BOOT_US = 1_760_000_000_000_000
JOURNAL_REMOTE = ("/lib/systemd/systemd-journal-remote", "/usr/lib/systemd/systemd-journal-remote")


def _tool(name: str, *paths: str) -> str:
    found = shutil.which(name) or next((p for p in paths if os.access(p, os.X_OK)), None)
    assert found, (
        f"{name} is not installed: these tests need systemd's real journal tools "
        "(Debian: apt-get install systemd systemd-journal-remote; scripts/install.sh does it)"
    )
    return found


@pytest.fixture(scope="module")
def journal_remote() -> str:
    _tool("journalctl")
    return _tool("systemd-journal-remote", *JOURNAL_REMOTE)


def _message(file: str, needle: str) -> str:
    """The message of the fixture line that contains `needle`, without its dmesg/journal prefix."""
    for raw in (FIXTURES / file).read_text().splitlines():
        if needle in raw and not raw.startswith("#"):
            line = LineReader().parse(raw)
            assert line is not None
            return line.text
    raise AssertionError(f"{file} has no line with {needle!r}")


# Real lines (tests/fixtures/kernel_log, sources cited there)
GPU_AT = _message("fallen_off_bus.txt", "NVRM: GPU at PCI:0000:91:00: GPU-b6c3b2be")  # gpud sxid README
XID_79 = _message("fallen_off_bus.txt", "NVRM: Xid (PCI:0000:91:00): 79")
FELL = _message("fallen_off_bus.txt", "NVRM: GPU 0000:91:00.0: GPU has fallen off the bus.")
XID_119 = _message("nvrm_xid.txt", "Expected function 103 (GSP_RM_ALLOC)")  # gpud PR #1209
XID_119_FREE = _message("nvrm_xid.txt", "Expected function 10 (FREE) (0xa55a0210 0x0)")
SXID = [  # canonical/tdx#414: one non-fatal SXid in three lines
    _message("nvswitch_sxid.txt", "22013, Non-fatal, Link 44 Minion"),
    _message("nvswitch_sxid.txt", "22013, Severity 0 Engine instance 44"),
    _message("nvswitch_sxid.txt", "22013, Data {0x0000002c"),
]
# NVIDIA/NVSentinel#155: the probe-time record is one printk with newlines inside (dmesg shows the
# later lines indented, each with its own `NVRM: `); journald keeps it as one entry, newlines kept
PROBE_FELL = "\n".join(
    [
        _message("fallen_off_bus.txt", "NVRM: The NVIDIA GPU 0000:b3:00.0"),
        _message("fallen_off_bus.txt", "NVRM: (PCI ID: 10de:26b5) installed in this system has"),
        _message("fallen_off_bus.txt", "NVRM: fallen off the bus and is not responding to commands."),
    ]
)


class Journal:
    """A journal directory whose files systemd-journal-remote writes, and the boots' clocks."""

    def __init__(self, root: Path, writer: str) -> None:
        self.dir = root / "journal"
        self.dir.mkdir()
        self.writer = writer
        self.clock_us: dict[str, int] = {}

    def write(self, file: str, entries: list[tuple[str, str | bytes]], transport: str = "kernel") -> None:
        """Entries (boot id, message) appended to FILE.journal (made if it is not there)."""
        out = bytearray()
        for boot, message in entries:
            t = self.clock_us[boot] = self.clock_us.get(boot, 4_000_000) + 1_250
            fields: list[tuple[str, str | bytes]] = [
                ("__REALTIME_TIMESTAMP", str(REALTIME_AT_BOOT_US + t)),
                ("__MONOTONIC_TIMESTAMP", str(t + 150)),  # journald's clock: when it got the record
                ("_BOOT_ID", boot_hex(boot)),
                ("_MACHINE_ID", "fedcba9876543210fedcba9876543210"),
                ("_HOSTNAME", "gpu-node-01"),
                ("_TRANSPORT", transport),
                ("SYSLOG_IDENTIFIER", "kernel" if transport == "kernel" else "sshd"),
                ("PRIORITY", "4"),
                ("SYSLOG_FACILITY", "0"),
                ("_SOURCE_MONOTONIC_TIMESTAMP", str(t)),
                ("MESSAGE", message),
            ]
            for key, value in fields:
                data = value if isinstance(value, bytes) else value.encode()
                if b"\n" in data or isinstance(value, bytes):  # export format's binary field
                    out += key.encode() + b"\n" + struct.pack("<Q", len(data)) + data + b"\n"
                else:
                    out += key.encode() + b"=" + data + b"\n"
            out += b"\n"
        subprocess.run(
            [self.writer, f"--output={self.dir / file}.journal", "-"],
            input=bytes(out),
            check=True,
            capture_output=True,
            timeout=30,
        )

    def args(self) -> list[str]:
        return ["--directory", str(self.dir)]


@pytest.fixture
def journal(tmp_path: Path, journal_remote: str) -> Journal:
    return Journal(tmp_path, journal_remote)


def _boot(tmp_path: Path, boot_id: str = BOOT_A) -> Path:
    p = tmp_path / f"boot_id-{boot_id[:4]}"
    p.write_text(boot_id + "\n")
    return p


def _source(journal: Journal, boot: Path, cursor: str | None = None, **kw: object) -> KernelLogSource:
    return KernelLogSource(
        boot_id=boot,
        gpus=lambda: {"0000:91:00.0": 5},
        reader="journal",
        journal_cursor=cursor,
        journal_args=journal.args(),
        **kw,  # type: ignore[arg-type]
    )


def _events(part: dict) -> list[tuple[str, int | None, int]]:
    return [(e["kind"], e.get("code"), e["count"]) for e in part.get("kernel", {}).get("events", [])]


def _valid(part: dict) -> None:
    body = {k: v for k, v in part.items() if k != "_cursor"}
    schemas.validate({"schema": "telemetry/1", "node": "n1", "ts": 1.0, "seq": 0, "gpus": [], **body})


# ---------------------------------------------------------------- reading, cursor, restarts


def test_a_first_read_takes_this_boots_kernel_entries_as_events(tmp_path: Path, journal: Journal) -> None:
    journal.write("system", [(BOOT_A, GPU_AT), (BOOT_A, XID_79), (BOOT_A, FELL)])
    journal.write("system", [(BOOT_A, "sshd: Accepted publickey for root")], transport="syslog")
    journal.write("system", [(BOOT_A, line) for line in SXID] + [(BOOT_A, PROBE_FELL)])
    src = _source(journal, _boot(tmp_path))
    part = src.sample()
    assert _events(part) == [
        ("xid", 79, 1),
        ("fallen_off_bus", None, 1),
        ("sxid", 22013, 1),
        ("fallen_off_bus", None, 1),
    ]
    section = part["kernel"]
    assert section["records"] == 7 and section["boot"] == BOOT_A  # the sshd entry is not the kernel's
    xid = section["events"][0]
    assert (xid["gpu"], xid["uuid"], xid["pci"]) == (
        5,
        "GPU-b6c3b2be-c55b-d076-fa0e-d464e4c7e08b",
        "0000:91:00.0",
    )
    # the journal's clocks: the wall clock and the kernel's; no kmsg seq, no boot id in an event
    assert xid["ts"] == pytest.approx((REALTIME_AT_BOOT_US + 4_002_500) / 1e6)
    assert xid["since_boot_s"] == pytest.approx(4.0025)
    assert "seq" not in xid and "boot_id" not in xid
    sxid = section["events"][2]
    assert (sxid["severity"], sxid["link"], sxid["engine"]) == ("nonfatal", 44, 44) and "data" in sxid
    probe = section["events"][3]
    assert probe["pci"] == "0000:b3:00.0" and "\n" not in probe["text"]  # one line, as kmsg's is
    assert part["_cursor"]["journal_cursor"].startswith("s=")
    assert cursor_boot(part["_cursor"]["journal_cursor"]) == boot_hex(BOOT_A)
    _valid(part)
    assert _events(src.sample()) == []  # nothing new
    src.close()


def test_a_restart_from_the_spooled_cursor_repeats_nothing_and_misses_nothing(
    tmp_path: Path, journal: Journal
) -> None:
    """Through the agent: the cursor goes into the spool with the sample, and a new agent on that
    spool builds the source from it; entries appended while no agent ran are read once."""
    boot = _boot(tmp_path)
    journal.write("system", [(BOOT_A, GPU_AT), (BOOT_A, XID_79)])
    spool = Spool(tmp_path / "spool" / "n1.sqlite", max_bytes=1 << 20)
    options = {"reader": "journal", "journal_args": journal.args(), "boot_id": boot, "gpus": dict}

    def agent() -> Agent:
        forwarder = SpoolForwarder(spool, "fleet.telemetry.v1", "127.0.0.1:1")  # never pumped
        return Agent(
            "n1", [SourceRunner("kernel", source_factory("kernel", spool, options))], spool, forwarder
        )

    first = agent()
    try:
        msg = first.tick()
        assert [e["code"] for e in msg["kernel"]["events"]] == [79] and "_cursor" not in msg
        saved = spool.get_meta_text("journal_cursor")
        assert saved is not None and cursor_boot(saved) == boot_hex(BOOT_A)
        assert "kernel" not in first.tick()  # quiet: nothing new
    finally:
        for r in first.runners:
            r.close()
        first.forwarder.close()
    # while no agent runs: more entries, in the same file and in another one
    journal.write("system", [(BOOT_A, XID_119)])
    journal.write("system-2", [(BOOT_A, XID_119_FREE), (BOOT_A, FELL)])
    second = agent()
    try:
        msg = second.tick()
        section = msg["kernel"]
        assert [(e["kind"], e.get("code"), e["count"]) for e in section["events"]] == [
            ("xid", 119, 2),  # both XID 119 lines, one event: same GPU and code
            ("fallen_off_bus", None, 1),
        ]
        assert section["records"] == 3 and "missed" not in section
        assert spool.get_meta_text("journal_cursor") != saved
    finally:
        for r in second.runners:
            r.close()
        second.forwarder.close()
        spool.close()


def test_a_new_boot_rescans_from_its_first_entry(tmp_path: Path, journal: Journal) -> None:
    journal.write("system", [(BOOT_A, XID_79)])
    first = _source(journal, _boot(tmp_path, BOOT_A))
    assert _events(first.sample()) == [("xid", 79, 1)]
    saved = first.cursor
    first.close()
    # the node rebooted: the journal holds both boots
    journal.write("system", [(BOOT_B, GPU_AT), (BOOT_B, XID_119)])
    second = _source(journal, _boot(tmp_path, BOOT_B), cursor=saved)  # type: ignore[arg-type]
    part = second.sample()
    assert _events(part) == [("xid", 119, 1)] and part["kernel"]["boot"] == BOOT_B
    assert "missed" not in part["kernel"]  # another boot's cursor: no loss, a new start
    assert cursor_boot(part["_cursor"]["journal_cursor"]) == boot_hex(BOOT_B)
    second.close()


def test_a_cursor_the_journal_no_longer_has_is_counted_and_reading_goes_on(
    tmp_path: Path, journal: Journal
) -> None:
    boot = _boot(tmp_path)
    journal.write("system@old", [(BOOT_A, XID_79), (BOOT_A, XID_119), (BOOT_A, FELL)])
    journal.write("system", [(BOOT_A, XID_119_FREE)] + [(BOOT_A, line) for line in SXID])
    first = _source(journal, boot, max_records=2)  # stops after the first two entries
    assert _events(first.sample()) == [("xid", 79, 1), ("xid", 119, 1)]
    saved = first.cursor
    first.close()
    # the file holding the cursor's entry (and one not read yet) is vacuumed while the agent is down
    (journal.dir / "system@old.journal").unlink()
    second = _source(journal, boot, cursor=saved)  # type: ignore[arg-type]
    part = second.sample()
    assert part["kernel"]["missed"] == 1  # said, never silent: a finding (detectors/kernel_rules.py)
    assert _events(part) == [("xid", 119, 1), ("sxid", 22013, 1)]  # the oldest entries still there
    _valid(part)
    again = second.sample()
    assert "kernel" not in again  # counted once
    second.close()
    # a restart from the new cursor: nothing lost, nothing repeated
    third = _source(journal, boot, cursor=part["_cursor"]["journal_cursor"])
    assert "kernel" not in third.sample()
    third.close()


def test_a_cursor_journalctl_refuses_is_counted_and_the_boot_read_from_its_start(
    tmp_path: Path, journal: Journal
) -> None:
    journal.write("system", [(BOOT_A, XID_79)])
    bad = f"b={boot_hex(BOOT_A)};not-a-cursor"  # of this boot, but nothing journalctl can seek to
    src = _source(journal, _boot(tmp_path), cursor=bad)
    part = src.sample()
    assert part["kernel"]["missed"] == 1 and _events(part) == [("xid", 79, 1)]
    assert part["_cursor"]["journal_cursor"] != bad
    src.close()


def test_a_message_that_is_not_utf8_is_decoded_with_replacement(tmp_path: Path, journal: Journal) -> None:
    # the XID 119 line of the fixture with its process name's last byte made 0xE9 (latin-1): journald
    # keeps such a message as bytes, and journalctl prints them as an array of numbers
    raw = XID_119.encode().replace(b"name=nvidia-smi,", b"name=nvidia-sm\xe9,")
    assert b"\xe9" in raw
    journal.write("system", [(BOOT_A, raw), (BOOT_A, b"\xff\xfe not a kernel line")])
    reader = JournalReader(BOOT_A, None, args=journal.args())
    records = reader.read(10)
    assert '"MESSAGE":"NVRM: Xid (PCI:0000:9b:00): 119, pid=2024380, name=nvidia-sm\ufffd,' in records[0]
    reader.close()
    part = _source(journal, _boot(tmp_path)).sample()
    assert _events(part) == [("xid", 119, 1)] and part["kernel"]["events"][0]["process"] == "nvidia-sm\ufffd"
    _valid(part)


def test_a_flood_is_read_in_bounded_slices_each_entry_once(tmp_path: Path, journal: Journal) -> None:
    journal.write("system", [(BOOT_A, XID_79)] * 2500)
    src = _source(journal, _boot(tmp_path), max_records=1000)
    counts = [src.sample()["kernel"]["records"] for _ in range(3)]
    assert counts == [1000, 1000, 500]
    assert "kernel" not in src.sample()
    src.close()


# ---------------------------------------------------------------- failures: said, never a hang


def _fake_journalctl(tmp_path: Path, body: str) -> str:
    exe = tmp_path / "journalctl"
    exe.write_text("#!/bin/sh\n" + body)
    exe.chmod(0o755)
    return str(exe)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def test_a_hung_journalctl_is_killed_at_its_deadline_and_reported(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    # a journalctl stuck (a journal on a dead mount): it and what it started print nothing, ever
    fake = _fake_journalctl(tmp_path, f"sleep 60 &\necho $$ $! > {pids}\nwait\n")
    src = KernelLogSource(
        boot_id=_boot(tmp_path), reader="journal", journalctl=fake, journal_timeout_s=0.6, budget_s=0.1
    )
    started = time.monotonic()
    errors = []
    for _ in range(20):
        t = time.monotonic()
        try:
            assert src.sample() == {}  # waiting: nothing read, nothing said yet
        except JournalHung as e:
            errors.append(str(e))
        assert time.monotonic() - t < 0.5  # a sample never waits on it past its budget
        if errors:
            break
    assert errors and "printed nothing for 0.6 s: killed" in errors[0]
    assert 0.6 <= time.monotonic() - started < 3
    shell, child = (int(p) for p in pids.read_text().split())
    # the whole process group: SIGKILL is delivered asynchronously, and the grandchild is nobody's
    # to wait for here, so it may take a moment on a loaded machine (a full run saw one still running)
    deadline = time.monotonic() + 5
    while (_alive(shell) or _alive(child)) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not _alive(shell) and not _alive(child)
    src.close()


def test_the_agent_reports_a_hung_journalctl_and_goes_on(tmp_path: Path) -> None:
    fake = _fake_journalctl(tmp_path, "exec sleep 60\n")
    options = {
        "reader": "journal",
        "journalctl": fake,
        "journal_timeout_s": 0.3,
        "budget_s": 0.05,
        "boot_id": _boot(tmp_path),
    }
    spool = Spool(tmp_path / "n1.sqlite", max_bytes=1 << 20)
    forwarder = SpoolForwarder(spool, "fleet.telemetry.v1", "127.0.0.1:1")
    agent = Agent("n1", [SourceRunner("kernel", source_factory("kernel", spool, options))], spool, forwarder)
    try:
        said = []
        for _ in range(10):
            said.append(agent.tick()["agent"]["source_errors"].get("kernel", ""))
            time.sleep(0.1)
        assert any(s.startswith("error: JournalHung:") for s in said), said
    finally:
        for r in agent.runners:
            r.close()
        forwarder.close()
        spool.close()


def test_a_journal_that_is_not_there_is_an_error_of_the_sample(tmp_path: Path, journal: Journal) -> None:
    src = KernelLogSource(
        boot_id=_boot(tmp_path), reader="journal", journal_args=["--file", str(tmp_path / "none.journal")]
    )
    with pytest.raises(RuntimeError, match=r"journalctl exited with status 1: .*No such file"):
        src.sample()
    src.close()


def test_a_missing_journalctl_makes_the_source_unavailable(tmp_path: Path) -> None:
    missing = str(tmp_path / "no" / "journalctl")
    with pytest.raises(SourceUnavailable, match="journalctl not found"):
        KernelLogSource(boot_id=_boot(tmp_path), reader="journal", journalctl=missing)
    spool = Spool(tmp_path / "n1.sqlite", max_bytes=1 << 20)
    options = {"reader": "journal", "journalctl": missing, "boot_id": _boot(tmp_path)}
    runner = SourceRunner("kernel", source_factory("kernel", spool, options))
    assert runner.start() is None  # the source is made in the runner's thread, under the deadline
    part, err = runner.result(5.0)
    assert part is None and err is not None
    assert err.startswith("unavailable: SourceUnavailable: journalctl not found")
    assert runner.start() == err  # not made again before its retry is due
    runner.close()
    spool.close()


# ---------------------------------------------------------------- selection and the spool


def test_collect_selects_the_reader_and_its_journalctl_arguments() -> None:
    args = build_parser().parse_args(
        ["collect", "--kernel-log", "journal", "--journal-args", "-D /srv/journal"]
    )
    assert source_options(args)["kernel"] == {"reader": "journal", "journal_args": ["-D", "/srv/journal"]}
    assert "kernel" not in source_options(build_parser().parse_args(["collect"]))  # kmsg: its defaults
    with pytest.raises(ValueError, match="--journal-args is for --kernel-log journal"):
        source_options(argparse.Namespace(kernel_log="kmsg", journal_args="-D /x"))
    with pytest.raises(ValueError, match="unknown kernel log reader"):
        KernelLogSource(reader="syslog")


def test_the_spool_keeps_a_text_meta_value_with_the_sample(tmp_path: Path) -> None:
    path = tmp_path / "n1.sqlite"
    spool = Spool(path, max_bytes=1 << 20)
    assert spool.get_meta_text("journal_cursor") is None
    spool.append(b"n1", b"{}", meta={"next_seq": 1, "journal_cursor": "s=1;i=2"})
    spool.append(b"n1", b"{}", meta={"next_seq": 2, "journal_cursor": "s=1;i=3"})
    spool.close()
    again = Spool(path, max_bytes=1 << 20)
    assert again.get_meta_text("journal_cursor") == "s=1;i=3" and again.get_meta("next_seq") == 2
    again.close()


def test_a_spool_of_an_earlier_release_opens_and_takes_a_text_value(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)  # the schema of a release before text meta values
    db.executescript(
        "CREATE TABLE spool (id INTEGER PRIMARY KEY AUTOINCREMENT, key BLOB, value BLOB NOT NULL, "
        "size INTEGER NOT NULL); CREATE TABLE meta (k TEXT PRIMARY KEY, v INTEGER NOT NULL);"
        "INSERT INTO meta VALUES ('next_seq', 7);"
    )
    db.commit()
    db.close()
    spool = Spool(path, max_bytes=1 << 20)
    assert spool.get_meta("next_seq") == 7 and spool.get_meta_text("journal_cursor") is None
    spool.append(b"n1", b"{}", meta={"next_seq": 8, "journal_cursor": "s=1;i=4"})
    spool.close()
    db = sqlite3.connect(path)
    assert db.execute("SELECT v FROM meta_text WHERE k = 'journal_cursor'").fetchone() == ("s=1;i=4",)
    db.execute("UPDATE meta_text SET v = x'00ff' WHERE k = 'journal_cursor'")  # not this agent's
    db.commit()
    db.close()
    spool = Spool(path, max_bytes=1 << 20)
    with pytest.raises(SpoolUnusable, match="journal_cursor"):
        spool.get_meta_text("journal_cursor")
    spool.close()
