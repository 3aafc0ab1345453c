"""NetSource on fake sysfs/procfs trees, and once on this machine's real /proc/net/dev."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fleetwatch import schemas
from fleetwatch.collectors.net import (
    NetSource,
    parse_ib_rate,
    parse_ib_state,
    parse_net_dev,
    parse_pcie_speed,
    parse_pcie_width,
)
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


def virtual(sysfs: Path, *names: str) -> None:
    """Make `names` virtual interfaces as the kernel lays them out: class/net/NAME a link into
    devices/virtual/net/NAME; a physical one links into its bus device's directory."""
    for name in names:
        target = sysfs / "devices" / "virtual" / "net" / name
        target.mkdir(parents=True, exist_ok=True)
        entry = sysfs / "class" / "net" / name
        if entry.is_dir() and not entry.is_symlink():  # the fake tree's plain directory: move it
            for f in entry.iterdir():
                f.rename(target / f.name)
            entry.rmdir()
        entry.parent.mkdir(parents=True, exist_ok=True)
        entry.symlink_to(Path("..") / ".." / "devices" / "virtual" / "net" / name)


def physical(sysfs: Path, name: str, pci: str) -> None:
    target = sysfs / "devices" / "pci0000:00" / pci / "net" / name
    target.mkdir(parents=True)
    entry = sysfs / "class" / "net" / name
    if entry.is_dir() and not entry.is_symlink():
        for f in entry.iterdir():
            f.rename(target / f.name)
        entry.rmdir()
    entry.symlink_to(Path("..") / ".." / "devices" / "pci0000:00" / pci / "net" / name)


def test_virtual_interfaces_are_left_out_unless_asked_for(tmp_path: Path) -> None:
    """A container host's veth pairs (a new name per pod) and its bridges are the kernel's virtual
    devices: left out by default, their counters are no hardware's; the bus device eth0 stays, and
    its operstate is read through the link. An entry with no link (not resolvable) is kept."""
    sysfs, proc = fake_tree(tmp_path)
    physical(sysfs, "eth0", "0000:00:03.0")
    virtual(sysfs, "veth9a1b", "eth1")
    eth = NetSource(sys_root=str(sysfs), proc_root=str(proc)).sample()["net"]["eth"]
    assert [e["iface"] for e in eth] == ["eth0", "ib0"]  # ib0: a plain directory here, kept
    assert eth[0]["state"] == "up"
    every = NetSource(sys_root=str(sysfs), proc_root=str(proc), include_virtual=True).sample()["net"]["eth"]
    assert [e["iface"] for e in every] == ["eth0", "eth1", "ib0", "veth9a1b"]
    assert every[1]["state"] == "down"  # read through its link into devices/virtual


def test_collect_flags_reach_the_net_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fleetwatch import cli, config
    from fleetwatch.collectors.agent import source_options

    monkeypatch.delenv(config.ENV, raising=False)

    assert source_options(cli.parse(["collect"]))["net"] == {"include_virtual": False, "skip_prefixes": ()}
    args = cli.parse(["collect", "--net-virtual", "--net-skip", "veth", "--net-skip", "cali"])
    assert source_options(args)["net"] == {"include_virtual": True, "skip_prefixes": ("veth", "cali")}
    f = tmp_path / "fleetwatch.toml"
    f.write_text('[collect]\nnet_virtual = true\nnet_skip = ["docker"]\n')
    assert source_options(cli.parse(["collect", "--config", str(f)]))["net"] == {
        "include_virtual": True,
        "skip_prefixes": ("docker",),
    }
    for bad in ("", "a/b", "eth:0", "x y", "x" * 16):
        with pytest.raises(SystemExit):
            cli.parse(["collect", "--net-skip", bad])


def test_no_infiniband_and_no_net_dev_leave_keys_out(tmp_path: Path) -> None:
    proc = write_tree(tmp_path / "proc", {"net/dev": NET_DEV})
    net = NetSource(sys_root=str(tmp_path / "sys"), proc_root=str(proc)).sample()["net"]
    assert "ib" not in net and len(net["eth"]) == 4
    assert NetSource(sys_root=str(tmp_path / "sys"), proc_root=str(tmp_path / "none")).sample() == {"net": {}}


