"""Fault effects: how each fault kind (kinds.py) changes the cluster state tick by tick.

A fault lives on a tick grid: `begin()` at its onset tick (the sudden event, the first visible
sign of a gradual one), `apply()` on every tick from onset until it ends (modifiers and counter
growth), `finish()` at its end tick (undoing conditions such as a lost GPU). Truth timestamps are
those tick times, so "onset" is exactly when the signature first appears in telemetry.

A node is made unschedulable (`blocked`) only while a fault leaves it physically unable to run a
job: a lost GPU, a port down, the node down, an uncontained ECC error (GPU reset needed), or after
a gradual fault's hard failure. Other faults fail the running job and leave the node in service,
as a real scheduler would - taking such nodes out is the detectors' job.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from fleetwatch.collectors.sim import nvidia
from fleetwatch.collectors.sim.cluster import ClusterState
from fleetwatch.collectors.sim.kernel_log import gpu_pci, port_pci
from fleetwatch.collectors.sim.kinds import KindSpec
from fleetwatch.collectors.sim.scenario import FaultSpec

PENDING, ACTIVE, ENDED = "pending", "active", "ended"


def tick_of(seconds: float, dt: float) -> int:
    """Index of the first tick at or after `seconds` (ticks are at 0, dt, 2 dt, ...)."""
    return max(0, math.ceil(seconds / dt - 1e-9))


class Fault:
    """One injected fault. Subclasses override the hooks they need."""

    def __init__(self, fid: str, spec: FaultSpec, dt: float, rng: np.random.Generator) -> None:
        self.id = fid
        self.spec = spec
        self.kind: KindSpec = spec.spec
        self.node = spec.node
        self.gpu = spec.gpu
        self.params = dict(spec.params)
        self.rng = rng
        self.dt = dt
        self.onset_k = tick_of(spec.onset_s, dt)
        duration = self.params.get("duration_s")
        self.end_k: int | None = (
            None if duration is None else max(self.onset_k, tick_of(spec.onset_s + duration, dt))
        )
        self.failure_k: int | None = None
        self.status = PENDING
        self.onset_ts: float | None = None  # set by the simulation at the onset tick
        self.bound_job: str | None = None  # ends when this job stops (background stragglers)
        self.job: str | None = None  # job on the node at onset, reported in truth for stragglers

    def begin(self, st: ClusterState, k: int) -> None:
        """The onset tick: sudden events happen here."""

    def apply(self, st: ClusterState, k: int) -> None:
        """Every tick while active (including the onset tick)."""

    def finish(self, st: ClusterState, k: int) -> None:
        """The end tick: undo lasting conditions."""

    def truth_extra(self) -> dict[str, Any]:
        return {}


# ---------------------------------------------------------------- sudden


class LostGpu(Fault):
    """xid79 / xid119: the XID arrives with the last good sample; from the next tick on, NVML no
    longer reaches the GPU and telemetry carries only its index. Processes that used it hang in
    D state. PCIe replays often co-occur with XID 79 (Kokolis et al.)."""

    xid = nvidia.XID_FALLEN_OFF_BUS

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self._lost = False
        self._blocked = False
        if self.kind.name == "xid119":
            self.xid = nvidia.XID_GSP_RPC_TIMEOUT

    def begin(self, st: ClusterState, k: int) -> None:
        st.xid(self.node, self.gpu, self.xid)
        if self.kind.name == "xid79":
            st.pcie_replay[self.node, self.gpu] += int(self.params.get("pcie_burst", 0))
        st.fail_job_on(self.node)
        st.blocked[self.node] += 1
        self._blocked = True

    def apply(self, st: ClusterState, k: int) -> None:
        if k > self.onset_k and not self._lost:
            st.lost[self.node, self.gpu] += 1
            self._lost = True
        if self._lost:
            st.d_state_add[self.node] += 2

    def finish(self, st: ClusterState, k: int) -> None:
        if self._lost:
            st.lost[self.node, self.gpu] -= 1
        if self._blocked:
            st.blocked[self.node] -= 1


class EccError(Fault):
    """xid48 / xid94 / xid95: an uncorrectable ECC error, counted as a DBE, with its XID; the
    contained/uncontained ones (94/95) leave a row remap pending until the GPU is reset."""

    def begin(self, st: ClusterState, k: int) -> None:
        code = {
            "xid48": nvidia.XID_DOUBLE_BIT_ECC,
            "xid94": nvidia.XID_CONTAINED_ECC,
            "xid95": nvidia.XID_UNCONTAINED_ECC,
        }[self.kind.name]
        st.add_dbe(self.node, self.gpu)
        st.xid(self.node, self.gpu, code)
        if code != nvidia.XID_DOUBLE_BIT_ECC:
            st.remap_pending[self.node, self.gpu] += 1
        st.fail_job_on(self.node)
        if code == nvidia.XID_UNCONTAINED_ECC:
            st.blocked[self.node] += 1

    def finish(self, st: ClusterState, k: int) -> None:
        if self.kind.name == "xid95":
            st.blocked[self.node] -= 1


class IbLinkDown(Fault):
    def begin(self, st: ClusterState, k: int) -> None:
        port = self.params["port"]
        st.ib_down[self.node, port] += 1
        st.ib_downed[self.node, port] += 1
        st.fail_job_on(self.node)  # NCCL over a dead rail times out
        st.blocked[self.node] += 1

    def finish(self, st: ClusterState, k: int) -> None:
        st.ib_down[self.node, self.params["port"]] -= 1
        st.blocked[self.node] -= 1

    def truth_extra(self) -> dict[str, Any]:
        return {"port": self.params["port"]}


class NodeDown(Fault):
    def begin(self, st: ClusterState, k: int) -> None:
        st.silent[self.node] += 1
        st.blocked[self.node] += 1
        st.fail_job_on(self.node)

    def finish(self, st: ClusterState, k: int) -> None:
        st.silent[self.node] -= 1
        st.blocked[self.node] -= 1


class SoftwareCrash(Fault):
    """An application bug: one XID 13 and a failed job, nothing wrong with the node. Instantaneous."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.end_k = self.onset_k

    def begin(self, st: ClusterState, k: int) -> None:
        st.xid(self.node, self.gpu, nvidia.XID_GRAPHICS_ENGINE_EXCEPTION)
        st.fail_job_on(self.node)


