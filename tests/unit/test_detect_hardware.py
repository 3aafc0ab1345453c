"""HardwareDetector rules: each fires with the right kind/severity on its signature, stays silent on
healthy noise, groups and resolves incidents by event time, and gives the same findings whatever
the batching and across a snapshot/restore."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetwatch.alerts.policy import drain_reason
from fleetwatch.detectors import xid_catalog
from fleetwatch.detectors.batch import TelemetryBatch
from fleetwatch.detectors.hardware import MAX_LISTED, HardwareConfig, HardwareDetector
from tests.helpers.admission import observe, restored_index
from tests.helpers.batches import gpu_entry, ib_port, telemetry
from tests.helpers.detector_inputs import NODE, GpuFault, gpus_with, series
from tests.helpers.hardware_runs import opened, run


def rules(findings: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {(f["kind"], f["evidence"]["rule"].split(":")[0], f["severity"]) for f in opened(findings)}


# ---------------------------------------------------------------- healthy noise


def healthy_noise(nodes: int, samples: int, seed: int) -> list[dict[str, Any]]:
    """Jittering gauges, benign throttle reasons (idle, power cap), short thermal blips, one stray
    SBE per GPU at most, IB traffic counters moving, error counters still."""
    rng = random.Random(seed)
    msgs = []
    sbe = {(n, i): 0 for n in range(nodes) for i in range(8)}
    for k in range(samples):
        for n in range(nodes):
            gpus = []
            for i in range(8):
                blip = rng.random() < 0.02
                if rng.random() < 0.001:
                    sbe[(n, i)] = min(sbe[(n, i)] + 1, 1)
                gpus.append(
                    gpu_entry(
                        i,
                        util=rng.uniform(0, 100),
                        temp_c=rng.uniform(35, 85),
                        power_w=rng.uniform(80, 700),
                        sm_clock_mhz=rng.uniform(1200, 1980),
                        throttle_reasons=rng.choice([0, 0, 0, 0x1, 0x4]) | (0x20 if blip else 0),
                        ecc_sbe_volatile=sbe[(n, i)],
                        ecc_sbe_aggregate=sbe[(n, i)],
                    )
                )
            traffic = int(k * 4e10 + rng.random() * 1e9)
            msgs.append(
                telemetry(
                    f"node-{n:02d}",
                    1e6 + k + rng.uniform(-0.2, 0.2),
                    gpus,
                    seq=k,
                    ib=[ib_port(tx_bytes=traffic, rx_bytes=traffic)],
                )
            )
    return msgs


def test_healthy_noise_gives_no_findings() -> None:
    msgs = healthy_noise(nodes=4, samples=250, seed=7)
    assert len(msgs) == 1000
    assert run(msgs, batch=300) == []


# ---------------------------------------------------------------- XIDs


def test_xid79_is_one_critical_incident_per_burst_and_resolves_after_silence() -> None:
    burst = set(range(10, 40, 3))  # ten XIDs 3 s apart
    msgs = series(400, lambda k: {3: {"xids": [79]}} if k in burst else {})
    f = run(msgs, batch=64)
    x = [g for g in f if g["kind"] == "xid"]
    assert [g["resolved"] for g in x] == [False, True]
    first, done = x
    assert first["severity"] == "critical" and first["gpu"] == 3
    assert first["summary"] == "gpu-node-0007 GPU3: XID 79 GPU has fallen off the bus (drain node)"
    assert first["first_seen"] == 1010.0
    assert done["id"] == first["id"] and done["evidence"]["total"] == len(burst)
    assert done["evidence"]["xids"] == {"79": len(burst)}
    assert done["ts"] == 1000.0 + max(burst) + HardwareConfig().xid_quiet_s


def test_xid_after_the_quiet_period_is_a_new_incident() -> None:
    quiet = int(HardwareConfig().xid_quiet_s)
    times = {5, 5 + quiet + 20}
    f = [
        g for g in run(series(600, lambda k: {0: {"xids": [48]}} if k in times else {})) if g["kind"] == "xid"
    ]
    assert [g["resolved"] for g in f] == [False, True, False, True]
    assert f[0]["id"] != f[2]["id"]
    assert all(g["severity"] == "critical" for g in f)


def test_xid_severity_follows_the_catalog() -> None:
    for code, sev in ((13, "warning"), (43, "info"), (94, "warning"), (95, "critical"), (119, "critical")):
        f = opened(run(series(5, lambda k, c=code: {1: {"xids": [c]}} if k == 1 else {})))
        assert [(g["kind"], g["severity"]) for g in f] == [("xid", sev)], code


def test_unknown_xid_is_a_warning() -> None:
    f = opened(run(series(3, lambda k: {0: {"xids": [999]}} if k == 1 else {})))
    assert len(f) == 1 and f[0]["severity"] == "warning" and "unknown" in f[0]["summary"]


def test_large_burst_escalates_but_application_xids_stay_below_critical() -> None:
    n = HardwareConfig().xid_burst_escalate
    # NVLink5 XIDs by code alone are a warning to investigate (hardware): a burst of them escalates
    hw = opened(run(series(n + 5, lambda k: {0: {"xids": [149]}} if k < n else {})))
    assert [g["severity"] for g in hw] == ["warning", "critical"]
    assert hw[1]["evidence"]["total"] == n
    app = opened(run(series(n + 5, lambda k: {0: {"xids": [13]}} if k < n else {})))
    assert [g["severity"] for g in app] == ["warning"]


def test_worst_xid_of_a_burst_wins() -> None:
    msgs = series(10, lambda k: {2: {"xids": [13]}} if k == 1 else ({2: {"xids": [79]}} if k == 3 else {}))
    f = opened([g for g in run(msgs) if g["kind"] == "xid"])
    assert [g["severity"] for g in f] == ["warning", "critical"]
    assert f[0]["id"] == f[1]["id"] and "XID 79" in f[1]["summary"]


def test_catalog_follows_nvidias_buckets() -> None:
    """Severity and action come from NVIDIA's resolution bucket (detectors/xid_catalog.py); the
    buckets themselves are pinned in tests/unit/test_xid_catalog.py."""
    for code in (13, 31):  # RESTART_APP: the application's fault, never a drain
        info = xid_catalog.lookup(code)
        assert (info.cause, info.severity, info.action) == ("application", "warning", "restart_app")
    for code in (43, 63, 92):  # IGNORE
        assert (xid_catalog.lookup(code).severity, xid_catalog.lookup(code).action) == ("info", "none")
    assert xid_catalog.lookup(45).action == "none"  # WORKFLOW_XID_45: clean-up after other errors
    for code in (48, 74, 79):  # WORKFLOW_XID_48, WORKFLOW_NVLINK_ERR, RESTART_BM
        assert (xid_catalog.lookup(code).severity, xid_catalog.lookup(code).action) == (
            "critical",
            "drain_node",
        )
    for code in (64, 95, 119, 120):  # RESET_GPU
        assert (xid_catalog.lookup(code).severity, xid_catalog.lookup(code).action) == (
            "critical",
            "reset_gpu",
        )
    assert xid_catalog.lookup(94).cause == "hardware"  # a memory error, whose remedy is a restart
    assert set(xid_catalog.CATALOG) == set(range(1, 173))
    unknown = xid_catalog.lookup(4000)
    assert (unknown.name, unknown.severity, unknown.action) == ("unknown", "warning", "investigate")


# Issue 23, item 2: the evidence lists at most MAX_LISTED codes, but the severity, the worst code
# and the drain decision see every code of the burst.
BENIGN = (
    8,
    11,
    13,
    14,
    25,
    31,
    32,
    38,
    43,
    45,
    63,
    68,
    69,
    92,
    1001,
    1002,
    1003,
    1004,
)  # RESTART_APP, IGNORE


def test_a_burst_of_many_benign_codes_does_not_hide_a_later_xid79() -> None:
    """18 distinct benign codes (catalogued warnings/infos and unknown ones), then XID 79: the
    incident turns critical with worst_xid 79, lists 79 first, and act's policy drains on it."""
    codes = {k: c for k, c in enumerate(BENIGN, start=1)}
    codes[len(BENIGN) + 2] = 79
    msgs = series(len(BENIGN) + 10, lambda k: {4: {"xids": [codes[k]]}} if k in codes else {})
    f = opened([g for g in run(msgs, batch=7) if g["kind"] == "xid"])
    last = f[-1]
    assert last["severity"] == "critical" and last["evidence"]["worst_xid"] == 79
    listed = list(last["evidence"]["xids"])
    assert listed[0] == "79" and len(listed) <= MAX_LISTED
    assert last["evidence"]["total"] == len(BENIGN) + 1
    unlisted = last["evidence"]["xids_unlisted"]
    assert unlisted == len(BENIGN) + 1 - MAX_LISTED
    assert last["evidence"]["total"] == sum(last["evidence"]["xids"].values()) + unlisted
    assert "XID 79" in last["summary"]
    assert drain_reason(last) == "XID 79"


