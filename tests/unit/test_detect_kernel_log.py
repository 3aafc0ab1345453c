"""The kernel log's events judged by the hardware detector, on the path a real node's take: real
driver lines (tests/fixtures/kernel_log) logged into a ring buffer that answers as /dev/kmsg does
(tests/helpers/fake_kmsg.py), read by the agent's own kernel source, sent in telemetry/1 messages
as bytes, decoded by the worker's decoder (pipeline/telemetry_decode.py) and observed after the
node task's admission.

- An XID that NVML and the kernel log both report is one XID, whichever came first; the kernel
  log alone (an agent restart, a GPU whose NVML hangs) still counts.
- XID 154's recovery action and an NVLink5 XID's Fatal decide the burst's action.
- "Fallen off the bus" is the lost-GPU incident NVML's lost GPU opens: one finding.
- NVSwitch SXids, PCIe AER errors, unknown kinds and a wrapped ring buffer each get theirs.
- Hostile sections (huge counts, wrong types) neither crash nor fool it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from fleetwatch import schemas
from fleetwatch.alerts.policy import drain_reason
from fleetwatch.collectors.kernel_log.source import KernelLogSource
from fleetwatch.detectors.batch import TelemetryBatch
from fleetwatch.detectors.hardware import HardwareDetector
from fleetwatch.pipeline.telemetry_decode import decode_telemetry
from tests.helpers.admission import observe, restored_index
from tests.helpers.batches import gpu_entry, telemetry
from tests.helpers.fake_kmsg import RingKmsg

NODE = "gpu-node-07"
T0 = 1_760_000_000.0
# the GPUs the node's sysfs would list (NVIDIA GPUs in PCI order), for the lines' addresses
GPUS = {"0000:02:00.0": 0, "0000:44:00.0": 1, "0000:91:00.0": 5, "0000:9b:00.0": 3, "0009:01:00.0": 2}
XID_79 = "NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
XID_119 = "NVRM: Xid (PCI:0000:9b:00): 119, pid=2024380, name=nvidia-smi, Timeout after 6s of waiting for RPC"
XID_13 = (
    "NVRM: Xid (PCI:0000:9b:00): 13, Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Out Of Range Address"
)
XID_154 = (
    "NVRM: Xid (PCI:0009:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)"
)
XID_149_FATAL = (
    "NVRM: Xid (PCI:0009:01:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 01 "
    "(0x021425c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)"
)
SXID_FATAL = [  # one event in three lines (nvswitch_sxid.txt)
    "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 62 LTSSM Fault Up",
    "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Severity 1 Engine instance 62 Sub-engine instance 00",
    "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Data {0x10000000, 0x10000000, 0x00000000}",
]
SXID_NONFATAL = (
    "nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Non-fatal, Link 44 Minion Link DLREQ interrupt"
)
FALLEN_MULTILINE = [  # fallen_off_bus.txt (b)
    "NVRM: The NVIDIA GPU 0000:44:00.0",
    "NVRM: (PCI ID: 10de:20b2) installed in this system has",
    "NVRM: fallen off the bus and is not responding to commands.",
]
AER_FATAL = [  # pcie_aer.txt: the port's report, then the device below it
    "pcieport 0000:00:02.0: AER: Uncorrected (Fatal) error received: id=0010",
    "pcieport 0000:00:02.0: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction Layer, "
    "(Receiver ID)",
]


class Node:
    """One node's agent: its kernel source over a ring buffer, and the XIDs NVML reports."""

    def __init__(self, tmp_path: Path, capacity: int = 4096) -> None:
        boot = tmp_path / "boot_id"
        boot.write_text("0cec5dfe-715f-4b50-8a6a-7591dd3ffb2e\n")
        self.ring = RingKmsg(capacity=capacity)
        self.source = KernelLogSource(
            device=self.ring.open, boot_id=boot, gpus=lambda: GPUS, below=lambda: {"0000:00:02.0": (0,)}
        )
        self.seq = 0

    def sample(
        self, ts: float, lines: list[str] = (), nvml_xids: dict[int, list[int]] | None = None, **over: Any
    ) -> bytes:
        for line in lines:
            self.ring.log(line)
        part = self.source.sample()
        part.pop("_cursor", None)
        gpus = [gpu_entry(i, xids=(nvml_xids or {}).get(i, [])) for i in range(8)]
        m = telemetry(NODE, ts, gpus, seq=self.seq)
        self.seq += 1
        m.update(part, **over)
        return orjson.dumps(schemas.validate(m, schemas.TELEMETRY))


