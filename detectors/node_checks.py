"""The seed's node checks, judged: what a node's agent measures beside its GPUs' counters (mounts,
block devices, disk and inode space, processes stuck in the kernel, PCIe links, device counts).

Each check has a finding kind of its own; the thresholds and why:

- mount (rules mount_missing, mount_readonly, mount_unwritable, mount_failed, mount_hung):
  a required mount (`collect --mount`) that is not mounted, mounted read-only, refuses a write,
  fails its probe, or has not answered within the agent's deadline (a hung NFS or Lustre server)
  is critical from the first sample: jobs on the node fail or hang on their I/O, as LBNL NHC's
  check_fs_mount fails a node. The names come from the sample's `checks` section.
- block_device (blockdev_missing, blockdev_readonly): an expected device (`collect --blockdev`)
  gone, or switched read-only by the kernel after I/O errors: critical.
- disk (disk_full, inodes_full): the root filesystem's space or inodes used at or above
  `disk_warn_frac` (95%) is a warning, at or above `disk_critical_frac` (99%) critical: a job
  that cannot write its checkpoint or its logs fails (NHC's check_fs_used defaults to 98%).
- hung_tasks (d_state): `d_state_min` (5) or more processes in uninterruptible sleep for
  `sustained_s` (5 min): processes stuck in the kernel, on a hung mount or a wedged driver.
  A few for a moment is ordinary I/O; a crowd that stays is not. A warning: its cause is often
  shared (a file server), which the storm guard, not a drain per node, should answer.
- pcie_link (gpu_link_width, gpu_link_gen, hca_link_width, hca_link_gen): a link trained below
  its maximum for `sustained_s`. A GPU lowers its link's generation (and, by NVIDIA's wording,
  maybe its width) when idle to save power, so a GPU's link is judged only while it is busy
  (util >= `busy_util`). A narrower link is a bad riser, cable or slot: critical (it drains, as
  the seed's checks drain on PCIe failures; a GPU at x8 makes its whole job a straggler). A
  slower generation is a warning. The max is what the device and slot support together for GPUs
  (NVML); for HCAs sysfs gives the card's own.
- device_count (gpu_count, hca_count): fewer GPUs or InfiniBand HCAs than expected: critical.
  GPUs are judged only against `expected_gpus` (0: not judged): a GPU the node used to report is
  the hardware detector's lost-GPU finding already. HCAs against `expected_hcas`, or, at 0, the
  most HCAs the node has reported (a card that did not come back after a reboot). Only samples
  that list any GPU (any IB port) are judged: an empty list is a failed collector, not hardware.

Immediate checks use each sample's values; sustained ones keep, per node, the event time each
condition has held since (one float per node and condition), carried across batches and
snapshots. Everything up to "which samples are bad" is vectorised; only bad samples reach Python.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fleetwatch.config import knob
from fleetwatch.detectors.batch import GPU_COL, HOST_COL, IB_COL, TelemetryBatch
from fleetwatch.detectors.counters import Segments, decode_array, encode_array, positions_in
from fleetwatch.detectors.findings import Forgotten, IncidentBook, SampleTimes, severity_score
from fleetwatch.detectors.node_index import NodeIndex
from fleetwatch.detectors.protocol import NodeContext
from fleetwatch.detectors.rows import Compaction, grow

STATE_VERSION = 1
# the sustained conditions, each a column of `since`
SUSTAINED = ("d_state", "gpu_link_width", "gpu_link_gen", "hca_link_width", "hca_link_gen")
_S = {name: i for i, name in enumerate(SUSTAINED)}
# mount counts (host fields) and the rule each raises; the `checks` section names the mounts
MOUNT_RULES = (
    ("mounts_missing", "mount_missing", "not mounted"),
    ("mounts_readonly", "mount_readonly", "mounted read-only"),
    ("mounts_unwritable", "mount_unwritable", "refuses writes"),
    ("mounts_failed", "mount_failed", "fails its probe"),
    ("mounts_hung", "mount_hung", "not answering (hung)"),
)
BLOCKDEV_RULES = (
    ("blockdevs_missing", "blockdev_missing", "missing"),
    ("blockdevs_readonly", "blockdev_readonly", "read-only"),
)
MAX_NAMED = 16  # GPUs, HCAs, mounts named in one finding's evidence
EXACT = 2**53  # counts arrive as float64: exact up to here; a u64 count past it is reported as this


def _count(x: Any) -> int:
    return int(min(float(x), EXACT))


@dataclass(frozen=True)
class NodeChecksConfig:
    sustained_s: float = knob(
        300.0, "a condition that is ordinary for a moment (D-state processes, a slow link) is a finding "
        "after holding this long (s)", ge=0,
    )  # fmt: skip
    d_state_min: int = knob(5, "processes in uninterruptible sleep that, sustained, are hung tasks", ge=1)
    busy_util: float = knob(
        30.0, "GPU utilisation (%) above which its PCIe link is judged (idle GPUs lower it on purpose)", ge=0
    )
    disk_warn_frac: float = knob(0.95, "root filesystem space or inodes used: a warning", gt=0, le=1)
    disk_critical_frac: float = knob(0.99, "root filesystem space or inodes used: critical", gt=0, le=1)
    expected_gpus: int = knob(
        0, "GPUs every node must have (0: not judged; lost GPUs are judged anyway)", ge=0
    )
    expected_hcas: int = knob(
        0, "InfiniBand HCAs every node must have (0: the most the node has reported)", ge=0
    )
    clear_after_s: float = knob(
        300.0, "a node-check finding resolves this long (s) after it was last seen", gt=0
    )


def held_since(
    rows: np.ndarray, ts: np.ndarray, bad: np.ndarray, since: np.ndarray, first: np.ndarray
) -> np.ndarray:
    """For elements grouped by node (`rows` their node rows, `first` each group's first element,
    arrival order within a group): the event time each one's run of `bad` began (NaN where not
    bad). A run that was going at the end of the last batch goes on from `since[row]` (NaN: none).
    No Python loop: each run's start is found with one running maximum over element indices."""
    n = len(ts)
    if n == 0:
        return np.empty(0)
    prev_bad = np.r_[False, bad[:-1]] & ~first
    start = bad & ~prev_bad
    start_ts = np.where(first & ~np.isnan(since[rows]), since[rows], ts)  # a run carried in
    at = np.maximum.accumulate(np.where(start, np.arange(n), -1))
    return np.where(bad, start_ts[np.maximum(at, 0)], np.nan)


