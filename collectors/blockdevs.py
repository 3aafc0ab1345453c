"""Expected block devices (`fleetwatch collect --blockdev NAME`): each one present in /sys/block,
with a size, and not read-only. telemetry/1 `host` carries the counts (`blockdevs_missing`,
`blockdevs_readonly`), `checks.blockdevs` names the devices that fail (docs/contract.md).

- missing: /sys/block/NAME is gone (an NVMe controller that died takes its namespaces with it), or
  it reports a size of 0 sectors (a disk that lost its medium or capacity: problem "empty").
- readonly: /sys/block/NAME/ro is 1 (the kernel or the device made the whole disk read-only).

NAME "all" expects every whole disk the first sample finds: the entries of /sys/block that are
not virtual (loop, ram, zram, device-mapper and md devices live under /sys/devices/virtual),
not removable (card readers, optical drives) and not hidden (the per-path devices of NVMe
multipath). A disk lost before the agent started is then not known to be missing: name the
devices where that matters. I/O errors in the kernel log are the kernel source's (collectors/
kernel_log). Only sysfs is read, never the devices themselves: a failing disk cannot block it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from typing import Any

from fleetwatch import schemas
from fleetwatch.collectors.sources import read_stripped

ALL = "all"
MAX_NAMED = schemas.MAX_CHECK_ENTRIES
# kernel block device names: sda, nvme0n1, vdb, md127, cciss!c0d0 ('!' stands for '/' in sysfs)
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:!+-]{0,63}\Z")


def check_blockdev_name(name: str) -> str:
    if name != ALL and not NAME_RE.match(name):
        raise ValueError(f"{name[:80]!r}: a block device is a name in /sys/block (sda, nvme0n1) or 'all'")
    return name


def whole_disks(sys_root: str = "/sys") -> list[str] | None:
    """The real, fixed, visible whole disks in /sys/block, sorted; None if it cannot be read."""
    block = os.path.join(sys_root, "block")
    try:
        names = sorted(e.name for e in os.scandir(block))
    except OSError:
        return None
    disks = []
    for name in names:
        path = os.path.join(block, name)
        try:
            target = os.readlink(path)
        except OSError:  # not a link (an old sysfs layout): judged by its flags alone
            target = ""
        if "/virtual/" in f"/{target}/":
            continue
        if (
            read_stripped(os.path.join(path, "removable")) == "1"
            or read_stripped(os.path.join(path, "hidden")) == "1"
        ):
            continue
        if NAME_RE.match(name):
            disks.append(name)
    return disks


class BlockDevChecker:
    """check() -> (the `host` counts, the `checks.blockdevs` entries of the devices that fail)."""

    def __init__(self, names: Iterable[str], sys_root: str = "/sys") -> None:
        wanted = list(dict.fromkeys(check_blockdev_name(n) for n in names))
        self._all = ALL in wanted
        self._named = [n for n in wanted if n != ALL]
        if len(self._named) > MAX_NAMED:
            raise ValueError(f"{len(self._named)} block devices: at most {MAX_NAMED} can be named")
        self._sys = os.fspath(sys_root)
        self._expected: list[str] | None = None if self._all else self._named

    def check(self) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        if self._expected is None:  # "all": the whole disks of the first sample that can read them
            found = whole_disks(self._sys)
            if found is None:
                return {}, []
            self._expected = list(dict.fromkeys([*self._named, *found]))
        missing = readonly = 0
        entries: list[dict[str, Any]] = []
        for name in self._expected:
            base = os.path.join(self._sys, "block", name)
            size, ro = read_stripped(os.path.join(base, "size")), read_stripped(os.path.join(base, "ro"))
            problem = None
            if size is None or ro is None:  # gone, or going while read
                problem = "missing"
            elif size == "0":
                problem = "empty"
            elif ro == "1":
                problem = "readonly"
            if problem is None:
                continue
            if problem == "readonly":
                readonly += 1
            else:
                missing += 1
            if len(entries) < schemas.MAX_CHECK_ENTRIES:  # the counts hold them all
                entries.append({"name": name, "problem": problem})
        return {"blockdevs_missing": missing, "blockdevs_readonly": readonly}, entries
