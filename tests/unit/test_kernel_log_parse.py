"""The kernel-log parser on real lines (tests/fixtures/kernel_log, each group cited there): every
NVIDIA and AER event in them is found with its code, address and fields, multi-line events are
folded, every time format gives its time, and a line it does not know is counted, not guessed."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

import orjson
import pytest

from fleetwatch.collectors.kernel_log.events import EventParser, KernelEvent, parse_events, pci_address
from fleetwatch.collectors.kernel_log.lines import LineReader, LogLine

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kernel_log"


def _lines(name: str, year: int = 2025) -> tuple[list[LogLine], LineReader]:
    reader = LineReader(year=year)
    out = []
    for raw in (FIXTURES / name).read_text().splitlines():
        if raw.startswith("#"):
            continue
        line = reader.parse(raw)
        if line is not None:
            out.append(line)
    return out, reader


def _events(name: str) -> list[KernelEvent]:
    return parse_events(_lines(name)[0])[0]


def _raw(name: str) -> list[str]:
    return [r for r in (FIXTURES / name).read_text().splitlines() if r and not r.startswith("#")]


@pytest.mark.parametrize("name", ["nvrm_xid.txt", "nvlink5_xid.txt", "fallen_off_bus.txt", "pcie_aer.txt"])
def test_every_xid_line_is_one_xid_event_with_its_code_and_address(name: str) -> None:
    expected = [
        (pci_address(m.group(1)), int(m.group(2)))
        for r in _raw(name)
        if (m := re.search(r"Xid \((?:PCI:)?([0-9a-f:]+)\): (\d+),", r))
    ]
    found = [(e.pci, e.code) for e in _events(name) if e.kind == "xid"]
    assert expected and found == expected


def test_the_fields_of_each_driver_generation() -> None:
    by_line = {e.line: e for e in _events("nvrm_xid.txt")}
    events = list(by_line.values())
    old = next(e for e in events if e.code == 14)  # no PCI: prefix, no pid (the oldest form)
    assert old.pci == "0000:03:00.0" and "pid" not in old.extra
    unknown = next(e for e in events if e.code == 13 and "<unknown>" in e.text)
    assert "pid" not in unknown.extra and "process" not in unknown.extra
    named = next(e for e in events if e.code == 119)
    assert named.extra["pid"] == 2024380 and named.extra["process"] == "nvidia-smi"
    assert named.pci == "0000:9b:00.0"
    assert dt.datetime.fromtimestamp(named.ts or 0, dt.UTC) == dt.datetime(
        2025, 2, 23, 16, 24, 18, tzinfo=dt.UTC
    )
    pid_only = next(e for e in events if e.code == 64)  # pid= without name=
    assert pid_only.extra["pid"] == 57530 and "process" not in pid_only.extra


def test_nvlink5_xids_carry_severity_unit_and_link_however_they_are_spaced() -> None:
    events = [e for e in _events("nvlink5_xid.txt") if e.code in range(144, 151)]
    assert len(events) == sum(1 for r in _raw("nvlink5_xid.txt") if re.search(r"\): 14[4-9]|\): 150", r))
    padded = events[0]  # "149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 01 (..."
    assert (padded.code, padded.severity, padded.extra["unit"], padded.extra["link"]) == (
        149,
        "fatal",
        "NETIR_LINK_EVT",
        1,
    )
    assert {e.severity for e in events} == {"fatal", "nonfatal"}
    assert any(e.extra["link"] == -1 for e in events)  # "Link -1": not one link
    with_pid = next(e for e in events if e.extra.get("process") == "ray::WorkerDict")
    assert with_pid.extra["unit"] == "RLW_RXPIPE" and with_pid.extra["link"] == 13


def test_xid_154_gives_the_recovery_action_it_changed_to() -> None:
    changes = [e for e in _events("nvlink5_xid.txt") if e.code == 154]
    assert [(e.extra["recovery_action_before"], e.extra["recovery_action"]) for e in changes] == [
        (0, 4),
        (4, 1),
        (4, 1),
        (4, 1),
        (0, 1),
    ]
    assert changes[0].extra["recovery_action_name"] == "Drain and Reset"


def test_sxid_lines_of_one_event_are_folded_per_switch_even_interleaved() -> None:
    events = [e for e in _events("nvswitch_sxid.txt") if e.kind == "sxid"]
    link44 = next(e for e in events if e.extra.get("link") == 44)
    assert (link44.pci, link44.code, link44.severity) == ("0000:04:00.0", 22013, "nonfatal")
    assert link44.extra["severity_level"] == 0 and link44.extra["engine"] == 44
    assert link44.extra["data"].startswith("0x0000002c")
    # three switches interleaved (gpud's README): each Fatal line keeps its own switch's companions
    link62 = next(e for e in events if e.extra.get("link") == 62)
    assert link62.pci == "0000:05:00.0" and link62.extra["engine"] == 62
    link37 = next(e for e in events if e.extra.get("link") == 37)
    assert link37.pci == "0000:07:00.0" and link37.extra["engine"] == 37

    # every SXid line became part of exactly one event: its first line, or a companion folded in
    def lines_of(e: KernelEvent) -> int:
        folded = sum(1 for k in ("severity_level", "data") if k in e.extra)
        first_is_companion = re.search(r"\): \d+, (Severity|Data)", e.text) is not None
        return 1 + folded - first_is_companion

    assert sum(lines_of(e) for e in events) == sum(1 for r in _raw("nvswitch_sxid.txt") if "SXid (" in r)
    soe = [e for e in events if e.code in (26006, 26007, 26008)]  # SOE lines have no severity word
    assert len(soe) == 4 and all(e.severity is None for e in soe)


def test_a_gpu_fallen_off_the_bus_in_each_form() -> None:
    fallen = [e for e in _events("fallen_off_bus.txt") if e.kind == "fallen_off_bus"]
    # the three-line probe-time record as dmesg prints it (later lines indented), and the one-line form
    assert [e.pci for e in fallen] == ["0000:b3:00.0", "0000:91:00.0"]
    assert "fallen off the bus and is not responding" in fallen[0].text
    assert fallen[0].since_boot_s == pytest.approx(1843.308145)


def test_the_probe_time_record_read_from_kmsg_is_one_record() -> None:
    # /dev/kmsg escapes the newlines inside a record (Documentation/ABI/testing/dev-kmsg); the
    # text is the real record's of fallen_off_bus.txt (NVSentinel issue 155)
    record = (
        r"3,1204,1843308145,-;NVRM: The NVIDIA GPU 0000:b3:00.0\x0aNVRM: (PCI ID: 10de:26b5) installed in"
        r" this system has\x0aNVRM: fallen off the bus and is not responding to commands."
    )
    line = LineReader().parse(record)
    assert line is not None and line.seq == 1204
    events = EventParser().feed(line)
    assert [(e.kind, e.pci, e.seq) for e in events] == [("fallen_off_bus", "0000:b3:00.0", 1204)]


def test_a_probe_message_that_is_not_a_fall_is_no_event() -> None:
    parser = EventParser()
    reader = LineReader()
    out: list[KernelEvent] = []
    for raw in (
        "[ 2.1] NVRM: The NVIDIA GPU 0000:01:00.0 (PCI ID: 10de:1b80)",
        "               NVRM: installed in this system is not supported by the",
        "               NVRM: NVIDIA 550.67 driver release.",
    ):
        line = reader.parse(raw)
        assert line is not None
        out += parser.feed(line)
    assert out + parser.flush() == []


def test_gpu_uuids_are_learnt_from_the_driver_lines() -> None:
    _events, parser = parse_events(_lines("gpu_pci_map.txt")[0])
    # two machines' GPUs at 0000:03:00 in the file: the later line names the address now
    assert parser.uuids["0000:03:00.0"] == "GPU-455d8f70-2051-db6c-0430-ffc457bff834"
    assert parser.uuids["0000:02:00.0"] == "GPU-660d987e-5b28-3bf6-2a2d-1d5ecae7f6df"
    assert parser.uuids["0000:9b:00.0"] == "GPU-509665ad-b600-ac93-3616-d754b23d636d"


def test_aer_events_name_the_device_below_the_port_and_fold_their_detail_lines() -> None:
    events = [e for e in _events("pcie_aer.txt") if e.kind == "aer"]
    first = events[0]  # old kernel: "received: id=0010" is bus 0, device 2, function 0
    assert (first.pci, first.extra["port"], first.severity) == ("0000:00:02.0", "0000:00:02.0", "corrected")
    assert first.extra["errors"] == ["Replay Timer Timeout"] and first.extra["pci_id"] == "8086:6f04"
    surprise = events[1]
    assert surprise.severity == "fatal" and surprise.extra["errors"] == ["Surprise Down Error"]
    newer = next(e for e in events if e.extra["port"] == "0000:00:1b.2" and e.severity == "corrected")
    assert newer.pci == "0000:03:04.0" and newer.extra["error_type"] == "Physical Layer"
    assert {e.severity for e in events} == {"corrected", "fatal"}


def test_every_time_format_gives_its_time() -> None:
    lines, reader = _lines("timestamp_formats.txt")
    forms = {line.form for line in lines}
    assert {"kmsg", "dmesg", "dmesg_t", "syslog", "iso"} <= forms
    kmsg = [line for line in lines if line.form == "kmsg"]
    assert all(line.seq is not None and line.since_boot_s is not None for line in kmsg)
    assert all(line.ts is not None for line in lines if line.form in ("dmesg_t", "syslog", "iso"))
    # a journal line with a CJK month ("4月") and one with "jan." (fixture lines)
    months = {
        dt.datetime.fromtimestamp(line.ts, dt.UTC).month
        for line in lines
        if line.form == "syslog" and line.ts
    }
    assert {1, 4} <= months
    assert reader.unknown <= 1  # a `grep -r` prefix ("messages:Jun 17 ...") is no kernel line


@pytest.mark.parametrize(
    ("stamp", "expected"),
    [
        ("[Tue Mar  5 10:11:12 2024]", dt.datetime(2024, 3, 5, 10, 11, 12)),
        ("[Di Mär  5 10:11:12 2024]", dt.datetime(2024, 3, 5, 10, 11, 12)),  # de_DE
        ("[mar. mars  5 10:11:12 2024]", dt.datetime(2024, 3, 5, 10, 11, 12)),  # fr_FR
        ("[火  3月  5 10:11:12 2024]", dt.datetime(2024, 3, 5, 10, 11, 12)),  # ja_JP
        ("[вт мар  5 10:11:12 2024]", dt.datetime(2024, 3, 5, 10, 11, 12)),  # ru_RU
    ],
)
def test_dmesg_T_in_any_locale(stamp: str, expected: dt.datetime) -> None:
    # the stamp as each locale's glibc prints dmesg -T's "%a %b %e %H:%M:%S %Y" (none was found in a
    # public log; the names are CLDR's); the message is a real line of nvrm_xid.txt
    line = LineReader().parse(
        f"{stamp} NVRM: Xid (PCI:0000:9b:00): 119, pid=2024380, name=nvidia-smi, Timeout"
    )
    assert line is not None and line.form == "dmesg_t"
    assert line.ts == expected.replace(tzinfo=dt.UTC).timestamp()


def test_a_month_that_names_no_certain_month_gives_no_line() -> None:
    reader = LineReader()
    assert reader.parse("[Foo Bar  5 10:11:12 2024] NVRM: Xid (PCI:0000:9b:00): 119, x") is None
    assert reader.unknown == 1


def test_journal_json_lines() -> None:
    raw = (
        '{"__REALTIME_TIMESTAMP":"1740327858000000","_BOOT_ID":"0f3c","_TRANSPORT":"kernel",'
        '"_SOURCE_MONOTONIC_TIMESTAMP":"171167620236","PRIORITY":"4",'
        '"MESSAGE":"NVRM: Xid (PCI:0009:01:00): 154, GPU recovery action changed from 0x0 (None) '
        'to 0x4 (Drain and Reset)"}'
    )
    line = LineReader().parse(raw)
    assert line is not None and (line.ts, line.boot_id, line.priority) == (1740327858.0, "0f3c", 4)
    (event,) = EventParser().feed(line)
    assert event.code == 154 and event.extra["recovery_action"] == 4 and event.boot_id == "0f3c"
    as_bytes = raw.replace('"MESSAGE":"NVRM', '"MESSAGE":[78,86,82,77],"X":"')  # MESSAGE as a byte array
    parsed = LineReader().parse(as_bytes)
    assert parsed is not None and parsed.text == "NVRM"


def test_hostile_lines_are_counted_and_skipped() -> None:
    reader, parser = LineReader(), EventParser()
    for raw in (
        "NVRM: Xid (PCI:0000:9b:00): 99999999999, pid=1, name=x, too big",  # a code past 2**32
        "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 4294967296, Fatal, Link 1 x",
        "x" * 100_000,  # huge
        "NVRM: Xid (PCI:0000:9b:00)\x00: 79, binary",
        "\ufffd\ufffd NVRM: Xid (PCI:zz:9b:00): 79, not an address",
        # times that are none: each line is unknown, not a crash
        "[Tue Mar  5 25:11:12 2024] NVRM: Xid (PCI:0000:9b:00): 79, pid=1, name=x, hour 25",
        "Mar  5 10:61:12 host kernel: NVRM: Xid (PCI:0000:9b:00): 79, minute 61",
        "2024-02-30T10:11:12+00:00 host kernel: NVRM: Xid (PCI:0000:9b:00): 79, 30 February",
        "2024-03-05T10:11:12+99:00 host kernel: NVRM: Xid (PCI:0000:9b:00): 79, offset past a day",
    ):
        line = reader.parse(raw)
        if line is not None:
            assert parser.feed(line) == []
    # rejected: the two codes past 2**32 and the XID line whose address is none
    assert parser.rejected == 3 and reader.unknown == 6
    for cut in (
        "NVRM: Xid (PCI:0000:9b:00): 79",
        "NVRM: Xid (PCI:0000:9b:00): -5, x",
        "nvidia-nvswitch0: SXid (PCI:0",
    ):
        line = reader.parse(cut)
        assert line is not None and parser.feed(line) == []
    assert parser.rejected == 6  # cut short or with no code: counted, not silently lost


def test_numbers_past_their_field_leave_the_field_out_and_the_event_whole() -> None:
    """A pid, a link, an engine or a recovery action of more digits than the driver prints: the
    event stands without that field (a number past 64 bits once made the JSON encoder raise, which
    ended a whole `fleetwatch xids` run at that line)."""
    reader, parser = LineReader(), EventParser()
    nines, switch = "9" * 30, "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028,"
    events = []
    for raw in (
        f"NVRM: Xid (PCI:0000:9b:00): 79, pid={nines}, name=python, GPU has fallen off the bus.",
        f"NVRM: Xid (PCI:0000:9b:00): 145, pid=1, name=x, RLW_REMAP Nonfatal XC0 i0 Link {nines} (0x0)",
        f"NVRM: Xid (PCI:0000:9b:00): 154, GPU recovery action changed from 0x0 (None) to 0x{'f' * 40} (R)",
        f"{switch} Non-fatal, Link {nines} egress non-posted PRIV error",
        f"{switch} Severity {nines} Engine instance 1 Sub-engine instance 0",
    ):
        line = reader.parse(raw)
        assert line is not None
        events += parser.feed(line)
    events += parser.flush()
    assert [e.code for e in events if e.kind == "xid"] == [79, 145, 154]
    assert {e.code for e in events if e.kind == "sxid"} == {12028}
    too_long = {"pid", "link", "recovery_action", "severity_level"}
    for e in events:
        fields = orjson.loads(orjson.dumps(e.to_dict()))  # as the agent and `xids` write it
        assert not too_long & fields.get("extra", {}).keys(), fields


def test_storage_errors_hung_tasks_and_nfs_timeouts_are_events_naming_what_failed() -> None:
    """other_io_errors.txt: every block-layer, buffer and ext4 I/O error line names its device; the
    hung-task watchdog's report names the task; an NFS server's timeout names the server; the
    lines around them (SCSI detail, `nfs: server ... OK`, the watchdog's advice) are no events."""
    events = _events("other_io_errors.txt")
    raw = _raw("other_io_errors.txt")
    io = [e for e in events if e.kind == "io_error"]
    expected_io = [r for r in raw if re.search(r"I/O error, dev |Buffer I/O error on dev|EXT4-fs error", r)]
    assert len(io) == len(expected_io) and {e.extra["device"] for e in io} == {
        "sda",
        "sda1",
        "mmcblk0p2",
        "dm-1",
    }
    hung = [e for e in events if e.kind == "hung_task"]
    # (the last report is grep's output, `messages:` before the syslog line: no known form)
    assert [(e.extra["process"], e.extra.get("pid")) for e in hung] == [("objcopy", 24916), ("nfsd", 3782)]
    nfs = [e for e in events if e.kind == "nfs_timeout"]
    assert [e.extra["server"] for e in nfs] == ["ease", "ease", "10.0.0.2"]
    assert {e.kind for e in events} == {"io_error", "hung_task", "nfs_timeout"}