def test_more_ports_than_a_sample_may_list_send_the_first_256(tmp_path: Path) -> None:
    """SR-IOV's virtual functions are PCI devices (kept as physical): 300 of them made the net part
    out of contract, left out whole (before: the whole sample blanked)."""
    header = "\n".join(NET_DEV.splitlines()[:2])
    rows = "".join(f"enp1s0f0v{i}: 1 1 0 0 0 0 0 0 1 1 0 0 0 0 0 0\n" for i in range(300))
    proc = write_tree(tmp_path / "proc", {"net/dev": f"{header}\n{rows}"})
    body = NetSource(sys_root=str(tmp_path / "sys"), proc_root=str(proc)).sample()
    schemas.validate(telemetry_message(body))
    eth = body["net"]["eth"]
    assert len(eth) == schemas.MAX_PORTS and [e["iface"] for e in eth[:2]] == ["enp1s0f0v0", "enp1s0f0v1"]


def test_interface_names_past_ascii_are_looked_up_as_they_are_and_sent_printable(tmp_path: Path) -> None:
    """Linux takes any byte in a name but '/' and NUL: /proc/net/dev read as ASCII with replacement
    mangled them, so their sysfs entries were missed (no state, and a virtual one sent although
    virtual ones are left out; an adversarial probe's find)."""
    proc, sysfs = tmp_path / "proc", tmp_path / "sys"
    (proc / "net").mkdir(parents=True)
    (sysfs / "class" / "net").mkdir(parents=True)
    names = {b"eth\xfc0": "pci0000:00/0000:00:03.0", "veth\u00fc1".encode(): "virtual"}
    rows = [b"Inter-| hdr", b" face | hdr"] + [n + b": 1 2 0 0 0 0 0 0 3 4 0 0 0 0 0 0" for n in names]
    (proc / "net" / "dev").write_bytes(b"\n".join(rows) + b"\n")
    for name, where in names.items():
        d = os.fsencode(sysfs / "devices" / where / "net") + b"/" + name
        os.makedirs(d)
        with open(d + b"/operstate", "wb") as f:
            f.write(b"up\n")
        os.symlink(d, os.fsencode(sysfs / "class" / "net") + b"/" + name)
    body = NetSource(sys_root=str(sysfs), proc_root=str(proc)).sample()
    schemas.encode(schemas.validate(telemetry_message(body)))
    [eth] = body["net"]["eth"]  # the virtual one left out
    assert (eth["iface"], eth["state"], eth["rx_bytes"], eth["tx_bytes"]) == ("eth\\xfc0", "up", 1, 3)


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
    # Independent view of the same namespace: /sys/class/net lists the same interfaces; those
    # whose device the kernel keeps under /sys/devices/virtual (lo among them) are left out
    real = Path("/sys/class/net")
    expected = sorted(n for n in os.listdir(real) if "/devices/virtual/" not in os.path.realpath(real / n))
    assert sorted(set(os.listdir(real)) - set(expected)) == sorted(os.listdir("/sys/devices/virtual/net"))
    eth = net.get("eth", [])
    assert sorted(e["iface"] for e in eth) == expected
    for entry in eth:
        stats = Path("/sys/class/net") / entry["iface"] / "statistics"
        # Counters only grow: sysfs read after the sample is at least what the sample saw.
        assert int((stats / "rx_bytes").read_text()) >= entry["rx_bytes"]
        assert int((stats / "tx_bytes").read_text()) >= entry["tx_bytes"]
        assert entry["state"] == (Path("/sys/class/net") / entry["iface"] / "operstate").read_text().strip()


# ---------------------------------------------------------------- PCIe link, more IB counters, carrier

