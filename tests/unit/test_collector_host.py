"""HostSource on fake /proc trees, and once on this machine's real /proc."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from fleetwatch import schemas
from fleetwatch.collectors import host
from fleetwatch.collectors.host import HostSource, process_state
from tests.fakes import telemetry_message, write_tree

#           user nice system idle  iowait irq softirq steal guest guest_nice
CPU_BEFORE = "cpu  1000 10 500 8000 100 5 5 0 200 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n"
# +30 user (of which +30 guest, already inside user), +10 system, +50 idle, +10 iowait: 100 jiffies, 40 busy
CPU_AFTER = "cpu  1030 10 510 8050 110 5 5 0 230 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n"

MEMINFO = "MemTotal:       1000 kB\nMemFree:         100 kB\nMemAvailable:    250 kB\nBuffers: 5 kB\n"


def pid_stat(pid: int, comm: str, state: str) -> str:
    return f"{pid} ({comm}) {state} 1 {pid} {pid} 0 -1 4194304 99 0 0 0 0 0 0 0 20 0 1 0 65617 3133440\n"


def fake_proc(root: Path, **extra: str) -> Path:
    return write_tree(
        root,
        {
            "stat": CPU_BEFORE,
            "meminfo": MEMINFO,
            "loadavg": "1.50 0.75 0.25 3/420 12345\n",
            "1/stat": pid_stat(1, "systemd", "S"),
            "20/stat": pid_stat(20, "nfsd", "D"),
            "21/stat": pid_stat(21, "python3 (x) D", "R"),  # a comm with spaces and ") D" in it
            "22/stat": pid_stat(22, "kworker/u8:1", "D"),
            "23/stat": pid_stat(23, "zombie", "Z"),
            "self/stat": pid_stat(99, "self", "D"),  # not a pid directory: ignored
            "sys/kernel/hostname": "n1\n",
            **extra,
        },
    )


def test_values_from_a_fake_proc_tree(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path)
    src = HostSource(proc_root=str(proc), disk_path=str(tmp_path))
    (proc / "stat").write_text(CPU_AFTER)
    out = src.sample()["host"]
    assert out["cpu_util"] == pytest.approx(40.0)
    assert out["mem_used_frac"] == pytest.approx(0.75)
    assert out["load1"] == 1.5
    assert out["procs_d_state"] == 2
    assert 0.0 <= out["disk_used_frac"] <= 1.0
    schemas.validate(telemetry_message({"host": out}))


def test_cpu_util_covers_the_time_between_samples(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path)
    src = HostSource(proc_root=str(proc))
    assert "cpu_util" not in src.sample()["host"]  # no tick since the constructor's reading
    (proc / "stat").write_text(CPU_AFTER)
    assert src.sample()["host"]["cpu_util"] == pytest.approx(40.0)
    # Fully busy next interval: +100 user, nothing idle.
    (proc / "stat").write_text("cpu  1130 10 510 8050 110 5 5 0 230 0\n")
    assert src.sample()["host"]["cpu_util"] == pytest.approx(100.0)
    # iowait stepping backwards (a known kernel quirk) must not push the value out of [0, 100].
    (proc / "stat").write_text("cpu  1130 10 510 8150 100 5 5 0 230 0\n")
    assert src.sample()["host"]["cpu_util"] == pytest.approx(0.0)


def test_disk_used_frac_uses_df_arithmetic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = os.statvfs_result((4096, 4096, 1000, 300, 200, 100, 50, 50, 0, 255))
    seen: list[str] = []

    def statvfs(path: str) -> os.statvfs_result:
        seen.append(path)
        return fake

    monkeypatch.setattr(host.os, "statvfs", statvfs)
    out = HostSource(proc_root=str(fake_proc(tmp_path / "p")), disk_path="/data").sample()["host"]
    # used = blocks - bfree = 700; root-reserved (bfree - bavail = 100) is neither used nor available.
    assert out["disk_used_frac"] == pytest.approx(700 / 900)
    assert seen == ["/data"]


def test_missing_files_leave_fields_out(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    src = HostSource(proc_root=str(empty), disk_path=str(tmp_path / "no-such-dir"))
    assert src.sample() == {"host": {"procs_d_state": 0}}
    # statvfs of / still reads (inodes too, where its file system counts them)
    assert HostSource(proc_root=str(tmp_path / "absent")).sample()["host"].keys() - {"inodes_used_frac"} == {
        "disk_used_frac"
    }


def test_meminfo_without_memavailable_is_not_guessed(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, meminfo="MemTotal: 1000 kB\nMemFree: 100 kB\nCached: 500 kB\n")
    assert "mem_used_frac" not in HostSource(proc_root=str(proc)).sample()["host"]


def test_garbage_files_leave_fields_out(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, loadavg="\n", meminfo="MemTotal: lots\n", stat="intr 1 2 3\n")
    (proc / "20" / "stat").write_text("truncated")
    out = HostSource(proc_root=str(proc)).sample()["host"]
    assert "load1" not in out and "mem_used_frac" not in out and "cpu_util" not in out
    assert out["procs_d_state"] == 1  # pid 22 only


def test_process_vanishing_mid_scan_is_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    proc = fake_proc(tmp_path)
    real_scandir = os.scandir

    def scandir_then_exit(path, *args):  # the directory listing is taken, then pid 20 exits
        if path != str(proc):  # os is shared: pass every other caller (shutil too) through
            return real_scandir(path, *args)
        entries = list(real_scandir(path))
        shutil.rmtree(proc / "20")
        return iter(entries)

    real_open = open

    def open_esrch(path, *args, **kwargs):  # reading a dying process's stat can also give ESRCH
        if str(path).endswith(os.path.join("22", "stat")):
            raise ProcessLookupError(3, "No such process")
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(host.os, "scandir", scandir_then_exit)
    monkeypatch.setattr(host, "open", open_esrch, raising=False)
    assert HostSource(proc_root=str(proc)).sample()["host"]["procs_d_state"] == 0


def test_process_state_parsing() -> None:
    assert process_state(pid_stat(7, "a) b (c", "D")) == "D"
    assert process_state("7 (x) R 1 2") == "R"
    assert process_state("7 no parens") is None
    assert process_state("7 (x)") is None


def test_real_proc() -> None:
    src = HostSource()
    deadline = time.monotonic() + 0.1
    while time.monotonic() < deadline:  # burn CPU time so at least one jiffy passes
        pass
    out = src.sample()["host"]
    assert set(out) - {"inodes_used_frac"} == {
        "cpu_util",
        "mem_used_frac",
        "load1",
        "disk_used_frac",
        "procs_d_state",
    }
    assert 0 < out["cpu_util"] <= 100  # this very loop kept a CPU busy
    assert 0 < out["mem_used_frac"] < 1
    assert abs(out["load1"] - os.getloadavg()[0]) < 1.0
    usage = shutil.disk_usage("/")
    assert out["disk_used_frac"] == pytest.approx(usage.used / (usage.used + usage.free), abs=0.01)
    assert isinstance(out["procs_d_state"], int) and out["procs_d_state"] >= 0
    schemas.validate(telemetry_message(src.sample()))
    src.close()


def test_load1_and_ib_rate_share_one_reading_of_the_leading_number() -> None:
    # parse_load1 (host) and parse_ib_rate (net) both read collectors.sources.leading_float
    from fleetwatch.collectors.net import parse_ib_rate

    assert host.parse_load1("0.52 0.40 0.31 1/234 5678\n") == 0.52
    assert parse_ib_rate("2.5 Gb/sec (1X SDR)") == 2.5
    for bad in ("", "   ", "n/a 1 2", "-1.0 0 0"):
        assert host.parse_load1(bad) is None
        assert parse_ib_rate(bad) is None