def detect(samples: list[bytes], det: HardwareDetector | None = None) -> list[dict[str, Any]]:
    """The findings of these samples, decoded as the worker decodes them, one batch each."""
    det = det or HardwareDetector()
    out: list[dict[str, Any]] = []
    for raw in samples:
        batch, bad = decode_telemetry([raw], now=T0 + 10_000, clock=None)
        assert bad == []
        out += observe(det, det.index, batch)
    for f in out:
        schemas.validate(f, schemas.FINDING)
    return out


def latest(findings: list[dict[str, Any]], kind: str, rule: str) -> dict[str, Any]:
    mine = [f for f in findings if f["kind"] == kind and f["evidence"]["rule"] == rule and not f["resolved"]]
    assert mine, [(f["kind"], f["evidence"]["rule"]) for f in findings]
    return mine[-1]


def burst_state(det: HardwareDetector, gpu: int | None) -> dict[str, Any]:
    inc = det.book.get((NODE, gpu, None, "xid", "xid_burst"))
    assert inc is not None
    return inc.evidence


# ---------------------------------------------------------------- XIDs: one, whichever first


def test_an_xid_both_sources_report_in_one_sample_is_one_xid(tmp_path: Path) -> None:
    node, det = Node(tmp_path), HardwareDetector()
    findings = detect([node.sample(T0, [XID_119], nvml_xids={3: [119]})], det)
    xid = latest(findings, "xid", "xid_burst")
    assert xid["gpu"] == 3 and xid["evidence"]["total"] == 1 and xid["evidence"]["xids"] == {"119": 1}
    assert xid["evidence"]["first_seen_by"] == {"nvml": 1}
    assert len([f for f in findings if f["kind"] == "xid"]) == 1


def test_the_kernel_log_first_then_nvml_a_sample_later_is_still_one_xid(tmp_path: Path) -> None:
    node, det = Node(tmp_path), HardwareDetector()
    detect([node.sample(T0, [XID_119]), node.sample(T0 + 1, nvml_xids={3: [119]})], det)
    ev = burst_state(det, 3)
    assert ev["total"] == 1 and ev["first_seen_by"] == {"kernel": 1}


def test_repeats_pair_one_to_one_and_what_only_one_source_saw_counts(tmp_path: Path) -> None:
    """Three XID 13s in the log (one line, repeated: one event with count 3), two of them seen by
    NVML in the same sample: 3 XIDs. NVML's third sighting a sample later is the log's third XID
    (within the window, the same code); past the window, one the log alone has is a fourth."""
    node, det = Node(tmp_path), HardwareDetector()
    detect(
        [
            node.sample(T0, [XID_13] * 3, nvml_xids={3: [13, 13]}),
            node.sample(T0 + 1, nvml_xids={3: [13]}),
            node.sample(T0 + 60, [XID_13]),
        ],
        det,
    )
    ev = burst_state(det, 3)
    assert ev["total"] == 4 and ev["first_seen_by"] == {"nvml": 2, "kernel": 2}


def test_xids_logged_while_the_agent_was_down_are_counted_from_the_log_alone(tmp_path: Path) -> None:
    node, det = Node(tmp_path), HardwareDetector()
    for _ in range(25):  # a burst the driver logged with no NVML listening
        node.ring.log(XID_79)
    findings = detect([node.sample(T0)], det)
    xid = latest(findings, "xid", "xid_burst")
    assert xid["gpu"] == 5 and xid["evidence"]["total"] == 25 and xid["severity"] == "critical"
    assert drain_reason(xid) == "XID 79"


