"""HardwareDetector's link rules of issue 25 item 3: the InfiniBand PortCounters' other error
counters (link error recovery as a flapping link, local link integrity, excessive buffer overrun,
remote physical errors; xmit_wait never judged) and Ethernet interfaces (receive and transmit
errors, carrier flapping, a link that went down). Each fires on its signature with values shaped
as the kernel reports them, stays silent on healthy noise, handles saturated and hostile
counters, and gives the same findings whatever the batching, across a snapshot, from the
scanner's columns, and from a snapshot of the release before these rules."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import orjson
import pytest

from fleetwatch import schemas
from fleetwatch.alerts.alert_model import ALERTNAMES
from fleetwatch.alerts.policy import drain_reason
from fleetwatch.detectors.batch import TelemetryBatch
from fleetwatch.detectors.findings import Forgotten
from fleetwatch.detectors.hardware import MAX_LISTED, HardwareConfig, HardwareDetector
from fleetwatch.pipeline.telemetry_decode import decode_telemetry
from tests.helpers.admission import observe, restored_index
from tests.helpers.batches import ib_port, telemetry
from tests.helpers.hardware_runs import opened, run

NODE = "gpu-node-0042"
STEP = 10.0  # the agent's default sampling interval
T0 = 1_764_000_000.0
NEW_STATE = ("ib_ext_counters", "ib_ext_decay", "eth_rows", "eth_counters", "eth_decay", "eth_was_up")


def port(device: str = "mlx5_0", **fields: Any) -> dict[str, Any]:
    """An HDR port as sysfs shows it on a node up for a while: three retrains since boot, the
    threshold counters at 0, xmit_wait large (any busy fabric waits for credits)."""
    p = ib_port(device, 1)
    p.update(
        link_error_recovery=3,
        local_link_integrity_errors=0,
        excessive_buffer_overrun_errors=0,
        rcv_remote_physical_errors=0,
        xmit_wait=81_234_567,
    )
    p.update(fields)
    return p


def iface(name: str = "eno1", **fields: Any) -> dict[str, Any]:
    """An Ethernet interface as collectors/net.py reads it (/proc/net/dev, operstate, carrier
    counts: one carrier-up at boot, so carrier_changes 1 = up 1 + down 0)."""
    e: dict[str, Any] = {
        "iface": name,
        "state": "up",
        "rx_bytes": 9_876_543_210,
        "tx_bytes": 1_234_567_890,
        "rx_errors": 0,
        "tx_errors": 0,
        "rx_dropped": 17,
        "tx_dropped": 0,
        "carrier_changes": 1,
        "carrier_up_count": 1,
        "carrier_down_count": 0,
    }
    for k, v in fields.items():
        if v is None:
            e.pop(k, None)
        else:
            e[k] = v
    return e


def sample(
    k: int,
    *,
    ib: list[dict[str, Any]] | None = None,
    eth: list[dict[str, Any]] | None = None,
    node: str = NODE,
) -> dict[str, Any]:
    m = telemetry(node, T0 + k * STEP, 2, seq=k, ib=ib if ib is not None else [port()])
    m["net"]["eth"] = eth if eth is not None else [iface()]
    return schemas.validate(m, schemas.TELEMETRY)


def rules(findings: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {(f["kind"], f["evidence"]["rule"], f["severity"]) for f in opened(findings)}


def key(f: dict[str, Any]) -> tuple[Any, ...]:
    return (f["id"], f["ts"], f["severity"], f["resolved"], f["kind"], f["evidence"]["rule"], f["summary"])


# ---------------------------------------------------------------- healthy noise


def healthy(nodes: int = 4, samples: int = 1080, seed: int = 5) -> list[dict[str, Any]]:
    """Three hours of nodes that work: xmit_wait climbing fast (congestion is no fault), a stray
    symbol-free retrain every hour or so, a stray receive error now and then, one carrier bounce
    (a switch reboot), interfaces that were never up (docker0, an unused port) or report
    "unknown" (a tunnel)."""
    rng = random.Random(seed)
    wait = dict.fromkeys(range(nodes), 10**9)
    retrains = dict.fromkeys(range(nodes), 3)
    rx_err = dict.fromkeys(range(nodes), 0)
    msgs = []
    for k in range(samples):
        for n in range(nodes):
            wait[n] += rng.randrange(0, 5 * 10**8)
            retrains[n] += rng.random() < STEP / 3600
            rx_err[n] += rng.random() < 2 * STEP / 3600
            bounce = 2 if n == 1 and k >= 500 else 0
            eth = [
                iface(rx_errors=rx_err[n], carrier_changes=1 + bounce, carrier_down_count=bounce // 2),
                iface("docker0", state="down", carrier_changes=0, carrier_up_count=0),
                iface("ens2f1", state="down", carrier_changes=0, carrier_up_count=0),
                iface("tun0", state="unknown"),
            ]
            ib = [port(f"mlx5_{j}", xmit_wait=wait[n] + j, link_error_recovery=retrains[n]) for j in range(4)]
            msgs.append(sample(k, ib=ib, eth=eth, node=f"node-{n:02d}"))
    return msgs


def test_healthy_links_give_no_findings() -> None:
    assert run(healthy(), batch=500) == []


# ---------------------------------------------------------------- InfiniBand


def test_a_link_that_keeps_retraining_is_flapping() -> None:
    """link_error_recovery (the 8-bit LinkErrorRecoveryCounter) up once a minute: 60/h, above
    ibcheckerrs' 10: a warning naming the port; ten times the threshold is critical, and drains."""
    msgs = [sample(k, ib=[port(), port("mlx5_1", link_error_recovery=3 + k // 6)]) for k in range(360)]
    f = opened(run(msgs))
    assert rules(f) == {("ib_link", "ib_link_flapping", "warning")}
    ev = f[0]["evidence"]
    assert ev["ports"] == ["mlx5_1/1"] and ev["worst_port"] == "mlx5_1/1" and ev["delta"] == 1
    assert ev["per_window"] > ev["threshold_per_window"] == 10.0
    assert "flapping" in f[0]["summary"] and drain_reason(f[0]) is None
    # every 10 s sample: 360/h, above 10x the threshold once the window has filled
    fast = opened(run([sample(k, ib=[port(link_error_recovery=min(255, 3 + k))]) for k in range(300)]))
    assert ("ib_link", "ib_link_flapping", "critical") in rules(fast)
    worst = next(x for x in fast if x["severity"] == "critical")
    assert drain_reason(worst) == "IB link errors"
    # ...and the 8-bit counter stops at 255: saturated, its rate no longer measurable
    assert ("ib_link", "ib_counter_saturated", "warning") in rules(fast)
    assert {"link_error_recovery"} <= {s for x in fast for s in x["evidence"].get("saturated", [])}


def test_threshold_counters_fire_then_saturate_at_15() -> None:
    """local_link_integrity_errors and excessive_buffer_overrun_errors are 4-bit: one a minute
    passes 10/h, and at 15 the counter sticks ("15 or more"), which is a finding of its own."""
    for name, rule in (
        ("local_link_integrity_errors", "ib_local_link_integrity_errors"),
        ("excessive_buffer_overrun_errors", "ib_excessive_buffer_overrun_errors"),
    ):
        msgs = [sample(k, ib=[port(**{name: min(15, k // 6)})]) for k in range(200)]
        found = run(msgs)
        assert rules(found) >= {("ib_link", rule, "warning"), ("ib_link", "ib_counter_saturated", "warning")}
        sat = next(f for f in opened(found) if f["evidence"]["rule"] == "ib_counter_saturated")
        assert sat["evidence"]["saturated"] == [name] and sat["ts"] == T0 + 90 * STEP  # 15 from k=90


def test_remote_physical_errors_per_hour_above_100() -> None:
    """Packets marked bad upstream (16-bit PortRcvRemotePhysicalErrors): one a sample is 360/h,
    above ibcheckerrs' 100 (a warning, under 10x); 50 an hour stays silent."""
    msgs = [sample(k, ib=[port(rcv_remote_physical_errors=k)]) for k in range(400)]
    assert rules(run(msgs)) == {("ib_link", "ib_rcv_remote_physical_errors", "warning")}
    slow = [sample(k, ib=[port(rcv_remote_physical_errors=k // 72)]) for k in range(1000)]
    assert run(slow) == []


def test_xmit_wait_is_congestion_and_never_judged() -> None:
    msgs = [sample(k, ib=[port(xmit_wait=k * 10**12)]) for k in range(100)]
    msgs += [sample(100 + k, ib=[port(xmit_wait=k)]) for k in range(10)]  # and reset: still nothing
    assert run(msgs) == []


def test_ib_counters_cleared_are_a_reset_not_errors() -> None:
    msgs = [sample(k, ib=[port(link_error_recovery=200, local_link_integrity_errors=15)]) for k in range(5)]
    msgs += [sample(5 + k, ib=[port(link_error_recovery=0, local_link_integrity_errors=0)]) for k in range(5)]
    f = opened(run(msgs))
    assert ("ib_link", "counter_reset", "info") in rules(f)
    assert not {r for _k, r, _s in rules(f)} & {"ib_link_flapping", "ib_local_link_integrity_errors"}


# ---------------------------------------------------------------- Ethernet


def test_receive_and_transmit_errors_per_hour_are_warnings_that_never_drain() -> None:
    """A failing optic: 50 CRC errors a sample (18,000/h) on one port, transmit errors on another."""
    msgs = [
        sample(k, eth=[iface(rx_errors=50 * k), iface("eno2", tx_errors=3 * k), iface("eno3")])
        for k in range(60)
    ]
    f = opened(run(msgs))
    assert rules(f) == {("eth_link", "eth_rx_errors", "warning"), ("eth_link", "eth_tx_errors", "warning")}
    rx = next(x for x in f if x["evidence"]["rule"] == "eth_rx_errors")
    assert rx["evidence"]["interfaces"] == ["eno1"] and rx["evidence"]["worst_interface"] == "eno1"
    assert rx["evidence"]["delta"] == 50 and rx["evidence"]["window_s"] == 3600.0
    assert all(drain_reason(x) is None for x in f)
    assert ALERTNAMES["eth_link"] == "FleetwatchEthLink" and "eth_link" in schemas.FINDING_KINDS
    # a stray error an hour stays silent
    assert run([sample(k, eth=[iface(rx_errors=k // 360)]) for k in range(1000)]) == []


def test_carrier_bouncing_repeatedly_is_flapping_and_one_bounce_is_not() -> None:
    """carrier_changes counts ups and downs: one bounce is +2 (silent); a second within a minute
    makes 4 in the 2-minute window (above 2), as kube-prometheus' changes(...[2m]) > 2."""

    def bounces(at: tuple[int, ...]) -> list[dict[str, Any]]:
        out = []
        for k in range(60):
            n = sum(k >= a for a in at)
            out.append(
                sample(
                    k, eth=[iface(carrier_changes=1 + 2 * n, carrier_up_count=1 + n, carrier_down_count=n)]
                )
            )
        return out

    assert run(bounces((10,))) == []
    assert run(bounces((10, 40))) == []  # five minutes apart: two separate bounces
    f = run(bounces((10, 15)))
    assert rules(f) == {("eth_link", "eth_carrier_flapping", "warning")}
    first = opened(f)[0]
    assert first["ts"] == T0 + 15 * STEP and first["evidence"]["per_window"] > 2
    # the count stays above 2.5 for 30 s (3.3 e^(-t/120)), then 300 s without a bad sample
    assert [x["ts"] for x in f if x["resolved"]] == [T0 + 18 * STEP + 300]


def test_carrier_flapping_from_the_up_and_down_counts_where_carrier_changes_is_absent() -> None:
    msgs = [
        sample(k, eth=[iface(carrier_changes=None, carrier_up_count=1 + k // 2, carrier_down_count=k // 2)])
        for k in range(30)
    ]
    assert rules(run(msgs)) == {("eth_link", "eth_carrier_flapping", "warning")}


def test_an_interface_that_went_down_is_a_warning_until_it_is_up_again() -> None:
    """Down after being up: a warning naming it and its operstate, resolved once it is up again.
    Never-up and "unknown" interfaces are not judged; "lowerlayerdown" (a VLAN whose parent went
    down) is down."""

    def eth(k: int) -> list[dict[str, Any]]:
        down = 20 <= k < 50
        return [
            iface(state="down" if down else "up"),
            iface("eno1.100", state="lowerlayerdown" if down else "up"),
            iface("docker0", state="down"),
            iface("tun0", state="unknown" if k % 2 else "up"),
        ]

    f = run([sample(k, eth=eth(k)) for k in range(100)])
    assert rules(f) == {("eth_link", "eth_link_down", "warning")}
    down = opened(f)[0]
    assert down["ts"] == T0 + 20 * STEP and down["evidence"]["interfaces"] == ["eno1", "eno1.100"]
    assert down["evidence"]["states"] == ["down", "lowerlayerdown"]
    assert [x["ts"] for x in f if x["resolved"]] == [T0 + 49 * STEP + 300]


def test_interfaces_of_a_node_are_one_finding_per_rule() -> None:
    many = [[iface(f"veth{i:03d}", rx_errors=100 * k) for i in range(200)] for k in range(20)]
    f = opened(run([sample(k, eth=many[k]) for k in range(20)]))
    assert [
        (x["evidence"]["rule"], x["evidence"]["interfaces_total"], len(x["evidence"]["interfaces"]))
        for x in f
    ] == [("eth_rx_errors", 200, MAX_LISTED)]


# ---------------------------------------------------------------- hostile values, state


def test_hostile_and_absent_values_do_not_crash() -> None:
    """2**64 - 1 in every counter (a powered-off device reads all ones), fields absent, an
    interface with no name or state, a port with no device: no crash, valid findings."""
    top = schemas.U64_MAX
    msgs = []
    for k in range(30):
        hostile = k % 3 == 1
        ib = [
            port(
                **{c: top if hostile else 0 for c in ("link_error_recovery", "local_link_integrity_errors")}
            ),
            {"state": "ACTIVE", "excessive_buffer_overrun_errors": top, "rcv_remote_physical_errors": top},
            {"port": 2},
        ]
        eth = [
            iface(rx_errors=top if hostile else 0, tx_errors=top, carrier_changes=top if hostile else 1),
            {"rx_errors": top},
            {"iface": "eno9"},
            iface("eno2", state=None, carrier_changes=None, carrier_up_count=None),
        ]
        msgs.append(sample(k, ib=ib, eth=eth))
    f = run(msgs, batch=7)
    assert {x["kind"] for x in f} <= {"ib_link", "eth_link"}
    assert all(np.isfinite(x["score"]) for x in f)


SCENARIO_NODES = ("node-a", "node-b")


def faulty(samples: int = 240) -> list[dict[str, Any]]:
    """Two nodes with every new rule's fault at some time, incidents open at the middle."""
    msgs = []
    for k in range(samples):
        for n, node in enumerate(SCENARIO_NODES):
            flap = k // 3 if n == 0 and k >= 40 else 0
            ib = [port(link_error_recovery=3 + flap, rcv_remote_physical_errors=2 * k if n else 0)]
            eth = [
                iface(state="down" if n == 1 and 100 <= k < 160 else "up", rx_errors=40 * k if n == 0 else 0),
                iface("eno2", carrier_changes=1 + 2 * (k // 4 if 60 <= k < 140 and n == 1 else 0)),
            ]
            msgs.append(sample(k, ib=ib, eth=eth, node=node))
    return msgs


def test_batching_does_not_change_findings() -> None:
    msgs = faulty()
    whole = run(msgs, batch=1)
    assert {r for _k, r, _s in rules(whole)} >= {
        "ib_link_flapping",
        "ib_rcv_remote_physical_errors",
        "eth_rx_errors",
        "eth_link_down",
        "eth_carrier_flapping",
    }
    for size in (7, 64, 1000):
        assert sorted(map(key, run(msgs, batch=size))) == sorted(map(key, whole))


def test_snapshot_restore_mid_incident_gives_the_same_findings() -> None:
    msgs = faulty()
    whole = run(msgs, batch=50)
    det = HardwareDetector()
    half = len(msgs) // 2 + 20  # link down, flapping and error incidents open here
    first = run(msgs[:half], det, batch=50)
    assert {f["kind"] for f in opened(first)} == {"ib_link", "eth_link"}
    state = orjson.loads(det.to_bytes())
    assert set(NEW_STATE) <= state.keys()
    restored = HardwareDetector.from_state(state, None, restored_index(det.index))
    rest = run(msgs[half - 10 :], restored, batch=50)  # re-sent ones are dropped by admission
    assert sorted(map(key, first + rest)) == sorted(map(key, whole))


def test_a_snapshot_of_the_release_before_these_rules_restores_and_starts_them_afresh() -> None:
    """A snapshot without the extended IB and Ethernet state (as the previous release wrote it)
    restores: the IB incidents it held go on, the new counters take the next sample as their
    baseline, and the new rules fire from there."""
    before = [sample(k, ib=[port(symbol_errors=k // 2)]) for k in range(30)]
    det = HardwareDetector()
    opened_before = opened(run(before, det))
    assert rules(opened_before) == {("ib_link", "ib_symbol_errors", "warning")}
    old = orjson.loads(det.to_bytes())
    for k in NEW_STATE:
        del old[k]
    restored = HardwareDetector.from_state(old, HardwareConfig(), restored_index(det.index))
    assert restored.eth_map.n == 0 and len(restored.ib_ext_counters.last_val) == 0
    after = [
        sample(
            k,
            ib=[port(symbol_errors=k // 2, link_error_recovery=k)],
            eth=[iface(state="down" if k > 40 else "up")],
        )
        for k in range(30, 90)
    ]
    got = run(after, restored)
    assert {f["evidence"]["rule"] for f in opened(got)} == {"ib_link_flapping", "eth_link_down"}
    assert not [f for f in got if f["evidence"]["rule"] == "ib_symbol_errors"]  # still open, not re-sent
    assert ("gpu-node-0042", None, None, "ib_link", "ib_symbol_errors") in restored.book.open


def test_bad_snapshot_rows_are_refused() -> None:
    det = HardwareDetector()
    run(faulty(20), det)
    state = orjson.loads(det.to_bytes())
    state["eth_rows"][0][2] = 10**9  # an entity row no array could hold
    with pytest.raises(ValueError, match="Ethernet"):
        HardwareDetector.from_state(state)


def test_forgotten_nodes_take_their_interfaces_and_extended_counters_with_them() -> None:
    det = HardwareDetector()
    run(faulty(120), det)
    assert det.eth_map.n == 4 and det.ib_map.n == 2
    rows = det.index.drop(["node-a"])
    out = det.forget(Forgotten({"node-a": T0 + 119 * STEP}, 600.0), rows)
    assert out and {f["node"] for f in out} == {"node-a"} and all(f["resolved"] for f in out)
    assert det.eth_map.n == 2 and det.ib_map.n == 1
    assert len(det.eth_counters.last_val) >= 2 and len(det.ib_ext_decay.s) >= 1
    # node-b goes on as before: its interfaces kept their state
    rest = run([m for m in faulty(240)[240:] if m["node"] == "node-b"], det)
    assert not [f for f in rest if f["node"] == "node-a"]
    state = orjson.loads(det.to_bytes())
    assert [r[1] for r in state["eth_rows"]] == ["eno1", "eno2"] and len(state["ib_rows"]) == 1


def test_the_scanners_columns_give_the_same_findings_as_dicts() -> None:
    """The worker decodes with the compiled scanner (pipeline/telemetry_decode.py): Ethernet ports
    and the new IB counters reach the rules exactly as from dicts."""
    msgs = faulty()
    raws = [schemas.encode(m) for m in msgs]
    by_dicts, by_scanner = HardwareDetector(), HardwareDetector()
    want: list[dict[str, Any]] = []
    got: list[dict[str, Any]] = []
    for i in range(0, len(msgs), 100):
        want += observe(by_dicts, by_dicts.index, msgs[i : i + 100])
        batch, bad = decode_telemetry(raws[i : i + 100], now=2e9, clock=None)
        assert bad == [] and isinstance(batch, TelemetryBatch) and len(batch.eth_msg) == 2 * len(batch)
        got += observe(by_scanner, by_scanner.index, batch)
    assert got == want and want
