"""Network telemetry: InfiniBand ports from sysfs, Ethernet-style interfaces from /proc/net/dev.

telemetry/1 `net` = {"ib": [...], "eth": [...]}. A list is left out (not sent empty) when nothing
of its kind is found, the same "absent, never invented" rule as for single fields; so a node
without InfiniBand sends no `ib` key, and `net` may be {}.

InfiniBand, one entry per <sys_root>/class/infiniband/<device>/ports/<port>/ (RoCE ports show
up here too):
    device, port        directory names (port as an int: "1" -> 1)
    state               `state` "4: ACTIVE" -> "ACTIVE"
    phys_state          (extra) `phys_state` "5: LinkUp" -> "LinkUp": tells a cable/PHY problem
                        ("Polling", "Disabled") from a subnet-manager one (state INIT with LinkUp)
    rate_gbps           `rate` "200 Gb/sec (4X HDR)" -> 200.0
    symbol_errors       counters/symbol_error
    link_downed         counters/link_downed
    rcv_errors          counters/port_rcv_errors
    xmit_discards       counters/port_xmit_discards
    tx_bytes, rx_bytes  counters/port_xmit_data, port_rcv_data times 4: the IB spec counts them in
                        units of 4 octets
    link_error_recovery counters/link_error_recovery: link retrains that succeeded (link_downed
                        counts the ones that failed)
    local_link_integrity_errors      counters/local_link_integrity_errors: times the local physical
                        errors passed the LocalPhyErrors threshold
    excessive_buffer_overrun_errors  counters/excessive_buffer_overrun_errors: input buffer overruns
                        (a misconfigured port, or poor signal integrity)
    rcv_remote_physical_errors       counters/port_rcv_remote_physical_errors: packets received
                        marked bad (EBP) by the sender's side: a problem upstream of this port
    xmit_wait           counters/port_xmit_wait: ticks with data to send but none sent (no credits:
                        congestion)
    pcie_link_gen, pcie_link_gen_max, pcie_link_width, pcie_link_width_max
                        the PCIe link of the port's HCA, the same for each port of a device:
                        <device>/device/current_link_speed, max_link_speed, current_link_width,
                        max_link_width. A speed is pci_speed_string()'s text, "16.0 GT/s PCIe"
                        ("16 GT/s" from kernels 5.6 and earlier, as NVIDIA/nccl's
                        src/graph/topo.cc kvDictPciGen notes; "Unknown" for a rate it has no name
                        for), a generation by its rate (2.5, 5, 8, 16, 32, 64, 128 GT/s: 1..7); a
                        width a lane count ("16"; "x16" read the same). Unlike NVML's max (the GPU
                        and its slot), these maxima are the HCA's own Link Capabilities: an HCA
                        in a slot narrower or slower than itself shows below max for good.
A file that is missing or unparsable leaves its field out, and so does a value the contract does
not allow (a counter past 2**64 - 1 or negative, a width past 32: a powered-off device reads all
ones): one such value would make the whole sample invalid.

Sources: the counter files and their meaning, Linux Documentation/ABI/stable/sysfs-class-infiniband;
their widths, drivers/infiniband/core/sysfs.c (PORT_PMA_ATTR: link_error_recovery 8 bits, the two
threshold counters 4 bits, port_rcv_remote_physical_errors 16, port_xmit_wait 32). They are the
PMA PortCounters attribute's counters, which the InfiniBand spec has saturate at their maximum
rather than wrap: a 4-bit counter stuck at 15 means "15 or more". The link files,
drivers/pci/pci-sysfs.c (max_link_speed, current_link_width, ...) and drivers/pci/probe.c
(pci_speed_string). Whether an HCA lowers its link speed when idle as GPUs do (collectors/nvml.py)
is not documented that we found: judge its generation under traffic too.

Ethernet, one entry per interface in <proc_root>/net/dev that is a device on a bus: the kernel's
virtual interfaces (<sys_root>/class/net/<iface> a link into devices/virtual/: `lo`, bridges,
veth pairs, VLANs, bonds, tunnels, ifb) are left out unless `include_virtual` (`collect
--net-virtual`). A container host makes a veth pair per pod, each a name never seen before, and
their counters say nothing of the node's hardware: the physical ports under a bond or a bridge carry
its errors. Names starting with one of `skip_prefixes` (`collect --net-skip`) are left out too.
Each entry:
iface, rx_bytes, rx_errors, rx_dropped, tx_bytes, tx_errors, tx_dropped, and `state` from
<sys_root>/class/net/<iface>/operstate ("up", "down", "unknown", ...). Link flaps from the same
directory: `carrier_changes` (carrier_changes: ups and downs of the carrier since the device was
registered), and where the kernel has them (4.16 and later) `carrier_up_count`,
`carrier_down_count` (Documentation/ABI/testing/sysfs-class-net; net/core/net-sysfs.c prints
them with %d, so a count past 2**31 would read negative: left out).
"""

from __future__ import annotations