# Real file contents: the kernel writes a speed with pci_speed_string() ("32.0 GT/s PCIe"; "8 GT/s"
# before 5.7) and a width as a bare number.
CX7 = {  # ConnectX-7 (NDR, PCIe Gen5 x16) at full link
    "current_link_speed": "32.0 GT/s PCIe\n",
    "max_link_speed": "32.0 GT/s PCIe\n",
    "current_link_width": "16\n",
    "max_link_width": "16\n",
}
CX6_DEGRADED = {  # ConnectX-6 (HDR, Gen4 x16) that trained at Gen3 x8
    "current_link_speed": "8.0 GT/s PCIe\n",
    "max_link_speed": "16.0 GT/s PCIe\n",
    "current_link_width": "8\n",
    "max_link_width": "16\n",
}


def hca(dev: str, link: dict[str, str]) -> dict[str, str]:
    return {f"class/infiniband/{dev}/device/{name}": text for name, text in link.items()}


def test_hca_pcie_link_and_extended_counters(tmp_path: Path) -> None:
    sysfs = write_tree(
        tmp_path / "sys",
        {
            **hca("mlx5_0", CX7),
            **ib_port(
                "mlx5_0",
                1,
                state="4: ACTIVE\n",
                **{
                    "counters/link_error_recovery": "255\n",  # 8 bits, saturated
                    "counters/local_link_integrity_errors": "15\n",  # 4 bits, saturated
                    "counters/excessive_buffer_overrun_errors": "0\n",
                    "counters/port_rcv_remote_physical_errors": "12\n",
                    "counters/port_xmit_wait": "4294967295\n",  # 32 bits
                },
            ),
            **hca("mlx5_1", CX6_DEGRADED),
            **ib_port("mlx5_1", 1, state="4: ACTIVE\n"),
            **ib_port("mlx5_1", 2, state="1: DOWN\n"),  # the device's link, on each of its ports
            # a software RDMA device: no PCI device behind it, so no link fields
            **ib_port("rxe0", 1, state="4: ACTIVE\n"),
        },
    )
    body = NetSource(sys_root=str(sysfs), proc_root=str(tmp_path / "proc")).sample()
    ib = body["net"]["ib"]
    assert ib[0] == {
        "device": "mlx5_0",
        "port": 1,
        "state": "ACTIVE",
        "link_error_recovery": 255,
        "local_link_integrity_errors": 15,
        "excessive_buffer_overrun_errors": 0,
        "rcv_remote_physical_errors": 12,
        "xmit_wait": 4294967295,
        "pcie_link_gen": 5,
        "pcie_link_gen_max": 5,
        "pcie_link_width": 16,
        "pcie_link_width_max": 16,
    }
    degraded = {"pcie_link_gen": 3, "pcie_link_gen_max": 4, "pcie_link_width": 8, "pcie_link_width_max": 16}
    assert [{k: p[k] for k in degraded} for p in ib[1:3]] == [degraded, degraded]
    assert ib[3] == {"device": "rxe0", "port": 1, "state": "ACTIVE"}
    assert schemas.validate(telemetry_message(body))


@pytest.mark.parametrize(
    ("text", "gen"),
    [
        ("2.5 GT/s PCIe\n", 1),
        ("5.0 GT/s PCIe", 2),
        ("8.0 GT/s PCIe", 3),
        ("16.0 GT/s PCIe", 4),
        ("32.0 GT/s PCIe", 5),
        ("64.0 GT/s PCIe", 6),
        ("8 GT/s\n", 3),  # kernels 5.6 and earlier
        ("16 GT/s", 4),
        ("5 GT/s", 2),
        ("Unknown\n", None),  # pci_speed_string past its table
        ("Unknown speed\n", None),  # older kernels
        ("", None),
        ("12.0 GT/s PCIe", None),  # no generation runs at 12
        ("-16.0 GT/s PCIe", None),
        ("16.0 GT/s PCIe garbage", None),
        ("1e3 GT/s", None),
        ("9" * 400 + " GT/s", None),
        ("133 MHz PCI-X 533", None),
    ],
)
def test_parse_pcie_speed(text: str, gen: int | None) -> None:
    assert parse_pcie_speed(text) == gen


