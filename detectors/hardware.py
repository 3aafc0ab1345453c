"""Hardware rule detectors over telemetry/1 batches: XID, ECC, row remap, NVLink, PCIe, thermal,
lost GPU, InfiniBand link and Ethernet link rules.

Everything up to "which elements are bad" is vectorised over the batch (see counters.py); only the
bad elements, rare in a healthy fleet, reach Python code that builds findings. Time is the
messages' `ts` (event time), never the wall clock, so replaying the same telemetry gives the same
findings with the same ids, in any batch sizes (tests check this).

Thresholds (HardwareConfig) and why:
- XID: events, not a last-value gauge. A burst on one GPU ended by `xid_quiet_s` = 180 s of silence
  is one incident (docs/contract.md 7.1: dcgm-exporter's gauge never resets). Severity from xid_catalog; a
  burst of >= `xid_burst_escalate` = 20 events is escalated one level, except application-caused
  XIDs, capped at warning (a crash loop of a bad job is still the job's fault). The severity, the
  worst code (the most severe, then the one whose action takes most: an RMA over a GPU reset) and
  the codes act drains on are read from every code of the burst, each as NVIDIA's multi-event
  workflows judge it among the others (xid_catalog.in_workflow: 48 with 63/64 drains, alone
  resets; 45 alone warns), and NVML's recovery action, where the GPU reports one, overrides them
  (the driver's own verdict): the incident counts each
  catalogued code by itself (the catalogue is bounded, so the counts are). The evidence lists at
  most MAX_LISTED codes, worst first, so every critical one is named (xids_unlisted counts the
  rest). A critical code that joins a burst already critical sends the finding again.
- ECC DBE: any volatile double-bit count > 0 or any increase of the volatile/aggregate count is
  critical. The volatile count only clears on a GPU reset/driver reload, which is what repairs the
  GPU, so the incident stays open until then.
- SBE: more than `sbe_per_hour` = 10 correctable errors in a decaying one-hour window is a warning.
  DCGM's health watch uses the same figure (DCGM_LIMIT_MAX_SBE_RATE = 10); healthy HBM shows
  essentially no correctable errors, so one stray bit-flip (a particle strike) stays silent while a
  weak row that fires repeatedly, the usual prelude to a row remap or a DBE, is caught.
- Retired pages: any new retirement is a warning; >= 15 retired is a warning that persists and >= 63
  is critical (DCGM's retired-pages soft limit and limit, DCGM_LIMIT_MAX_RETIRED_PAGES[_SOFT_LIMIT]).
- Row remap: a pending remap (needs a GPU reset to take effect) is a warning; a remap failure (no
  spare rows: the memory error cannot be fenced off) is critical.
- NVLink: CRC flit errors above 100/s (DCGM_LIMIT_MAX_NVLINK_CRC_ERROR; "CRC errors only matter at
  rates of 100+ per second") and replay errors above 1/min (DCGM_LIMIT_MAX_NVLINK_ERROR = 1) over a
  decaying 60 s window are warnings.
- PCIe: replays above 8/min (DCGM_LIMIT_MAX_PCIREPLAY_RATE: "8 replays per minute is the maximum
  recommended by RM") over a decaying 60 s window is a warning.
- Rate rules (SBE excepted) become critical when the windowed count exceeds `critical_factor` = 10x
  the threshold, or the incident has stayed open for `sustained_s` = 600 s.
- Thermal: HW slowdown (0x8), SW thermal (0x20) or HW thermal (0x40) throttle bits
  (nvmlClocksThrottleReason*, pynvml) for `thermal_samples` = 5 consecutive samples is a warning;
  HW power brake (0x80) likewise (HW slowdown that comes with the brake counts as the brake).
  Consecutive, so a one-sample blip at a load step stays silent.
- Lost GPU: an entry with `lost: true` or with no metric at all, or a GPU index the node used to
  report that is now absent while its other GPUs report, is critical (kind pcie: a GPU off the bus).
- InfiniBand: a port not ACTIVE or an increase of link_downed is critical; symbol errors > 10/h,
  receive errors > 10/h and transmit discards > 100/h are warnings (the default thresholds of
  infiniband-diags' ibcheckerrs); an error counter stuck at its saturation maximum (16-bit fields
  saturate per the IB spec) is a warning, since its rate can no longer be measured.
- InfiniBand, the PortCounters' other error counters (collectors/net.py reads them from sysfs), per
  hour over the same decaying `ib_window_s`: link_error_recovery (LinkErrorRecoveryCounter: the
  link retrained itself and came back; a link that keeps doing so is flapping, rule
  ib_link_flapping) above `ib_link_recovery_per_hour` = 10; local_link_integrity_errors (times
  the port's physical errors passed its PortInfo LocalPhyErrors threshold) above
  `ib_link_integrity_per_hour` = 10; excessive_buffer_overrun_errors (times receive-buffer
  overruns in a row passed the OverrunErrors threshold: a broken flow-control contract) above
  `ib_buffer_overrun_per_hour` = 10; rcv_remote_physical_errors (packets that arrived marked bad
  by another link of their path) above `ib_rcv_remote_physical_per_hour` = 100. These are
  ibcheckerrs' defaults (LinkRecovers=10, LinkIntegrityErrors=10, ExcBufOverrunErrors=10,
  RcvRemotePhysErrors=100; linux-rdma/rdma-core scripts/ibcheckerrs.in @3eb3622b), which it
  compares with a counter's count since it was last cleared; read per hour here, as the rules
  above. NVIDIA's NVSentinel is stricter (an increase of either threshold counter is fatal,
  link_error_recovery above 5/min degrades; NVIDIA/NVSentinel docs/configuration/
  nic-health-monitor.md @07b82dc2): a site that wants that sets a figure below 1. Warnings,
  critical at `critical_factor` x the threshold. Widths (IBA PortCounters; Linux
  drivers/infiniband/core/sysfs.c PORT_PMA_ATTR): link_error_recovery 8 bits, the two threshold
  counters 4 bits (15 means "15 or more"), rcv_remote_physical_errors 16 bits; they saturate and
  join ib_counter_saturated. Their state is kept apart (ib_ext_counters, ib_ext_decay), so a
  snapshot of the release before them restores (they start from the next sample).
- InfiniBand xmit_wait (PortXmitWait: ticks a port had data to send and no credits to send it) is
  congestion, not a fault of the port: it rises with any busy fabric or slow receiver on a
  healthy link, so no rule judges it (nor is it tracked).
- Ethernet (kind eth_link: warnings, never a drain), per interface of net.eth[] (every interface
  of /proc/net/dev but lo; collectors/net.py): rx_errors (bad packets received: CRC, length,
  frame) above `eth_rx_errors_per_hour` = 100 and tx_errors (transmit problems: aborted,
  carrier, FIFO) above `eth_tx_errors_per_hour` = 100 over a decaying `eth_window_s` = 3600 s
  (Linux include/uapi/linux/if_link.h, struct rtnl_link_stats64). No tool we found sets a count:
  node_exporter's mixin alerts on errors above 1% of packets for an hour (NodeNetworkReceiveErrs,
  prometheus/node_exporter docs/node-mixin/alerts/alerts.libsonnet @0336d132; telemetry/1 has
  no packet counts), NVSentinel lists rx_errors and tx_errors but enables neither by default,
  and NHC only checks that a named interface exists (check_hw_eth, mej/nhc scripts/lbnl_hw.nhc
  @02ffddcc). 100/h is ibcheckerrs' figure for the counters that gather errors of more than one
  cause (RcvRemotePhysErrors, XmtDiscards): a healthy wired link counts none, a failing cable or
  optic under traffic counts thousands an hour, and a neighbour's stray oversized frames (length
  errors) stay under it.
- Ethernet flapping: carrier_changes (the carrier's ups and downs, so one bounce counts 2; where
  absent, carrier_up_count + carrier_down_count, which the kernel sums into it: Linux
  net/core/net-sysfs.c carrier_changes_show) above `eth_carrier_changes` = 2.5 in a decaying
  `eth_flap_window_s` = 120 s is a warning (rule eth_carrier_flapping): more than 2 changes in 2
  minutes, as kube-prometheus' NodeNetworkInterfaceFlapping (changes(node_network_up[2m]) > 2;
  prometheus-operator/kube-prometheus jsonnet/kube-prometheus/components/mixin/alerts/
  node.libsonnet @1bf43811) and NVSentinel's carrier_changes (delta > 2). The half change is for
  the decaying count, whose older changes never fade to exactly 0: against 2, two bounces an hour
  apart would pass it. One bounce (a switch reboot) stays silent; a second within ~2.8 minutes
  (2 e^(-t/120) + 2 > 2.5), or a third change within ~35 s of a bounce, is flapping. A sample's
  changes count whole (not spread over the time since the last sample): a burst seen through a
  long sampling interval is still a burst.
- Ethernet link down: an interface whose operstate is down, lowerlayerdown, dormant, notpresent
  or testing while it was "up" in an earlier sample is a warning (rule eth_link_down) until it is
  up again. "unknown" is not judged (drivers that keep no operstate report it while working), nor
  is an interface never seen up (an unused port, an empty bridge). Ethernet state is kept apart
  (eth_rows, eth_counters, eth_decay, eth_was_up), so older snapshots restore.
- Counter reset: a cumulative counter that goes down (driver reload, GPU reset, reboot, cleared IB
  counters, or a garbled read) is re-baselined (counters.py) and reported as an info finding, rule
  counter_reset, per GPU and counter family or per node for IB ports: a reset is maintenance to
  know about, never a page or a drain (it used to count the new value as new errors, so 3 -> 2
  uncorrectable errors read as 2 new ones); per node for Ethernet interfaces too (kind eth_link).
- IB rules are judged per port and reported per node and rule (the ports in the evidence, at most
  MAX_LISTED, with their total): a node has a handful of ports, but one sample may list 256, and
  one finding per port would let one sample flood the pipeline (and a drain request's id list).
  Ethernet rules likewise, with the interfaces in the evidence.
- Every incident resolves after `clear_after_s` = 300 s without a bad sample (XID bursts after
  `xid_quiet_s`), with one more finding carrying resolved=true.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from fleetwatch.config import knob
from fleetwatch.detectors import kernel_events, kernel_rules, xid_catalog
from fleetwatch.detectors.batch import ETH_COL, GPU_COL, IB_COL, TelemetryBatch
from fleetwatch.detectors.counters import (
    CounterTracker,
    DecayingCount,
    RunLength,
    Segments,
    decode_array,
    encode_array,
    positions_in,
)
from fleetwatch.detectors.findings import (
    SEVERITIES,
    SEVERITY_RANK,
    Forgotten,
    IncidentBook,
    SampleTimes,
    severity_score,
)
from fleetwatch.detectors.node_index import NodeIndex
from fleetwatch.detectors.port_map import PortMap
from fleetwatch.detectors.protocol import NodeContext
from fleetwatch.detectors.rows import Compaction, first_appearances, grow
from fleetwatch.schemas import GPU_COUNTERS

STATE_VERSION = 1

# nvmlClocksThrottleReason* bits (pynvml): HwSlowdown 0x8, SwThermalSlowdown 0x20,
# HwThermalSlowdown 0x40, HwPowerBrakeSlowdown 0x80.
THERMAL_BITS = {0x8: "hw_slowdown", 0x20: "sw_thermal", 0x40: "hw_thermal"}
HW_SLOWDOWN = 0x8
THERMAL_MASK = HW_SLOWDOWN | 0x20 | 0x40
POWER_BRAKE = 0x80

# IB PortCounters widths (IBTA spec): error counters saturate instead of wrapping.
IB_COUNTERS = ("symbol_errors", "link_downed", "rcv_errors", "xmit_discards", "tx_bytes", "rx_bytes")
IB_LIMITS = {
    "symbol_errors": (16, "saturate"),
    "link_downed": (8, "saturate"),
    "rcv_errors": (16, "saturate"),
    "xmit_discards": (16, "saturate"),
}
IB_ERROR_COUNTERS = ("symbol_errors", "link_downed", "rcv_errors", "xmit_discards")
# The PortCounters' other error counters, tracked apart (snapshots of the release before them
# restore); xmit_wait is congestion, not an error, and is not tracked.
IB_EXT_COUNTERS = (
    "link_error_recovery",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
    "rcv_remote_physical_errors",
)
IB_EXT_LIMITS = {
    "link_error_recovery": (8, "saturate"),
    "local_link_integrity_errors": (4, "saturate"),
    "excessive_buffer_overrun_errors": (4, "saturate"),
    "rcv_remote_physical_errors": (16, "saturate"),
}
# The finding rule of each extended counter's rate (link_error_recovery's is the flapping link).
IB_EXT_RULES = {
    "link_error_recovery": "ib_link_flapping",
    "local_link_integrity_errors": "ib_local_link_integrity_errors",
    "excessive_buffer_overrun_errors": "ib_excessive_buffer_overrun_errors",
    "rcv_remote_physical_errors": "ib_rcv_remote_physical_errors",
}
# Ethernet counters judged (64-bit in /proc/net/dev; carrier_changes a kernel int, which the
# collector leaves out past 2**31: none wraps, a decrease is a reset).
ETH_COUNTERS = ("rx_errors", "tx_errors", "carrier_changes")
# The finding kind a reset of each GPU counter is reported under (the subsystem it counts).
RESET_KIND = {
    "ecc_sbe_volatile": "ecc",
    "ecc_dbe_volatile": "ecc",
    "ecc_sbe_aggregate": "ecc",
    "ecc_dbe_aggregate": "ecc",
    "retired_pages": "ecc",
    "remapped_rows_pending": "row_remap",
    "remapped_rows_failure": "row_remap",
    "remapped_rows_correctable": "row_remap",
    "remapped_rows_uncorrectable": "row_remap",
    "nvlink_crc_errors": "nvlink",
    "nvlink_replay_errors": "nvlink",
    "pcie_replay": "pcie",
}
MAX_LISTED = 16  # ports (or XID codes) named in one finding's evidence; the rest are counted
# An XID incident counts each catalogued code by itself and at most this many uncatalogued ones; any
# further uncatalogued codes share OTHER_XIDS (old snapshots also put overflow catalogued codes there).
MAX_UNKNOWN_XIDS = 16
OTHER_XIDS = "other"
_XID_ACTION_RANK = {"none": 0, "restart_app": 1, "investigate": 2, "reset_gpu": 3, "drain_node": 4, "rma": 5}

_GC = {name: i for i, name in enumerate(GPU_COUNTERS)}
_GPU_COUNTER_COLS = np.array([GPU_COL[c] for c in GPU_COUNTERS])
_IC = {name: i for i, name in enumerate(IB_COUNTERS)}
_IB_COUNTER_COLS = np.array([IB_COL[c] for c in IB_COUNTERS])
_IB_EXT_COLS = np.array([IB_COL[c] for c in IB_EXT_COUNTERS])
_IB_ERROR_COLS = [_IC[c] for c in IB_ERROR_COUNTERS]
_EC = {name: i for i, name in enumerate(ETH_COUNTERS)}
_ETH_COUNTER_COLS = np.array([ETH_COL[c] for c in ETH_COUNTERS])


@dataclass(slots=True)
class HardwareConfig:
    xid_quiet_s: float = knob(180.0, "an XID burst ends after this many seconds without another XID", gt=0)
    xid_burst_escalate: int = knob(20, "XIDs in one burst that make it critical, whatever their codes", ge=1)
    xid_same_event_s: float = knob(
        30.0,
        "an XID that NVML and the kernel log both report within this many seconds (sample times) is one XID",
        ge=0,
    )
    clear_after_s: float = knob(
        300.0, "a hardware finding resolves this many seconds after its fault was last seen", gt=0
    )
    sbe_per_hour: float = knob(10.0, "single-bit ECC errors per hour on a GPU that raise a finding", gt=0)
    retired_pages_soft: int = knob(15, "retired memory pages on a GPU that raise a warning", ge=0)
    retired_pages_max: int = knob(63, "retired memory pages on a GPU that are critical (its limit)", ge=1)
    rate_window_s: float = knob(60.0, "window (s) over which NVLink and PCIe error rates are measured", gt=0)
    nvlink_crc_per_s: float = knob(100.0, "NVLink CRC errors per second that raise a finding", gt=0)
    nvlink_replay_per_min: float = knob(1.0, "NVLink replays per minute that raise a finding", gt=0)
    pcie_replay_per_min: float = knob(8.0, "PCIe replays per minute that raise a finding", gt=0)
    critical_factor: float = knob(10.0, "an error rate this many times its threshold is critical", ge=1)
    sustained_s: float = knob(600.0, "an error-rate finding that lasts this long (s) becomes critical", ge=0)
    thermal_samples: int = knob(
        5, "samples in a row with thermal or power throttling that raise a finding", ge=1
    )
    ib_window_s: float = knob(3600.0, "window (s) over which InfiniBand error rates are measured", gt=0)
    ib_symbol_per_hour: float = knob(
        10.0, "InfiniBand symbol errors per hour on a port that raise a finding", gt=0
    )
    ib_rcv_per_hour: float = knob(
        10.0, "InfiniBand receive errors per hour on a port that raise a finding", gt=0
    )
    ib_xmit_discards_per_hour: float = knob(
        100.0, "InfiniBand transmit discards per hour on a port that raise a finding", gt=0
    )
    ib_link_recovery_per_hour: float = knob(
        10.0,
        "InfiniBand link error recoveries (the link retrained) per hour on a port that make it a "
        "flapping link (ibcheckerrs' LinkRecovers)",
        gt=0,
    )
    ib_link_integrity_per_hour: float = knob(
        10.0,
        "InfiniBand local link integrity errors (physical errors past the port's threshold) per hour "
        "that raise a finding (ibcheckerrs' LinkIntegrityErrors)",
        gt=0,
    )
    ib_buffer_overrun_per_hour: float = knob(
        10.0,
        "InfiniBand excessive buffer overrun errors (flow control broken) per hour that raise a "
        "finding (ibcheckerrs' ExcBufOverrunErrors)",
        gt=0,
    )
    ib_rcv_remote_physical_per_hour: float = knob(
        100.0,
        "InfiniBand packets received marked bad by another link of their path per hour that raise a "
        "finding (ibcheckerrs' RcvRemotePhysErrors)",
        gt=0,
    )
    eth_window_s: float = knob(3600.0, "window (s) over which Ethernet error rates are measured", gt=0)
    eth_rx_errors_per_hour: float = knob(
        100.0,
        "Ethernet receive errors (CRC, length, frame) per hour on an interface that raise a finding: "
        "a healthy link counts none, a failing cable or optic thousands",
        gt=0,
    )
    eth_tx_errors_per_hour: float = knob(
        100.0, "Ethernet transmit errors per hour on an interface that raise a finding", gt=0
    )
    eth_flap_window_s: float = knob(
        120.0, "window (s) over which Ethernet carrier changes are counted (kube-prometheus: 2 min)", gt=0
    )
    eth_carrier_changes: float = knob(
        2.5,
        "Ethernet carrier changes (a bounce is 2) in the decaying flap window above which an interface "
        "is flapping: more than 2 in 2 minutes, with half a change for the faded tail of older ones",
        gt=0,
    )


def _f(x: Any) -> float | int | None:
    """A numpy scalar as a JSON-friendly number (None for NaN; ints stay ints)."""
    v = float(x)
    if v != v:
        return None
    return int(v) if v.is_integer() and abs(v) < 2**53 else round(v, 6)


class HardwareDetector:
    """Stateful rule engine: `observe(batch, ctx)` -> finding/1 dicts; `to_state()`/`from_state()` resume.
    A snapshot of an earlier release may hold "node_ts" (each node's latest ts, when this detector
    dropped stale samples itself): ignored, NodeIndex holds that."""

    def __init__(self, config: HardwareConfig | None = None, index: NodeIndex | None = None) -> None:
        self.cfg = config or HardwareConfig()
        self.index = NodeIndex() if index is None else index  # node rows (the task's, shared)
        # GPU entities: (node row, gpu index) -> entity row; -1 = never seen.
        self.gpu_rows = np.full((0, 8), -1, dtype=np.int64)
        self.n_gpu = 0
        self.gpu_counters = CounterTracker(GPU_COUNTERS)
        w = self.cfg.rate_window_s
        # columns: sbe (1 h), nvlink crc, nvlink replay, pcie replay (rate window)
        self.gpu_decay = DecayingCount((3600.0, w, w, w))
        self.gpu_runs = RunLength(2)  # thermal, power brake
        # IB port entities: (node row, "device/port") -> entity row, sparse and capped per node
        # (detectors/port_map.py); snapshots keep it as (node row, "device/port", entity row) triples.
        self.ib_map = PortMap("IB port")
        self.ib_counters = CounterTracker(IB_COUNTERS, IB_LIMITS)
        iw = self.cfg.ib_window_s
        self.ib_decay = DecayingCount((iw, iw, iw))  # symbol, rcv, xmit_discards
        self.ib_ext_counters = CounterTracker(IB_EXT_COUNTERS, IB_EXT_LIMITS)
        self.ib_ext_decay = DecayingCount((iw,) * len(IB_EXT_COUNTERS))
        # Ethernet interface entities, as IB ports: (node row, iface) -> entity row
        self.eth_map = PortMap("Ethernet interface")
        self.eth_counters = CounterTracker(ETH_COUNTERS)
        ew = self.cfg.eth_window_s
        self.eth_decay = DecayingCount((ew, ew, self.cfg.eth_flap_window_s))  # rx, tx, carrier changes
        self.eth_was_up = np.zeros(0, dtype=bool)  # seen with operstate "up" in an earlier sample
        self.book = IncidentBook()

    # ------------------------------------------------------------ state

    def to_state(self) -> dict[str, Any]:
        n = len(self.index)
        return {
            "version": STATE_VERSION,
            # No "config": a restore takes its configuration from the deployment (from_state).
            # the node rows' names, as the previous release reads them (the task's index)
            "nodes": list(self.index.names),
            "gpu_rows": encode_array(grow(self.gpu_rows, n, -1)[:n]),
            "n_gpu": self.n_gpu,
            # entity rows in use only: the arrays' spare rows (they grow by doubling) are not state
            "gpu_counters": self.gpu_counters.to_state(self.n_gpu),
            "gpu_decay": self.gpu_decay.to_state(self.n_gpu),
            "gpu_runs": self.gpu_runs.to_state(self.n_gpu),
            "ib_rows": self.ib_map.triples(),
            "ib_counters": self.ib_counters.to_state(self.ib_map.n),
            "ib_decay": self.ib_decay.to_state(self.ib_map.n),
            "ib_ext_counters": self.ib_ext_counters.to_state(self.ib_map.n),
            "ib_ext_decay": self.ib_ext_decay.to_state(self.ib_map.n),
            "eth_rows": self.eth_map.triples(),
            "eth_counters": self.eth_counters.to_state(self.eth_map.n),
            "eth_decay": self.eth_decay.to_state(self.eth_map.n),
            "eth_was_up": encode_array(grow(self.eth_was_up, self.eth_map.n, False)[: self.eth_map.n]),
            "incidents": self.book.to_state(),
        }

    def to_bytes(self) -> bytes:
        return orjson.dumps(self.to_state())

    @classmethod
    def from_state(
        cls, d: dict[str, Any], config: HardwareConfig | None = None, index: NodeIndex | None = None
    ) -> HardwareDetector:
        """State from the snapshot, thresholds and windows from `config` (the deployment's; an old
        snapshot's "config" is ignored), node rows from `index` (the task's, restored; without
        one, the snapshot's own). The decaying counts are shaped by the rules, not by the window
        lengths, so a changed window restores too (DecayingCount.from_state says what the counts
        then mean)."""
        if d.get("version") != STATE_VERSION:
            raise ValueError(f"unsupported hardware detector state version {d.get('version')!r}")
        saved = d["nodes"]
        self = cls(config, NodeIndex(saved) if index is None else index)
        n, gpu_rows = len(self.index), decode_array(d["gpu_rows"])
        self.gpu_rows = self.index.place(saved, gpu_rows, np.full((n, gpu_rows.shape[1]), -1, dtype=np.int64))
        self.n_gpu = int(d["n_gpu"])
        # GPU and port entity rows are dense and each belongs to a node's cell: numbers beyond
        # that (a hostile record on the state topic) would size arrays past the worker's memory
        if not 0 <= self.n_gpu <= gpu_rows.size:
            raise ValueError(f"n_gpu {self.n_gpu} for {gpu_rows.size} GPU cells")
        self.gpu_counters = CounterTracker.from_state(d["gpu_counters"], GPU_COUNTERS)
        self.gpu_decay = DecayingCount.from_state(d["gpu_decay"], tuple(self.gpu_decay.tau))
        self.gpu_runs = RunLength.from_state(d["gpu_runs"])
        self.ib_map.restore(d["ib_rows"], saved, self.index.rows)
        self.ib_counters = CounterTracker.from_state(d["ib_counters"], IB_COUNTERS)
        self.ib_decay = DecayingCount.from_state(d["ib_decay"], tuple(self.ib_decay.tau))
        # the extended IB counters and Ethernet came later: a snapshot without them starts them
        # afresh (their first sample is a baseline)
        if "ib_ext_counters" in d:
            self.ib_ext_counters = CounterTracker.from_state(d["ib_ext_counters"], IB_EXT_COUNTERS)
            self.ib_ext_decay = DecayingCount.from_state(d["ib_ext_decay"], tuple(self.ib_ext_decay.tau))
        if "eth_rows" in d:
            self._eth_restore(d, saved)
        if self.ib_map.unplaced() or self.eth_map.unplaced():
            # ports of nodes the index does not hold: gone now, or the next snapshot would name
            # them with a row no restore takes
            self._compact_ports(None)
        self.book = IncidentBook.from_state(d["incidents"], self._clear_after)
        return self

    def _eth_restore(self, d: dict[str, Any], saved: list[str]) -> None:
        """The Ethernet interfaces of a snapshot: (node row, iface, entity row) triples, checked as
        the IB ports' are, and each entity's counters, decaying counts and was-up flag."""
        self.eth_map.restore(d["eth_rows"], saved, self.index.rows)
        self.eth_counters = CounterTracker.from_state(d["eth_counters"], ETH_COUNTERS)
        self.eth_decay = DecayingCount.from_state(d["eth_decay"], tuple(self.eth_decay.tau))
        was_up = decode_array(d["eth_was_up"]).astype(bool)
        if was_up.ndim != 1 or len(was_up) > self.eth_map.n:
            raise ValueError(f"eth_was_up of shape {was_up.shape} for {self.eth_map.n} interfaces")
        self.eth_was_up = was_up

    @classmethod
    def from_bytes(cls, raw: bytes, config: HardwareConfig | None = None) -> HardwareDetector:
        return cls.from_state(orjson.loads(raw), config)

    def forget(self, gone: Forgotten, nodes: Compaction | None) -> list[dict[str, Any]]:
        """Forgotten nodes (pipeline/node_stage.py): their open incidents resolve, saying so, and
        their rows go from every table: node rows (`nodes`, the index's), then the entity rows of
        their GPUs and IB ports (counters, decaying counts, runs), renumbered densely so that
        memory and snapshots shrink."""
        out = self.book.forget(gone)
        if nodes is None:
            return out
        grid = nodes.take(self.gpu_rows, -1)
        gpus = Compaction.referenced(self.n_gpu, grid)
        self.gpu_rows, self.n_gpu = gpus.renumber(grid), len(gpus.keep)
        for gpu_state in (self.gpu_counters, self.gpu_decay, self.gpu_runs):
            gpu_state.compact(gpus)
        self._compact_ports(nodes)
        return out

    def _compact_ports(self, nodes: Compaction | None) -> None:
        """The IB ports' and interfaces' entities of the nodes that stay (`nodes`; None: every node
        the index holds), renumbered densely with their counters, decaying counts and flags."""
        ports = self.ib_map.compact(nodes)
        for port_state in (self.ib_counters, self.ib_decay, self.ib_ext_counters, self.ib_ext_decay):
            port_state.compact(ports)
        ifaces = self.eth_map.compact(nodes)
        for iface_state in (self.eth_counters, self.eth_decay):
            iface_state.compact(ifaces)
        self.eth_was_up = ifaces.take(self.eth_was_up, False)

    def _clear_after(self, kind: str, rule: str) -> float:
        """An incident's healthy period before it resolves, as the rules below open it."""
        return self.cfg.xid_quiet_s if (kind, rule) == ("xid", "xid_burst") else self.cfg.clear_after_s

    # ------------------------------------------------------------ main entry

    def observe(self, batch: TelemetryBatch, ctx: NodeContext) -> list[dict[str, Any]]:
        """The NodeDetector protocol (detectors/protocol.py): the rules need the batch and its
        node rows only. The task admitted every sample by its agent's numbering
        (detectors/protocol.admit): each is new, and a node's event times never go back, though
        two may be equal (its clock went back); an XID in such a sample still counts."""
        if batch.size == 0:
            return []
        node_rows = ctx.rows
        self.gpu_rows = grow(self.gpu_rows, len(self.index), -1)
        acc = Segments.of(node_rows).order  # message indices, grouped by node, in arrival order
        times = SampleTimes(self.index.names, self.index.rows, node_rows[acc], batch.ts[acc])
        out: list[dict[str, Any]] = []
        out += self._gpu_rules(batch, acc, times)
        out += self._xid_rules(batch, acc, times)
        out += self._kernel_rules(batch, acc, times)
        out += self._ib_rules(batch, acc, times)
        out += self._eth_rules(batch, acc, times)
        out += self.book.sweep(times.next_ts, times.latest)
        out.sort(key=lambda f: (f["ts"], f["node"], f.get("gpu", -1), f["kind"], f["evidence"]["rule"]))
        return out

    # ------------------------------------------------------------ GPU metric rules

    def _gpu_entities(
        self, mrow: np.ndarray, present: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Entity rows of the present (message, gpu) pairs, allocating new ones; plus each new
        entity's first element position (to know, message by message, which GPUs a node had)."""
        g = present.shape[1]
        if self.gpu_rows.shape[1] < g:
            wide = np.full((len(self.gpu_rows), g), -1, dtype=np.int64)
            wide[:, : self.gpu_rows.shape[1]] = self.gpu_rows
            self.gpu_rows = wide
        mi, gi = np.nonzero(present)
        ent = self.gpu_rows[mrow[mi], gi]
        new = ent < 0
        first_pos = np.full(self.n_gpu, -1, dtype=np.int64)
        if new.any():
            key = mrow[mi[new]] * self.gpu_rows.shape[1] + gi[new]
            first_ix = first_appearances(key)  # allocate in order of appearance
            uniq = key[first_ix]
            rows = np.arange(self.n_gpu, self.n_gpu + len(uniq))
            self.gpu_rows[uniq // self.gpu_rows.shape[1], uniq % self.gpu_rows.shape[1]] = rows
            self.n_gpu += len(uniq)
            ent = self.gpu_rows[mrow[mi], gi]
            first_pos = np.full(self.n_gpu, -1, dtype=np.int64)
            first_pos[rows] = mi[new][first_ix]
        return mi, gi, ent, first_pos

    def _gpu_rules(self, batch: TelemetryBatch, acc: np.ndarray, ctx: SampleTimes) -> list[dict[str, Any]]:
        cfg = self.cfg
        present = batch.present[acc]
        if present.size == 0:
            return []
        mi, gi, ent, first_pos = self._gpu_entities(ctx.mrow, present)
        vals = batch.gpu[acc[mi], gi]  # (E, F)
        te = ctx.mts[mi]
        cu = self.gpu_counters.update(ent, te, vals[:, _GPU_COUNTER_COLS])
        d = cu.delta

        def col(name: str) -> np.ndarray:
            return vals[:, GPU_COL[name]]

        def dcol(name: str) -> np.ndarray:
            return d[:, _GC[name]]

        vol_missing = np.isnan(dcol("ecc_sbe_volatile"))
        sbe = np.where(vol_missing, dcol("ecc_sbe_aggregate"), dcol("ecc_sbe_volatile"))
        windowed = ("nvlink_crc_errors", "nvlink_replay_errors", "pcie_replay")
        deltas = np.stack([sbe, *(dcol(c) for c in windowed)], 1)
        dt = cu.dt
        sbe_dt = np.where(vol_missing, dt[:, _GC["ecc_sbe_aggregate"]], dt[:, _GC["ecc_sbe_volatile"]])
        spread = np.stack([sbe_dt, *(dt[:, _GC[c]] for c in windowed)], 1)
        win = self.gpu_decay.update(ent, te, deltas, spread)

        tr = col("throttle_reasons")
        tri = np.where(np.isnan(tr), 0, tr).astype(np.int64)
        brake = (tri & POWER_BRAKE) != 0
        # HW slowdown (0x8) is also asserted while the power brake pulls; then it is a power event,
        # reported as power_brake, not as thermal throttling.
        thermal = ((tri & (THERMAL_MASK & ~HW_SLOWDOWN)) != 0) | (((tri & HW_SLOWDOWN) != 0) & ~brake)
        runs = self.gpu_runs.update(ent, np.stack([thermal, brake], 1))

        out: list[dict[str, Any]] = []
        hit = _Hits(self, ctx, mi, gi, out)
        with np.errstate(invalid="ignore"):
            dbe_v, dbe_a = col("ecc_dbe_volatile"), col("ecc_dbe_aggregate")
            dbe_bad = (dbe_v > 0) | (dcol("ecc_dbe_volatile") > 0) | (dcol("ecc_dbe_aggregate") > 0)
            for i in np.flatnonzero(dbe_bad):
                hit(
                    i,
                    "ecc",
                    "ecc_dbe",
                    "critical",
                    1.0,
                    f"uncorrectable ECC error (DBE volatile={_f(dbe_v[i])}, "
                    f"aggregate={_f(dbe_a[i])}) (drain node)",
                    {
                        "ecc_dbe_volatile": _f(dbe_v[i]),
                        "ecc_dbe_aggregate": _f(dbe_a[i]),
                        "delta_volatile": _f(dcol("ecc_dbe_volatile")[i]),
                        "delta_aggregate": _f(dcol("ecc_dbe_aggregate")[i]),
                    },
                )

            # NVML's GPU recovery action: the driver's own verdict, the strongest signal there is
            # (detectors/kernel_events.RECOVERY_ACTIONS); 0 (none) says nothing is wrong
            ra = col("recovery_action")
            for i in np.flatnonzero(ra > 0):
                r = int(ra[i])
                what, sev, action = kernel_events.RECOVERY_ACTIONS.get(
                    r, (f"recovery action {r}", "warning", "investigate")
                )
                hit(
                    i,
                    "xid",
                    "recovery_action",
                    sev,
                    1.0,
                    f"the driver asks for: {what} ({xid_catalog.ACTION_TEXT[action]})",
                    {"recovery_action": r, "name": what, "action": action},
                )

            thr = cfg.sbe_per_hour
            for i in np.flatnonzero(win[:, 0] > thr):
                hit(
                    i,
                    "ecc",
                    "ecc_sbe_rate",
                    "warning",
                    win[i, 0] / thr,
                    f"correctable ECC errors {win[i, 0]:.0f}/h above {thr:g}/h (watch; reset GPU if rising)",
                    {
                        "sbe_per_hour": _f(win[i, 0]),
                        "threshold_per_hour": thr,
                        "ecc_sbe_volatile": _f(col("ecc_sbe_volatile")[i]),
                        "ecc_sbe_aggregate": _f(col("ecc_sbe_aggregate")[i]),
                        "delta": _f(sbe[i]),
                    },
                )

            rp, drp = col("retired_pages"), dcol("retired_pages")
            rp_bad = (drp > 0) | (rp >= cfg.retired_pages_soft)
            for i in np.flatnonzero(rp_bad):
                sev = "critical" if rp[i] >= cfg.retired_pages_max else "warning"
                hit(
                    i,
                    "ecc",
                    "retired_pages",
                    sev,
                    rp[i] / cfg.retired_pages_max if sev == "critical" else 1.0,
                    f"{_f(rp[i])} retired memory pages (+{_f(drp[i]) or 0}; limit {cfg.retired_pages_max})"
                    + (" (drain node, RMA)" if sev == "critical" else " (reset GPU when idle)"),
                    {
                        "retired_pages": _f(rp[i]),
                        "delta": _f(drp[i]),
                        "soft_limit": cfg.retired_pages_soft,
                        "limit": cfg.retired_pages_max,
                    },
                )

            pend, fail = col("remapped_rows_pending"), col("remapped_rows_failure")
            for i in np.flatnonzero(pend > 0):
                hit(
                    i,
                    "row_remap",
                    "row_remap_pending",
                    "warning",
                    1.0,
                    "memory row remap pending (reset GPU to apply)",
                    {"remapped_rows_pending": _f(pend[i])},
                )
            for i in np.flatnonzero(fail > 0):
                hit(
                    i,
                    "row_remap",
                    "row_remap_failure",
                    "critical",
                    1.0,
                    "memory row remap failed (drain node, RMA)",
                    {"remapped_rows_failure": _f(fail[i])},
                )

            w = cfg.rate_window_s
            for c, kind, rule, what, limit in (
                (1, "nvlink", "nvlink_crc", "NVLink CRC errors", cfg.nvlink_crc_per_s * w),
                (2, "nvlink", "nvlink_replay", "NVLink replays", cfg.nvlink_replay_per_min * w / 60.0),
                (3, "pcie", "pcie_replay", "PCIe replays", cfg.pcie_replay_per_min * w / 60.0),
            ):
                raw = col({1: "nvlink_crc_errors", 2: "nvlink_replay_errors", 3: "pcie_replay"}[c])
                for i in np.flatnonzero(win[:, c] > limit):
                    ratio = win[i, c] / limit
                    sev = "critical" if ratio > cfg.critical_factor else "warning"
                    per_min = win[i, c] * 60.0 / w
                    hit(
                        i,
                        kind,
                        rule,
                        sev,
                        ratio,
                        f"{what} {per_min:.0f}/min above {limit * 60.0 / w:g}/min",
                        {
                            "per_window": _f(win[i, c]),
                            "window_s": w,
                            "threshold_per_window": limit,
                            "counter": _f(raw[i]),
                            "delta": _f(deltas[i, c]),
                        },
                        sustain=True,
                    )

            n = cfg.thermal_samples
            temp, power = col("temp_c"), col("power_w")
            for i in np.flatnonzero(runs[:, 0] >= n):
                bits = [name for b, name in THERMAL_BITS.items() if tri[i] & b]
                hit(
                    i,
                    "thermal",
                    "thermal_throttle",
                    "warning",
                    runs[i, 0] / n,
                    f"thermal throttling ({', '.join(bits)}) for {runs[i, 0]} samples, {_f(temp[i])} C",
                    {
                        "throttle_reasons": hex(int(tri[i])),
                        "bits": bits,
                        "consecutive_samples": int(runs[i, 0]),
                        "min_samples": n,
                        "temp_c": _f(temp[i]),
                        "power_w": _f(power[i]),
                    },
                )
            for i in np.flatnonzero(runs[:, 1] >= n):
                hit(
                    i,
                    "thermal",
                    "power_brake",
                    "warning",
                    runs[i, 1] / n,
                    f"HW power brake engaged for {runs[i, 1]} samples (check PSU/power delivery)",
                    {
                        "throttle_reasons": hex(int(tri[i])),
                        "consecutive_samples": int(runs[i, 1]),
                        "min_samples": n,
                        "power_w": _f(power[i]),
                    },
                )

            self._gpu_resets(hit, cu.reset, vals)
        out += self._lost_rules(batch, acc, ctx, present, first_pos)
        return out

    @staticmethod
    def _gpu_resets(hit: _Hits, reset: np.ndarray, vals: np.ndarray) -> None:
        """One info finding per GPU and counter family whose counters went down in this sample."""
        for i in np.flatnonzero(reset.any(axis=1)):
            by_kind: dict[str, dict[str, Any]] = {}
            for j in np.flatnonzero(reset[i]).tolist():
                name = GPU_COUNTERS[j]
                by_kind.setdefault(RESET_KIND[name], {})[name] = _f(vals[i, GPU_COL[name]])
            for kind, counters in by_kind.items():
                hit(
                    i,
                    kind,
                    "counter_reset",
                    "info",
                    1.0,
                    f"{', '.join(counters)} went down (GPU reset, driver reload or reboot): re-baselined",
                    {"counters": counters},
                )

    def _lost_rules(
        self,
        batch: TelemetryBatch,
        acc: np.ndarray,
        ctx: SampleTimes,
        present: np.ndarray,
        first_pos: np.ndarray,
    ) -> list[dict[str, Any]]:
        lost = batch.lost[acc] & present
        g = present.shape[1]
        grid = self.gpu_rows[ctx.mrow][:, :g] if g else np.zeros(present.shape, dtype=np.int64)
        pos = np.arange(len(acc))[:, None]
        # Known at this message = seen in an earlier batch, or earlier in this batch.
        known = (grid >= 0) & (first_pos[np.maximum(grid, 0)] <= pos) if self.n_gpu else grid >= 0
        missing = known & ~present & present.any(axis=1)[:, None]
        # GPUs beyond this batch's widest message can also go missing.
        extra = self.gpu_rows[ctx.mrow][:, g:]
        out: list[dict[str, Any]] = []
        m_i, g_i = np.nonzero(lost | missing)
        if extra.size:
            em, eg = np.nonzero((extra >= 0) & present.any(axis=1)[:, None])
            m_i, g_i = np.r_[m_i, em], np.r_[g_i, eg + g]
        hit = _Hits(self, ctx, m_i, g_i, out)
        for i in range(len(m_i)):
            m, gg = m_i[i], g_i[i]
            how = "absent from telemetry" if gg >= g or not present[m, gg] else "lost, no metrics readable"
            hit(
                i,
                "pcie",
                "gpu_lost",
                "critical",
                1.0,
                f"GPU lost ({how}; fallen off the bus?) (drain node)",
                {"state": how},
            )
        return out

    # ------------------------------------------------------------ XIDs

    def _xid_sightings(
        self, batch: TelemetryBatch, acc: np.ndarray
    ) -> list[tuple[int, int | None, int, str, str, int]]:
        """Every XID of the accepted messages as (position, gpu, code, variant, source, count): NVML's
        (gpus[].xids) and the kernel log's (kernel.events[] of kind xid), by message, NVML's first
        within a message. A kernel-log XID whose GPU the agent could not name has gpu None."""
        out: list[tuple[int, int | None, int, str, str, int]] = []
        if len(batch.xid_msg):
            pos = positions_in(acc, batch.size, batch.xid_msg)
            keep = pos >= 0
            for p, gpu, code in zip(
                pos[keep].tolist(), batch.xid_gpu[keep].tolist(), batch.xid_code[keep].tolist(), strict=True
            ):
                out.append((p, gpu, code, "", "nvml", 1))
        for p, _section, e in kernel_rules.accepted_events(batch, acc):
            code, gpu = e.get("code"), e.get("gpu")
            if e.get("kind") == "xid" and isinstance(code, int) and not isinstance(code, bool):
                gpu = gpu if isinstance(gpu, int) and not isinstance(gpu, bool) else None
                out.append((p, gpu, code, kernel_rules.xid_variant(e), "kernel", kernel_rules.count_of(e)))
        out.sort(key=lambda x: x[0])  # stable: by message, NVML's before the kernel log's
        return out

    @staticmethod
    def _recovery_action(
        batch: TelemetryBatch, acc: np.ndarray, p: int, gpu: int | None, extra: dict[str, Any]
    ) -> int:
        """The GPU's recovery action (a value NVML defines, not 0) as its latest sample up to this
        XID's said it, kept in the burst's `extra`: 0 where none is known or the last said none."""
        if gpu is not None and gpu < batch.gpu.shape[1]:
            v = batch.gpu[acc[p], gpu, GPU_COL["recovery_action"]]
            if v == v:  # read in this sample (NaN: absent)
                extra["recovery_action"] = int(v)
        ra = int(extra.get("recovery_action", 0))
        return ra if ra in kernel_events.RECOVERY_ACTIONS else 0

    def _xid_rules(self, batch: TelemetryBatch, acc: np.ndarray, ctx: SampleTimes) -> list[dict[str, Any]]:
        sightings = self._xid_sightings(batch, acc)
        cfg = self.cfg
        out: list[dict[str, Any]] = []
        for p, gpu, code, variant, source, n in sightings:
            node, ts = ctx.names[int(ctx.mrow[p])], float(ctx.mts[p])
            key = (node, gpu, None, "xid", "xid_burst")
            done = self.book.expire(key, ts, ctx.next_ts)
            if done is not None:
                out.append(done)
            inc = self.book.get(key)
            extra: dict[str, Any] = orjson.loads(orjson.dumps(inc.extra)) if inc else {}
            counts: dict[str, int] = extra.setdefault("counts", {})
            new = kernel_rules.sighted(extra, source, code, ts, n, cfg.xid_same_event_s)
            name = _xid_bucket(counts, code, variant)
            news = inc is not None and name not in counts and _xid_info(name)[0].severity == "critical"
            if new:
                counts[name] = counts.get(name, 0) + new
            moved = 0
            if n > new and name != str(code):
                # NVML's sighting of this XID came first and was counted by its code alone; the
                # line says more (a recovery action, Fatal): it now counts as what the line says
                moved = min(n - new, counts.get(str(code), 0))
                if moved:
                    counts[str(code)] -= moved
                    if not counts[str(code)]:
                        del counts[str(code)]
                    counts[name] = counts.get(name, 0) + moved
            if inc is not None and not new and not moved:
                inc.extra = extra  # XIDs counted already: only the pairing changed
                continue
            burst = _XidBurst.of(counts)
            worst, total = burst.worst, burst.total
            rank = burst.rank
            # NVML's GPU recovery action, read with this XID's sample, is the driver's own verdict:
            # where it asks for something (not 0, none), it decides the burst's severity and action
            ra = self._recovery_action(batch, acc, p, gpu, extra)
            if ra:
                worst = kernel_rules.variant_info(worst.code, f"ra{ra}")
                rank = SEVERITY_RANK[worst.severity]
            if total >= cfg.xid_burst_escalate:
                cap = SEVERITY_RANK["warning"] if worst.cause == "application" else SEVERITY_RANK["critical"]
                rank = max(rank, min(rank + 1, cap))
            sev = SEVERITIES[rank]
            where = f"{node} GPU{gpu}" if gpu is not None else f"{node} (GPU not named)"
            summary = f"{where}: XID {worst.code} {worst.name} ({worst.action_text})"
            if total > 1:
                summary += f"; {total} XIDs in burst"
            evidence = {
                "xids": burst.listed,
                "total": total,
                "worst_xid": worst.code,
                "cause": worst.cause,
                "action": worst.action,
                "bucket": worst.bucket,  # NVIDIA's resolution bucket, which decided the action
                "description": worst.description,
                "quiet_s": cfg.xid_quiet_s,
                "first_seen_by": dict(extra.get("first_by", {})),  # which source reported them first
            }
            if ra:
                evidence["recovery_action"] = ra
            if inc is not None and _XID_ACTION_RANK[worst.action] > _XID_ACTION_RANK.get(
                str(inc.evidence.get("action")), 0
            ):
                news = True  # the burst now asks for more (a 63 joined a 48, the driver spoke): say so
            unlisted = total - sum(burst.listed.values())
            if unlisted:  # XIDs of codes the list leaves out (or of uncatalogued ones beyond it)
                evidence["xids_unlisted"] = unlisted
            out += self.book.observe(
                node=node,
                gpu=gpu,
                kind="xid",
                rule="xid_burst",
                ts=ts,
                severity=sev,
                score=severity_score(sev, total / cfg.xid_burst_escalate),
                summary=summary,
                evidence=evidence,
                clear_after=cfg.xid_quiet_s,
                next_ts=ctx.next_ts,
                extra=extra,
                # a critical code new to a burst that is critical already changes what act decides
                # (its drain reads the codes): the finding goes out again
                news=news,
            )
        return out

    # ------------------------------------------------------------ the kernel log's other events

    def _kernel_rules(self, batch: TelemetryBatch, acc: np.ndarray, ctx: SampleTimes) -> list[dict[str, Any]]:
        """Findings of the kernel-log events other than XIDs (detectors/kernel_rules.py)."""
        out: list[dict[str, Any]] = []
        last_section: dict[str, Any] | None = None
        for p, section, e in kernel_rules.accepted_events(batch, acc):
            node, ts = ctx.names[int(ctx.mrow[p])], float(ctx.mts[p])
            if section is not last_section:  # once per section: what the ring buffer lost
                last_section = section
                missed = kernel_rules.missed_records(section)
                if missed:
                    out += self._kernel_observe(
                        ctx, node, None, "kernel_log", "records_missed", ts, "warning", "investigate",
                        f"{missed} kernel log records lost before the agent read them (ring buffer "
                        "overwritten): faults they reported are unseen",
                        {"missed": missed, "overruns": section.get("overruns", 0)}, count=missed,
                    )  # fmt: skip
            kind = e.get("kind")
            if not e or kind == "xid":
                continue
            gpu = e.get("gpu")
            gpu = gpu if isinstance(gpu, int) and not isinstance(gpu, bool) else None
            j = kernel_events.judge(e)
            n = kernel_rules.count_of(e)
            ev = kernel_rules.event_evidence(e)
            if kind == "fallen_off_bus":
                out += self._kernel_observe(
                    ctx, node, gpu, "pcie", "gpu_lost", ts, "critical", "drain_node",
                    "GPU lost (the kernel log: fallen off the bus) (drain node)",
                    {"state": "fallen off the bus (kernel log)", **ev},
                )  # fmt: skip
            elif kind == "sxid":
                out += self._kernel_observe(
                    ctx, node, None, "nvswitch", "sxid", ts, j.severity, j.action,
                    f"{j.name} on {ev.get('pci', 'an NVSwitch')} ({xid_catalog.ACTION_TEXT[j.action]})",
                    ev, count=n,
                )  # fmt: skip
            elif kind == "aer":
                out += self._kernel_observe(
                    ctx, node, gpu, "pcie", "aer", ts, j.severity, j.action,
                    f"{j.name} on {ev.get('hca') or ev.get('pci') or ev.get('port', 'a PCIe device')}",
                    ev, count=n,
                )  # fmt: skip
            elif kind in kernel_rules.STORAGE_EVENTS:
                finding_kind, rule = kernel_rules.STORAGE_EVENTS[kind]
                out += self._kernel_observe(
                    ctx, node, None, finding_kind, rule, ts, j.severity, j.action,
                    f"{j.name} (the kernel log)", ev, count=n,
                )  # fmt: skip
            else:
                out += self._kernel_observe(
                    ctx, node, None, "kernel_log", "unknown_event", ts, "warning", "investigate",
                    f"kernel log event of a kind this release does not know: {str(kind)[:32]}",
                    {"event_kind": str(kind)[:32], **ev}, count=n,
                )  # fmt: skip
        return out

    def _kernel_observe(
        self,
        ctx: SampleTimes,
        node: str,
        gpu: int | None,
        kind: str,
        rule: str,
        ts: float,
        severity: str,
        action: str,
        what: str,
        evidence: dict[str, Any],
        count: int = 1,
    ) -> list[dict[str, Any]]:
        """One kernel-log event into its incident: the evidence keeps the worst event's fields and
        the events counted so far (a sample's repeats are one event with a count)."""
        key = (node, gpu, None, kind, rule)
        out: list[dict[str, Any]] = []
        done = self.book.expire(key, ts, ctx.next_ts)  # healthy long enough: a new one counts from zero
        if done is not None:
            out.append(done)
        inc = self.book.get(key)
        seen = int(inc.extra.get("events", 0)) if inc else 0
        seen = min(seen + count, kernel_rules.MAX_COUNT)
        worse = inc is None or SEVERITY_RANK[severity] >= SEVERITY_RANK[inc.severity]
        if worse:
            evidence = {**evidence, "action": action, "events": seen}
        else:
            evidence = {**inc.evidence, "events": seen}
        where = f"{node} GPU{gpu}" if gpu is not None else node
        return out + self.book.observe(
            node=node,
            gpu=gpu,
            kind=kind,
            rule=rule,
            ts=ts,
            severity=severity,
            score=severity_score(severity),
            summary=f"{where}: {what}" if worse else inc.summary,
            evidence=evidence,
            clear_after=self.cfg.clear_after_s,
            next_ts=ctx.next_ts,
            extra={"events": seen},
        )

    # ------------------------------------------------------------ InfiniBand

    def _ib_rules(self, batch: TelemetryBatch, acc: np.ndarray, ctx: SampleTimes) -> list[dict[str, Any]]:
        sel, pos = _port_elements(batch.size, acc, batch.ib_msg)
        sel, pos, ent = _port_entities(self.ib_map, ctx.mrow, batch.ib_key_names, batch.ib_key_idx, sel, pos)
        if len(sel) == 0:
            return []
        keys = _Names(self.ib_map.names.names, self.ib_map.name_codes(ent))
        vals = batch.ib[sel]
        active = batch.ib_active[sel]
        te = ctx.mts[pos]
        cu = self.ib_counters.update(ent, te, vals[:, _IB_COUNTER_COLS])
        d = cu.delta
        wcols = [_IC["symbol_errors"], _IC["rcv_errors"], _IC["xmit_discards"]]
        win = self.ib_decay.update(ent, te, d[:, wcols], cu.dt[:, wcols])
        ext = self.ib_ext_counters.update(ent, te, vals[:, _IB_EXT_COLS])
        ext_win = self.ib_ext_decay.update(ent, te, ext.delta, ext.dt)

        cfg = self.cfg
        out: list[dict[str, Any]] = []
        hit = _Hits(self, ctx, pos, None, out)
        per_node = _PerMessage(pos)
        rate_unit = cfg.ib_window_s / 3600.0  # thresholds are per hour; the window may differ
        for i, ports in per_node(active == 0):
            states = sorted({str(batch.ib_state_names[int(batch.ib_state_idx[sel[j]])]) for j in ports})
            hit(
                i,
                "ib_link",
                "ib_port_state",
                "critical",
                1.0,
                f"IB {_ports_text(keys, ports)} not ACTIVE ({', '.join(states)[:80]}) (drain node)",
                {**_ports(keys, ports), "states": states[:MAX_LISTED]},
            )
        with np.errstate(invalid="ignore"):
            ld = d[:, _IC["link_downed"]]
            for i, ports in per_node(ld > 0):
                hit(
                    i,
                    "ib_link",
                    "ib_link_downed",
                    "critical",
                    1.0,
                    f"IB {_ports_text(keys, ports)} link went down {_f(ld[ports].sum())}x (drain node)",
                    {**_ports(keys, ports), "delta": _f(ld[ports].sum())},
                )
            # (windowed counts, their column, delta, the counter, rule, what, threshold per hour)
            rates = [
                (win, c, d[:, _IC[name]], name, f"ib_{name}", name.replace("_", " "), per_hour)
                for c, (name, per_hour) in enumerate(
                    (
                        ("symbol_errors", cfg.ib_symbol_per_hour),
                        ("rcv_errors", cfg.ib_rcv_per_hour),
                        ("xmit_discards", cfg.ib_xmit_discards_per_hour),
                    )
                )
            ]
            ext_per_hour = (
                cfg.ib_link_recovery_per_hour,
                cfg.ib_link_integrity_per_hour,
                cfg.ib_buffer_overrun_per_hour,
                cfg.ib_rcv_remote_physical_per_hour,
            )
            rates += [
                (ext_win, c, ext.delta[:, c], name, IB_EXT_RULES[name], _IB_EXT_WHAT[name], per_hour)
                for c, (name, per_hour) in enumerate(zip(IB_EXT_COUNTERS, ext_per_hour, strict=True))
            ]
            for counts, c, delta, name, rule, what, per_hour in rates:
                limit = per_hour * rate_unit
                for _i, ports in per_node(counts[:, c] > limit):
                    worst = ports[int(np.argmax(counts[ports, c]))]
                    ratio = counts[worst, c] / limit
                    sev = "critical" if ratio > cfg.critical_factor else "warning"
                    hit(
                        worst,
                        "ib_link",
                        rule,
                        sev,
                        ratio,
                        f"IB {_ports_text(keys, ports)} {what} up to "
                        f"{counts[worst, c] / rate_unit:.0f}/h above {per_hour:g}/h",
                        {
                            **_ports(keys, ports),
                            "worst_port": keys[worst],
                            "per_window": _f(counts[worst, c]),
                            "window_s": cfg.ib_window_s,
                            "threshold_per_window": limit,
                            "counter": _f(vals[worst, IB_COL[name]]),
                            "delta": _f(delta[worst]),
                        },
                    )
            # (a whole-array any() first: per-row any() is slow, and nearly every batch has none)
            if cu.saturated.any() or ext.saturated.any():  # only error counters have a width
                sat = np.concatenate([cu.saturated[:, _IB_ERROR_COLS], ext.saturated], axis=1)
            else:
                sat = np.zeros((len(sel), 0), dtype=bool)
            sat_names = (*IB_ERROR_COUNTERS, *IB_EXT_COUNTERS)
            for i, ports in per_node(sat.any(axis=1)):
                which = sorted({sat_names[j] for p in ports for j in np.flatnonzero(sat[p])})
                hit(
                    i,
                    "ib_link",
                    "ib_counter_saturated",
                    "warning",
                    1.0,
                    f"IB {_ports_text(keys, ports)} counters saturated ({', '.join(which)}); "
                    "clear them (perfquery -x)",
                    {**_ports(keys, ports), "saturated": which},
                )
            reset = _rows_any(cu.reset) | _rows_any(ext.reset)
            for i, ports in per_node(reset):
                hit(
                    i,
                    "ib_link",
                    "counter_reset",
                    "info",
                    1.0,
                    f"IB {_ports_text(keys, ports)} counters went down (cleared or reset): re-baselined",
                    _ports(keys, ports),
                )
        return out

    # ------------------------------------------------------------ Ethernet

    def _eth_rules(self, batch: TelemetryBatch, acc: np.ndarray, ctx: SampleTimes) -> list[dict[str, Any]]:
        sel, pos = _port_elements(batch.size, acc, batch.eth_msg)
        sel, pos, ent = _port_entities(
            self.eth_map, ctx.mrow, batch.eth_iface_names, batch.eth_iface_idx, sel, pos
        )
        if len(sel) == 0:
            return []
        names = _Names(self.eth_map.names.names, self.eth_map.name_codes(ent))
        rows = batch.eth[sel]
        vals = rows[:, _ETH_COUNTER_COLS]
        # carrier_changes is the sum of the up and down counts (net-sysfs.c): where only they came
        cc = _EC["carrier_changes"]
        halves = rows[:, ETH_COL["carrier_up_count"]] + rows[:, ETH_COL["carrier_down_count"]]
        vals[:, cc] = np.where(np.isnan(vals[:, cc]), halves, vals[:, cc])
        te = ctx.mts[pos]
        cu = self.eth_counters.update(ent, te, vals)
        spread = cu.dt.copy()
        spread[:, cc] = 0.0  # a sample's carrier changes count whole (a burst stays a burst)
        win = self.eth_decay.update(ent, te, cu.delta, spread)
        up = batch.eth_up[sel]
        self.eth_was_up = grow(self.eth_was_up, self.eth_map.n, False)
        down = up == 0
        if down.any():
            down &= _was_before(self.eth_was_up, ent, up == 1)
        else:  # the usual batch: nothing is down, so only remember what is up
            self.eth_was_up[ent[up == 1]] = True

        cfg = self.cfg
        out: list[dict[str, Any]] = []
        hit = _Hits(self, ctx, pos, None, out)
        per_node = _PerMessage(pos)

        def text(ifaces: np.ndarray) -> str:
            return _ports_text(names, ifaces, "interface")

        for i, ifaces in per_node(down):
            states = sorted({str(batch.eth_state_names[int(batch.eth_state_idx[sel[j]])]) for j in ifaces})
            hit(
                i,
                "eth_link",
                "eth_link_down",
                "warning",
                1.0,
                f"Ethernet {text(ifaces)} down ({', '.join(states)[:80]}), up before",
                {**_ports(names, ifaces, "interfaces"), "states": states[:MAX_LISTED]},
            )
        rate_unit = cfg.eth_window_s / 3600.0
        with np.errstate(invalid="ignore"):
            rates = (  # (counter, rule, what, threshold per hour; None: carrier changes per flap window)
                ("rx_errors", "eth_rx_errors", "receive errors", cfg.eth_rx_errors_per_hour),
                ("tx_errors", "eth_tx_errors", "transmit errors", cfg.eth_tx_errors_per_hour),
                ("carrier_changes", "eth_carrier_flapping", "carrier changes", None),
            )
            for name, rule, what, per_hour in rates:
                c = _EC[name]
                window = cfg.eth_window_s if per_hour is not None else cfg.eth_flap_window_s
                per_window = per_hour * rate_unit if per_hour is not None else cfg.eth_carrier_changes
                for _i, ifaces in per_node(win[:, c] > per_window):
                    worst = ifaces[int(np.argmax(win[ifaces, c]))]
                    ratio = win[worst, c] / per_window
                    if per_hour is not None:
                        level = f"up to {win[worst, c] / rate_unit:.0f}/h above {per_hour:g}/h"
                    else:
                        level = f"{win[worst, c]:.1f} in {window:g} s above {per_window:g} (flapping)"
                    hit(
                        worst,
                        "eth_link",
                        rule,
                        "warning",
                        ratio,
                        f"Ethernet {text(ifaces)} {what} {level}",
                        {
                            **_ports(names, ifaces, "interfaces"),
                            "worst_interface": names[worst],
                            "per_window": _f(win[worst, c]),
                            "window_s": window,
                            "threshold_per_window": per_window,
                            "counter": _f(vals[worst, c]),
                            "delta": _f(cu.delta[worst, c]),
                        },
                    )
            for i, ifaces in per_node(_rows_any(cu.reset)):
                hit(
                    i,
                    "eth_link",
                    "counter_reset",
                    "info",
                    1.0,
                    f"Ethernet {text(ifaces)} counters went down (reboot or driver reload): re-baselined",
                    _ports(names, ifaces, "interfaces"),
                )
        return out


class _PerMessage:
    """Groups a batch's flagged port elements by the message (node sample) they belong to, so a
    rule yields one finding per node and sample, not one per port."""

    def __init__(self, pos: np.ndarray) -> None:
        self.pos = pos  # each element's message, ascending

    def __call__(self, flagged: np.ndarray) -> list[tuple[int, np.ndarray]]:
        """(first flagged element, all flagged elements) per message, in message order."""
        idx = np.flatnonzero(flagged)
        if len(idx) == 0:
            return []
        starts = np.flatnonzero(np.r_[True, self.pos[idx][1:] != self.pos[idx][:-1]])
        groups = np.split(idx, starts[1:])
        return [(int(g[0]), g) for g in groups]


def _ports(keys: _Names, ports: np.ndarray, field: str = "ports") -> dict[str, Any]:
    """Evidence naming the ports (or interfaces: `field`; at most MAX_LISTED) and how many there are."""
    names = sorted({keys[p] for p in ports.tolist()})
    return {field: names[:MAX_LISTED], f"{field}_total": len(names)}


def _ports_text(keys: _Names, ports: np.ndarray, noun: str = "port") -> str:
    names = sorted({keys[p] for p in ports.tolist()})
    shown = ", ".join(names[:3])
    return (
        f"{noun} {shown}"
        if len(names) == 1
        else f"{noun}s {shown}" + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    )


# How a summary names each extended IB counter's rate.
_IB_EXT_WHAT = {
    "link_error_recovery": "link retrained (link error recovery; flapping)",
    "local_link_integrity_errors": "local link integrity errors",
    "excessive_buffer_overrun_errors": "excessive buffer overruns",
    "rcv_remote_physical_errors": "packets marked bad upstream (remote physical errors)",
}


def _rows_any(flags: np.ndarray) -> np.ndarray:
    """flags.any(axis=1) of a (n, k) bool array, at the cost of one whole-array any() when none is
    set (the usual batch: per-row any() over a few columns costs ~10x that)."""
    return flags.any(axis=1) if flags.any() else np.zeros(len(flags), dtype=bool)


def _port_elements(size: int, acc: np.ndarray, msg: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The list entries (IB ports, Ethernet interfaces) of accepted messages, by message position
    (stable): (their indices in the batch's lists, each one's message position)."""
    if len(msg) == 0:
        empty = np.empty(0, dtype=np.int64)
        return empty, empty
    pos = positions_in(acc, size, msg)
    sel = np.flatnonzero(pos >= 0)
    sel = sel[np.argsort(pos[sel], kind="stable")]
    return sel, pos[sel]


def _was_before(state: np.ndarray, ent: np.ndarray, now: np.ndarray) -> np.ndarray:
    """For each element (in sample order), whether its entity had `now` true in an earlier
    element or, before this batch, in `state` (a per-entity flag, set here for every entity with
    `now` true: it stays set)."""
    n = len(ent)
    order = np.argsort(ent, kind="stable")
    e, flag = ent[order], now[order]
    idx = np.arange(n)
    start = np.maximum.accumulate(np.where(np.r_[True, e[1:] != e[:-1]], idx, 0))  # group's first
    last = np.maximum.accumulate(np.where(flag, idx, -1))  # latest flagged element so far
    earlier = np.r_[-1, last[:-1]] >= start  # flagged before, in this batch
    out = np.empty(n, dtype=bool)
    out[order] = state[e] | earlier
    state[e[flag]] = True
    return out


def _xid_bucket(counts: dict[str, int], code: int, variant: str = "") -> str:
    """The name an XID is counted under in its incident's counts: its own for every catalogued
    code (the catalogue is bounded, so the counts are), "<code>:<variant>" where its kernel-log
    line says more than the code (kernel_rules.xid_variant: bounded too), and for the first
    MAX_UNKNOWN_XIDS others; further uncatalogued codes share OTHER_XIDS."""
    name = str(code)
    if variant and code in xid_catalog.CATALOG:
        return f"{name}:{variant}"
    if name in counts or code in xid_catalog.CATALOG:
        return name
    unknown = sum(1 for c in counts if c != OTHER_XIDS and int(c) not in xid_catalog.CATALOG)
    return name if unknown < MAX_UNKNOWN_XIDS else OTHER_XIDS


def _ranked(info: xid_catalog.XidInfo) -> tuple[xid_catalog.XidInfo, tuple[int, int]]:
    return info, (SEVERITY_RANK[info.severity], _XID_ACTION_RANK[info.action])


@functools.lru_cache(maxsize=4096)
def _xid_info(name: str) -> tuple[xid_catalog.XidInfo, tuple[int, int]]:
    """A counted code's catalogue entry and how bad it is: its severity, then how much its action
    takes (a drain over a reset). OTHER_XIDS reads as an uncatalogued code. Cached: a burst looks
    its codes up at every XID."""
    if name == OTHER_XIDS:
        info = xid_catalog.lookup(-1)
    else:
        code, _, variant = name.partition(":")
        info = kernel_rules.variant_info(int(code), variant)
    return info, (SEVERITY_RANK[info.severity], _XID_ACTION_RANK[info.action])


@dataclass(frozen=True, slots=True)
class _XidBurst:
    """What an XID incident's counts say, read from every code it has had: the worst code, the
    severity rank, the total, and the codes the evidence lists (worst first, then most frequent,
    at most MAX_LISTED: every critical catalogued code fits, so none that drains is left out)."""

    worst: xid_catalog.XidInfo
    rank: int
    total: int
    listed: dict[str, int]

    @classmethod
    def of(cls, counts: dict[str, int]) -> _XidBurst:
        # each code as NVIDIA's multi-event workflows judge it among the burst's others (48 with
        # 63/64, 45 alone: xid_catalog.in_workflow)
        codes = frozenset(int(c.partition(":")[0]) for c in counts if c != OTHER_XIDS)
        named = [
            (c, n, *_ranked(xid_catalog.in_workflow(_xid_info(c)[0], codes)))
            for c, n in counts.items()
            if c != OTHER_XIDS
        ]
        # max() keeps the first of equals: among codes as bad as each other the first seen is worst
        worst = max(named, key=lambda x: x[3])[2] if named else _xid_info(OTHER_XIDS)[0]
        rank = SEVERITY_RANK[worst.severity]
        if OTHER_XIDS in counts:  # uncatalogued codes (or, from an older snapshot, any overflow)
            rank = max(rank, _xid_info(OTHER_XIDS)[1][0])
        order = sorted(range(len(named)), key=lambda i: (named[i][3], named[i][1], -i), reverse=True)
        listed = {named[i][0]: named[i][1] for i in order[:MAX_LISTED]}
        return cls(worst, rank, sum(counts.values()), listed)


def _port_entities(
    ports: PortMap,
    mrow: np.ndarray,
    names: Sequence[str],
    name_idx: np.ndarray,
    sel: np.ndarray,
    pos: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The entity of each list entry (`sel`, `pos` as _port_elements gives them; `mrow`: each
    message's node row): (sel, pos, entity rows), the entries a node past its cap of ports or
    interfaces names left out (detectors/port_map.py counts and logs them)."""
    if len(sel) == 0:
        return sel, pos, sel
    ent = ports.entities(mrow[pos], names, name_idx[sel])
    keep = ent >= 0
    if keep.all():
        return sel, pos, ent
    return sel[keep], pos[keep], ent[keep]


class _Names:
    """names[codes[i]] on demand: rules name the few ports they report, not every port."""

    __slots__ = ("codes", "names")

    def __init__(self, names: list[str], codes: np.ndarray) -> None:
        self.names, self.codes = names, codes

    def __getitem__(self, i: Any) -> str:
        return self.names[int(self.codes[i])]


class _Hits:
    """Turns one bad element into IncidentBook.observe(...) with the common fields filled in."""

    def __init__(
        self,
        det: HardwareDetector,
        ctx: SampleTimes,
        msg_pos: np.ndarray,
        gpu: np.ndarray | None,
        out: list[dict[str, Any]],
    ) -> None:
        self.det, self.ctx, self.msg_pos, self.gpu, self.out = det, ctx, msg_pos, gpu, out

    def __call__(
        self,
        i: int,
        kind: str,
        rule: str,
        severity: str,
        ratio: float,
        what: str,
        evidence: dict[str, Any],
        sustain: bool = False,
    ) -> None:
        ctx, cfg = self.ctx, self.det.cfg
        p = int(self.msg_pos[i])
        node, ts = ctx.names[int(ctx.mrow[p])], float(ctx.mts[p])
        gpu = None if self.gpu is None else int(self.gpu[i])
        if sustain:
            inc = self.det.book.get((node, gpu, None, kind, rule))
            if (
                inc is not None
                and ts - inc.first_seen >= cfg.sustained_s
                and ts - inc.last_bad < inc.clear_after
            ):
                severity = "critical"
                evidence = {**evidence, "sustained_s": round(ts - inc.first_seen, 3)}
        where = f"{node} GPU{gpu}" if gpu is not None else node
        self.out += self.det.book.observe(
            node=node,
            gpu=gpu,
            kind=kind,
            rule=rule,
            ts=ts,
            severity=severity,
            score=severity_score(severity, float(ratio)),
            summary=f"{where}: {what}",
            evidence=evidence,
            clear_after=cfg.clear_after_s,
            next_ts=ctx.next_ts,
        )