class KernelLogFault(Fault):
    """A fault only the kernel log shows in full (collectors/sim/kernel_log.py): logged at onset;
    it fails the running job and, but for kmsg_overrun, keeps the node out of service until it
    ends. fallen_off_bus also loses the GPU from the next tick, as a real one does."""

    SXID_TEXT = "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 62 LTSSM Fault Up"

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self._blocked = self._lost = False
        if self.kind.name == "kmsg_overrun":
            self.end_k = self.onset_k

    def begin(self, st: ClusterState, k: int) -> None:
        log, name = st.kernel_log, self.kind.name
        if name == "kmsg_overrun":
            log.lost_records(self.node, int(self.params["records"]))
            return
        if name == "nvswitch_fatal":
            log.event(
                self.node,
                {"kind": "sxid", "code": 20034, "pci": "0000:05:00.0", "severity": "fatal", "link": 62,
                 "switch": 0, "text": self.SXID_TEXT},
            )  # fmt: skip
        elif name == "pcie_aer_fatal":
            port = port_pci(self.gpu)
            log.event(
                self.node,
                {"kind": "aer", "pci": port, "port": port, "gpu": self.gpu, "severity": "fatal",
                 "error_type": "Transaction Layer",
                 "text": f"pcieport {port}: AER: Uncorrected (Fatal) error received: {port}"},
            )  # fmt: skip
        elif name == "fallen_off_bus":
            pci = gpu_pci(self.gpu)
            log.event(
                self.node,
                {
                    "kind": "fallen_off_bus",
                    "pci": pci,
                    "gpu": self.gpu,
                    "text": f"NVRM: The NVIDIA GPU {pci}",
                },
            )
        elif name == "nvlink5_fatal":
            st.xid(self.node, self.gpu, 149, what="NETIR_LINK_EVT  Fatal   XC0 i0 Link 01", severity="fatal",
                   link=1, unit="XC0")  # fmt: skip
        st.fail_job_on(self.node)
        st.blocked[self.node] += 1
        self._blocked = True

    def apply(self, st: ClusterState, k: int) -> None:
        if self.kind.name == "fallen_off_bus" and k > self.onset_k and not self._lost:
            st.lost[self.node, self.gpu] += 1
            self._lost = True

    def finish(self, st: ClusterState, k: int) -> None:
        if self._lost:
            st.lost[self.node, self.gpu] -= 1
        if self._blocked:
            st.blocked[self.node] -= 1


class NodeCheckFault(Fault):
    """What the node checks see (detectors/node_checks.py): a required mount that hangs, a block
    device switched read-only, a GPU link retrained narrower, an HCA gone from the device list,
    processes stuck in D state. Each holds from onset until the fault ends."""

    def begin(self, st: ClusterState, k: int) -> None:
        name, node = self.kind.name, self.node
        if name == "mount_hung":  # the job hangs on its I/O rather than failing (no exit yet)
            st.mounts_hung[node] += 1
        elif name == "blockdev_readonly":
            st.blockdevs_readonly[node] += 1
        elif name == "pcie_downtrain":
            st.gpu_link_width[node, self.gpu] = int(self.params["width"])
        elif name == "hca_missing":
            st.hca_gone[node, -1] += 1
            st.fail_job_on(node)

    def apply(self, st: ClusterState, k: int) -> None:
        name, node = self.kind.name, self.node
        if name == "mount_hung":  # every process touching /lustre blocks in the kernel
            st.d_state_add[node] += 12
        elif name == "d_state_stuck":
            st.d_state_add[node] += int(self.params["procs"])
        elif name == "pcie_downtrain":  # half the link: host-device copies take longer
            st.slow[node, self.gpu] *= 1.03

    def finish(self, st: ClusterState, k: int) -> None:
        name, node = self.kind.name, self.node
        if name == "mount_hung":
            st.mounts_hung[node] -= 1
        elif name == "blockdev_readonly":
            st.blockdevs_readonly[node] -= 1
        elif name == "pcie_downtrain":
            st.gpu_link_width[node, self.gpu] = st.gpu_link_width.max()
        elif name == "hca_missing":
            st.hca_gone[node, -1] -= 1


class LinkFlapping(Fault):
    """ib_link_flapping / eth_flapping: the link drops and retrains every `interval_s` or so (the
    first at onset), too briefly for a sample to see it down: only its counter says so."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self._next_k = self.onset_k

    def apply(self, st: ClusterState, k: int) -> None:
        if k < self._next_k:
            return
        if self.kind.name == "ib_link_flapping":
            st.ib_link_recovery[self.node, int(self.params["port"]) % st.n_ports] += 1
        else:
            st.eth_carrier_changes[self.node] += 2  # a down, then an up
        gap = self.rng.exponential(self.params["interval_s"])
        self._next_k = k + max(1, round(gap / self.dt))


# ---------------------------------------------------------------- gradual


class Gradual(Fault):
    """Growth from onset to failure_ts (`ramp_s`), then a hard failure that fails the job and takes
    the node out of service until the fault ends (`duration_s` from onset; default: never)."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        ramp_k = max(1, round(self.params["ramp_s"] / self.dt))
        self.ramp_k = ramp_k
        if self.params["fail"]:
            self.failure_k = self.onset_k + ramp_k
        self._failed = False
        self._blocked = False

    def progress(self, k: int) -> float:
        """0 at onset, 1 at the end of the ramp."""
        return min(1.0, (k - self.onset_k) / self.ramp_k)

    def rate(self, k: int) -> float:
        f = self.progress(k)
        return self.params["rate_start"] + (self.params["rate_end"] - self.params["rate_start"]) * f

    def errors(self, k: int) -> int:
        """Poisson error count this tick; at least one on the onset tick so that onset is visible."""
        n = int(self.rng.poisson(self.rate(k) * self.dt))
        return max(n, 1) if k == self.onset_k else n

    def apply(self, st: ClusterState, k: int) -> None:
        if self.failure_k is not None and k >= self.failure_k:
            if not self._failed:
                self._failed = True
                self.fail(st, k)
                st.fail_job_on(self.node)
                st.blocked[self.node] += 1
                self._blocked = True
            self.after_failure(st, k)
        else:
            self.grow(st, k)

    def grow(self, st: ClusterState, k: int) -> None:
        raise NotImplementedError

    def fail(self, st: ClusterState, k: int) -> None:
        raise NotImplementedError

    def after_failure(self, st: ClusterState, k: int) -> None:
        """Lasting state after the failure (default: none beyond being out of service)."""

    def finish(self, st: ClusterState, k: int) -> None:
        if self._blocked:
            st.blocked[self.node] -= 1


class DiskFull(Gradual):
    """Used space climbs from where it was to 99.5% at failure_ts; then the node is out of service
    (jobs cannot write) until the fault ends."""

    def begin(self, st: ClusterState, k: int) -> None:
        self._from = float(st.disk[self.node])

    def grow(self, st: ClusterState, k: int) -> None:
        st.disk[self.node] = self._from + (0.995 - self._from) * self.progress(k)

    def fail(self, st: ClusterState, k: int) -> None:
        st.disk[self.node] = 0.995


class EccSbeRising(Gradual):
    def grow(self, st: ClusterState, k: int) -> None:
        st.add_sbe(self.node, self.gpu, self.errors(k))

    def fail(self, st: ClusterState, k: int) -> None:
        st.add_dbe(self.node, self.gpu)
        st.xid(self.node, self.gpu, nvidia.XID_DOUBLE_BIT_ECC)
        st.remap_pending[self.node, self.gpu] += 1