# ---------------------------------------------------------------- what the line says beyond the code


def test_xid_154s_recovery_action_decides_even_after_nvml_counted_the_bare_code(tmp_path: Path) -> None:
    node, det = Node(tmp_path), HardwareDetector()
    findings = detect([node.sample(T0, nvml_xids={2: [154]}), node.sample(T0 + 1, [XID_154])], det)
    xid = latest(findings, "xid", "xid_burst")
    assert xid["evidence"]["xids"] == {"154:ra4": 1} and xid["evidence"]["total"] == 1
    assert xid["severity"] == "critical" and xid["evidence"]["action"] == "drain_node"
    assert drain_reason(xid) == "XID 154"


def test_an_nvlink5_xid_whose_line_says_fatal_drains_and_its_code_alone_does_not(tmp_path: Path) -> None:
    node = Node(tmp_path)
    fatal = latest(detect([node.sample(T0, [XID_149_FATAL])]), "xid", "xid_burst")
    assert fatal["evidence"]["xids"] == {"149:fatal": 1} and drain_reason(fatal) == "XID 149"
    bare = latest(detect([Node(tmp_path).sample(T0, nvml_xids={2: [149]})]), "xid", "xid_burst")
    assert bare["severity"] == "warning" and drain_reason(bare) is None


# ---------------------------------------------------------------- other events


def test_fallen_off_the_bus_and_nvmls_lost_gpu_are_one_finding(tmp_path: Path) -> None:
    node, det = Node(tmp_path), HardwareDetector()
    first = node.sample(T0, FALLEN_MULTILINE)
    lost = telemetry(NODE, T0 + 1, [gpu_entry(i) for i in range(8) if i != 1], seq=99)
    findings = detect([first, orjson.dumps(lost)], det)
    gone = [f for f in findings if f["evidence"]["rule"] == "gpu_lost" and not f["resolved"]]
    assert len(gone) == 1 and gone[0]["gpu"] == 1 and gone[0]["severity"] == "critical"
    assert "kernel log" in gone[0]["evidence"]["state"] and drain_reason(gone[0]) == "GPU lost"


def test_a_fatal_sxid_drains_the_node_and_a_non_fatal_one_only_warns(tmp_path: Path) -> None:
    node = Node(tmp_path)
    findings = detect([node.sample(T0, SXID_FATAL), node.sample(T0 + 1, [SXID_NONFATAL])])
    sx = [f for f in findings if f["kind"] == "nvswitch"]
    assert len(sx) == 1 and "gpu" not in sx[0]  # the node's: a switch is no GPU
    f = sx[0]
    assert (
        f["severity"] == "critical"
        and f["evidence"]["code"] == 20034
        and f["evidence"]["pci"] == "0000:05:00.0"
    )
    assert drain_reason(f) == "NVSwitch SXid 20034"
    warn = latest(detect([Node(tmp_path).sample(T0, [SXID_NONFATAL])]), "nvswitch", "sxid")
    assert warn["severity"] == "warning" and drain_reason(warn) is None


def test_a_fatal_aer_error_is_the_gpus_below_the_port_and_critical(tmp_path: Path) -> None:
    findings = detect([Node(tmp_path).sample(T0, AER_FATAL)])
    aer = latest(findings, "pcie", "aer")
    assert aer["gpu"] == 0 and aer["severity"] == "critical" and drain_reason(aer) == "PCIe errors"


def test_an_event_of_an_unknown_kind_is_a_warning_never_a_drain(tmp_path: Path) -> None:
    newer = {"events": [{"kind": "c2c_link", "code": 7, "text": "a newer agent's event"}], "boot": "b"}
    raw = Node(tmp_path).sample(T0, kernel=newer)
    f = latest(detect([raw]), "kernel_log", "unknown_event")
    assert (
        f["severity"] == "warning" and f["evidence"]["event_kind"] == "c2c_link" and drain_reason(f) is None
    )


