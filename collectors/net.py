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
A file that is missing or unparsable leaves its field out.

Ethernet, one entry per interface in <proc_root>/net/dev except `lo` (and names starting with
`skip_prefixes`, e.g. ("veth", "cali") on container hosts with hundreds of virtual interfaces):
iface, rx_bytes, rx_errors, rx_dropped, tx_bytes, tx_errors, tx_dropped, and `state` from
<sys_root>/class/net/<iface>/operstate ("up", "down", "unknown", ...).
"""

from __future__ import annotations

import os
from typing import Any

from fleetwatch.collectors.sources import SingleFlight, leading_float

IB_COUNTERS = (  # (telemetry field, file under counters/, multiplier)
    ("symbol_errors", "symbol_error", 1),
    ("link_downed", "link_downed", 1),
    ("rcv_errors", "port_rcv_errors", 1),
    ("xmit_discards", "port_xmit_discards", 1),
    ("tx_bytes", "port_xmit_data", 4),
    ("rx_bytes", "port_rcv_data", 4),
)

# /proc/net/dev columns after "iface:": 8 receive then 8 transmit counters.
NETDEV_COLUMNS = {
    "rx_bytes": 0,
    "rx_errors": 2,
    "rx_dropped": 3,
    "tx_bytes": 8,
    "tx_errors": 10,
    "tx_dropped": 11,
}


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return None


def _read_int(path: str) -> int | None:
    text = _read(path)
    try:
        return int(text) if text is not None else None
    except ValueError:  # e.g. "N/A (no PMA)" from some drivers
        return None


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
        self, sys_root: str = "/sys", proc_root: str = "/proc", skip_prefixes: tuple[str, ...] = ()
    ) -> None:
        self._sys = os.fspath(sys_root)
        self._proc = os.fspath(proc_root)
        self._skip_prefixes = tuple(skip_prefixes)
        self._guard = SingleFlight(self.name)

    def sample(self) -> dict[str, Any]:
        with self._guard():
            net: dict[str, Any] = {}
            ib = self._infiniband()
            if ib:
                net["ib"] = ib
            eth = self._ethernet()
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
            for port in sorted(_listdir(ports_dir), key=_port_key):
                ports.append(self._ib_port(device, port, os.path.join(ports_dir, port)))
        return ports

    def _ib_port(self, device: str, port: str, path: str) -> dict[str, Any]:
        entry: dict[str, Any] = {"device": device, "port": int(port) if port.isdigit() else port}
        for key, filename, parse in (
            ("state", "state", parse_ib_state),
            ("phys_state", "phys_state", parse_ib_state),
            ("rate_gbps", "rate", parse_ib_rate),
        ):
            text = _read(os.path.join(path, filename))
            value = parse(text) if text is not None else None
            if value is not None:
                entry[key] = value
        for key, filename, scale in IB_COUNTERS:
            value = _read_int(os.path.join(path, "counters", filename))
            if value is not None and value >= 0:
                entry[key] = value * scale
        return entry

    # ------------------------------------------------------------------ Ethernet

    def _ethernet(self) -> list[dict[str, Any]]:
        text = _read(os.path.join(self._proc, "net", "dev"))
        if text is None:
            return []
        interfaces: list[dict[str, Any]] = []
        for iface, counters in parse_net_dev(text).items():
            if iface == "lo" or (self._skip_prefixes and iface.startswith(self._skip_prefixes)):
                continue
            entry: dict[str, Any] = {"iface": iface}
            state = _read(os.path.join(self._sys, "class", "net", iface, "operstate"))
            if state:
                entry["state"] = state
            entry.update(counters)
            interfaces.append(entry)
        return interfaces


def _listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []
