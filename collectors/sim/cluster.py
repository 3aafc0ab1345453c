"""Node and GPU state of the simulated cluster: healthy dynamics and telemetry/1 messages.

All state is numpy arrays shaped (nodes, gpus) or (nodes, ports), advanced once per tick with
whole-array operations; message dicts are built only at the end of a tick. Faults do not own
any state: each tick they write "modifiers" (temperature offsets, clock caps, throttle bits,
slowdowns) and bump counters here, and the healthy model folds the modifiers in.

The healthy noise draws a fixed number of random values per tick from its own generator,
whatever the jobs and faults do, so two runs of one seed that differ only in an injected fault
have identical healthy noise: a fault's signature is the only difference between them.
"""

from __future__ import annotations

import uuid
from typing import Any

import numpy as np

from fleetwatch import schemas
from fleetwatch.collectors.sim import nvidia
from fleetwatch.collectors.sim.kernel_log import SimKernelLog
from fleetwatch.collectors.sim.scenario import Scenario

# Node activity phases, set by the scheduler.
IDLE, STARTUP, TRAIN, CHECKPOINT = 0, 1, 2, 3

_UUID_NS = uuid.UUID("6f1c7b0e-5a4f-4c39-9d0c-3f6f2f1d9a11")  # fixed: GPU UUIDs stable across runs

# Healthy rare events, per GPU (or port) per second. Low enough to be background, high enough that
# a 5-minute 32-node demo sees an occasional harmless one, as real fleets do.
SBE_RATE = 2e-5
NVLINK_CRC_RATE = 1e-5
PCIE_REPLAY_RATE = 1e-5
IB_SYMBOL_RATE = 2e-6
IB_DISCARD_RATE = 2e-5
ETH_DROP_RATE = 1e-4
BENIGN_POWER_CAP_P = 0.06  # share of busy GPU-samples at the power limit (SW power cap, clock -15..60 MHz)
BENIGN_DIP_P = 0.002  # per node per tick: a 1-3 tick util dip (data loader stall, GC pause)
TEMP_TAU_S = 25.0  # thermal time constant of a GPU and its heat sink
PCIE_GEN, PCIE_WIDTH = 5, 16  # H100 SXM and ConnectX-7: PCIe Gen5 x16
IDLE_PCIE_GEN = 1  # an idle GPU lowers its link to Gen1 to save power (nvidia-smi -q shows it)
REQUIRED_MOUNTS = (("/home", "nfs4"), ("/lustre", "lustre"))