def test_records_the_ring_overwrote_past_the_cursor_are_a_warning(tmp_path: Path) -> None:
    node, det = Node(tmp_path, capacity=8), HardwareDetector()
    quiet = node.sample(T0, ["usb 1-1: new device"])  # the agent's cursor is in this boot now
    for i in range(20):  # the agent is behind: the ring turns over past its cursor
        node.ring.log(f"usb 1-1: new device {i}")
    findings = detect([quiet, node.sample(T0 + 1)], det)
    f = latest(findings, "kernel_log", "records_missed")
    assert f["evidence"]["missed"] == 12 and f["severity"] == "warning" and drain_reason(f) is None


def test_records_gone_before_a_first_start_are_no_finding(tmp_path: Path) -> None:
    node = Node(tmp_path, capacity=8)
    for i in range(20):  # a node up for weeks when the agent is first installed
        node.ring.log(f"usb 1-1: new device {i}")
    raw = node.sample(T0)
    assert orjson.loads(raw)["kernel"]["gone_before_start"] == 12
    assert detect([raw]) == []


# ---------------------------------------------------------------- state and hostile input


def test_pairing_survives_a_snapshot_between_the_two_sightings(tmp_path: Path) -> None:
    node, det = Node(tmp_path), HardwareDetector()
    detect([node.sample(T0, [XID_119])], det)
    again = HardwareDetector.from_bytes(det.to_bytes())
    again.index = restored_index(det.index)
    detect([node.sample(T0 + 1, nvml_xids={3: [119]})], again)
    assert burst_state(again, 3)["total"] == 1


def test_the_kernel_section_reaches_the_batch_the_same_by_both_decoders(tmp_path: Path) -> None:
    node = Node(tmp_path)
    raw = [node.sample(T0, [XID_119, *SXID_FATAL]), node.sample(T0 + 1), node.sample(T0 + 2, [XID_79])]
    batch, _bad = decode_telemetry(raw, now=T0 + 10_000, clock=None)
    dicts = TelemetryBatch.from_messages([orjson.loads(r) for r in raw])
    assert batch.kernel_msg.tolist() == dicts.kernel_msg.tolist() == [0, 2]
    assert batch.kernel == dicts.kernel
    assert batch.take(batch.kernel_msg[::-1].copy()).kernel == dicts.kernel[::-1]


def test_hostile_sections_neither_crash_nor_count_past_bounds(tmp_path: Path) -> None:
    hostile = {
        "boot": "b",
        "missed": 2**64 - 1,
        "events": [
            {"kind": "xid", "code": 79, "gpu": 5, "count": 2**64 - 1},
            {"kind": "xid", "code": 2**32 - 1, "gpu": 63},
            {"kind": "xid", "code": 13, "recovery_action": 2**32 - 1},
            {"kind": "aer", "severity": "fatal"},
            {"kind": "sxid"},
            {"kind": "fallen_off_bus", "gpu": 63},
            {"kind": "x" * 64},
        ],
    }
    findings = detect([Node(tmp_path).sample(T0, kernel=hostile)])
    kinds = {(f["kind"], f["evidence"]["rule"]) for f in findings}
    assert ("xid", "xid_burst") in kinds and ("kernel_log", "records_missed") in kinds
    xid79 = [f for f in findings if f["kind"] == "xid" and f.get("gpu") == 5][-1]
    assert xid79["evidence"]["total"] == 2**32
    unknown = [f for f in findings if f["evidence"]["rule"] == "unknown_event"][-1]
    assert len(unknown["evidence"]["event_kind"]) == 32


# ---------------------------------------------------------------- NVML's recovery action