import os
import re
from typing import Any

from fleetwatch import schemas
from fleetwatch.collectors.sources import SingleFlight, leading_float, printable_name, read_stripped
from fleetwatch.schemas import MAX_PCIE_GEN, MAX_PCIE_WIDTH, U64_MAX

IB_COUNTERS = (  # (telemetry field, file under counters/, multiplier)
    ("symbol_errors", "symbol_error", 1),
    ("link_downed", "link_downed", 1),
    ("rcv_errors", "port_rcv_errors", 1),
    ("xmit_discards", "port_xmit_discards", 1),
    ("tx_bytes", "port_xmit_data", 4),
    ("rx_bytes", "port_rcv_data", 4),
    ("link_error_recovery", "link_error_recovery", 1),
    ("local_link_integrity_errors", "local_link_integrity_errors", 1),
    ("excessive_buffer_overrun_errors", "excessive_buffer_overrun_errors", 1),
    ("rcv_remote_physical_errors", "port_rcv_remote_physical_errors", 1),
    ("xmit_wait", "port_xmit_wait", 1),
)
# (telemetry field, file in the HCA's PCI device directory, parser)
PCIE_LINK_FILES = (
    ("pcie_link_gen", "current_link_speed", "speed"),
    ("pcie_link_gen_max", "max_link_speed", "speed"),
    ("pcie_link_width", "current_link_width", "width"),
    ("pcie_link_width_max", "max_link_width", "width"),
)
# A PCIe generation by its transfer rate in GT/s (PCI Express base specifications 1.0 to 7.0).
GEN_BY_GT_PER_S = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6, 128.0: 7}
ETH_CARRIER_FILES = ("carrier_changes", "carrier_up_count", "carrier_down_count")
_GT_PER_S = re.compile(r"(\d+(?:\.\d+)?) GT/s(?: PCIe)?")

# /proc/net/dev columns after "iface:": 8 receive then 8 transmit counters.
NETDEV_COLUMNS = {
    "rx_bytes": 0,
    "rx_errors": 2,
    "rx_dropped": 3,
    "tx_bytes": 8,
    "tx_errors": 10,
    "tx_dropped": 11,
}


def _read_int(path: str) -> int | None:
    text = read_stripped(path)
    try:
        return int(text) if text is not None else None
    except ValueError:  # e.g. "N/A (no PMA)" from some drivers
        return None


def _read_counter(path: str, scale: int = 1) -> int | None:
    """A counter file's value times `scale`, or None: missing, unparsable, negative, or past 2**64 - 1."""
    value = _read_int(path)
    if value is None or value < 0 or value * scale > U64_MAX:
        return None
    return value * scale


def parse_pcie_speed(text: str) -> int | None:
    """ "32.0 GT/s PCIe" -> 5 (and a kernel before 5.7's "32 GT/s"); "Unknown", "Unknown speed",
    a rate no generation has, or anything else -> None."""
    match = _GT_PER_S.fullmatch(text.strip())
    gen = GEN_BY_GT_PER_S.get(float(match.group(1))) if match else None
    return gen if gen is not None and gen <= MAX_PCIE_GEN else None


def parse_pcie_width(text: str) -> int | None:
    """ "16" (what the kernel writes) or "x16" -> 16; past 32 (a powered-off device's register reads
    all ones: 63), negative or not a number -> None."""
    text = text.strip()
    digits = text[1:] if text[:1] in ("x", "X") else text
    if not digits.isascii() or not digits.isdigit() or len(digits) > 3:
        return None
    width = int(digits)
    return width if width <= MAX_PCIE_WIDTH else None


def parse_ib_state(text: str) -> str | None:
    """ "4: ACTIVE" -> "ACTIVE" (also used for phys_state "5: LinkUp" -> "LinkUp")."""
    name = text.partition(":")[2].strip() if ":" in text else text.strip()
    return name or None


def parse_ib_rate(text: str) -> float | None:
    """ "200 Gb/sec (4X HDR)" -> 200.0; "2.5 Gb/sec (1X SDR)" -> 2.5."""
    return leading_float(text)


def parse_net_dev(text: str) -> dict[str, dict[str, int]]:
    """{iface: {rx_bytes: ..., ...}} from /proc/net/dev (two header lines, then `iface: counters`)."""
    result: dict[str, dict[str, int]] = {}
    for line in text.splitlines()[2:]:
        # Split on ':' rather than whitespace: large counters can touch it ("eth0:123456789 ...").
        iface, sep, rest = line.partition(":")
        values = rest.split()
        if not sep or len(values) < 16:
            continue
        try:
            result[iface.strip()] = {key: int(values[col]) for key, col in NETDEV_COLUMNS.items()}
        except ValueError:
            continue
    return result


def _port_key(name: str) -> tuple[int, str]:
    return (int(name), "") if name.isdigit() else (1 << 30, name)


