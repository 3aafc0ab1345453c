"""Host telemetry from procfs and statvfs: telemetry/1 `host` {cpu_util, mem_used_frac, load1,
disk_used_frac, inodes_used_frac, procs_d_state}, and the node checks of required mounts and
block devices (their counts in `host`, the names of the failing ones in `checks`).

Definitions (each field is left out when its file cannot be read or parsed):

- cpu_util: percent of CPU time not idle between two readings of the aggregate `cpu` line of
  /proc/stat, over user+nice+system+idle+iowait+irq+softirq+steal (guest time is already inside
  user/nice, so it is not added again); iowait counts as idle, as in top and psutil. The first
  reading is taken by the constructor, so the first sample() covers the time since construction;
  it is left out when no tick has passed (two readings within one jiffy). A since-boot average is
  never reported: it would look like a sudden level change to the detectors.
- mem_used_frac: 1 - MemAvailable / MemTotal from /proc/meminfo. Not derived from MemFree on
  kernels without MemAvailable (< 3.14): that would be a different quantity under the same name.
- load1: the first field of /proc/loadavg.
- disk_used_frac: used / (used + available to unprivileged users) of `disk_path`, as `df` computes
  Use%: blocks reserved for root count neither as used nor as available.
- inodes_used_frac: (f_files - f_ffree) / f_files of `disk_path`, as `df -i` computes IUse%
  (coreutils src/df.c, get_field_values: inodes reserved for root count as free); left out where
  the file system reports no inode count (btrfs).
- procs_d_state: processes (thread-group leaders listed in /proc) in state D, uninterruptible
  sleep: the mark of a hung NFS/Lustre mount or a wedged driver. A process that exits while being
  scanned is skipped.
- mounts_* (collectors/mounts.py), blockdevs_* (collectors/blockdevs.py): counts over the
  configured mounts and block devices, absent when none is configured; `checks` names the ones
  that fail and is sent only then (a healthy node's samples keep the scanner's fast path).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from fleetwatch.collectors.blockdevs import BlockDevChecker
from fleetwatch.collectors.mounts import DEFAULT_PROBE_DIR, PROBE_WRITE, MountChecker, MountSpec
from fleetwatch.collectors.sources import SingleFlight, leading_float

# /proc/stat `cpu` columns: user nice system idle iowait irq softirq steal [guest guest_nice]
_CPU_COLUMNS = 8
_IDLE, _IOWAIT = 3, 4


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def parse_cpu_times(stat: str) -> tuple[int, int] | None:
    """(total, idle) jiffies from the aggregate `cpu` line of /proc/stat."""
    for line in stat.splitlines():
        if line.startswith("cpu "):
            try:
                values = [int(v) for v in line.split()[1 : 1 + _CPU_COLUMNS]]
            except ValueError:
                return None
            if len(values) <= _IOWAIT:
                return None
            return sum(values), values[_IDLE] + values[_IOWAIT]
    return None


def cpu_percent(before: tuple[int, int], after: tuple[int, int]) -> float | None:
    total = after[0] - before[0]
    if total <= 0:
        return None
    # Per-CPU iowait accounting can make the idle sum step back slightly: clamp into [0, 100].
    busy = min(max(total - (after[1] - before[1]), 0), total)
    return 100.0 * busy / total


def parse_mem_used_frac(meminfo: str) -> float | None:
    values: dict[str, int] = {}
    for line in meminfo.splitlines():
        key, _, rest = line.partition(":")
        if key in ("MemTotal", "MemAvailable"):
            try:
                values[key] = int(rest.split()[0])
            except (IndexError, ValueError):
                return None
    total, available = values.get("MemTotal"), values.get("MemAvailable")
    if not total or available is None:
        return None
    return min(max(1.0 - available / total, 0.0), 1.0)


def parse_load1(loadavg: str) -> float | None:
    return leading_float(loadavg)


def process_state(stat: str) -> str | None:
    """The state letter of a /proc/[pid]/stat line. comm (field 2) may hold spaces and ')',
    so the state is the first field after the *last* ')'."""
    _, paren, rest = stat.rpartition(")")
    fields = rest.split()
    return fields[0] if paren and fields else None


class HostSource:
    """`sample()` -> {"host": {"cpu_util": ..., "mem_used_frac": ..., "load1": ...,
    "disk_used_frac": ..., "procs_d_state": ..., ...}} with unreadable fields left out, and
    {"checks": {"mounts": [...], "blockdevs": [...]}} beside it when a configured one fails.

    mounts: the mounts required (MountSpec, or "PATH[:rw|:ro]"); mount_deadline_s: a probe
    running longer is hung; mount_interval_s: seconds between probes of one mount; mount_wait_s:
    the most sample() waits for the probes it started; mount_probe, mount_probe_dir: how to test
    writing (collectors/mounts.py). blockdevs: the block devices expected (names, or "all")."""

    name = "host"

    def __init__(
        self,
        proc_root: str = "/proc",
        disk_path: str = "/",
        sys_root: str = "/sys",
        mounts: Sequence[MountSpec | str] = (),
        mount_deadline_s: float = 10.0,
        mount_interval_s: float = 10.0,
        mount_wait_s: float = 0.2,
        mount_probe: str = PROBE_WRITE,
        mount_probe_dir: str = DEFAULT_PROBE_DIR,
        blockdevs: Sequence[str] = (),
    ) -> None:
        self._proc = os.fspath(proc_root)
        self._disk_path = os.fspath(disk_path)
        self._guard = SingleFlight(self.name)
        self._mounts = (
            MountChecker(
                mounts,
                mountinfo=os.path.join(self._proc, "self", "mountinfo"),
                deadline_s=mount_deadline_s,
                interval_s=mount_interval_s,
                wait_s=mount_wait_s,
                probe=mount_probe,
                probe_dir=mount_probe_dir,
            )
            if mounts
            else None
        )
        self._blockdevs = BlockDevChecker(blockdevs, sys_root) if blockdevs else None
        self._cpu_before = self._cpu_times()  # primes cpu_util for the first sample()

    def sample(self) -> dict[str, Any]:
        with self._guard():
            host: dict[str, Any] = {}
            _put(host, "cpu_util", self._cpu_util())
            meminfo = _read(os.path.join(self._proc, "meminfo"))
            _put(host, "mem_used_frac", parse_mem_used_frac(meminfo) if meminfo is not None else None)
            loadavg = _read(os.path.join(self._proc, "loadavg"))
            _put(host, "load1", parse_load1(loadavg) if loadavg is not None else None)
            disk = self._statvfs()
            _put(host, "disk_used_frac", disk_used_frac(disk) if disk is not None else None)
            _put(host, "inodes_used_frac", inodes_used_frac(disk) if disk is not None else None)
            _put(host, "procs_d_state", self._procs_d_state())
            out: dict[str, Any] = {"host": host}
            checks: dict[str, list[dict[str, Any]]] = {}
            for key, checker in (("mounts", self._mounts), ("blockdevs", self._blockdevs)):
                if checker is not None:
                    counts, failing = checker.check()
                    host.update(counts)
                    if failing:
                        checks[key] = failing
            if checks:  # only when something fails: a healthy node sends no `checks`
                out["checks"] = checks
            return out

    def close(self) -> None:
        """Nothing to release: every file is opened and closed within sample()."""

    def _cpu_times(self) -> tuple[int, int] | None:
        stat = _read(os.path.join(self._proc, "stat"))
        return parse_cpu_times(stat) if stat is not None else None

    def _cpu_util(self) -> float | None:
        now = self._cpu_times()
        before, self._cpu_before = self._cpu_before, now
        if before is None or now is None:
            return None
        return cpu_percent(before, now)

    def _statvfs(self) -> os.statvfs_result | None:
        try:
            return os.statvfs(self._disk_path)
        except OSError:
            return None

    def _procs_d_state(self) -> int | None:
        try:
            entries = [e.name for e in os.scandir(self._proc) if e.name.isdigit()]
        except OSError:
            return None
        count = 0
        for pid in entries:
            stat = _read(os.path.join(self._proc, pid, "stat"))  # None: the process has exited
            if stat is not None and process_state(stat) == "D":
                count += 1
        return count


def disk_used_frac(st: os.statvfs_result) -> float | None:
    used = st.f_blocks - st.f_bfree
    usable = used + st.f_bavail
    if usable <= 0:  # pseudo filesystems report zero blocks
        return None
    return min(max(used / usable, 0.0), 1.0)


def inodes_used_frac(st: os.statvfs_result) -> float | None:
    if st.f_files <= 0:  # no inode count (btrfs, pseudo filesystems)
        return None
    return min(max((st.f_files - st.f_ffree) / st.f_files, 0.0), 1.0)


def _put(out: dict[str, Any], key: str, value: Any) -> None:
    if value is not None:
        out[key] = value