@pytest.mark.parametrize(
    ("text", "width"),
    [
        ("16\n", 16),
        ("8", 8),
        ("1", 1),
        ("32", 32),
        ("0", 0),  # a link that did not train
        ("x16", 16),
        ("63\n", None),  # the width bits of a status register read as all ones (device powered off)
        ("33", None),
        ("-1", None),
        ("", None),
        ("Unknown", None),
        ("99999999999999999999999", None),
        ("١٦", None),  # not ASCII digits
        ("16.0", None),
    ],
)
def test_parse_pcie_width(text: str, width: int | None) -> None:
    assert parse_pcie_width(text) == width


def test_hostile_files_leave_their_fields_out_and_the_sample_valid(tmp_path: Path) -> None:
    sysfs = write_tree(
        tmp_path / "sys",
        {
            **hca(
                "mlx5_0",
                {
                    "current_link_speed": "Unknown\n",
                    "max_link_speed": "\n",
                    "current_link_width": "63\n",
                    "max_link_width": "-16\n",
                },
            ),
            **ib_port(
                "mlx5_0",
                1,
                **{
                    "counters/link_error_recovery": "-1\n",
                    "counters/local_link_integrity_errors": "N/A (no PMA)\n",  # older kernels
                    "counters/excessive_buffer_overrun_errors": "\n",
                    "counters/port_rcv_remote_physical_errors": "18446744073709551616\n",  # 2**64
                    "counters/port_xmit_wait": "1" * 5000 + "\n",  # past int()'s digit limit
                    "counters/symbol_error": "18446744073709551615\n",  # 2**64 - 1: still a u64
                    "counters/port_xmit_data": "4611686018427387904\n",  # 2**62 words: 2**64 bytes
                    "counters/port_rcv_data": "4611686018427387903\n",
                },
            ),
            "class/net/eth0/carrier_changes": "-2147483646\n",  # %d of a count past 2**31
            "class/net/eth0/carrier_up_count": "\n",
            "class/net/eth0/carrier_down_count": "99999999999999999999999\n",
            "class/net/eth1/carrier_changes": "3\n",  # a kernel before the up/down halves
        },
    )
    proc = write_tree(tmp_path / "proc", {"net/dev": NET_DEV})
    body = NetSource(sys_root=str(sysfs), proc_root=str(proc)).sample()
    assert body["net"]["ib"] == [
        {"device": "mlx5_0", "port": 1, "symbol_errors": 2**64 - 1, "rx_bytes": (2**62 - 1) * 4}
    ]
    eth = {e["iface"]: e for e in body["net"]["eth"]}
    assert not {"carrier_changes", "carrier_up_count", "carrier_down_count"} & eth["eth0"].keys()
    assert eth["eth1"]["carrier_changes"] == 3 and "carrier_up_count" not in eth["eth1"]
    message = telemetry_message(body)
    assert schemas.decode(schemas.encode(message)) == message  # every decoder takes it


def test_ethernet_carrier_counts(tmp_path: Path) -> None:
    sysfs, proc = fake_tree(tmp_path)
    write_tree(
        sysfs,
        {
            "class/net/eth0/carrier_changes": "7\n",
            "class/net/eth0/carrier_up_count": "4\n",
            "class/net/eth0/carrier_down_count": "3\n",
        },
    )
    eth = NetSource(sys_root=str(sysfs), proc_root=str(proc)).sample()["net"]["eth"]
    assert (eth[0]["carrier_changes"], eth[0]["carrier_up_count"], eth[0]["carrier_down_count"]) == (7, 4, 3)
    assert "carrier_changes" not in eth[1]  # no file: absent


def test_real_carrier_counts() -> None:
    """This machine's /sys/class/net: the counts only grow, and carrier_changes = up + down."""
    eth = NetSource().sample()["net"].get("eth", [])
    for entry in eth:
        base = Path("/sys/class/net") / entry["iface"]
        if "carrier_changes" in entry:
            assert int((base / "carrier_changes").read_text()) >= entry["carrier_changes"]
        if "carrier_up_count" in entry and "carrier_down_count" in entry:
            assert entry["carrier_changes"] == entry["carrier_up_count"] + entry["carrier_down_count"]