def test_a_later_critical_code_with_a_drain_action_wins_over_an_earlier_one_without() -> None:
    """46 (critical, reset the GPU) then 57 (critical, NVIDIA: contact support): the worst code is
    the one that needs the most done, whatever came first, so the finding's action says drain."""
    msgs = series(200, lambda k: {1: {"xids": [46]}} if k == 1 else ({1: {"xids": [57]}} if k == 3 else {}))
    burst = [g for g in run(msgs) if g["kind"] == "xid" and g["resolved"]]
    (done,) = burst
    assert done["evidence"]["worst_xid"] == 57 and done["evidence"]["action"] == "drain_node"
    assert done["evidence"]["bucket"] == "CONTACT_SUPPORT"
    assert list(done["evidence"]["xids"]) == ["57", "46"]
    assert drain_reason({**done, "resolved": False}) is not None


def test_a_burst_of_more_critical_codes_than_the_list_holds_names_its_worst_and_drains() -> None:
    """NVIDIA's catalogue has more critical codes than the evidence lists (MAX_LISTED): the worst
    code, which decides the action, is listed first, and the finding drains."""
    critical = [c for c, info in xid_catalog.CATALOG.items() if info.severity == "critical"]
    assert len(critical) > MAX_LISTED
    burst = critical[: MAX_LISTED + 4]
    msgs = series(len(burst) + 5, lambda k: {3: {"xids": [burst[k]]}} if k < len(burst) else {})
    last = opened([g for g in run(msgs) if g["kind"] == "xid"])[-1]
    listed = list(last["evidence"]["xids"])
    assert len(listed) == MAX_LISTED and listed[0] == str(last["evidence"]["worst_xid"])
    assert last["evidence"]["xids_unlisted"] == 4 and drain_reason(last) is not None