def test_nvmls_recovery_action_is_a_finding_whose_action_the_driver_decides() -> None:
    det = HardwareDetector()
    gpus = [gpu_entry(i, recovery_action=4 if i == 6 else 0) for i in range(8)]
    findings = detect([orjson.dumps(telemetry(NODE, T0, gpus, seq=1))], det)
    f = latest(findings, "xid", "recovery_action")
    assert f["gpu"] == 6 and f["severity"] == "critical" and f["evidence"]["action"] == "drain_node"
    assert drain_reason(f) == "GPU recovery action: drain and reset"
    reset = [gpu_entry(i, recovery_action=1 if i == 2 else 0) for i in range(8)]
    f = latest(detect([orjson.dumps(telemetry(NODE, T0, reset, seq=1))]), "xid", "recovery_action")
    assert f["evidence"]["action"] == "reset_gpu" and drain_reason(f) == "GPU recovery action: GPU reset"
    assert drain_reason(f, gpu_reset_automated=True) is None
    # a value this release does not name (a newer driver): a warning to look at, never a drain
    newer = [gpu_entry(i, recovery_action=9 if i == 0 else 0) for i in range(8)]
    f = latest(detect([orjson.dumps(telemetry(NODE, T0, newer, seq=1))]), "xid", "recovery_action")
    assert f["severity"] == "warning" and drain_reason(f) is None


def test_nvidias_workflow_for_xid_48_and_the_recovery_action_decide_the_bursts_action() -> None:
    """XID 48 alone asks for a GPU reset; with 63 (a row remap recorded) for a drain and reset. Where
    NVML's recovery action says what the driver wants, it decides whatever the codes say."""
    solo = latest(
        detect([orjson.dumps(telemetry(NODE, T0, [gpu_entry(1, xids=[48])], seq=1))]), "xid", "xid_burst"
    )
    assert solo["evidence"]["action"] == "reset_gpu" and drain_reason(solo, gpu_reset_automated=True) is None
    pair = [
        orjson.dumps(telemetry(NODE, T0 + k, [gpu_entry(1, xids=[c])], seq=k)) for k, c in ((1, 48), (2, 63))
    ]
    both = latest(detect(pair), "xid", "xid_burst")
    assert (
        both["evidence"]["action"] == "drain_node"
        and drain_reason(both, gpu_reset_automated=True) == "XID 48"
    )
    # XID 13 is the application's, but the driver asks for a drain and reset: the driver decides
    said = [gpu_entry(1, xids=[13], recovery_action=4)]
    f = latest(detect([orjson.dumps(telemetry(NODE, T0, said, seq=1))]), "xid", "xid_burst")
    assert (f["severity"], f["evidence"]["action"], f["evidence"]["recovery_action"]) == (
        "critical",
        "drain_node",
        4,
    )
    assert drain_reason(f) == "XID 13"


def test_the_kernels_own_word_on_disks_hung_tasks_and_nfs_servers_is_a_warning_of_their_kind(
    tmp_path: Path,
) -> None:
    """other_io_errors.txt's lines: a disk's I/O errors (block_device/io_errors), the hung-task
    watchdog (hung_tasks/hung_task_report), an NFS server not answering (mount/nfs_not_responding);
    warnings naming what failed, never a drain (the agent's probes judge the mounts themselves)."""
    lines = [
        "blk_update_request: I/O error, dev sda, sector 6192120 op 0x1:(WRITE) flags 0x100000 phys_seg 3 "
        "prio class 0",
        "Buffer I/O error on dev sda1, logical block 244, lost async page write",
        "INFO: task objcopy:24916 blocked for more than 120 seconds.",
        "nfs: server 10.0.0.2 not responding, timed out",
    ]
    findings = detect([Node(tmp_path).sample(T0, lines)])
    got = {(f["kind"], f["evidence"]["rule"]): f for f in findings}
    io = got["block_device", "io_errors"]
    assert io["severity"] == "warning" and io["evidence"]["device"] in ("sda", "sda1")
    assert len([f for f in findings if f["kind"] == "block_device"]) == 1  # one incident of the node
    assert got["hung_tasks", "hung_task_report"]["evidence"]["process"] == "objcopy"
    assert got["mount", "nfs_not_responding"]["evidence"]["server"] == "10.0.0.2"
    assert all(drain_reason(f) is None for f in findings)