class NetSource:
    """`sample()` -> {"net": {"ib": [{device, port, ...}], "eth": [{iface, ...}]}}, empty lists left out."""

    name = "net"

    def __init__(
        self,
        sys_root: str = "/sys",
        proc_root: str = "/proc",
        skip_prefixes: tuple[str, ...] = (),
        include_virtual: bool = False,
    ) -> None:
        self._sys = os.fspath(sys_root)
        self._proc = os.fspath(proc_root)
        self._skip_prefixes = tuple(skip_prefixes)
        self._include_virtual = include_virtual
        self._guard = SingleFlight(self.name)

    def sample(self) -> dict[str, Any]:
        with self._guard():
            net: dict[str, Any] = {}
            # at most what one sample may list (SR-IOV's virtual functions are PCI devices, so they
            # are not left out as virtual; 257 made the whole part out of contract): the first ones
            # in natural name order (IB) and as /proc/net/dev lists them (physical functions first)
            ib = self._infiniband()[: schemas.MAX_PORTS]
            if ib:
                net["ib"] = ib
            eth = self._ethernet()[: schemas.MAX_PORTS]
            if eth:
                net["eth"] = eth
            return {"net": net}

    def close(self) -> None:
        """Nothing to release: every file is opened and closed within sample()."""

    # ------------------------------------------------------------------ InfiniBand

    def _infiniband(self) -> list[dict[str, Any]]:
        ports: list[dict[str, Any]] = []
        ib_root = os.path.join(self._sys, "class", "infiniband")
        for device in _listdir(ib_root):
            ports_dir = os.path.join(ib_root, device, "ports")
            link = _pcie_link(os.path.join(ib_root, device, "device"))  # once per device, not per port
            for port in sorted(_listdir(ports_dir), key=_port_key):
                entry = self._ib_port(device, port, os.path.join(ports_dir, port))
                entry.update(link)
                ports.append(entry)
        return ports

    def _ib_port(self, device: str, port: str, path: str) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "device": printable_name(device),
            "port": int(port) if port.isdigit() else printable_name(port),
        }
        for key, filename, parse in (
            ("state", "state", parse_ib_state),
            ("phys_state", "phys_state", parse_ib_state),
            ("rate_gbps", "rate", parse_ib_rate),
        ):
            text = read_stripped(os.path.join(path, filename))
            value = parse(text) if text is not None else None
            if value is not None:
                entry[key] = value
        for key, filename, scale in IB_COUNTERS:
            value = _read_counter(os.path.join(path, "counters", filename), scale)
            if value is not None:
                entry[key] = value
        return entry

    # ------------------------------------------------------------------ Ethernet

    def _ethernet(self) -> list[dict[str, Any]]:
        # names as bytes (Linux takes any but '/' and NUL in one): its sysfs entries are opened by
        # the name as it is, and it is sent printable (\xNN for what is not UTF-8)
        text = read_stripped(os.path.join(self._proc, "net", "dev"), errors="surrogateescape")
        if text is None:
            return []
        interfaces: list[dict[str, Any]] = []
        for iface, counters in parse_net_dev(text).items():
            if iface == "lo" or (self._skip_prefixes and iface.startswith(self._skip_prefixes)):
                continue
            if not self._include_virtual and self._virtual(iface):
                continue
            entry: dict[str, Any] = {"iface": printable_name(iface)}
            state = read_stripped(os.path.join(self._sys, "class", "net", iface, "operstate"))
            if state:
                entry["state"] = state
            entry.update(counters)
            for filename in ETH_CARRIER_FILES:
                value = _read_counter(os.path.join(self._sys, "class", "net", iface, filename))
                if value is not None:
                    entry[filename] = value
            interfaces.append(entry)
        return interfaces

    def _virtual(self, iface: str) -> bool:
        """Whether the kernel registered `iface` as a virtual device (its class entry links into
        devices/virtual/net). An interface whose entry cannot be resolved is kept: a missing
        answer must not hide a port."""
        try:
            target = os.readlink(os.path.join(self._sys, "class", "net", iface))
        except OSError:
            return False
        return "/devices/virtual/" in "/" + target.replace(os.sep, "/")


def _pcie_link(device_dir: str) -> dict[str, int]:
    """The PCIe link fields of the PCI device at `device_dir` (an IB device's `device` link); {} for
    a device that is not PCIe (a software RDMA device has no such files)."""
    link: dict[str, int] = {}
    for key, filename, kind in PCIE_LINK_FILES:
        text = read_stripped(os.path.join(device_dir, filename))
        if text is None:
            continue
        value = parse_pcie_speed(text) if kind == "speed" else parse_pcie_width(text)
        if value is not None:
            link[key] = value
    return link


def _listdir(path: str) -> list[str]:
    """Names in natural order (mlx5_2 before mlx5_10): past the 256 a sample may list, the first
    devices (the physical functions, registered before their VFs) are the ones kept."""
    try:
        return sorted(os.listdir(path), key=_natural)
    except OSError:
        return []


def _natural(name: str) -> list[tuple[int, int | str]]:
    return [(0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", name) if part]