def test_xid_state_is_bounded_by_the_catalogue_and_old_other_buckets_restore() -> None:
    """A burst of 500 distinct unknown codes keeps a bounded count per code; an incident
    snapshotted by the release that counted overflow codes as "other" restores and goes on."""
    msgs = series(520, lambda k: {0: {"xids": [2000 + k]}} if k < 500 else {})
    det = HardwareDetector()
    run(msgs[:300], det)
    (inc,) = [i for i in det.book.open.values() if i.kind == "xid"]
    assert len(inc.extra["counts"]) <= len(xid_catalog.CATALOG) + MAX_LISTED + 1
    old = det.to_state()
    for d in old["incidents"]:
        if d["kind"] == "xid":
            d["extra"] = {"counts": {**{str(c): 1 for c in BENIGN[:16]}, "other": 284}}
    restored = HardwareDetector.from_state(old, HardwareConfig(), None)
    tail = series(10, lambda k: {0: {"xids": [79]}} if k == 2 else {}, start=1400.0)
    f = opened([g for g in run(tail, restored) if g["kind"] == "xid"])
    assert f and f[-1]["severity"] == "critical" and f[-1]["evidence"]["worst_xid"] == 79
    assert f[-1]["evidence"]["total"] == 16 + 284 + 1


def test_a_critical_code_joining_a_burst_already_critical_goes_out_again() -> None:
    """20 unknown codes escalate a burst to critical ("investigate": nothing to drain); an XID 79
    after them does not raise the severity, but its finding goes out again, same id, and drains."""
    msgs = series(
        40, lambda k: {0: {"xids": [3000 + k]}} if k < 20 else ({0: {"xids": [79]}} if k == 25 else {})
    )
    f = opened([g for g in run(msgs, batch=5) if g["kind"] == "xid"])
    assert [g["severity"] for g in f] == ["warning", "critical", "critical"]
    assert drain_reason(f[1]) is None and f[1]["evidence"]["action"] == "investigate"
    assert f[2]["id"] == f[1]["id"] and f[2]["evidence"]["worst_xid"] == 79 and drain_reason(f[2]) == "XID 79"


