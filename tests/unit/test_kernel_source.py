"""The agent's kernel source: the kernel log read from a cursor the spool keeps with each sample, so
an agent restart neither repeats nor loses an event, a reboot rescans the new boot, a ring buffer
that wrapped is reported, and a flood is read in bounded slices with repeats counted.

The ring buffer is tests/helpers/fake_kmsg.py (it answers read() with /dev/kmsg's records and
errors); the lines logged into it are real ones from tests/fixtures/kernel_log. The real
/dev/kmsg is read in tests/integration/test_kernel_log_agent.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetwatch import schemas
from fleetwatch.collectors.agent import Agent, SourceRunner, source_factory
from fleetwatch.collectors.forwarder import SpoolForwarder
from fleetwatch.collectors.kernel_log.kmsg import Cursor, boot_hash
from fleetwatch.collectors.kernel_log.source import (
    KernelLogSource,
    gpus_below_ports,
    hcas_below_ports,
    nvidia_gpus,
)
from fleetwatch.collectors.spool import Spool
from tests.helpers.fake_kmsg import RingKmsg

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kernel_log"
XID_79 = "NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
XID_119 = "NVRM: Xid (PCI:0000:9b:00): 119, pid=2024380, name=nvidia-smi, Timeout after 6s of waiting for RPC"
SXID = [  # one event in three lines (gpud's README, nvswitch_sxid.txt)
    "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 62 LTSSM Fault Up",
    "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Severity 1 Engine instance 62 Sub-engine instance 00",
    "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Data {0x10000000, 0x10000000, 0x00000000}",
]


def _boot(tmp_path: Path, boot_id: str = "0cec5dfe-715f-4b50-8a6a-7591dd3ffb2e") -> Path:
    p = tmp_path / f"boot_id-{boot_id[:4]}"
    p.write_text(boot_id + "\n")
    return p


def _source(ring: RingKmsg, boot: Path, cursor: Cursor | None = None, **kw: object) -> KernelLogSource:
    return KernelLogSource(
        cursor=cursor, device=ring.open, boot_id=boot, gpus=lambda: {"0000:91:00.0": 5}, **kw
    )


def _codes(section: dict) -> list[tuple[str, int | None, int]]:
    return [(e["kind"], e.get("code"), e["count"]) for e in section["events"]]


def test_events_since_the_last_sample_with_gpu_uuid_and_folded_sxid(tmp_path: Path) -> None:
    ring = RingKmsg()
    ring.log("NVRM: GPU at PCI:0000:91:00: GPU-b6c3b2be-c55b-d076-fa0e-d464e4c7e08b")
    ring.log(XID_79)
    for line in SXID:
        ring.log(line)
    src = _source(ring, _boot(tmp_path))
    part = src.sample()
    section = part["kernel"]
    assert _codes(section) == [("xid", 79, 1), ("sxid", 20034, 1)]
    xid = section["events"][0]
    assert (xid["gpu"], xid["uuid"], xid["pci"]) == (
        5,
        "GPU-b6c3b2be-c55b-d076-fa0e-d464e4c7e08b",
        "0000:91:00.0",
    )
    assert section["events"][1]["engine"] == 62 and "data" in section["events"][1]
    assert section["records"] == 5 and part["_cursor"]["kmsg_seq"] == 4
    assert "kernel" not in src.sample()  # nothing new: a quiet sample sends no section
    ring.log(XID_119)
    assert _codes(src.sample()["kernel"]) == [("xid", 119, 1)]
    # the section is valid telemetry/1 as the agent sends it
    schemas.validate({"schema": "telemetry/1", "node": "n1", "ts": 1.0, "seq": 0, "gpus": [], **part})


def test_an_event_field_past_the_contract_is_left_out_and_the_event_kept(tmp_path: Path) -> None:
    """A pid past 32 bits (the XID grammar takes 10 digits), an SXid link past 65535: one such field
    made the agent leave the whole kernel section out (the XID 79 beside it with it) and store the
    cursor past it, so the records were lost for good. The field is left out, counted as rejected."""
    ring = RingKmsg()
    ring.log("NVRM: Xid (PCI:0000:91:00): 13, pid=9999999999, name=python, Graphics Exception")
    ring.log("nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 999999 LTSSM Fault Up")
    ring.log(XID_79)
    section = _source(ring, _boot(tmp_path)).sample()["kernel"]
    schemas.validate(
        {"schema": "telemetry/1", "node": "n1", "ts": 1.0, "seq": 0, "gpus": [], "kernel": section}
    )
    assert sorted(_codes(section)) == [("sxid", 20034, 1), ("xid", 13, 1), ("xid", 79, 1)]
    by_code = {e["code"]: e for e in section["events"]}
    assert "pid" not in by_code[13] and by_code[13]["process"] == "python"
    assert "link" not in by_code[20034]
    assert section["rejected"] == 2


def test_a_record_numbered_past_what_the_spool_keeps_is_not_taken(tmp_path: Path) -> None:
    """A record numbered 2**63 or more (no kernel numbers one so: a 64-bit count from 0 at boot) made
    the agent's loop raise OverflowError storing the cursor in SQLite (an adversarial probe's find)."""
    ring = RingKmsg(first_seq=2**63)
    ring.log(XID_79)
    src = _source(ring, _boot(tmp_path))
    part = src.sample()
    assert "kernel" not in part or part["kernel"]["events"] == []
    assert part.get("_cursor", {}).get("kmsg_seq", -1) < 2**62


def test_a_restart_goes_on_from_the_cursor_without_repeating_or_losing(tmp_path: Path) -> None:
    ring, boot = RingKmsg(), _boot(tmp_path)
    ring.log(XID_79)
    first = _source(ring, boot)
    assert _codes(first.sample()["kernel"]) == [("xid", 79, 1)]
    saved = first.cursor
    first.close()
    ring.log(XID_119)  # while the agent is down
    again = _source(ring, boot, saved)
    section = again.sample()["kernel"]
    assert _codes(section) == [("xid", 119, 1)] and "missed" not in section


def test_a_ring_buffer_that_wrapped_while_the_agent_was_down_is_reported(tmp_path: Path) -> None:
    ring, boot = RingKmsg(capacity=8), _boot(tmp_path)
    ring.log(XID_79)
    first = _source(ring, boot)
    first.sample()
    saved = first.cursor
    for i in range(20):  # 20 records while down: 12 of them are gone before the agent is back
        ring.log(f"usb 1-1: new device {i}")
    section = _source(ring, boot, saved).sample()["kernel"]
    assert section["missed"] == 12 and section["records"] == 8


def test_records_overwritten_while_reading_are_counted(tmp_path: Path) -> None:
    ring, boot = RingKmsg(capacity=8), _boot(tmp_path)
    src = _source(ring, boot, max_records=4)
    for i in range(6):
        ring.log(f"line {i}")
    assert "kernel" not in src.sample()  # plain lines: nothing to say
    assert src.cursor.seq == 3  # a slice of 4 records; the rest next time
    for i in range(10):  # meanwhile the buffer turns over past the reader
        ring.log(f"more {i}")
    section = src.sample()["kernel"]
    assert section["missed"] == 4 and section.get("overruns") == 1  # seq 4-7 gone; 8-15 read


def test_a_reboot_rescans_the_new_boot(tmp_path: Path) -> None:
    ring = RingKmsg()
    ring.log(XID_79)
    first = _source(ring, _boot(tmp_path))
    first.sample()
    saved = first.cursor
    rebooted = RingKmsg()  # a new boot numbers its records from 0 again
    rebooted.log(XID_119)
    new_boot = _boot(tmp_path, "7d1e2c4a-0000-4b50-8a6a-000000000000")
    section = _source(rebooted, new_boot, saved).sample()["kernel"]
    assert _codes(section) == [("xid", 119, 1)]
    assert section["boot"].startswith("7d1e2c4a") and "missed" not in section


def test_a_first_start_says_how_much_of_this_boot_was_gone(tmp_path: Path) -> None:
    ring = RingKmsg(capacity=4)
    for i in range(10):
        ring.log(f"early {i}")
    section = _source(ring, _boot(tmp_path)).sample()["kernel"]
    assert section["gone_before_start"] == 6 and "missed" not in section


def test_a_flood_is_read_in_slices_and_repeats_are_one_event_with_a_count(tmp_path: Path) -> None:
    ring = RingKmsg(capacity=200_000)
    for _ in range(100_000):  # a driver in an error loop
        ring.log(XID_119)
    ring.log(XID_79)
    src = _source(ring, _boot(tmp_path), max_records=20_000, budget_s=60.0)
    sections = [src.sample()["kernel"] for _ in range(6)]
    assert [s["records"] for s in sections] == [20_000] * 5 + [1]
    assert all(len(s["events"]) <= 2 for s in sections)
    counts = [(e["code"], e["count"]) for s in sections for e in s["events"]]
    assert sum(c for code, c in counts if code == 119) == 100_000
    assert (79, 1) in counts


def test_a_sample_stops_reading_at_its_time_budget(tmp_path: Path) -> None:
    """However slow the machine, a sample of a flood returns within about its budget (one chunk
    of 1,000 records past it at most), and the next samples go on where it stopped."""
    ring = RingKmsg(capacity=100_000)
    for _ in range(50_000):
        ring.log(XID_119)
    src = _source(ring, _boot(tmp_path), budget_s=0.0)
    first = src.sample()["kernel"]
    assert first["records"] == 1000  # one chunk, then the clock says stop
    rest = 0
    while (n := src.sample().get("kernel", {}).get("records", 0)) > 0:
        rest += n
    assert first["records"] + rest == 50_000


def test_distinct_events_past_the_bound_are_counted_as_dropped(tmp_path: Path) -> None:
    ring = RingKmsg(capacity=1000)
    for link in range(300):
        ring.log(f"NVRM: Xid (PCI:0000:9b:00): 145, RLW_SRC_TRACK Nonfatal XC1 i0 Link {link} (0x040988e2)")
    section = _source(ring, _boot(tmp_path), max_events=256).sample()["kernel"]
    assert len(section["events"]) == 256 and section["dropped"] == 44


def test_the_gpu_index_comes_from_sysfs_in_address_order(tmp_path: Path) -> None:
    devices = {
        "0000:9b:00.0": ("0x10de", "0x030200"),  # H100: 3D controller
        "0000:1b:00.0": ("0x10de", "0x030200"),
        "0000:05:00.0": ("0x10de", "0x068000"),  # NVSwitch: a bridge, no GPU
        "0000:3b:00.0": ("0x15b3", "0x020700"),  # ConnectX: InfiniBand
        "0000:00:01.0": ("0x8086", "0x060400"),
    }
    for address, (vendor, klass) in devices.items():
        d = tmp_path / address
        d.mkdir()
        (d / "vendor").write_text(vendor + "\n")
        (d / "class").write_text(klass + "\n")
    assert nvidia_gpus(tmp_path) == {"0000:1b:00.0": 0, "0000:9b:00.0": 1}
    assert nvidia_gpus(tmp_path / "absent") == {}


@pytest.fixture
def spool(tmp_path: Path) -> Spool:
    s = Spool(tmp_path / "n1.sqlite", max_bytes=1 << 20)
    yield s
    s.close()


def test_the_agent_keeps_the_cursor_with_the_sample_and_builds_the_source_from_it(
    tmp_path: Path, spool: Spool, monkeypatch: pytest.MonkeyPatch
) -> None:
    ring, boot = RingKmsg(), _boot(tmp_path)
    ring.log(XID_79)
    monkeypatch.setattr("fleetwatch.collectors.kernel_log.source.BOOT_ID", boot)
    built: list[KernelLogSource] = []

    def make(name: str, **kw: object) -> KernelLogSource:
        src = KernelLogSource(device=ring.open, boot_id=boot, gpus=dict, **kw)  # type: ignore[arg-type]
        built.append(src)
        return src

    monkeypatch.setattr("fleetwatch.collectors.agent.make_source", make)
    forwarder = SpoolForwarder(spool, "fleet.telemetry.v1", "127.0.0.1:1")  # never pumped: nothing is sent
    agent = Agent("n1", [SourceRunner("kernel", source_factory("kernel", spool))], spool, forwarder)
    try:
        msg = agent.tick()
        assert [e["code"] for e in msg["kernel"]["events"]] == [79] and "_cursor" not in msg
        assert spool.get_meta("kmsg_boot", -1) == boot_hash(boot.read_text())
        assert spool.get_meta("kmsg_seq", -1) == 0
        ring.log(XID_119)
        agent.runners[0].close()  # the source is rebuilt (as after a failure): from the spool's cursor
        agent.runners = [SourceRunner("kernel", source_factory("kernel", spool))]
        msg = agent.tick()
        assert [e["code"] for e in msg["kernel"]["events"]] == [119]
        assert built[-1].cursor.seq == 1 and spool.get_meta("kmsg_seq", -1) == 1
    finally:
        for r in agent.runners:
            r.close()
        forwarder.close()


def _sysfs(root: Path) -> Path:
    """A /sys with the device tree of three GPUs: one alone below root port 00:02.0, two below a
    PCIe switch (03:00.0) under root port 00:03.0; /sys/bus/pci/devices links to each device."""
    tree = {
        "pci0000:00/0000:00:02.0": ("0x8086", "0x060400"),
        "pci0000:00/0000:00:02.0/0000:02:00.0": ("0x10de", "0x030200"),
        "pci0000:00/0000:00:03.0": ("0x8086", "0x060400"),
        "pci0000:00/0000:00:03.0/0000:03:00.0": ("0x1000", "0x060400"),
        "pci0000:00/0000:00:03.0/0000:03:00.0/0000:04:00.0": ("0x10de", "0x030200"),
        "pci0000:00/0000:00:03.0/0000:03:00.0/0000:05:00.0": ("0x10de", "0x030200"),
    }
    bus = root / "bus" / "pci" / "devices"
    bus.mkdir(parents=True)
    for path, (vendor, klass) in tree.items():
        d = root / "devices" / path
        d.mkdir(parents=True)
        (d / "vendor").write_text(vendor + "\n")
        (d / "class").write_text(klass + "\n")
        (bus / d.name).symlink_to(d)
    return bus


def _sysfs_source(ring: RingKmsg, tmp_path: Path, sys_pci: Path) -> KernelLogSource:
    """The kernel source over `ring`, its GPUs and HCAs from the fake sysfs at sys_pci."""
    return KernelLogSource(
        device=ring.open,
        boot_id=_boot(tmp_path),
        gpus=lambda: nvidia_gpus(sys_pci),
        below=lambda: gpus_below_ports(sys_pci),
        hcas=lambda: hcas_below_ports(sys_pci),
    )


def test_an_aer_error_of_a_port_is_the_one_gpus_below_it(tmp_path: Path) -> None:
    sys_pci = _sysfs(tmp_path / "sys")
    assert gpus_below_ports(sys_pci) == {
        "0000:00:02.0": (0,),
        "0000:00:03.0": (1, 2),
        "0000:03:00.0": (1, 2),
    }
    ring = RingKmsg()
    # pcie_aer.txt: the root port above a GPU that then fell off the bus (gpu-burn issue 1)
    for line in (
        "pcieport 0000:00:02.0: AER: Uncorrected (Fatal) error received: id=0010",
        "pcieport 0000:00:02.0: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction Layer, "
        "id=0010(Receiver ID)",
        "pcieport 0000:00:02.0:    [ 5] Surprise Down Error    (First)",
        "pcieport 0000:00:03.0: AER: Multiple Uncorrected (Fatal) error received: 0000:00:03.0",
    ):
        ring.log(line)
    events = _sysfs_source(ring, tmp_path, sys_pci).sample()["kernel"]["events"]
    assert [(e["port"], e.get("gpu")) for e in events] == [("0000:00:02.0", 0), ("0000:00:03.0", None)]
    assert events[0]["errors"] == ["Surprise Down Error"]


def test_the_agents_metrics_count_what_the_ring_buffer_lost_and_what_was_read(tmp_path: Path) -> None:
    """A wrapped ring buffer is a finding (detectors/kernel_rules.py) and a counter on the agent's
    /metrics, quiet samples included."""
    from prometheus_client import REGISTRY

    def counted(what: str) -> float:
        return REGISTRY.get_sample_value("fleetwatch_agent_kernel_records_total", {"what": what}) or 0.0

    before = {w: counted(w) for w in ("records", "missed")}
    events_before = REGISTRY.get_sample_value("fleetwatch_agent_kernel_events_total") or 0.0
    ring = RingKmsg(capacity=8)
    src = _source(ring, _boot(tmp_path))
    ring.log("usb 1-1: new device")
    src.sample()  # quiet: no section, still counted
    for i in range(20):
        ring.log(f"usb 1-1: new device {i}")
    ring.log(XID_79)
    src.sample()
    assert counted("records") - before["records"] == 1 + 8
    assert counted("missed") - before["missed"] == 13  # seq 1-13 overwritten; 14-21 read
    assert (REGISTRY.get_sample_value("fleetwatch_agent_kernel_events_total") or 0.0) - events_before == 1


def test_an_aer_error_at_or_above_an_infiniband_hca_names_the_hca(tmp_path: Path) -> None:
    """A ConnectX HCA (Mellanox 15b3, class 0207: InfiniBand) below root port 00:04.0, its RDMA device
    mlx5_0 in sysfs's `infiniband` directory: an AER error the port reports, or the HCA itself, is
    the HCA's (the issue's "attributed to the GPU or HCA below that port")."""
    sys_pci = _sysfs(tmp_path / "sys")
    hca = tmp_path / "sys" / "devices" / "pci0000:00" / "0000:00:04.0" / "0000:41:00.0"
    (hca / "infiniband" / "mlx5_0").mkdir(parents=True)
    (hca / "vendor").write_text("0x15b3\n")
    (hca / "class").write_text("0x020700\n")
    (sys_pci / hca.name).symlink_to(hca)
    assert hcas_below_ports(sys_pci) == {
        "0000:00:04.0": ("mlx5_0",),
        "0000:41:00.0": ("mlx5_0",),
    }
    ring = RingKmsg()
    for line in (  # the root port names the device the error came from, the device prints its detail
        "pcieport 0000:00:04.0: AER: Uncorrected (Non-Fatal) error received: 0000:41:00.0",
        "mlx5_core 0000:41:00.0: PCIe Bus Error: severity=Uncorrected (Non-Fatal), type=Transaction Layer, "
        "(Requester ID)",
        # an older kernel's form: the port's own error, about its link to the HCA
        "pcieport 0000:00:04.0: AER: Corrected error received: id=0020",
        "pcieport 0000:00:04.0: PCIe Bus Error: severity=Corrected, type=Physical Layer, "
        "id=0020(Receiver ID)",
    ):
        ring.log(line)
    events = _sysfs_source(ring, tmp_path, sys_pci).sample()["kernel"]["events"]
    assert [(e["kind"], e.get("hca"), e.get("gpu")) for e in events] == [("aer", "mlx5_0", None)] * 2
