"""The catalogue of fault kinds: names, categories, expected finding kind and parameters.

This is pure data, shared by scenario validation (which rejects unknown kinds and parameters)
and by the fault effects (faults.py). A kind name is a stable identifier: it is what
`truth/1.fault` carries and what scorers match findings against.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

CATEGORIES = ("sudden", "gradual", "straggler", "lemon")


@dataclass(frozen=True)
class Param:
    """One scenario parameter of a fault kind, with its default and allowed range."""

    default: Any
    type: type  # float, int, bool or str
    lo: float | None = None
    hi: float | None = None
    choices: tuple[str, ...] | None = None
    nullable: bool = False
    doc: str = ""


@dataclass(frozen=True)
class KindSpec:
    name: str
    category: str
    finding: str  # the finding/1 kind a detector is expected to raise for it
    per_gpu: bool  # the fault sits on one GPU (truth carries `gpu`)
    hardware: bool  # False for faults a node-health detector should not blame on the machine
    description: str
    params: Mapping[str, Param] = field(default_factory=dict)


def _duration(default: float | None = None) -> Param:
    return Param(
        default,
        float,
        lo=0.0,
        nullable=True,
        doc="seconds from onset until the fault ends; null = rest of run",
    )


def _ramp(default: float = 180.0) -> Param:
    return Param(default, float, lo=1.0, doc="seconds from onset to the hard failure (failure_ts)")


_FAIL = Param(True, bool, doc="end the ramp in a hard failure (False: the growth just continues)")


def _rates(start: float, end: float) -> dict[str, Param]:
    return {
        "rate_start": Param(start, float, lo=0.0, doc="errors per second at onset"),
        "rate_end": Param(end, float, lo=0.0, doc="errors per second at the end of the ramp"),
    }


def _port() -> Param:
    return Param(0, int, lo=0, doc="InfiniBand port index on the node")


def _gradual(ramp: float = 180.0, **extra: Param) -> dict[str, Param]:
    return {"ramp_s": _ramp(ramp), "fail": _FAIL, "duration_s": _duration(), **extra}


KINDS: dict[str, KindSpec] = {
    k.name: k
    for k in (
        # ------------------------------------------------------------ sudden
        KindSpec(
            "xid79",
            "sudden",
            "xid",
            True,
            True,
            "GPU fallen off the bus: XID 79 with a PCIe replay burst, then only its index is reported",
            {"duration_s": _duration(), "pcie_burst": Param(8, int, lo=0, doc="PCIe replays at onset")},
        ),
        KindSpec(
            "xid48",
            "sudden",
            "ecc",
            True,
            True,
            "double-bit ECC error: DBE counters +1 with XID 48",
            {"duration_s": _duration()},
        ),
        KindSpec(
            "xid94",
            "sudden",
            "ecc",
            True,
            True,
            "contained uncorrectable ECC error: DBE +1, XID 94, a row remap pending",
            {"duration_s": _duration()},
        ),
        KindSpec(
            "xid95",
            "sudden",
            "ecc",
            True,
            True,
            "uncontained uncorrectable ECC error: DBE +1, XID 95, a row remap pending; GPU unusable",
            {"duration_s": _duration()},
        ),
        KindSpec(
            "xid119",
            "sudden",
            "xid",
            True,
            True,
            "GPU System Processor RPC timeout: XID 119, then the GPU no longer answers NVML",
            {"duration_s": _duration()},
        ),
        KindSpec(
            "ib_link_down",
            "sudden",
            "ib_link",
            False,
            True,
            "InfiniBand port goes DOWN: state DOWN, link_downed +1, no traffic",
            {"port": _port(), "duration_s": _duration()},
        ),
        KindSpec(
            "node_down",
            "sudden",
            "host",
            False,
            True,
            "unplanned host maintenance/reboot: the node sends no telemetry for a while",
            {"duration_s": _duration(120.0)},
        ),
        KindSpec(
            "sw_crash",
            "sudden",
            "xid",
            True,
            False,
            "application crash (XID 13, graphics engine exception): the job fails, the hardware is fine",
            {},
        ),
        # the kernel log's own (collectors/sim/kernel_log.py): what NVML does not say
        KindSpec(
            "nvswitch_fatal",
            "sudden",
            "nvswitch",
            False,
            True,
            "a fatal NVSwitch error (SXid 20034, LTSSM fault on a link) in the kernel log: the fabric's "
            "links go down and the job fails; NVML says nothing",
            {"duration_s": _duration()},
        ),
        KindSpec(
            "pcie_aer_fatal",
            "sudden",
            "pcie",
            True,
            True,
            "an uncorrectable (fatal) PCIe error reported by AER on the switch port above the GPU, in "
            "the kernel log: the job fails",
            {"duration_s": _duration()},
        ),
        KindSpec(
            "fallen_off_bus",
            "sudden",
            "pcie",
            True,
            True,
            "the driver's probe-time 'fallen off the bus' message (no XID number) in the kernel log; "
            "from the next sample NVML reports only the GPU's index",
            {"duration_s": _duration()},
        ),
        KindSpec(
            "nvlink5_fatal",
            "sudden",
            "xid",
            True,
            True,
            "an NVLink5 XID 149 whose kernel-log line says Fatal (NVML's event has the code only, which "
            "alone is a warning): the link is down and the job fails",
            {"duration_s": _duration()},
        ),
        KindSpec(
            "kmsg_overrun",
            "sudden",
            "kernel_log",
            False,
            False,
            "a flood of kernel messages overwrote the ring buffer before the agent read them: records "
            "lost (the hardware is fine; what they said is unknown)",
            {"records": Param(5000, int, lo=1, doc="records lost")},
        ),
        # the node checks (detectors/node_checks.py)
        KindSpec(
            "mount_hung",
            "sudden",
            "mount",
            False,
            False,
            "the Lustre server stops answering: the required mount /lustre hangs (the agent's probe "
            "misses its deadline), processes pile up in D state, the job hangs on its I/O",
            {"duration_s": _duration()},
        ),
        KindSpec(
            "blockdev_readonly",
            "sudden",
            "block_device",
            False,
            True,
            "the local NVMe drive is switched read-only by the kernel after I/O errors",
            {"duration_s": _duration()},
        ),
        KindSpec(
            "pcie_downtrain",
            "sudden",
            "pcie_link",
            True,
            True,
            "a GPU's PCIe link retrains at x8 instead of x16 (a bad riser or connector): it stays up, "
            "slower; the GPU computes a little slower",
            {"duration_s": _duration(), "width": Param(8, int, lo=1, hi=15, doc="the link's width")},
        ),
        KindSpec(
            "hca_missing",
            "sudden",
            "device_count",
            False,
            True,
            "an InfiniBand HCA drops off the node's device list (its ports vanish): the job fails",
            {"duration_s": _duration()},
        ),
        KindSpec(
            "d_state_stuck",
            "sudden",
            "hung_tasks",
            False,
            True,
            "a wedged driver leaves processes stuck in uninterruptible sleep (D state)",
            {"duration_s": _duration(), "procs": Param(20, int, lo=1, doc="processes stuck")},
        ),
        KindSpec(
            "ib_link_flapping",
            "sudden",
            "ib_link",
            False,
            True,
            "an InfiniBand port's link keeps retraining (LinkErrorRecoveryCounter climbs: a marginal "
            "cable or transceiver) while it stays ACTIVE",
            {
                "port": _port(),
                "duration_s": _duration(),
                "interval_s": Param(8.0, float, lo=1.0, doc="mean seconds between retrains"),
            },
        ),
        KindSpec(
            "eth_flapping",
            "sudden",
            "eth_link",
            False,
            True,
            "the node's Ethernet link goes down and up again and again (carrier_changes climbs: a "
            "bad cable or switch port)",
            {
                "duration_s": _duration(),
                "interval_s": Param(15.0, float, lo=1.0, doc="mean seconds between flaps (a down and an up)"),
            },
        ),
        # ------------------------------------------------------------ gradual
        KindSpec(
            "disk_full",
            "gradual",
            "disk",
            False,
            False,
            "a job's output fills the root filesystem: used space climbs to 99.5% at failure_ts",
            _gradual(),
        ),
        KindSpec(
            "ecc_sbe_rising",
            "gradual",
            "ecc",
            True,
            True,
            "single-bit ECC error rate grows, then a DBE with XID 48 at failure_ts",
            _gradual(**_rates(0.5, 20.0)),
        ),
        KindSpec(
            "row_remap_pending",
            "gradual",
            "row_remap",
            True,
            True,
            "pending row remaps accumulate (XID 63 each), then a remap failure (XID 64) at failure_ts",
            _gradual(remaps=Param(6, int, lo=1, hi=1000, doc="pending remaps before the failure")),
        ),
        KindSpec(
            "nvlink_crc",
            "gradual",
            "nvlink",
            True,
            True,
            "NVLink CRC errors grow (replays follow), then XID 74 at failure_ts",
            _gradual(**_rates(2.0, 200.0)),
        ),
        KindSpec(
            "pcie_replay",
            "gradual",
            "pcie",
            True,
            True,
            "PCIe replay counter grows, then the GPU falls off the bus (XID 79) at failure_ts",
            _gradual(**_rates(0.5, 50.0)),
        ),
        KindSpec(
            "thermal",
            "gradual",
            "thermal",
            True,
            True,
            "temperature climbs, thermal throttle bits set, SM clock drops; thermal shutdown at failure_ts",
            _gradual(peak_c=Param(95.0, float, lo=80.0, hi=120.0, doc="temperature reached at failure_ts")),
        ),
        KindSpec(
            "ib_symbol_errors",
            "gradual",
            "ib_link",
            False,
            True,
            "InfiniBand symbol errors grow on one port, then the port goes DOWN at failure_ts",
            _gradual(port=_port(), **_rates(1.0, 100.0)),
        ),
        # ------------------------------------------------------------ straggler
        KindSpec(
            "straggler",
            "straggler",
            "straggler",
            False,
            True,
            "the node computes each step `slowdown` slower; its job's peers wait for it",
            {
                "slowdown": Param(0.15, float, lo=0.01, hi=2.0, doc="fractional step-time increase"),
                "cause": Param(
                    "none",
                    str,
                    choices=("none", "thermal", "power"),
                    doc="none: no telemetry cause; thermal/power: one GPU clocks lower and says why",
                ),
                "duration_s": _duration(),
            },
        ),
        # ------------------------------------------------------------ lemon
        KindSpec(
            "lemon",
            "lemon",
            "lemon",
            False,
            True,
            "a node with a repeatedly elevated failure rate: short incidents (XIDs) that fail its jobs",
            {
                "incident_interval_s": Param(60.0, float, lo=1.0, doc="mean seconds between incidents"),
                "min_gap_s": Param(
                    0.0, float, lo=0.0, doc="seconds at least between incidents (spread out, as over a week)"
                ),
                "duration_s": _duration(),
            },
        ),
    )
}


def kind(name: str) -> KindSpec:
    try:
        return KINDS[name]
    except KeyError:
        raise ValueError(f"unknown fault kind {name!r} (known: {', '.join(KINDS)})") from None