# ---------------------------------------------------------------- ECC, pages, row remap


def test_dbe_is_critical_and_emitted_once_while_it_persists() -> None:
    f = run(series(100, lambda k: {5: {"ecc_dbe_volatile": 1, "ecc_dbe_aggregate": 1}} if k >= 20 else {}))
    assert [(g["kind"], g["severity"], g["gpu"]) for g in f] == [("ecc", "critical", 5)]
    assert f[0]["evidence"]["ecc_dbe_volatile"] == 1


def test_dbe_resolves_after_the_gpu_reset_clears_the_volatile_count() -> None:
    clear = HardwareConfig().clear_after_s
    f = run(
        series(60, lambda k: {5: {"ecc_dbe_volatile": 1, "ecc_dbe_aggregate": 1}} if k < 20 else {}, step=10)
    )
    dbe = [g for g in f if g["evidence"]["rule"] == "ecc_dbe"]
    assert [g["resolved"] for g in dbe] == [False, True]
    assert dbe[1]["ts"] == 1000.0 + 19 * 10 + clear
    # the reset that cleared the count is reported, as info: maintenance, not a new error
    resets = [(g["kind"], g["severity"], g["ts"]) for g in f if g["evidence"]["rule"] == "counter_reset"]
    assert resets[0] == ("ecc", "info", 1000.0 + 20 * 10)