def _gpu_links(cur: np.ndarray, top: np.ndarray, flags: np.ndarray, i: int, unit: str) -> dict[str, str]:
    """The flagged GPUs' links of sorted message i, for evidence: {"GPU3": "x8 of x16"}."""
    return {
        f"GPU{j}": f"{unit}{int(cur[i, j])} of {unit}{int(top[i, j])}"
        for j in np.flatnonzero(flags[i])[:MAX_NAMED].tolist()
    }


def _last_of_groups(first: np.ndarray) -> np.ndarray:
    last = np.empty(len(first), dtype=bool)
    last[:-1] = first[1:]
    if len(first):
        last[-1] = True
    return last


class NodeChecks:
    """NodeDetector (detectors/protocol.py) over the node checks; see the module docstring."""

    def __init__(self, config: NodeChecksConfig | None = None, index: NodeIndex | None = None) -> None:
        self.cfg = config or NodeChecksConfig()
        self.index = NodeIndex() if index is None else index
        self.since = np.full((0, len(SUSTAINED)), np.nan)  # per node row: when each condition began
        self.most_hcas = np.zeros(0, dtype=np.int64)  # per node row: the most HCAs it has reported
        self.book = IncidentBook()

    # ------------------------------------------------------------ protocol

    def observe(self, batch: TelemetryBatch, ctx: NodeContext) -> list[dict[str, Any]]:
        if batch.size == 0:
            return []
        n = len(self.index)
        self.since = grow(self.since, n, np.nan)
        self.most_hcas = grow(self.most_hcas, n, 0)
        seg = Segments.of(ctx.rows)
        order, rows, first = seg.order, seg.rows, seg.first
        ts = batch.ts[order]
        times = SampleTimes(self.index.names, self.index.rows, rows, ts)
        host = batch.host[order]
        cfg = self.cfg
        out: list[dict[str, Any]] = []
        checks = self._checks_by_row(batch, order)

        def col(name: str) -> np.ndarray:
            return host[:, HOST_COL[name]]

        with np.errstate(invalid="ignore"):
            # ---- immediate: mounts, block devices, disk
            for field_rules, kind in ((MOUNT_RULES, "mount"), (BLOCKDEV_RULES, "block_device")):
                for field, rule, what in field_rules:
                    count = col(field)
                    for i in np.flatnonzero(count > 0).tolist():
                        out += self._named(kind, rule, what, _count(count[i]), i, rows, ts, times, checks)
            for field, rule, what in (
                ("disk_used_frac", "disk_full", "space"),
                ("inodes_used_frac", "inodes_full", "inodes"),
            ):
                frac = col(field)
                for i in np.flatnonzero(frac >= cfg.disk_warn_frac).tolist():
                    sev = "critical" if frac[i] >= cfg.disk_critical_frac else "warning"
                    out += self._hit(
                        rows[i], ts[i], times, None, "disk", rule, sev, float(frac[i]) / cfg.disk_warn_frac,
                        f"root filesystem {what} {100 * frac[i]:.1f}% used "
                        f"(over {100 * cfg.disk_warn_frac:.0f}%)",
                        {field: round(float(frac[i]), 4), "warn_frac": cfg.disk_warn_frac,
                         "critical_frac": cfg.disk_critical_frac},
                    )  # fmt: skip

            # ---- sustained: D state, PCIe links
            gpu = batch.gpu[order]
            width = gpu[..., GPU_COL["pcie_link_width"]]
            width_max = gpu[..., GPU_COL["pcie_link_width_max"]]
            gen, gen_max = gpu[..., GPU_COL["pcie_link_gen"]], gpu[..., GPU_COL["pcie_link_gen_max"]]
            busy = gpu[..., GPU_COL["util"]] >= cfg.busy_util
            gpu_narrow = busy & (width < width_max)  # (M, G)
            gpu_slow = busy & (gen < gen_max)
            hca_narrow, hca_slow, port_pos = self._hca_links(batch, order)
            bad = np.stack(
                [
                    col("procs_d_state") >= cfg.d_state_min,
                    gpu_narrow.any(axis=1),
                    gpu_slow.any(axis=1),
                    hca_narrow,
                    hca_slow,
                ],
                axis=1,
            )
            began = np.stack(
                [held_since(rows, ts, bad[:, c], self.since[:, c], first) for c in range(len(SUSTAINED))],
                axis=1,
            )
            last = _last_of_groups(first)
            self.since[rows[last]] = began[last]
            held = ts[:, None] - began >= cfg.sustained_s  # NaN (not bad) compares False
            for i in np.flatnonzero(held[:, _S["d_state"]]).tolist():
                d = _count(col("procs_d_state")[i])
                out += self._hit(
                    rows[i], ts[i], times, None, "hung_tasks", "d_state", "warning", d / cfg.d_state_min,
                    f"{d} processes stuck in uninterruptible sleep (D state) for "
                    f"{ts[i] - began[i, 0]:.0f} s: a hung mount or a wedged driver",
                    {"procs_d_state": d, "since": float(began[i, 0]), "threshold": cfg.d_state_min},
                )  # fmt: skip
            for c, sev, what, links_of in (
                ("gpu_link_width", "critical", "PCIe link below its maximum under load",
                 lambda i: _gpu_links(width, width_max, gpu_narrow, i, "x")),
                ("gpu_link_gen", "warning", "PCIe link below its maximum under load",
                 lambda i: _gpu_links(gen, gen_max, gpu_slow, i, "Gen")),
                ("hca_link_width", "critical", "HCA PCIe link below its maximum",
                 lambda i: self._hca_evidence(batch, port_pos, i, True)),
                ("hca_link_gen", "warning", "HCA PCIe link below its maximum",
                 lambda i: self._hca_evidence(batch, port_pos, i, False)),
            ):  # fmt: skip
                for i in np.flatnonzero(held[:, _S[c]]).tolist():
                    links = links_of(i)
                    out += self._hit(
                        rows[i], ts[i], times, None, "pcie_link", c, sev, 1.0,
                        f"{what} for {ts[i] - began[i, _S[c]]:.0f} s: "
                        + ", ".join(f"{k} {v}" for k, v in links.items()),
                        {"links": links, "since": float(began[i, _S[c]])},
                    )  # fmt: skip

            # ---- device counts
            out += self._counts(batch, order, first, rows, ts, times, port_pos)
        out += self.book.sweep(times.next_ts, times.latest)
        out.sort(key=lambda f: (f["ts"], f["node"], f["kind"], f["evidence"]["rule"]))
        return out

    def forget(self, gone: Forgotten, rows: Compaction | None) -> list[dict[str, Any]]:
        out = self.book.forget(gone)
        if rows is not None:
            self.since = rows.take(self.since, np.nan)
            self.most_hcas = rows.take(self.most_hcas, 0)
        return out

    def to_state(self) -> dict[str, Any]:
        n = len(self.index)
        return {
            "version": STATE_VERSION,
            "nodes": list(self.index.names),
            "since": encode_array(grow(self.since, n, np.nan)[:n]),
            "most_hcas": encode_array(grow(self.most_hcas, n, 0)[:n]),
            "incidents": self.book.to_state(),
        }

    @classmethod
    def from_state(
        cls, d: dict[str, Any], config: NodeChecksConfig | None = None, index: NodeIndex | None = None
    ) -> NodeChecks:
        if d.get("version") != STATE_VERSION:
            raise ValueError(f"unsupported node-checks state version {d.get('version')!r}")
        saved = d["nodes"]
        self = cls(config, NodeIndex(saved) if index is None else index)
        since, most = decode_array(d["since"]), decode_array(d["most_hcas"])
        if since.shape != (len(saved), len(SUSTAINED)) or most.shape != (len(saved),):
            raise ValueError(f"node-checks arrays {since.shape}, {most.shape} for {len(saved)} nodes")
        n = len(self.index)
        self.since = self.index.place(saved, since, np.full((n, len(SUSTAINED)), np.nan))
        self.most_hcas = self.index.place(saved, most.astype(np.int64), np.zeros(n, dtype=np.int64))
        self.book = IncidentBook.from_state(d["incidents"], self.cfg.clear_after_s)
        return self

    # ------------------------------------------------------------ helpers

    def _hit(
        self,
        row: Any,
        ts: Any,
        times: SampleTimes,
        gpu: int | None,
        kind: str,
        rule: str,
        severity: str,
        ratio: float,
        what: str,
        evidence: dict[str, Any],
    ) -> list[dict[str, Any]]:
        node = self.index.names[int(row)]
        return self.book.observe(
            node=node,
            gpu=gpu,
            kind=kind,
            rule=rule,
            ts=float(ts),
            severity=severity,
            score=severity_score(severity, ratio),
            summary=f"{node}: {what}",
            evidence=evidence,
            clear_after=self.cfg.clear_after_s,
            next_ts=times.next_ts,
        )

    @staticmethod
    def _checks_by_row(batch: TelemetryBatch, order: np.ndarray) -> dict[int, dict[str, Any]]:
        """The `checks` section of each message that has one, by its place in sorted order."""
        if not len(batch.checks_msg):
            return {}
        place = positions_in(order, batch.size, batch.checks_msg).tolist()
        return dict(zip(place, batch.checks, strict=True))

    def _named(
        self,
        kind: str,
        rule: str,
        what: str,
        count: int,
        i: int,
        rows: np.ndarray,
        ts: np.ndarray,
        times: SampleTimes,
        checks: dict[int, dict[str, Any]],
    ) -> list[dict[str, Any]]:
        """A mount or block-device rule at sorted message i, naming what failed where the sample's
        `checks` section does (an agent names each one whose problem matches the rule)."""
        problem = rule.split("_", 1)[1]
        key, name = ("mounts", "path") if kind == "mount" else ("blockdevs", "name")
        entries = [e for e in checks.get(i, {}).get(key, ()) if e.get("problem") == problem][:MAX_NAMED]
        names = [str(e.get(name)) for e in entries]
        noun = "required mount" if kind == "mount" else "expected block device"
        listed = f": {', '.join(names)}" if names else ""
        evidence: dict[str, Any] = {"count": count}
        if entries:
            evidence[key] = entries
        return self._hit(
            rows[i], ts[i], times, None, kind, rule, "critical", float(count),
            f"{count} {noun}{'s' if count > 1 else ''} {what}{listed} (drain node)", evidence,
        )  # fmt: skip

    @staticmethod
    def _hca_links(batch: TelemetryBatch, order: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per sorted message: an HCA port's link narrower / slower than its maximum; and each IB
        port's message in sorted order."""
        m = batch.size
        port_pos = positions_in(order, m, batch.ib_msg)
        narrow, slow = np.zeros(m, dtype=bool), np.zeros(m, dtype=bool)
        if len(port_pos):
            ib = batch.ib
            with np.errstate(invalid="ignore"):
                n_bad = ib[:, IB_COL["pcie_link_width"]] < ib[:, IB_COL["pcie_link_width_max"]]
                s_bad = ib[:, IB_COL["pcie_link_gen"]] < ib[:, IB_COL["pcie_link_gen_max"]]
            narrow[port_pos[n_bad]] = True
            slow[port_pos[s_bad]] = True
        return narrow, slow, port_pos

    @staticmethod
    def _hca_evidence(batch: TelemetryBatch, port_pos: np.ndarray, i: int, width: bool) -> dict[str, str]:
        cur, top = ("pcie_link_width", "pcie_link_width_max")
        if not width:
            cur, top = "pcie_link_gen", "pcie_link_gen_max"
        unit = "x" if width else "Gen"
        out: dict[str, str] = {}
        for p in np.flatnonzero(port_pos == i).tolist():
            c, t = batch.ib[p, IB_COL[cur]], batch.ib[p, IB_COL[top]]
            if c < t and len(out) < MAX_NAMED:
                device = batch.ib_key_names[int(batch.ib_key_idx[p])].rsplit("/", 1)[0]
                out[device] = f"{unit}{int(c)} of {unit}{int(t)}"
        return out

    def _counts(
        self,
        batch: TelemetryBatch,
        order: np.ndarray,
        first: np.ndarray,
        rows: np.ndarray,
        ts: np.ndarray,
        times: SampleTimes,
        port_pos: np.ndarray,
    ) -> list[dict[str, Any]]:
        cfg, out = self.cfg, []
        if cfg.expected_gpus:
            gpus = batch.present[order].sum(axis=1)
            for i in np.flatnonzero((gpus > 0) & (gpus < cfg.expected_gpus)).tolist():
                have = set(np.flatnonzero(batch.present[order[i]]).tolist())
                missing = sorted(set(range(cfg.expected_gpus)) - have)
                out += self._hit(
                    rows[i], ts[i], times, None, "device_count", "gpu_count", "critical",
                    cfg.expected_gpus / max(int(gpus[i]), 1),
                    f"{int(gpus[i])} GPUs of {cfg.expected_gpus} expected (missing index "
                    f"{', '.join(map(str, missing[:MAX_NAMED]))}) (drain node)",
                    {"gpus": int(gpus[i]), "expected": cfg.expected_gpus, "missing": missing[:MAX_NAMED]},
                )  # fmt: skip
        if not len(port_pos):
            return out
        # HCAs: the distinct devices among each message's IB ports ("mlx5_0/1" -> "mlx5_0"); the
        # batch names a few port keys, so their devices are coded once, in Python
        names: dict[str, int] = {}
        dev_of_key = np.fromiter(
            (names.setdefault(k.rsplit("/", 1)[0], len(names)) for k in batch.ib_key_names),
            np.int64,
            count=len(batch.ib_key_names),
        )
        # (message, device) pairs seen: a node has a handful of HCAs, so a (M, devices) grid
        seen = np.zeros((batch.size, len(names)), dtype=bool)
        seen[port_pos, dev_of_key[batch.ib_key_idx]] = True
        hcas = seen.sum(axis=1)  # per sorted message
        listed = hcas > 0
        if cfg.expected_hcas:
            expected = np.full(batch.size, cfg.expected_hcas, dtype=np.int64)
        else:  # the most this node has reported up to each sample (a running max per node)
            gid = np.cumsum(first) - 1
            span = int(hcas.max()) + 1
            running = np.maximum.accumulate(gid * span + hcas) - gid * span
            expected = np.maximum(running, self.most_hcas[rows])
            last = _last_of_groups(first)
            self.most_hcas[rows[last]] = expected[last]
        for i in np.flatnonzero(listed & (hcas < expected)).tolist():
            out += self._hit(
                rows[i], ts[i], times, None, "device_count", "hca_count", "critical",
                float(expected[i]) / int(hcas[i]),
                f"{int(hcas[i])} InfiniBand HCAs of {int(expected[i])} expected (drain node)",
                {"hcas": int(hcas[i]), "expected": int(expected[i]),
                 "basis": "configured" if cfg.expected_hcas else "the most this node has reported"},
            )  # fmt: skip
        return out
