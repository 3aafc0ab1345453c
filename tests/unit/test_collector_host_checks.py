"""The host source's node checks (collectors/mounts.py, collectors/blockdevs.py) on fake /proc and
/sys trees fed with real values, a hung mount made of a FIFO, and this machine's own mountinfo.

Real mountinfo lines: the nfs4 line is from Ph0m1/KWDB kwbase/pkg/util/cgroups/cgroups_test.go
(commit 12171b20116b1b3c5ad88b5b91a404dd98e51102), a Kubernetes node's NFS volume; the Lustre
line carries the source and the options a Lustre client printed on LNCC's SDumont
(`172.20.230.12@o2ib:172.20.230.13@o2ib:/cstor2/lncc on /scratch type lustre (rw,checksum,flock,
nouser_xattr,lruresize,lazystatfs,nouser_fid2path,verbose,noencrypt)`), in mountinfo's layout
(proc(5)); the ext4 line is this layout with the superblock's `ro` that ext4 shows after
errors=remount-ro fired. The /sys/block layout (links into /sys/devices, virtual devices under
/sys/devices/virtual/block, `ro`, `size`, `removable`, `hidden`) is the kernel's (sysfs-block ABI).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from fleetwatch import schemas
from fleetwatch.collectors import mounts as mounts_module
from fleetwatch.collectors.blockdevs import BlockDevChecker, check_blockdev_name, whole_disks
from fleetwatch.collectors.host import HostSource, inodes_used_frac
from fleetwatch.collectors.mounts import (
    MountChecker,
    MountSpec,
    ProbeOutcome,
    parse_mount_spec,
    parse_mountinfo,
    probe_mount,
)
from tests.fakes import telemetry_message, write_tree

NFS4 = (
    "3417 2892 0:212 / {path} rw,relatime - nfs4 "
    "20.20.20.43:/data/k8s/nfs_share/pvc-2108ee90-b185-43f7-a95c-21d9a4d84a67 rw,vers=4.1,rsize=1048576,"
    "wsize=1048576,namlen=255,hard,proto=tcp,timeo=600,retrans=2,sec=sys,clientaddr=20.20.20.27,"
    "local_lock=none,addr=20.20.20.43"
)
LUSTRE = (
    "312 29 0:61 / {path} rw,relatime shared:170 - lustre 172.20.230.12@o2ib:172.20.230.13@o2ib:/cstor2/lncc "
    "rw,checksum,flock,nouser_xattr,lruresize,lazystatfs,nouser_fid2path,verbose,noencrypt"
)
EXT4_REMOUNTED_RO = "776 625 259:3 / {path} rw,relatime - ext4 /dev/nvme2n1 ro,data=ordered"
RO_BIND = "814 625 0:68 / {path} ro,relatime - tmpfs tmpfs rw"
ROOT = "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard"


def mountinfo(tmp_path: Path, *lines: str) -> Path:
    """A fake /proc whose self/mountinfo holds `lines`; returns the /proc root."""
    return write_tree(tmp_path / "proc", {"self/mountinfo": "\n".join([ROOT, *lines]) + "\n"})


def mount_dir(tmp_path: Path, name: str) -> Path:
    d = tmp_path / name
    d.mkdir(parents=True, exist_ok=True)
    return d


def checker(proc: Path, specs: list[Any], **kw: Any) -> MountChecker:
    return MountChecker(specs, mountinfo=str(proc / "self" / "mountinfo"), **kw)


# ---------------------------------------------------------------- mountinfo and specs


def test_real_mountinfo_lines_parse() -> None:
    text = "\n".join(
        [
            ROOT,
            NFS4.format(path="/kaiwudb/certs"),
            LUSTRE.format(path="/scratch"),
            EXT4_REMOUNTED_RO.format(path="/kwbase/kwbase-data"),
            RO_BIND.format(path="/kwbase/kwbase-certs"),
            r"29 27 0:50 / /srv/a\040b\134c rw,relatime shared:9 master:3 - nfs server:/a\040b rw",
            "no separator here at all",
            "x 1 0:1 / /bad rw - ext4 /dev/x rw",  # not a mount id
            "31 27 0:51 / /short rw -",  # cut short
        ]
    )
    table = parse_mountinfo(text)
    assert set(table) == {
        "/",
        "/kaiwudb/certs",
        "/scratch",
        "/kwbase/kwbase-data",
        "/kwbase/kwbase-certs",
        "/srv/a b\\c",
    }
    nfs = table["/kaiwudb/certs"]
    assert (nfs.fstype, nfs.mount_id, nfs.readonly) == ("nfs4", 3417, False)
    assert "hard" in nfs.super_options and nfs.source.startswith("20.20.20.43:/data/k8s/")
    lustre = table["/scratch"]
    assert (lustre.fstype, lustre.readonly) == ("lustre", False)
    assert lustre.source == "172.20.230.12@o2ib:172.20.230.13@o2ib:/cstor2/lncc"
    assert "lazystatfs" in lustre.super_options
    assert table["/kwbase/kwbase-data"].readonly  # the superblock's ro: remounted after errors
    assert table["/kwbase/kwbase-certs"].readonly  # the mount's own ro
    escaped = table["/srv/a b\\c"]
    assert (escaped.fstype, escaped.source) == ("nfs", "server:/a b")


def test_a_mount_over_another_hides_it() -> None:
    table = parse_mountinfo(
        "\n".join([ROOT, "40 27 8:1 / /data rw - xfs /dev/sda1 rw", LUSTRE.format(path="/data")])
    )
    assert table["/data"].fstype == "lustre"


def test_this_machines_mountinfo_parses() -> None:
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
        text = f.read()
    table = parse_mountinfo(text)
    assert "/" in table
    assert len(table) >= 1
    lines = [line for line in text.splitlines() if " - " in line]
    assert len(table) <= len(lines)
    assert all(p.startswith("/") for p in table)


@pytest.mark.parametrize(
    ("text", "path", "writable"),
    [
        ("/home", "/home", True),
        ("/home:rw", "/home", True),
        ("/datasets:ro", "/datasets", False),
        ("/scratch/", "/scratch", True),
        ("//lustre//x/", "/lustre/x", True),
        ("/odd:name", "/odd:name", True),
        ("/a b/ü:ro", "/a b/ü", False),
    ],
)
def test_mount_specs(text: str, path: str, writable: bool) -> None:
    assert parse_mount_spec(text) == MountSpec(path, writable)


@pytest.mark.parametrize("text", ["home", "", ":rw", "/x\ny", "/x\ty", "/x\x85", "/x\udc80", "/" + "a" * 256])
def test_bad_mount_specs_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="absolute path"):
        parse_mount_spec(text)


# ---------------------------------------------------------------- probes on real directories


def test_healthy_mounts_send_zero_counts_and_no_checks(tmp_path: Path) -> None:
    home, scratch = mount_dir(tmp_path, "home"), mount_dir(tmp_path, "scratch")
    proc = mountinfo(tmp_path, NFS4.format(path=home), LUSTRE.format(path=scratch))
    src = HostSource(proc_root=str(proc), disk_path=str(tmp_path), mounts=[f"{home}", f"{scratch}:rw"])
    out = src.sample()
    host = out["host"]
    assert {k: v for k, v in host.items() if k.startswith("mounts_") and k != "mounts_slowest_s"} == {
        "mounts_missing": 0,
        "mounts_readonly": 0,
        "mounts_unwritable": 0,
        "mounts_failed": 0,
        "mounts_hung": 0,
    }
    assert 0.0 <= host["mounts_slowest_s"] < 5.0
    assert "checks" not in out
    # the write probe left its directory and nothing in it
    assert list((home / ".fleetwatch-probe").iterdir()) == []
    schemas.validate(telemetry_message(out))


def test_missing_readonly_unwritable_and_failed_mounts_are_named(tmp_path: Path) -> None:
    present = mount_dir(tmp_path, "present")
    ro_ok = mount_dir(tmp_path, "datasets")
    ro_bad = mount_dir(tmp_path, "checkpoints")
    # a mount that refuses writes even to root (procfs: no directory can be made in it)
    blocked = Path("/proc/self")
    gone = tmp_path / "stale"  # listed as mounted, but statvfs fails on it (as ESTALE would)
    proc = mountinfo(
        tmp_path,
        NFS4.format(path=present),
        RO_BIND.format(path=ro_ok),
        EXT4_REMOUNTED_RO.format(path=ro_bad),
        f"40 29 0:5 / {blocked} rw,nosuid,nodev,noexec,relatime - proc proc rw",
        NFS4.format(path=gone),
    )
    specs = [str(present), f"{ro_ok}:ro", str(ro_bad), str(blocked), str(gone), "/not/mounted"]
    src = HostSource(proc_root=str(proc), disk_path=str(tmp_path), mounts=specs)
    out = src.sample()
    host = out["host"]
    assert (host["mounts_missing"], host["mounts_readonly"]) == (1, 1)
    assert (host["mounts_unwritable"], host["mounts_failed"], host["mounts_hung"]) == (1, 1, 0)
    named = {e["path"]: e for e in out["checks"]["mounts"]}
    assert named["/not/mounted"] == {"path": "/not/mounted", "problem": "missing"}
    assert named[str(ro_bad)] == {"path": str(ro_bad), "problem": "readonly", "fstype": "ext4"}
    assert named[str(blocked)] == {
        "path": str(blocked),
        "problem": "unwritable",
        "fstype": "proc",
        "error": "ENOENT",
    }
    assert named[str(gone)] == {"path": str(gone), "problem": "failed", "fstype": "nfs4", "error": "ENOENT"}
    assert set(named) == {"/not/mounted", str(ro_bad), str(blocked), str(gone)}
    schemas.validate(telemetry_message(out))


def test_an_fstype_that_is_not_utf8_is_sent_escaped(tmp_path: Path) -> None:
    """A FUSE subtype is whatever the mounting program named it: a byte that is not UTF-8 came out of
    mountinfo (read with surrogateescape) as a lone surrogate no encoder takes, and the host part
    (every host field) was left out of the sample with it."""
    bad = mount_dir(tmp_path, "scratch")
    proc = mountinfo(tmp_path)
    line = f"36 35 0:40 / {bad} ro,relatime - fuse.s".encode() + b"\xffx t rw\n"
    (proc / "self" / "mountinfo").write_bytes((ROOT + "\n").encode() + line)
    out = HostSource(proc_root=str(proc), disk_path=str(tmp_path), mounts=[str(bad)]).sample()
    [entry] = out["checks"]["mounts"]
    assert entry == {"path": str(bad), "problem": "readonly", "fstype": "fuse.s\\xffx"}
    schemas.encode(schemas.validate(telemetry_message(out)))


def test_the_probe_never_writes_through_a_planted_link(tmp_path: Path) -> None:
    mnt = mount_dir(tmp_path, "scratch")
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    probe_dir = mnt / ".fleetwatch-probe"
    probe_dir.mkdir()
    name = "node-1.42.probe"
    (probe_dir / name).symlink_to(victim)
    assert probe_mount(
        str(mnt), writable=True, how="write", probe_dir=".fleetwatch-probe", probe_name=name
    ) == (ProbeOutcome())
    assert victim.read_text() == "keep me" and list(probe_dir.iterdir()) == []
    # a probe directory that is a link elsewhere, or a file, is never followed or written: a tenant
    # could plant one on a shared mount, which made it "unwritable" on every node (an adversarial
    # probe's find); the probe then writes in the mount's root under a name nobody can guess
    elsewhere = mount_dir(tmp_path, "elsewhere")
    other = mount_dir(tmp_path, "lustre")
    (other / ".fleetwatch-probe").symlink_to(elsewhere)
    outcome = probe_mount(
        str(other), writable=True, how="write", probe_dir=".fleetwatch-probe", probe_name=name
    )
    assert outcome == ProbeOutcome() and list(elsewhere.iterdir()) == []
    assert [p.name for p in other.iterdir()] == [".fleetwatch-probe"]  # the probe left nothing
    squatted = mount_dir(tmp_path, "shared")
    (squatted / ".fleetwatch-probe").write_text("a tenant's file")
    outcome = probe_mount(
        str(squatted), writable=True, how="write", probe_dir=".fleetwatch-probe", probe_name=name
    )
    assert outcome == ProbeOutcome() and (squatted / ".fleetwatch-probe").read_text() == "a tenant's file"


def test_access_probe_and_the_mount_root_as_probe_dir(tmp_path: Path) -> None:
    mnt = mount_dir(tmp_path, "home")
    assert probe_mount(str(mnt), writable=True, how="access", probe_dir="x", probe_name="n") == ProbeOutcome()
    assert (
        probe_mount(str(mnt), writable=True, how="write", probe_dir=".", probe_name="n.probe")
        == ProbeOutcome()
    )
    assert list(mnt.iterdir()) == []  # nothing left, no directory made


def test_mountinfo_unreadable_leaves_the_counts_out(tmp_path: Path) -> None:
    src = HostSource(proc_root=str(tmp_path / "none"), disk_path=str(tmp_path), mounts=["/home"])
    out = src.sample()
    assert not any(k.startswith("mounts_") for k in out["host"]) and "checks" not in out


def test_no_configured_checks_no_fields(tmp_path: Path) -> None:
    out = HostSource(proc_root=str(mountinfo(tmp_path)), disk_path=str(tmp_path)).sample()
    assert not any(k.startswith(("mounts_", "blockdevs_")) for k in out["host"]) and "checks" not in out


def test_probes_start_once_per_interval(tmp_path: Path) -> None:
    mnt = mount_dir(tmp_path, "home")
    now = [100.0]
    calls: list[str] = []

    def probe(spec: MountSpec, write: bool) -> ProbeOutcome:
        calls.append(spec.path)
        return ProbeOutcome()

    c = checker(
        mountinfo(tmp_path, NFS4.format(path=mnt)),
        [str(mnt)],
        interval_s=10.0,
        probe_fn=probe,
        clock=lambda: now[0],
    )
    for t in (100.0, 105.0, 109.9, 110.0, 115.0, 120.5):
        now[0] = t
        host, failing = c.check()
        assert host["mounts_hung"] == 0 and failing == []
    assert len(calls) == 3  # at 100, 110, 120.5


# ---------------------------------------------------------------- a hung mount


class Fifo:
    """A named pipe: opening it for reading blocks in the kernel until a writer opens it, as a call
    on a hung NFS mount blocks until the server answers."""

    def __init__(self, path: Path) -> None:
        self.path = path
        os.mkfifo(path)
        self.opened = 0
        self.released = False

    def block(self) -> None:
        if self.released:  # the server is back
            return
        self.opened += 1
        with open(self.path, "rb") as f:  # blocks here
            f.read()

    def release(self) -> None:
        self.released = True
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK)  # a reader is waiting: opens at once
        except OSError:  # ENXIO: no reader (the probe never blocked)
            return
        os.close(fd)


def test_a_hung_mount_never_blocks_sample_and_gets_no_second_probe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hung, fine = mount_dir(tmp_path, "lustre"), mount_dir(tmp_path, "home")
    fifo = Fifo(tmp_path / "server")
    real_probe = mounts_module.probe_mount

    def probe(path: str, **kw: Any) -> ProbeOutcome:
        if path == str(hung):
            fifo.block()
        return real_probe(path, **kw)

    monkeypatch.setattr(mounts_module, "probe_mount", probe)
    proc = mountinfo(tmp_path, LUSTRE.format(path=hung), NFS4.format(path=fine))
    deadline = 0.5
    src = HostSource(
        proc_root=str(proc),
        disk_path=str(tmp_path),
        mounts=[str(hung), str(fine)],
        mount_deadline_s=deadline,
        mount_interval_s=0.05,  # a new probe is due at every sample: the hung mount's must not start
        mount_wait_s=0.1,
    )
    threads_before = threading.active_count()
    try:
        t0 = time.monotonic()
        first = src.sample()
        assert time.monotonic() - t0 < deadline  # sample() returned while the probe is stuck
        assert first["host"]["mounts_hung"] == 0  # not yet past the deadline
        time.sleep(deadline)
        for _ in range(4):
            t0 = time.monotonic()
            out = src.sample()
            assert time.monotonic() - t0 < deadline
            assert out["host"]["mounts_hung"] == 1
            assert out["host"]["mounts_missing"] + out["host"]["mounts_failed"] == 0
            [entry] = out["checks"]["mounts"]
            assert (entry["path"], entry["problem"], entry["fstype"]) == (str(hung), "hung", "lustre")
            assert entry["took_s"] >= deadline
            schemas.validate(telemetry_message(out))
            time.sleep(0.06)
        assert fifo.opened == 1  # one stuck probe, never a second one
        assert threading.active_count() - threads_before <= 2  # at most one probe per mount
    finally:
        fifo.release()
    time.sleep(0.2)  # the probe returns once the "server" answers
    out = src.sample()
    assert out["host"]["mounts_hung"] == 0 and "checks" not in out


def test_a_probe_that_raises_is_a_failed_mount_not_a_crash(tmp_path: Path) -> None:
    mnt = mount_dir(tmp_path, "home")

    def probe(spec: MountSpec, write: bool) -> ProbeOutcome:
        raise RuntimeError("boom")

    c = checker(mountinfo(tmp_path, NFS4.format(path=mnt)), [str(mnt)], probe_fn=probe)
    host, failing = c.check()
    assert host["mounts_failed"] == 1 and failing[0]["error"] == "RuntimeError"


# ---------------------------------------------------------------- block devices


def fake_sys(root: Path) -> Path:
    """/sys with an NVMe namespace, a SATA disk, a loop and an md device (virtual), a CD drive
    (removable) and an NVMe multipath per-path device (hidden), linked from /sys/block as the
    kernel links them."""
    devices = {
        "nvme0n1": "devices/pci0000:00/0000:00:01.1/0000:01:00.0/nvme/nvme0/nvme0n1",
        "nvme0c0n1": "devices/pci0000:00/0000:00:01.1/0000:01:00.0/nvme/nvme0/nvme0c0n1",
        "sda": "devices/pci0000:00/0000:00:17.0/ata1/host0/target0:0:0/0:0:0:0/block/sda",
        "sr0": "devices/pci0000:00/0000:00:17.0/ata2/host1/target1:0:0/1:0:0:0/block/sr0",
        "loop0": "devices/virtual/block/loop0",
        "md127": "devices/virtual/block/md127",
    }
    flags = {
        "nvme0n1": ("7501476528", "0", "0", "0"),
        "nvme0c0n1": ("7501476528", "0", "0", "1"),
        "sda": ("937703088", "0", "0", "0"),
        "sr0": ("2097151", "0", "1", "0"),
        "loop0": ("0", "0", "0", "0"),
        "md127": ("1875406848", "0", "0", "0"),
    }
    for name, rel in devices.items():
        size, ro, removable, hidden = flags[name]
        write_tree(root / rel, {"size": f"{size}\n", "ro": f"{ro}\n", "removable": f"{removable}\n"})
        write_tree(root / rel, {"hidden": f"{hidden}\n"})
        (root / "block").mkdir(parents=True, exist_ok=True)
        (root / "block" / name).symlink_to(Path("..") / rel)
    return root


def test_all_means_the_fixed_whole_disks_found_first(tmp_path: Path) -> None:
    sys_root = fake_sys(tmp_path / "sys")
    assert whole_disks(str(sys_root)) == ["nvme0n1", "sda"]
    c = BlockDevChecker(["all"], str(sys_root))
    assert c.check() == ({"blockdevs_missing": 0, "blockdevs_readonly": 0}, [])
    # the NVMe drive falls off the bus; the SATA disk is made read-only
    (sys_root / "block" / "nvme0n1").unlink()
    (sys_root / "devices/pci0000:00/0000:00:17.0/ata1/host0/target0:0:0/0:0:0:0/block/sda/ro").write_text(
        "1\n"
    )
    host, failing = c.check()
    assert host == {"blockdevs_missing": 1, "blockdevs_readonly": 1}
    assert failing == [{"name": "nvme0n1", "problem": "missing"}, {"name": "sda", "problem": "readonly"}]


def test_named_devices_missing_and_empty(tmp_path: Path) -> None:
    sys_root = fake_sys(tmp_path / "sys")
    (sys_root / "devices/virtual/block/md127/size").write_text("0\n")
    src = HostSource(
        proc_root=str(tmp_path / "proc"),
        disk_path=str(tmp_path),
        sys_root=str(sys_root),
        blockdevs=["sda", "nvme1n1", "md127"],
    )
    out = src.sample()
    assert (out["host"]["blockdevs_missing"], out["host"]["blockdevs_readonly"]) == (2, 0)
    assert out["checks"] == {
        "blockdevs": [{"name": "nvme1n1", "problem": "missing"}, {"name": "md127", "problem": "empty"}]
    }
    schemas.validate(telemetry_message(out))


def test_unreadable_sys_block_leaves_the_counts_out_until_it_reads(tmp_path: Path) -> None:
    c = BlockDevChecker(["all"], str(tmp_path / "sys"))
    assert c.check() == ({}, [])
    fake_sys(tmp_path / "sys")
    assert c.check() == ({"blockdevs_missing": 0, "blockdevs_readonly": 0}, [])


@pytest.mark.parametrize("name", ["", "../sda", "sd a", "a/b", "x" * 65, "-sda"])
def test_bad_block_device_names_are_refused(name: str) -> None:
    with pytest.raises(ValueError):
        check_blockdev_name(name)


def test_this_machines_sys_block() -> None:
    disks = whole_disks("/sys")
    if disks is None:
        pytest.skip("no /sys/block here")
    assert not any(d.startswith(("loop", "ram", "zram", "dm-", "md")) for d in disks)
    host, _failing = BlockDevChecker(["all"]).check()
    assert host["blockdevs_missing"] == 0


# ---------------------------------------------------------------- inodes


def statvfs(files: int, ffree: int, favail: int) -> os.statvfs_result:
    return os.statvfs_result((4096, 4096, 1000, 500, 400, files, ffree, favail, 0, 255))


def test_inodes_used_as_df_i_counts_them() -> None:
    # df -i: IUsed = f_files - f_ffree, IUse% = IUsed / f_files (root's reserved inodes count as free)
    assert inodes_used_frac(statvfs(1000, 250, 200)) == pytest.approx(0.75)
    assert inodes_used_frac(statvfs(0, 0, 0)) is None  # btrfs reports no inode count
    assert inodes_used_frac(statvfs(10, 20, 20)) == 0.0


def test_inodes_of_the_disk_path(tmp_path: Path) -> None:
    out = HostSource(proc_root=str(tmp_path), disk_path=str(tmp_path)).sample()["host"]
    st = os.statvfs(tmp_path)
    if st.f_files:
        assert out["inodes_used_frac"] == pytest.approx((st.f_files - st.f_ffree) / st.f_files, abs=0.01)


# ---------------------------------------------------------------- configuration


def test_collect_flags_and_the_configuration_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fleetwatch import cli, config
    from fleetwatch.collectors.agent import source_options

    monkeypatch.delenv(config.ENV, raising=False)
    assert "host" not in source_options(cli.parse(["collect"]))
    f = tmp_path / "fleetwatch.toml"
    f.write_text('[collect]\nmount = ["/home", "/datasets:ro"]\nblockdev = ["all"]\nmount_deadline = 30.0\n')
    host = source_options(cli.parse(["collect", "--config", str(f)]))["host"]
    assert host["mounts"] == [MountSpec("/home", True), MountSpec("/datasets", False)]
    assert (host["blockdevs"], host["mount_deadline_s"], host["mount_probe"]) == (["all"], 30.0, "write")
    assert host["mount_wait_s"] == 0.2
    # flags given replace the file's list (never add to it)
    args = cli.parse(
        ["collect", "--config", str(f), "--mount", "/scratch", "--mount", "/lustre:rw", "--interval", "0.1"]
    )
    host = source_options(args)["host"]
    assert host["mounts"] == [MountSpec("/scratch"), MountSpec("/lustre")] and host["blockdevs"] == ["all"]
    assert host["mount_wait_s"] == pytest.approx(0.025)  # a quarter of a 0.1 s call
    with pytest.raises(SystemExit):
        cli.parse(["collect", "--mount", "relative/path"])
    with pytest.raises(SystemExit):
        cli.parse(["collect", "--blockdev", "../sda"])
    for text, words in (
        ('mount = "/home"', "a list of strings"),
        ('mount = ["home"]', "absolute path"),
        ('blockdev = ["sd a"]', "/sys/block"),
        ('mount_probe_dir = "a/b"', "mount_probe_dir"),
        ('mount_probe = "touch"', "one of write, access"),
    ):
        f.write_text(f"[collect]\n{text}\n")
        with pytest.raises(config.ConfigError, match=words):
            cli.parse(["collect", "--config", str(f)])