def test_sbe_rate_threshold() -> None:
    thr = HardwareConfig().sbe_per_hour

    def sbe_every(every: int) -> GpuFault:
        return lambda k: {0: {"ecc_sbe_volatile": k // every, "ecc_sbe_aggregate": k // every}}

    # Fewer than `thr` correctable errors within the hour: silent.
    assert run(series(int(thr) * 60, sbe_every(120), step=1)) == []
    hot = opened(run(series(600, sbe_every(10), step=1)))  # one every 10 s: 360/h
    assert [(g["kind"], g["severity"]) for g in hot] == [("ecc", "warning")]
    assert hot[0]["evidence"]["sbe_per_hour"] > thr


def test_retired_pages() -> None:
    cfg = HardwareConfig()
    f = opened(run(series(10, lambda k: {1: {"retired_pages": 2}} if k >= 3 else {})))
    assert [(g["kind"], g["severity"]) for g in f] == [("ecc", "warning")]
    f = opened(run(series(10, lambda k: {1: {"retired_pages": cfg.retired_pages_max}} if k >= 3 else {})))
    assert [(g["kind"], g["severity"]) for g in f] == [("ecc", "critical")]


def test_row_remap_pending_and_failure() -> None:
    f = opened(run(series(10, lambda k: {2: {"remapped_rows_pending": 1}} if k >= 3 else {})))
    assert [(g["kind"], g["severity"]) for g in f] == [("row_remap", "warning")]
    f = opened(run(series(10, lambda k: {2: {"remapped_rows_failure": 1}} if k >= 3 else {})))
    assert [(g["kind"], g["severity"]) for g in f] == [("row_remap", "critical")]


# ---------------------------------------------------------------- links


def test_nvlink_crc_rate_warning_then_sustained_critical() -> None:
    cfg = HardwareConfig()
    per_s = cfg.nvlink_crc_per_s * 3  # 3x the threshold: a warning at first
    n = int(cfg.sustained_s) + 200
    f = opened(run(series(n, lambda k: {4: {"nvlink_crc_errors": int(k * per_s)}})))
    assert [(g["kind"], g["severity"]) for g in f] == [("nvlink", "warning"), ("nvlink", "critical")]
    assert f[1]["ts"] - f[0]["first_seen"] >= cfg.sustained_s
    below = cfg.nvlink_crc_per_s * 0.5
    assert run(series(300, lambda k: {4: {"nvlink_crc_errors": int(k * below)}})) == []


def test_nvlink_crc_far_above_threshold_is_critical_at_once() -> None:
    cfg = HardwareConfig()
    per_s = cfg.nvlink_crc_per_s * cfg.critical_factor * 50
    f = opened(run(series(30, lambda k: {4: {"nvlink_crc_errors": int(k * per_s)}})))
    assert f and f[-1]["severity"] == "critical" and f[-1]["ts"] - f[0]["ts"] < 10


def test_nvlink_replay_and_pcie_replay() -> None:
    f = opened(run(series(120, lambda k: {6: {"nvlink_replay_errors": k // 10}})))
    assert ("nvlink", "nvlink_replay", "warning") in rules(f)
    f = opened(run(series(120, lambda k: {6: {"pcie_replay": k}})))  # 60/min
    assert rules(f) == {("pcie", "pcie_replay", "warning")}
    assert run(series(300, lambda k: {6: {"pcie_replay": k // 20}})) == []  # 3/min: fine


def test_counts_after_a_collector_gap_are_spread_over_the_gap() -> None:
    """40 replays over a 10-minute gap is 4/min, under the 8/min limit: no finding."""
    msgs = series(5) + series(5, lambda k: {6: {"pcie_replay": 40}}, start=1004.0 + 600.0)
    assert run(msgs) == []


def test_ib_port_down_and_link_downed_are_critical() -> None:
    f = opened(run(series(20, ib=lambda k: [ib_port(state="DOWN" if 5 <= k < 8 else "ACTIVE")])))
    assert rules(f) == {("ib_link", "ib_port_state", "critical")}
    assert f[0]["evidence"]["ports"] == ["mlx5_0/1"] and "gpu" not in f[0]
    f = opened(run(series(20, ib=lambda k: [ib_port(link_downed=1 if k >= 5 else 0)])))
    assert rules(f) == {("ib_link", "ib_link_downed", "critical")}


def test_ib_error_rates_and_saturation() -> None:
    f = opened(run(series(120, ib=lambda k: [ib_port(symbol_errors=k // 5)])))
    assert rules(f) == {("ib_link", "ib_symbol_errors", "warning")}
    f = opened(run(series(100, ib=lambda k: [ib_port(xmit_discards=k // 2)])))
    assert rules(f) == set()  # 50 in 100 s: under 100/h
    f = opened(run(series(10, ib=lambda k: [ib_port(rcv_errors=min(65535, 65530 + k))])))
    assert ("ib_link", "ib_counter_saturated", "warning") in rules(f)


def test_ports_of_a_node_are_one_incident_per_rule_naming_them() -> None:
    """Judged per port, reported per node and rule: one sample listing 256 ports down is one
    finding (the ports counted), not 256."""
    ports = [ib_port("mlx5_0", 1, state="DOWN"), ib_port("mlx5_1", 1, state="DOWN")]
    f = opened(run(series(5, ib=lambda k: ports)))
    assert len(f) == 1 and f[0]["evidence"]["ports"] == ["mlx5_0/1", "mlx5_1/1"]
    many = [ib_port(f"mlx5_{i}", 1, state="DOWN") for i in range(256)]
    f = opened(run(series(3, ib=lambda k: many)))
    assert [
        (g["evidence"]["rule"], g["evidence"]["ports_total"], len(g["evidence"]["ports"])) for g in f
    ] == [("ib_port_state", 256, 16)]
    # a port that goes down while another is down already is in the open incident's evidence
    later = run(series(6, ib=lambda k: ports[:1] if k < 3 else ports))
    assert len(opened(later)) == 1


# ---------------------------------------------------------------- thermal


def test_thermal_throttle_needs_n_consecutive_samples() -> None:
    n = HardwareConfig().thermal_samples
    for bit in (0x8, 0x20, 0x40):
        f = opened(
            run(series(30, lambda k, b=bit: {1: {"throttle_reasons": b | 0x4}} if 10 <= k < 10 + n else {}))
        )
        assert rules(f) == {("thermal", "thermal_throttle", "warning")}, hex(bit)
        assert f[0]["ts"] == 1000.0 + 10 + n - 1
    short = run(series(30, lambda k: {1: {"throttle_reasons": 0x40}} if 10 <= k < 9 + n else {}))
    assert short == []


def test_power_brake() -> None:
    # The brake also asserts HW slowdown: one power_brake finding, not a thermal one as well.
    f = opened(run(series(20, lambda k: {1: {"throttle_reasons": 0x80 | 0x8}} if k >= 5 else {})))
    assert rules(f) == {("thermal", "power_brake", "warning")}


# ---------------------------------------------------------------- lost GPU


def test_lost_gpu_variants_are_critical() -> None:
    variants: dict[str, dict[str, Any]] = {
        "flag": {"index": 3, "uuid": "GPU-3", "lost": True},
        "no metrics": {"index": 3, "uuid": "GPU-3"},
    }
    for name, entry in variants.items():
        f = opened(run(series(10, lambda k, e=entry: {3: e} if k >= 4 else {})))
        assert rules(f) == {("pcie", "gpu_lost", "critical")}, name
        assert f[0]["gpu"] == 3 and f[0]["ts"] == 1004.0
    # Absent altogether while the other GPUs report.
    msgs = [
        telemetry(NODE, 1000.0 + k, [gpu_entry(i) for i in range(8) if k < 4 or i != 7]) for k in range(10)
    ]
    f = opened(run(msgs, batch=3))
    assert rules(f) == {("pcie", "gpu_lost", "critical")} and f[0]["gpu"] == 7


def test_gpu_first_seen_later_in_a_batch_is_not_missing_before() -> None:
    msgs = [telemetry(NODE, 1000.0 + k, 4 if k < 3 else 8) for k in range(6)]
    assert run(msgs) == []


def test_fallen_off_the_bus_signature() -> None:
    """XID 79 then a metric-less entry: an xid and a gpu_lost finding, both critical."""

    def fault(k: int) -> dict[int, dict[str, Any]]:
        if k == 5:
            return {3: {"xids": [79]}}
        return {3: {"index": 3, "uuid": "GPU-3", "lost": True, "xids": []}} if k > 5 else {}

    f = opened(run(series(20, fault)))
    assert rules(f) == {("xid", "xid_burst", "critical"), ("pcie", "gpu_lost", "critical")}


# ---------------------------------------------------------------- ordering, batching, restarts


def test_duplicates_and_out_of_order_messages_are_ignored() -> None:
    msgs = series(20, lambda k: {0: {"xids": [13]}} if k == 5 else {})
    shuffled = [*msgs[:10], msgs[5], msgs[3], *msgs[10:], *msgs[:4]]
    f1, f2 = run(msgs), run(shuffled, batch=7)
    assert len(f1) == 1 and f1 == f2


FAULTS = ("xid", "dbe", "thermal", "crc", "lost", "ib_down", "sbe", "ib_sym")


def scenario(faults: list[tuple[int, str, int]], samples: int, steps: list[int]) -> list[dict[str, Any]]:
    """Two nodes; each fault (node, kind, onset) lasts a while; every 17th message is re-sent."""
    msgs: list[dict[str, Any]] = []
    ts = {0: 5000.0, 1: 5000.0}
    for k in range(samples):
        for n in (0, 1):
            ts[n] += steps[(k + n) % len(steps)]
            over: dict[int, dict[str, Any]] = {}
            port = ib_port()
            for fn, kind, onset in faults:
                if fn != n or not onset <= k < onset + 12:
                    continue
                d = k - onset + 1
                if kind == "xid":
                    over[1] = {"xids": [79, 13]}
                elif kind == "dbe":
                    over[2] = {"ecc_dbe_volatile": 1, "ecc_dbe_aggregate": 1}
                elif kind == "thermal":
                    over[3] = {"throttle_reasons": 0x40}
                elif kind == "crc":
                    over[4] = {"nvlink_crc_errors": d * 200000}
                elif kind == "lost":
                    over[5] = {"index": 5, "lost": True}
                elif kind == "sbe":
                    over[6] = {"ecc_sbe_volatile": d * 3, "ecc_sbe_aggregate": d * 3}
                elif kind == "ib_down":
                    port = ib_port(state="DOWN")
                elif kind == "ib_sym":
                    port = ib_port(symbol_errors=d * 50)
            gpus = gpus_with(over)
            msgs.append(telemetry(f"n{n}", ts[n], gpus, seq=k, ib=[port]))
            if k % 17 == 16:
                msgs.append(msgs[-2])  # at-least-once delivery: an old message again
    return msgs


def key(f: dict[str, Any]) -> tuple[Any, ...]:
    return (f["id"], f["ts"], f["severity"], f["resolved"], f["kind"], f["evidence"]["rule"], f["summary"])


fault_lists = st.lists(
    st.tuples(st.integers(0, 1), st.sampled_from(FAULTS), st.integers(0, 60)), min_size=1, max_size=6
)


@settings(max_examples=25, deadline=None)
@given(fault_lists, st.lists(st.sampled_from([1, 5, 20, 60]), min_size=1, max_size=4), st.data())
def test_batching_does_not_change_findings(faults, steps, data) -> None:
    msgs = scenario(faults, 80, steps)
    one_by_one = run(msgs, batch=1)
    cuts = sorted(data.draw(st.sets(st.integers(1, len(msgs) - 1), max_size=8)))
    det = HardwareDetector()
    batched: list[dict[str, Any]] = []
    for a, b in zip([0, *cuts], [*cuts, len(msgs)], strict=True):
        batched += observe(det, det.index, msgs[a:b])
    assert sorted(map(key, batched)) == sorted(map(key, one_by_one))
    assert one_by_one  # every scenario has at least one fault that fires


def test_snapshot_restore_and_replay_keep_ids() -> None:
    msgs = scenario([(0, "xid", 5), (1, "crc", 20), (0, "dbe", 40), (1, "lost", 50)], 120, [5, 20])
    whole = run(msgs, batch=50)
    assert whole
    half = len(msgs) // 2
    det = HardwareDetector()
    first = run(msgs[:half], det, batch=50)
    # A replacement worker resumes from the snapshot (the task's index with it) and is handed some
    # messages again: the task's admission drops them.
    restored = HardwareDetector.from_state(orjson.loads(det.to_bytes()), None, restored_index(det.index))
    rest = run(msgs[half - 30 :], restored, batch=40)
    assert sorted(map(key, first + rest)) == sorted(map(key, whole))
    # A worker that re-processes everything from scratch computes the same ids.
    assert [f["id"] for f in run(msgs, batch=13)] == [f["id"] for f in whole]


def test_state_budget_per_gpu() -> None:
    det = HardwareDetector()
    msgs = [telemetry(f"node-{n:03d}", 1000.0, 8) for n in range(200)]
    run(msgs, det)
    arrays = [det.gpu_counters.last_val, det.gpu_counters.last_ts, det.gpu_counters.row_ts]
    arrays += [det.gpu_decay.s, det.gpu_decay.t, det.gpu_runs.run]
    per_gpu = sum(a.nbytes for a in arrays) / det.n_gpu
    assert per_gpu < 2048
    assert len(det.to_bytes()) / det.n_gpu < 2048


def test_findings_are_sorted_by_event_time() -> None:
    msgs = scenario([(0, "xid", 3), (1, "thermal", 2), (0, "ib_down", 10)], 60, [10])
    f = run(msgs, batch=len(msgs))
    ts = [g["ts"] for g in f]
    assert ts == sorted(ts) and np.all(np.diff(ts) >= 0)


# ---------------------------------------------------------------- throughput (run by hand)


def measure_throughput(
    nodes: int = 2000, batches: int = 40, batch: int = 1000, seed: int = 1
) -> dict[str, float]:
    """node-samples/s of TelemetryBatch.from_messages + HardwareDetector.observe on 8-GPU messages.

    Not a test (timings depend on the machine): `python -m tests.unit.test_detect_hardware`. Messages are
    built and validated up front so only the detector core is timed; 1% of the nodes carry a fault
    (NVLink CRC errors climbing and an XID now and then) so the finding path is exercised too.
    """
    import time

    rng = random.Random(seed)
    faulty = set(rng.sample(range(nodes), max(1, nodes // 100)))
    msgs = []
    for k in range(batches * batch):
        n, tick = k % nodes, k // nodes
        over: dict[int, dict[str, Any]] = {}
        if n in faulty:
            over[2] = {"nvlink_crc_errors": tick * 50000, "xids": [13] if tick % 50 == 0 else []}
        gpus = [
            gpu_entry(i, util=rng.uniform(80, 100), temp_c=rng.uniform(50, 75), **over.get(i, {}))
            for i in range(8)
        ]
        traffic = tick * 10**10
        msgs.append(
            telemetry(
                f"gpu-node-{n:05d}",
                1e9 + tick,
                gpus,
                seq=tick,
                ib=[ib_port(tx_bytes=traffic, rx_bytes=traffic)],
            )
        )
    det = HardwareDetector()
    t_build = t_proc = 0.0
    found = 0
    for b in range(batches):
        chunk = msgs[b * batch : (b + 1) * batch]
        t0 = time.perf_counter()
        tb = TelemetryBatch.from_messages(chunk)
        t1 = time.perf_counter()
        found += len(observe(det, det.index, tb))
        t2 = time.perf_counter()
        t_build, t_proc = t_build + t1 - t0, t_proc + t2 - t1
    total = batches * batch
    return {
        "node_samples_per_s": total / (t_build + t_proc),
        "from_messages_per_s": total / t_build,
        "process_per_s": total / t_proc,
        "findings": found,
        "state_bytes_per_gpu": len(det.to_bytes()) / det.n_gpu,
    }


if __name__ == "__main__":
    for size in (1000, 5000):
        r = measure_throughput(batch=size, batches=40 if size == 1000 else 8)
        print(f"batch {size}: " + ", ".join(f"{k}={v:,.0f}" for k, v in r.items()))


def test_a_snapshot_with_the_detectors_own_node_times_restores_and_goes_on_alike() -> None:
    """Until issue 24 the detector dropped stale samples itself and kept each node's latest ts
    ("node_ts") in its snapshot; admission is the task's alone now (NodeIndex), and a snapshot
    written with that field restores, ignoring it, to the same state and the same findings."""
    msgs = scenario([(0, "xid", 5), (1, "crc", 20)], 80, [5])
    det = HardwareDetector()
    run(msgs[:40], det)
    state = det.to_state()
    assert "node_ts" not in state
    from fleetwatch.detectors.counters import encode_array

    old = {**state, "node_ts": encode_array(np.full(len(det.index), 1e9))}  # as that release wrote it
    a = HardwareDetector.from_state(orjson.loads(orjson.dumps(state)), None, restored_index(det.index))
    b = HardwareDetector.from_state(orjson.loads(orjson.dumps(old)), None, restored_index(det.index))
    assert a.to_bytes() == b.to_bytes()
    assert run(msgs[40:], a) == run(msgs[40:], b)