class ClusterState:
    """Everything a telemetry/1 message reports, for every node at once."""

    def __init__(self, sc: Scenario, rng: np.random.Generator) -> None:
        hw = sc.hardware
        self.sc = sc
        self.hw = hw
        self.rng = rng
        n, g, p = sc.nodes, sc.gpus_per_node, hw.ib_ports
        self.n_nodes, self.n_gpus, self.n_ports = n, g, p
        self.names = [sc.node_name(i) for i in range(n)]
        self.uuids = [[f"GPU-{uuid.uuid5(_UUID_NS, f'{name}/{j}')}" for j in range(g)] for name in self.names]

        # Static personality: chips and slots differ a little (cooling position, silicon power).
        self.temp_offset = rng.normal(0.0, 2.0, (n, g)) + rng.normal(0.0, 1.0, (n, 1))
        self.power_eff = rng.normal(1.0, 0.012, (n, g))
        self.mem_ratio = rng.uniform(0.35, 0.55, (n, g))  # memory-bandwidth util per unit of SM util
        self.mem_level = rng.uniform(0.70, 0.92, (n, g))  # HBM share a job uses; redrawn per job

        # Dynamic gauges.
        # Start warm: the cluster was busy before simulated second 0, as a real one would be.
        self.temp_state = 27.0 + self.temp_offset + 0.06 * 0.95 * hw.tdp_w
        self.dip_left = np.zeros(n, np.int64)
        self.disk = rng.uniform(0.30, 0.60, n)
        self.prev_phase = np.zeros(n, np.int8)

        # Raw cumulative counters. Lifetime aggregates start where a node with some uptime would be.
        i64 = np.int64
        self.sbe_vol = np.zeros((n, g), i64)
        self.sbe_agg = rng.poisson(2.0, (n, g)).astype(i64)
        self.dbe_vol = np.zeros((n, g), i64)
        self.dbe_agg = np.zeros((n, g), i64)
        self.retired = np.zeros((n, g), i64)  # H100 remaps rows instead of retiring pages
        self.remap_pending = np.zeros((n, g), i64)
        self.remap_failure = np.zeros((n, g), i64)
        self.nvlink_crc = rng.poisson(1.0, (n, g)).astype(i64)
        self.nvlink_replay = np.zeros((n, g), i64)
        self.pcie_replay = rng.poisson(0.5, (n, g)).astype(i64)
        self.ib_symbol = rng.poisson(0.3, (n, p)).astype(i64)
        self.ib_downed = np.zeros((n, p), i64)
        self.ib_rcv_err = np.zeros((n, p), i64)
        self.ib_discards = rng.poisson(3.0, (n, p)).astype(i64)
        uptime = rng.uniform(1.0, 30.0, (n, 1)) * 86_400.0  # days of traffic already counted
        self.ib_tx = (uptime * hw.ib_rate_gbps * 1.25e8 * 0.2 * rng.uniform(0.9, 1.1, (n, p))).astype(i64)
        self.ib_rx = (self.ib_tx * rng.uniform(0.98, 1.02, (n, p))).astype(i64)
        self.eth_rx = (uptime[:, 0] * 2e6).astype(i64)
        self.eth_tx = (uptime[:, 0] * 5e5).astype(i64)
        self.eth_drop = np.zeros(n, i64)

        # Conditions set by faults; counts, so that overlapping faults undo only their own part.
        self.lost = np.zeros((n, g), np.int64)  # GPU unreachable: telemetry carries only its index
        # The node checks (collectors/mounts.py, blockdevs.py, nvml.py, net.py): a site that requires
        # its two shared mounts (/home on NFS, /lustre) and its local NVMe; H100 SXM GPUs and
        # ConnectX-7 HCAs, both PCIe Gen5 x16
        self.mounts_hung = np.zeros(n, np.int64)  # required mounts not answering
        self.blockdevs_readonly = np.zeros(n, np.int64)
        # inodes in use follow the space in use (no draw from rng: every later draw, and so every
        # stream a seed gave before, stays what it was)
        self.inodes = 0.4 * self.disk
        self.gpu_link_width = np.full((n, g), PCIE_WIDTH, np.int64)
        self.hca_gone = np.zeros((n, p), np.int64)  # an HCA the node no longer lists
        self.ib_link_recovery = np.zeros((n, p), np.int64)  # the link retrained (PortCounters)
        self.eth_carrier_changes = np.full(n, 2, np.int64)  # a boot's first down and up
        self.silent = np.zeros(n, np.int64)  # node sends nothing
        self.blocked = np.zeros(n, np.int64)  # the scheduler cannot place work here
        self.ib_down = np.zeros((n, p), np.int64)

        # Per-tick modifiers and events, cleared by begin_tick().
        self.temp_add = np.zeros((n, g))
        self.clock_cap = np.full((n, g), float(hw.max_sm_clock_mhz))
        self.throttle_or = np.zeros((n, g), np.int64)
        self.slow = np.ones((n, g))  # compute-time multiplier not explained by clocks
        self.power_scale = np.ones((n, g))
        self.cpu_add = np.zeros(n)
        self.d_state_add = np.zeros(n, np.int64)
        self.xids: dict[tuple[int, int], list[int]] = {}
        self.kernel_log = SimKernelLog(self.names)  # what each node's kernel log says this tick
        self.fail_requests: set[int] = set()

        # Results of the last evolve(), used by telemetry().
        self._readings: dict[str, Any] = {}

    # ------------------------------------------------------------ used by faults

    def begin_tick(self) -> None:
        self.temp_add.fill(0.0)
        self.clock_cap.fill(float(self.hw.max_sm_clock_mhz))
        self.throttle_or.fill(0)
        self.slow.fill(1.0)
        self.power_scale.fill(1.0)
        self.cpu_add.fill(0.0)
        self.d_state_add.fill(0)
        self.xids = {}
        self.kernel_log.begin_tick()
        self.fail_requests = set()

    def xid(self, node: int, gpu: int, code: int, nvml: bool = True, **line: Any) -> None:
        """An XID: an NVML event (unless `nvml` is False: NVML missed it) and a kernel-log line,
        which says `line` beyond the code (e.g. severity="fatal", link=1 for an NVLink5 XID)."""
        if nvml:
            self.xids.setdefault((node, gpu), []).append(code)
        self.kernel_log.xid(node, gpu, code, **line)

    def add_sbe(self, node: int, gpu: int, k: int) -> None:
        self.sbe_vol[node, gpu] += k
        self.sbe_agg[node, gpu] += k

    def add_dbe(self, node: int, gpu: int, k: int = 1) -> None:
        self.dbe_vol[node, gpu] += k
        self.dbe_agg[node, gpu] += k

    def fail_job_on(self, node: int) -> None:
        """Ask the scheduler to fail whatever job runs on `node` this tick."""
        self.fail_requests.add(node)

    def node_slowdown(self) -> np.ndarray:
        """(nodes,) compute-time multiplier: a node is as slow as its slowest GPU (intra-node sync)."""
        per_gpu = self.slow * (self.hw.max_sm_clock_mhz / self.clock_cap)
        return per_gpu.max(axis=1)

    def unavailable(self) -> np.ndarray:
        return (self.blocked > 0) | (self.silent > 0)

    # ------------------------------------------------------------ healthy dynamics

    def evolve(self, dt: float, phase: np.ndarray, pace: np.ndarray) -> None:
        """Advance gauges and counters by one tick.

        phase: (nodes,) IDLE/STARTUP/TRAIN/CHECKPOINT; pace: (nodes,) the node's job iteration time
        as a multiple of the nominal one (its slowest rank), so a rank that computes for less than
        the iteration waits for the rest, at lower util and power.
        """
        hw, rng = self.hw, self.rng
        n, g, p = self.n_nodes, self.n_gpus, self.n_ports
        # Fixed-size draws every tick (see the module docstring).
        z_util = rng.standard_normal((n, g))
        u_eff = rng.random((n, g))
        z_power = rng.standard_normal((n, g))
        z_temp = rng.standard_normal((n, g))
        u_cap = rng.random((n, g))
        u_rare = rng.random((n, g, 2))
        u_mem = rng.uniform(0.70, 0.92, (n, g))
        u_ib = rng.random((n, p, 3))
        u_node = rng.random((n, 4))
        z_host = rng.standard_normal((n, 3))

        active = phase != IDLE
        act2 = active[:, None]
        started = active & (self.prev_phase == IDLE)
        self.mem_level[started] = u_mem[started]
        self.prev_phase = phase.copy()

        # Benign node dips: a data-loader stall or GC pause, 1-3 ticks of lower util.
        start_dip = (u_node[:, 0] < BENIGN_DIP_P) & (phase == TRAIN) & (self.dip_left == 0)
        self.dip_left[start_dip] = 1 + (u_node[start_dip, 0] / BENIGN_DIP_P * 3).astype(np.int64)
        dip = self.dip_left > 0
        self.dip_left[dip] -= 1

        slow_eff = self.slow * (hw.max_sm_clock_mhz / self.clock_cap)
        busy = np.zeros((n, g))
        train = phase == TRAIN
        busy[train] = slow_eff[train] / pace[train, None]
        busy[phase == STARTUP] = 0.30
        busy[phase == CHECKPOINT] = 0.12
        busy[dip] *= 0.7
        busy = np.clip(busy * (0.95 + 0.05 * u_eff), 0.0, 1.0)

        # SM clock and throttle reasons.
        cap_event = act2 & (u_cap < BENIGN_POWER_CAP_P) & (busy > 0.8)
        clock = np.where(act2, float(hw.max_sm_clock_mhz), float(hw.idle_sm_clock_mhz))
        clock = clock - np.where(cap_event, 15.0 + 45.0 * u_cap / BENIGN_POWER_CAP_P, 0.0)
        clock = np.where(act2, np.minimum(clock, self.clock_cap), clock)
        throttle = np.where(act2, 0, nvidia.THROTTLE_GPU_IDLE) | np.where(
            cap_event, nvidia.THROTTLE_SW_POWER_CAP, 0
        )
        throttle = throttle | self.throttle_or

        util = np.where(act2, np.clip(np.rint(100.0 * busy + 1.2 * z_util), 0, 100), 0.0)
        mem_util = np.clip(np.rint(util * self.mem_ratio + 0.8 * z_util), 0, 100)
        mem_used = np.where(act2, np.rint(self.mem_level * hw.mem_total_mib + 40.0 * z_temp), 0.0)

        span = 0.97 * hw.tdp_w - hw.idle_power_w
        power = hw.idle_power_w + span * busy * (clock / hw.max_sm_clock_mhz) * self.power_eff
        power = np.where(act2, power + 10.0 * z_power, hw.idle_power_w * self.power_eff + 2.0 * z_power)
        power = np.where(cap_event, hw.tdp_w * (0.985 + 0.012 * u_eff), power) * self.power_scale
        power = np.clip(power, 0.8 * hw.idle_power_w, hw.tdp_w)

        # First-order thermal response towards a power-dependent equilibrium.
        target = 27.0 + self.temp_offset + 0.06 * power
        self.temp_state += (target - self.temp_state) * (1.0 - np.exp(-dt / TEMP_TAU_S))
        temp = np.rint(self.temp_state + self.temp_add + 0.4 * z_temp)

        # Counters. Lost GPUs and down ports count nothing.
        ok = self.lost == 0
        sbe = (u_rare[..., 0] < SBE_RATE * dt) & ok
        self.sbe_vol += sbe
        self.sbe_agg += sbe
        self.nvlink_crc += (u_rare[..., 1] < NVLINK_CRC_RATE * dt) & ok
        self.pcie_replay += (np.abs(u_rare[..., 1] - 0.5) < PCIE_REPLAY_RATE * dt / 2) & ok

        up = self.ib_down == 0
        link_busy = np.where(active, 0.20 + 0.25 * busy.mean(axis=1), 0.0005)[:, None]
        ib_bytes = hw.ib_rate_gbps * 1.25e8 * dt * link_busy * (0.85 + 0.3 * u_ib[..., 0])
        self.ib_tx += (ib_bytes * up).astype(np.int64)
        self.ib_rx += (ib_bytes * (0.99 + 0.02 * u_ib[..., 1]) * up).astype(np.int64)
        self.ib_symbol += (u_ib[..., 2] < IB_SYMBOL_RATE * dt) & up
        self.ib_discards += (np.abs(u_ib[..., 2] - 0.5) < IB_DISCARD_RATE * dt / 2) & up
        eth = np.where(active, 1.5e7, 2e5) * dt * (0.7 + 0.6 * u_node[:, 1])
        self.eth_rx += eth.astype(np.int64)
        self.eth_tx += (eth * 0.25).astype(np.int64)
        self.eth_drop += u_node[:, 2] < ETH_DROP_RATE * dt

        # Host: data loading keeps CPUs busy in training; checkpoints write to disk (D-state procs).
        ckpt = phase == CHECKPOINT
        base_cpu = np.select([train, phase == STARTUP, ckpt], [30.0, 55.0, 40.0], 2.0)
        cpu = np.clip(base_cpu + np.where(active, 6.0, 0.8) * np.abs(z_host[:, 0]) + self.cpu_add, 0.0, 100.0)
        mem_frac = np.clip(
            np.where(active, 0.45, 0.08) + np.where(active, 0.02, 0.005) * z_host[:, 1], 0.01, 0.99
        )
        # checkpoints fill the disk slowly, never past 98% by themselves (a disk_full fault does)
        self.disk = np.minimum(self.disk + np.where(ckpt, 2e-5 * dt, 0.0), np.maximum(self.disk, 0.98))
        d_state = (
            (ckpt & (u_node[:, 3] < 0.4)).astype(np.int64) + (ckpt & (u_node[:, 3] < 0.1)) + self.d_state_add
        )
        load1 = np.maximum(cpu / 100.0 * hw.cpus * 0.5 + d_state + 0.3 * z_host[:, 2], 0.0)

        self._readings = {
            "util": util.astype(np.int64).tolist(),
            "util_raw": util,  # (nodes, gpus) for the PCIe link's idle downshift
            "mem_util": mem_util.astype(np.int64).tolist(),
            "mem_used": mem_used.astype(np.int64).tolist(),
            "temp": temp.astype(np.int64).tolist(),
            "power": np.round(power, 1).tolist(),
            "clock": np.rint(clock).astype(np.int64).tolist(),
            "throttle": throttle.astype(np.int64).tolist(),
            "cpu": np.round(cpu, 1).tolist(),
            "mem_frac": np.round(mem_frac, 3).tolist(),
            "load1": np.round(load1, 2).tolist(),
            "disk": np.round(self.disk, 4).tolist(),
            "d_state": d_state.tolist(),
        }

    # ------------------------------------------------------------ messages

    def _checks(self, node: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.mounts_hung[node]:
            out["mounts"] = [
                {"path": path, "problem": "hung", "fstype": fstype, "took_s": 12.0}
                for path, fstype in REQUIRED_MOUNTS[-int(self.mounts_hung[node]) :]
            ]
        if self.blockdevs_readonly[node]:
            out["blockdevs"] = [{"name": "nvme0n1", "problem": "readonly"}]
        return out

    def telemetry(self, ts: float, seq: int) -> list[tuple[str, dict[str, Any]]]:
        """(node, telemetry/1 dict) for every node that reports this tick (silent nodes do not)."""
        r = self._readings
        util, mem_util, mem_used, temp = r["util"], r["mem_util"], r["mem_used"], r["temp"]
        power, clock, throttle = r["power"], r["clock"], r["throttle"]
        sbe_v, sbe_a = self.sbe_vol.tolist(), self.sbe_agg.tolist()
        dbe_v, dbe_a = self.dbe_vol.tolist(), self.dbe_agg.tolist()
        retired, pend, fail = self.retired.tolist(), self.remap_pending.tolist(), self.remap_failure.tolist()
        crc, replay, pcie = self.nvlink_crc.tolist(), self.nvlink_replay.tolist(), self.pcie_replay.tolist()
        lost = (self.lost > 0).tolist()
        link_gen = np.where(r["util_raw"] >= 10, PCIE_GEN, IDLE_PCIE_GEN).tolist()
        link_width = self.gpu_link_width.tolist()
        hca_listed = (self.hca_gone == 0).tolist()
        mounts_hung, ro = self.mounts_hung.tolist(), self.blockdevs_readonly.tolist()
        inodes = np.round(self.inodes, 4).tolist()
        silent = (self.silent > 0).tolist()
        ib_up = (self.ib_down == 0).tolist()
        sym, downed, rcv = self.ib_symbol.tolist(), self.ib_downed.tolist(), self.ib_rcv_err.tolist()
        disc, tx, rx = self.ib_discards.tolist(), self.ib_tx.tolist(), self.ib_rx.tolist()
        erx, etx, edrop = self.eth_rx.tolist(), self.eth_tx.tolist(), self.eth_drop.tolist()
        recovery, carrier = self.ib_link_recovery.tolist(), self.eth_carrier_changes.tolist()
        cpu, mem_frac, load1, disk, d_state = r["cpu"], r["mem_frac"], r["load1"], r["disk"], r["d_state"]
        rate = self.hw.ib_rate_gbps
        links = self.hw.nvlinks
        xids = self.xids
        devices = [f"mlx5_{j}" for j in range(self.n_ports)]
        out: list[tuple[str, dict[str, Any]]] = []
        gpu_idx = range(self.n_gpus)
        for i, name in enumerate(self.names):
            if silent[i]:
                continue
            # Row locals: one index per field per GPU instead of two (this loop is the hot path).
            rows = zip(
                gpu_idx, self.uuids[i], util[i], mem_util[i], mem_used[i], temp[i], power[i], clock[i],
                throttle[i], sbe_v[i], dbe_v[i], sbe_a[i], dbe_a[i], retired[i], pend[i], fail[i],
                crc[i], replay[i], pcie[i], lost[i], link_gen[i], link_width[i], strict=True,
            )  # fmt: skip
            gpus: list[dict[str, Any]] = []
            for (
                j,
                uid,
                u,
                mu,
                mm,
                tc,
                pw,
                ck,
                th,
                sv,
                dv,
                sa,
                da,
                rp,
                pe,
                fa,
                cr,
                rl,
                pc,
                gone,
                lg,
                lw,
            ) in rows:
                x = xids.get((i, j), []) if xids else []
                if gone:
                    # An unreachable GPU: NVML answers nothing, so nothing is reported but the index
                    # (and a kernel-log XID if one arrives). "Missing fields are absent, never invented."
                    gpus.append({"index": j, "xids": x} if x else {"index": j})
                    continue
                gpus.append(
                    {
                        "index": j,
                        "uuid": uid,
                        "util": u,
                        "mem_util": mu,
                        "mem_used_mib": mm,
                        "temp_c": tc,
                        "power_w": pw,
                        "sm_clock_mhz": ck,
                        "throttle_reasons": th,
                        "ecc_sbe_volatile": sv,
                        "ecc_dbe_volatile": dv,
                        "ecc_sbe_aggregate": sa,
                        "ecc_dbe_aggregate": da,
                        "retired_pages": rp,
                        "remapped_rows_pending": pe,
                        "remapped_rows_failure": fa,
                        # what the NVML collector reads beside (collectors/nvml.py); the simulator
                        # models the pending/failure flags, not the row counts behind them
                        "remapped_rows_correctable": 0,
                        "remapped_rows_uncorrectable": 0,
                        "nvlink_links_active": links,
                        "nvlink_crc_errors": cr,
                        "nvlink_replay_errors": rl,
                        "pcie_replay": pc,
                        "pcie_link_gen": lg,
                        "pcie_link_gen_max": PCIE_GEN,
                        "pcie_link_width": lw,
                        "pcie_link_width_max": PCIE_WIDTH,
                        "xids": x,
                    }
                )
            ib = [
                {
                    "device": dev,
                    "port": 1,
                    "state": "ACTIVE" if up else "DOWN",
                    "rate_gbps": rate,
                    "symbol_errors": sy,
                    "link_downed": dn,
                    "rcv_errors": rc,
                    "xmit_discards": di,
                    "tx_bytes": t,
                    "rx_bytes": r_,
                    "pcie_link_gen": PCIE_GEN,
                    "pcie_link_gen_max": PCIE_GEN,
                    "pcie_link_width": PCIE_WIDTH,
                    "pcie_link_width_max": PCIE_WIDTH,
                    "link_error_recovery": lr,
                    "local_link_integrity_errors": 0,
                    "excessive_buffer_overrun_errors": 0,
                    "rcv_remote_physical_errors": 0,
                }
                for dev, up, sy, dn, rc, di, t, r_, lr, listed in zip(
                    devices,
                    ib_up[i],
                    sym[i],
                    downed[i],
                    rcv[i],
                    disc[i],
                    tx[i],
                    rx[i],
                    recovery[i],
                    hca_listed[i],
                    strict=True,
                )
                if listed
            ]
            msg = {
                "schema": schemas.TELEMETRY,
                "node": name,
                "ts": ts,
                "seq": seq,
                "gpus": gpus,
                "host": {
                    "cpu_util": cpu[i],
                    "mem_used_frac": mem_frac[i],
                    "load1": load1[i],
                    "disk_used_frac": disk[i],
                    "procs_d_state": d_state[i],
                    "mounts_missing": 0,
                    "mounts_readonly": 0,
                    "mounts_unwritable": 0,
                    "mounts_failed": 0,
                    "mounts_hung": mounts_hung[i],
                    "blockdevs_missing": 0,
                    "blockdevs_readonly": ro[i],
                    "inodes_used_frac": inodes[i],
                },
                "net": {
                    "ib": ib,
                    "eth": [
                        {
                            "iface": "eth0",
                            "state": "up",
                            "rx_bytes": erx[i],
                            "tx_bytes": etx[i],
                            "rx_errors": 0,
                            "tx_errors": 0,
                            "rx_dropped": edrop[i],
                            "tx_dropped": 0,
                            "carrier_changes": carrier[i],
                        }
                    ],
                },
            }
            kernel = self.kernel_log.section(i)
            if kernel is not None:
                msg["kernel"] = kernel
            if mounts_hung[i] or ro[i]:  # the agent names what failed, only then
                msg["checks"] = self._checks(i)
            out.append((name, msg))
        return out
