"""NetSource on fake sysfs/procfs trees, and once on this machine's real /proc/net/dev."""

from __future__ import annotations

import os
from pathlib import Path

from fleetwatch import schemas
from fleetwatch.collectors.net import NetSource, parse_ib_rate, parse_ib_state, parse_net_dev
from tests.fakes import telemetry_message, write_tree

NET_DEV = """Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls ...
    lo:   82537     761 0 0 0 0 0 0    82537     761 0 0 0 0 0 0
  eth0: 178247616  5430 1 2 0 0 0 0   540600    3412 3 4 0 0 0 0
eth1:12345678901234 10 0 0 0 0 0 0 98765432109876 20 0 0 0 0 0 0
   ib0:     100       1 0 0 0 0 0 0      200       2 0 0 0 0 0 0
veth9a1b:     5       1 0 0 0 0 0 0        6       1 0 0 0 0 0 0
 short: 1 2 3
"""

PORT = "class/infiniband/{dev}/ports/{port}/"


def ib_port(dev: str, port: int, **files: str) -> dict[str, str]:
    return {PORT.format(dev=dev, port=port) + name: text for name, text in files.items()}


def fake_tree(tmp_path: Path) -> tuple[Path, Path]:
    sysfs = write_tree(
        tmp_path / "sys",
        {
            **ib_port(
                "mlx5_0",
                1,
                state="4: ACTIVE\n",
                phys_state="5: LinkUp\n",
                rate="200 Gb/sec (4X HDR)\n",
                **{
                    "counters/symbol_error": "3\n",
                    "counters/link_downed": "1\n",
                    "counters/port_rcv_errors": "2\n",
                    "counters/port_xmit_discards": "5\n",
                    "counters/port_xmit_data": "1000\n",
                    "counters/port_rcv_data": "250\n",
                },
            ),
            # A second, broken port: down, some counters missing or unreadable.
            **ib_port(
                "mlx5_1",
                1,
                state="1: DOWN\n",
                phys_state="3: Disabled\n",
                rate="10 Gb/sec (4X)\n",
                **{"counters/symbol_error": "N/A (no PMA)\n", "counters/link_downed": "7\n"},
            ),
            **ib_port("mlx5_1", 2, rate="2.5 Gb/sec (1X SDR)\n"),
            "class/net/eth0/operstate": "up\n",
            "class/net/eth1/operstate": "down\n",
            "class/net/lo/operstate": "unknown\n",
        },
    )
    proc = write_tree(tmp_path / "proc", {"net/dev": NET_DEV})
    return sysfs, proc


def test_infiniband_ports_mapped_and_converted(tmp_path: Path) -> None:
    sysfs, proc = fake_tree(tmp_path)
    ib = NetSource(sys_root=str(sysfs), proc_root=str(proc)).sample()["net"]["ib"]
    assert ib == [
        {
            "device": "mlx5_0",
            "port": 1,
            "state": "ACTIVE",
            "phys_state": "LinkUp",
            "rate_gbps": 200.0,
            "symbol_errors": 3,
            "link_downed": 1,
            "rcv_errors": 2,
            "xmit_discards": 5,
            "tx_bytes": 4000,  # port_xmit_data counts 4-octet words
            "rx_bytes": 1000,
        },
        {
            "device": "mlx5_1",
            "port": 1,
            "state": "DOWN",
            "phys_state": "Disabled",
            "rate_gbps": 10.0,
            "link_downed": 7,
        },
        {"device": "mlx5_1", "port": 2, "rate_gbps": 2.5},
    ]


def test_ethernet_from_proc_net_dev(tmp_path: Path) -> None:
    sysfs, proc = fake_tree(tmp_path)
    eth = NetSource(sys_root=str(sysfs), proc_root=str(proc)).sample()["net"]["eth"]
    assert [e["iface"] for e in eth] == ["eth0", "eth1", "ib0", "veth9a1b"]  # lo and the short line skipped
    assert eth[0] == {
        "iface": "eth0",
        "state": "up",
        "rx_bytes": 178247616,
        "rx_errors": 1,
        "rx_dropped": 2,
        "tx_bytes": 540600,
        "tx_errors": 3,
        "tx_dropped": 4,
    }
    assert (eth[1]["state"], eth[1]["rx_bytes"], eth[1]["tx_bytes"]) == (
        "down",
        12345678901234,
        98765432109876,
    )
    assert "state" not in eth[2]  # no operstate file: absent


def test_skip_prefixes_drop_virtual_interfaces(tmp_path: Path) -> None:
    sysfs, proc = fake_tree(tmp_path)
    eth = NetSource(sys_root=str(sysfs), proc_root=str(proc), skip_prefixes=("veth",)).sample()["net"]["eth"]
    assert [e["iface"] for e in eth] == ["eth0", "eth1", "ib0"]


def test_no_infiniband_and_no_net_dev_leave_keys_out(tmp_path: Path) -> None:
    proc = write_tree(tmp_path / "proc", {"net/dev": NET_DEV})
    net = NetSource(sys_root=str(tmp_path / "sys"), proc_root=str(proc)).sample()["net"]
    assert "ib" not in net and len(net["eth"]) == 4
    assert NetSource(sys_root=str(tmp_path / "sys"), proc_root=str(tmp_path / "none")).sample() == {"net": {}}


def test_fake_tree_output_validates(tmp_path: Path) -> None:
    sysfs, proc = fake_tree(tmp_path)
    message = telemetry_message(NetSource(sys_root=str(sysfs), proc_root=str(proc)).sample())
    assert schemas.validate(message) is message


def test_parsers() -> None:
    assert parse_ib_state("4: ACTIVE") == "ACTIVE"
    assert parse_ib_state("ACTIVE") == "ACTIVE"
    assert parse_ib_state("4:") is None
    assert parse_ib_rate("400 Gb/sec (4X NDR)") == 400.0
    assert parse_ib_rate("") is None
    assert parse_ib_rate("fast") is None
    assert parse_net_dev(NET_DEV)["eth1"]["rx_bytes"] == 12345678901234


def test_real_proc_net_dev() -> None:
    net = NetSource().sample()["net"]
    schemas.validate(telemetry_message({"net": net}))
    # Independent view of the same namespace: /sys/class/net lists the same interfaces.
    expected = sorted(set(os.listdir("/sys/class/net")) - {"lo"})
    eth = net.get("eth", [])
    assert sorted(e["iface"] for e in eth) == expected
    for entry in eth:
        stats = Path("/sys/class/net") / entry["iface"] / "statistics"
        # Counters only grow: sysfs read after the sample is at least what the sample saw.
        assert int((stats / "rx_bytes").read_text()) >= entry["rx_bytes"]
        assert int((stats / "tx_bytes").read_text()) >= entry["tx_bytes"]
        assert entry["state"] == (Path("/sys/class/net") / entry["iface"] / "operstate").read_text().strip()