class RowRemapPending(Gradual):
    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        # The first remap lands on the onset tick, the rest spread over the ramp with some jitter.
        n = self.params["remaps"]
        offsets = np.sort(self.rng.uniform(0, self.ramp_k, n - 1)).astype(int) if n > 1 else np.array([], int)
        self._remap_ticks = [self.onset_k, *(self.onset_k + int(o) for o in offsets)]

    def grow(self, st: ClusterState, k: int) -> None:
        for _ in range(self._remap_ticks.count(k)):
            st.remap_pending[self.node, self.gpu] += 1
            st.add_sbe(self.node, self.gpu, int(self.rng.integers(1, 4)))  # the errors that triggered it
            st.xid(self.node, self.gpu, nvidia.XID_ROW_REMAP_EVENT)

    def fail(self, st: ClusterState, k: int) -> None:
        st.remap_failure[self.node, self.gpu] += 1
        st.add_dbe(self.node, self.gpu)
        st.xid(self.node, self.gpu, nvidia.XID_ROW_REMAP_FAILURE)


class NvlinkCrc(Gradual):
    def grow(self, st: ClusterState, k: int) -> None:
        st.nvlink_crc[self.node, self.gpu] += self.errors(k)
        st.nvlink_replay[self.node, self.gpu] += int(self.rng.poisson(0.1 * self.rate(k) * self.dt))

    def fail(self, st: ClusterState, k: int) -> None:
        st.xid(self.node, self.gpu, nvidia.XID_NVLINK_ERROR)
        st.nvlink_replay[self.node, self.gpu] += 1


class _EndsLost(Gradual):
    """Gradual faults whose failure is the GPU dropping off the bus (XID 79)."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self._lost = False

    def fail(self, st: ClusterState, k: int) -> None:
        st.xid(self.node, self.gpu, nvidia.XID_FALLEN_OFF_BUS)

    def after_failure(self, st: ClusterState, k: int) -> None:
        if k > self.failure_k and not self._lost:  # type: ignore[operator]
            st.lost[self.node, self.gpu] += 1
            self._lost = True
        if self._lost:
            st.d_state_add[self.node] += 2

    def finish(self, st: ClusterState, k: int) -> None:
        super().finish(st, k)
        if self._lost:
            st.lost[self.node, self.gpu] -= 1


class PcieReplay(_EndsLost):
    def grow(self, st: ClusterState, k: int) -> None:
        st.pcie_replay[self.node, self.gpu] += self.errors(k)


class Thermal(_EndsLost):
    """A failing fan or cold plate: the temperature climbs linearly to `peak_c` at failure_ts.
    Above 85 C the driver slows clocks (SW thermal), above 90 C the hardware does (HW thermal +
    HW slowdown); the lower SM clock makes this node its job's straggler. At the peak the GPU shuts
    down (XID 79)."""

    SW_THRESHOLD_C = 85.0
    HW_THRESHOLD_C = 90.0

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self._base: float | None = None

    def grow(self, st: ClusterState, k: int) -> None:
        if self._base is None:
            self._base = float(st.temp_state[self.node, self.gpu])
        add = self.progress(k) * max(0.0, self.params["peak_c"] - self._base)
        st.temp_add[self.node, self.gpu] += add
        temp = float(st.temp_state[self.node, self.gpu]) + add
        if temp >= self.SW_THRESHOLD_C - 2:
            # Clock falls from max at 83 C to 55% of max at 95 C.
            frac = max(0.55, 1.0 - 0.45 * (temp - (self.SW_THRESHOLD_C - 2)) / 12.0)
            cap = st.hw.max_sm_clock_mhz * frac
            st.clock_cap[self.node, self.gpu] = min(st.clock_cap[self.node, self.gpu], cap)
        if temp >= self.SW_THRESHOLD_C:
            st.throttle_or[self.node, self.gpu] |= nvidia.THROTTLE_SW_THERMAL
        if temp >= self.HW_THRESHOLD_C:
            st.throttle_or[self.node, self.gpu] |= nvidia.THROTTLE_HW_THERMAL | nvidia.THROTTLE_HW_SLOWDOWN

    def fail(self, st: ClusterState, k: int) -> None:
        super().fail(st, k)
        st.temp_add[self.node, self.gpu] += max(
            0.0, self.params["peak_c"] - float(st.temp_state[self.node, self.gpu])
        )


class IbSymbolErrors(Gradual):
    def grow(self, st: ClusterState, k: int) -> None:
        port = self.params["port"]
        st.ib_symbol[self.node, port] += self.errors(k)
        st.ib_rcv_err[self.node, port] += int(self.rng.poisson(0.2 * self.rate(k) * self.dt))

    def fail(self, st: ClusterState, k: int) -> None:
        port = self.params["port"]
        st.ib_down[self.node, port] += 1
        st.ib_downed[self.node, port] += 1

    def finish(self, st: ClusterState, k: int) -> None:
        super().finish(st, k)
        if self._failed:
            st.ib_down[self.node, self.params["port"]] -= 1

    def truth_extra(self) -> dict[str, Any]:
        return {"port": self.params["port"]}


# ---------------------------------------------------------------- straggler and lemon


class Straggler(Fault):
    """The node computes each step `slowdown` slower. cause=none: nothing in its telemetry says why
    (only that it never waits while its peers do); thermal/power: one GPU's SM clock is capped at
    max/(1+slowdown) and its throttle reasons say why (SW thermal 0x20 / HW power brake 0x80)."""

    def apply(self, st: ClusterState, k: int) -> None:
        s = 1.0 + self.params["slowdown"]
        cause = self.params["cause"]
        if cause == "none":
            st.slow[self.node, :] *= s
            return
        g = self.gpu
        st.clock_cap[self.node, g] = min(st.clock_cap[self.node, g], st.hw.max_sm_clock_mhz / s)
        if cause == "thermal":
            st.temp_add[self.node, g] += 8.0
            st.throttle_or[self.node, g] |= nvidia.THROTTLE_SW_THERMAL
        else:
            st.power_scale[self.node, g] *= 0.85
            st.throttle_or[self.node, g] |= nvidia.THROTTLE_HW_POWER_BRAKE

    def truth_extra(self) -> dict[str, Any]:
        extra: dict[str, Any] = {"slowdown": self.params["slowdown"], "cause": self.params["cause"]}
        if self.job is not None:
            extra["job"] = self.job
        return extra


class Lemon(Fault):
    """Short incidents at `incident_interval_s` mean spacing (the first at onset): an XID on a random
    GPU that fails the running job. The node stays in service, so it keeps failing new jobs."""

    XIDS = (
        nvidia.XID_GRAPHICS_ENGINE_EXCEPTION,
        nvidia.XID_GPU_MEMORY_PAGE_FAULT,
        nvidia.XID_GPU_STOPPED_PROCESSING,
        nvidia.XID_CONTAINED_ECC,
    )

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self._next_k = self.onset_k
        self.incidents = 0

    def apply(self, st: ClusterState, k: int) -> None:
        if k < self._next_k:
            return
        g = int(self.rng.integers(0, st.n_gpus))
        code = int(self.rng.choice(self.XIDS))
        st.xid(self.node, g, code)
        if code == nvidia.XID_CONTAINED_ECC:
            st.add_dbe(self.node, g)
        st.fail_job_on(self.node)
        self.incidents += 1
        gap = max(self.rng.exponential(self.params["incident_interval_s"]), self.params.get("min_gap_s", 0.0))
        self._next_k = k + max(1, round(gap / self.dt))


_CLASSES: dict[str, type[Fault]] = {
    "xid79": LostGpu,
    "xid119": LostGpu,
    "xid48": EccError,
    "xid94": EccError,
    "xid95": EccError,
    "ib_link_down": IbLinkDown,
    "node_down": NodeDown,
    "sw_crash": SoftwareCrash,
    "nvswitch_fatal": KernelLogFault,
    "pcie_aer_fatal": KernelLogFault,
    "fallen_off_bus": KernelLogFault,
    "nvlink5_fatal": KernelLogFault,
    "kmsg_overrun": KernelLogFault,
    "mount_hung": NodeCheckFault,
    "blockdev_readonly": NodeCheckFault,
    "pcie_downtrain": NodeCheckFault,
    "hca_missing": NodeCheckFault,
    "d_state_stuck": NodeCheckFault,
    "disk_full": DiskFull,
    "ib_link_flapping": LinkFlapping,
    "eth_flapping": LinkFlapping,
    "ecc_sbe_rising": EccSbeRising,
    "row_remap_pending": RowRemapPending,
    "nvlink_crc": NvlinkCrc,
    "pcie_replay": PcieReplay,
    "thermal": Thermal,
    "ib_symbol_errors": IbSymbolErrors,
    "straggler": Straggler,
    "lemon": Lemon,
}


def make_fault(fid: str, spec: FaultSpec, dt: float, rng: np.random.Generator) -> Fault:
    return _CLASSES[spec.kind](fid, spec, dt, rng)
