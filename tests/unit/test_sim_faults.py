"""Each fault kind: truth at onset, its signature in telemetry after onset, nothing before.

Every fault run is compared with the same seed's fault-free run: the simulator's random streams
are independent per concern, so everything before the onset tick must be byte-identical, and
the differences after it are the fault's doing.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

import pytest

from fleetwatch import schemas, topics
from fleetwatch.collectors.sim import KINDS, Simulation
from fleetwatch.collectors.sim import nvidia as nv
from fleetwatch.collectors.sim.kernel_log import gpu_pci
from fleetwatch.collectors.sim.scenario import parse_scenario

NODE = 3  # node number in fault entries (gpu-node-0003)
NAME = "gpu-node-0003"
GPU = 5
ONSET = 30.0
RAMP = 40.0
DURATION = 100.0


def scenario_doc(faults: list[dict[str, Any]], **over: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "name": "t",
        "seed": 3,
        "nodes": 8,
        "gpus_per_node": 8,
        "interval_s": 1.0,
        "duration_s": DURATION,
        "jobs": {
            "sizes": [4],
            "duration_s": [1000, 1000],
            "startup_s": [2, 2],
            "step_time_s": [1.0, 1.0],
            "checkpoint_every_s": 0,
            "requeue_delay_s": 5,
        },
        "faults": faults,
    }
    doc.update(over)
    return doc


def run(doc: dict[str, Any]) -> tuple[Simulation, list[list[tuple[str, str, dict[str, Any]]]]]:
    sim = Simulation(parse_scenario(doc))
    return sim, list(sim.ticks())


def fault_entry(kind: str) -> dict[str, Any]:
    spec = KINDS[kind]
    f: dict[str, Any] = {"kind": kind, "node": NODE, "onset_s": ONSET}
    if spec.per_gpu:
        f["gpu"] = GPU
    if spec.category == "gradual":
        f["ramp_s"] = RAMP
    if kind == "node_down":
        f["duration_s"] = 20.0
    if "port" in spec.params:
        f["port"] = 2
    if kind == "lemon":
        f["incident_interval_s"] = 10.0
    return f


def node_series(ticks, name: str = NAME) -> dict[int, dict[str, Any]]:
    """tick index -> telemetry message of `name` (absent ticks: the node sent nothing)."""
    out = {}
    for k, tick in enumerate(ticks):
        for t, _, m in tick:
            if t == topics.TELEMETRY and m["node"] == name:
                out[k] = m
    return out


def gpu(m: dict[str, Any], g: int = GPU) -> dict[str, Any]:
    return next(x for x in m["gpus"] if x["index"] == g)


def field_series(series, k0: int, k1: int, f: str, g: int = GPU) -> list[int]:
    return [gpu(series[k])[f] for k in range(k0, k1) if k in series and f in gpu(series[k])]


def failed_jobs_at(ticks, k: int, name: str = NAME) -> list[str]:
    return [
        m["job"] for t, _, m in ticks[k] if t == topics.JOBS and m["state"] == "failed" and name in m["nodes"]
    ]


@pytest.fixture(scope="module")
def baseline():
    return run(scenario_doc([]))


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_fault_signature(kind: str, baseline) -> None:
    _, base = baseline
    sim, ticks = run(scenario_doc([fault_entry(kind)]))
    k0 = int(ONSET / sim.dt)
    onset_ts = sim.tick_ts(k0)
    spec = KINDS[kind]

    # Nothing before onset: byte-identical to the fault-free run.
    for k in range(k0):
        assert [schemas.encode(m) for *_, m in ticks[k]] == [schemas.encode(m) for *_, m in base[k]], k

    # Truth at onset, valid, with the kind's category and location.
    truths = [m for tick in ticks for t, _, m in tick if t == topics.TRUTH]
    assert truths, "no truth emitted"
    first = truths[0]
    schemas.validate(first, schemas.TRUTH)
    assert first in [m for t, _, m in ticks[k0] if t == topics.TRUTH]
    assert (first["node"], first["fault"], first["onset_ts"], first["category"]) == (
        NAME,
        kind,
        onset_ts,
        spec.category,
    )
    assert first["finding"] == spec.finding
    if spec.per_gpu:
        assert first["gpu"] == GPU
    if spec.category == "gradual":
        assert first["failure_ts"] == sim.tick_ts(k0 + int(RAMP / sim.dt))

    s = node_series(ticks)
    b = node_series(base)
    fail_k = k0 + int(RAMP / sim.dt)
    CHECKS[kind](sim, ticks, s, b, k0, fail_k, truths)


# ---------------------------------------------------------------- per-kind signatures


def _lost_after(s, k: int) -> None:
    assert gpu(s[k]) == {"index": GPU} or set(gpu(s[k])) <= {"index", "xids"}
    assert all(set(gpu(s[j])) == {"index"} for j in range(k + 1, k + 10) if j in s)


def check_xid79(sim, ticks, s, b, k0, fk, truths) -> None:
    assert nv.XID_FALLEN_OFF_BUS in gpu(s[k0])["xids"]
    assert gpu(s[k0])["pcie_replay"] > gpu(s[k0 - 1])["pcie_replay"]  # PCIe errors co-occur
    _lost_after(s, k0 + 1)
    assert failed_jobs_at(ticks, k0)
    assert s[k0 + 5]["host"]["procs_d_state"] >= 2


def check_xid119(sim, ticks, s, b, k0, fk, truths) -> None:
    assert nv.XID_GSP_RPC_TIMEOUT in gpu(s[k0])["xids"]
    _lost_after(s, k0 + 1)
    assert failed_jobs_at(ticks, k0)


def _ecc(code: int, pending: bool):
    def check(sim, ticks, s, b, k0, fk, truths) -> None:
        before, at = gpu(s[k0 - 1]), gpu(s[k0])
        assert code in at["xids"]
        assert at["ecc_dbe_volatile"] == before["ecc_dbe_volatile"] + 1
        assert at["ecc_dbe_aggregate"] == before["ecc_dbe_aggregate"] + 1
        assert (at["remapped_rows_pending"] > before["remapped_rows_pending"]) == pending
        assert failed_jobs_at(ticks, k0)

    return check


def check_ib_link_down(sim, ticks, s, b, k0, fk, truths) -> None:
    p_before, p_at = s[k0 - 1]["net"]["ib"][2], s[k0]["net"]["ib"][2]
    assert p_before["state"] == "ACTIVE" and p_at["state"] == "DOWN"
    assert p_at["link_downed"] == p_before["link_downed"] + 1
    later = s[k0 + 10]["net"]["ib"][2]
    assert later["state"] == "DOWN" and later["tx_bytes"] == p_at["tx_bytes"]
    assert all(p["state"] == "ACTIVE" for i, p in enumerate(s[k0]["net"]["ib"]) if i != 2)
    assert failed_jobs_at(ticks, k0)


def check_node_down(sim, ticks, s, b, k0, fk, truths) -> None:
    end_k = k0 + 20
    assert all(k not in s for k in range(k0, end_k))
    assert end_k in s and s[end_k]["seq"] == end_k  # back, with a gap in seq
    assert failed_jobs_at(ticks, k0)
    end = [m for m in truths if "end_ts" in m]
    assert end and end[0]["end_ts"] == sim.tick_ts(end_k)


def check_sw_crash(sim, ticks, s, b, k0, fk, truths) -> None:
    assert gpu(s[k0])["xids"] == [nv.XID_GRAPHICS_ENGINE_EXCEPTION]
    assert failed_jobs_at(ticks, k0)
    assert truths[0]["end_ts"] == truths[0]["onset_ts"] and truths[0]["hardware"] is False
    for f in ("ecc_dbe_volatile", "remapped_rows_pending", "pcie_replay", "nvlink_crc_errors"):
        assert gpu(s[k0])[f] == gpu(s[k0 - 1])[f]


def _growth(field: str, *, min_per_s: float):
    """The counter grows from onset on, much faster than the healthy baseline over the same window."""

    def grows(s, b, k0, fk) -> None:
        vals = field_series(s, k0 - 1, fk, field)
        base = field_series(b, k0 - 1, fk, field)
        assert vals[1] > vals[0], "no increment on the onset tick"
        rate = (vals[-1] - vals[0]) / (fk - k0)
        assert rate >= min_per_s
        assert base[-1] - base[0] <= 2  # healthy: at most a stray count

    return grows


def check_ecc_sbe_rising(sim, ticks, s, b, k0, fk, truths) -> None:
    _growth("ecc_sbe_volatile", min_per_s=1.0)(s, b, k0, fk)
    rates = [gpu(s[k + 1])["ecc_sbe_volatile"] - gpu(s[k])["ecc_sbe_volatile"] for k in range(k0, fk - 1)]
    assert sum(rates[len(rates) // 2 :]) > sum(rates[: len(rates) // 2])  # the rate rises
    assert nv.XID_DOUBLE_BIT_ECC in gpu(s[fk])["xids"]
    assert gpu(s[fk])["ecc_dbe_volatile"] == gpu(s[fk - 1])["ecc_dbe_volatile"] + 1
    assert failed_jobs_at(ticks, fk)


def check_row_remap_pending(sim, ticks, s, b, k0, fk, truths) -> None:
    pend = field_series(s, k0 - 1, fk, "remapped_rows_pending")
    assert pend[1] == pend[0] + 1 and pend[-1] >= pend[0] + 2
    assert nv.XID_ROW_REMAP_EVENT in gpu(s[k0])["xids"]
    assert gpu(s[fk])["remapped_rows_failure"] == gpu(s[fk - 1])["remapped_rows_failure"] + 1
    assert nv.XID_ROW_REMAP_FAILURE in gpu(s[fk])["xids"]
    assert failed_jobs_at(ticks, fk)


def check_nvlink_crc(sim, ticks, s, b, k0, fk, truths) -> None:
    _growth("nvlink_crc_errors", min_per_s=5.0)(s, b, k0, fk)
    assert nv.XID_NVLINK_ERROR in gpu(s[fk])["xids"]
    assert failed_jobs_at(ticks, fk)


def check_pcie_replay(sim, ticks, s, b, k0, fk, truths) -> None:
    _growth("pcie_replay", min_per_s=1.0)(s, b, k0, fk)
    assert nv.XID_FALLEN_OFF_BUS in gpu(s[fk])["xids"]
    _lost_after(s, fk + 1)
    assert failed_jobs_at(ticks, fk)


def check_thermal(sim, ticks, s, b, k0, fk, truths) -> None:
    temps = field_series(s, k0, fk, "temp_c")
    base_max = max(field_series(b, k0, fk, "temp_c"))
    assert temps[-1] > 85 > base_max
    assert all(temps[i + 5] >= temps[i] for i in range(0, len(temps) - 5, 5))  # climbing
    throttle = field_series(s, k0, fk, "throttle_reasons")
    assert any(t & nv.THROTTLE_SW_THERMAL for t in throttle)
    assert any(t & nv.THROTTLE_HW_THERMAL and t & nv.THROTTLE_HW_SLOWDOWN for t in throttle)
    clocks = field_series(s, k0, fk, "sm_clock_mhz")
    assert min(clocks[-5:]) < 0.8 * sim.scenario.hardware.max_sm_clock_mhz
    assert nv.XID_FALLEN_OFF_BUS in gpu(s[fk])["xids"]
    _lost_after(s, fk + 1)


def check_ib_symbol_errors(sim, ticks, s, b, k0, fk, truths) -> None:
    sym = [s[k]["net"]["ib"][2]["symbol_errors"] for k in range(k0 - 1, fk)]
    base = [b[k]["net"]["ib"][2]["symbol_errors"] for k in range(k0 - 1, fk)]
    assert sym[1] > sym[0] and (sym[-1] - sym[0]) / (fk - k0) >= 5
    assert base[-1] - base[0] <= 1
    assert s[fk - 1]["net"]["ib"][2]["state"] == "ACTIVE" and s[fk]["net"]["ib"][2]["state"] == "DOWN"
    assert failed_jobs_at(ticks, fk)


def check_straggler(sim, ticks, s, b, k0, fk, truths) -> None:
    # The full step-time check is test_straggler_*; here: its job's peers now wait for it.
    waits = [
        m["wait_time_s"]
        for tick in ticks[k0 + 5 :]
        for t, _, m in tick
        if t == topics.STEPS and m["node"] == NAME
    ]
    assert waits and statistics.median(waits) < 0.01
    running = [m["job"] for tick in ticks[:k0] for t, _, m in tick if t == topics.JOBS and NAME in m["nodes"]]
    assert truths[0]["job"] == running[-1]  # the job it slows down
    assert truths[0]["slowdown"] == KINDS["straggler"].params["slowdown"].default


def check_lemon(sim, ticks, s, b, k0, fk, truths) -> None:
    xid_ticks = [k for k in range(k0, len(ticks)) if k in s and any(g.get("xids") for g in s[k]["gpus"])]
    assert xid_ticks[0] == k0
    failed = {j for k in range(len(ticks)) for j in failed_jobs_at(ticks, k)}
    assert len(xid_ticks) >= 3 and len(failed) >= 2  # repeated incidents that fail its jobs


def _kernel(m: dict[str, Any]) -> list[dict[str, Any]]:
    return m.get("kernel", {}).get("events", [])


def _quiet_before(s, k0: int) -> None:
    """Nothing in the node's kernel log before the fault: the sim sends no section for a quiet tick."""
    assert all("kernel" not in s[k] for k in range(k0) if k in s)


def check_nvswitch_fatal(sim, ticks, s, b, k0, fk, truths) -> None:
    _quiet_before(s, k0)
    [e] = _kernel(s[k0])
    assert (e["kind"], e["code"], e["severity"]) == ("sxid", 20034, "fatal") and "gpu" not in e
    assert all(not gpu(s[k0], g)["xids"] for g in range(8))  # NVML says nothing
    assert failed_jobs_at(ticks, k0)


def check_pcie_aer_fatal(sim, ticks, s, b, k0, fk, truths) -> None:
    _quiet_before(s, k0)
    [e] = _kernel(s[k0])
    assert (e["kind"], e["severity"], e["gpu"]) == ("aer", "fatal", GPU) and "AER" in e["text"]
    assert failed_jobs_at(ticks, k0)


def check_fallen_off_bus(sim, ticks, s, b, k0, fk, truths) -> None:
    _quiet_before(s, k0)
    [e] = _kernel(s[k0])
    assert (e["kind"], e["gpu"]) == ("fallen_off_bus", GPU) and "code" not in e
    assert not gpu(s[k0])["xids"]  # no XID number: NVML has no event for it
    _lost_after(s, k0 + 1)


def check_nvlink5_fatal(sim, ticks, s, b, k0, fk, truths) -> None:
    assert gpu(s[k0])["xids"] == [149]  # NVML: the code alone
    [e] = _kernel(s[k0])  # the line: Fatal, the link
    assert (e["kind"], e["code"], e["severity"], e["link"], e["gpu"]) == ("xid", 149, "fatal", 1, GPU)
    assert failed_jobs_at(ticks, k0)


def check_kmsg_overrun(sim, ticks, s, b, k0, fk, truths) -> None:
    _quiet_before(s, k0)
    assert s[k0]["kernel"]["missed"] == 5000 and _kernel(s[k0]) == []
    assert "kernel" not in s[k0 + 1] and not failed_jobs_at(ticks, k0)
    assert truths[0]["hardware"] is False


def check_mount_hung(sim, ticks, s, b, k0, fk, truths) -> None:
    assert all(s[k]["host"]["mounts_hung"] == 0 and "checks" not in s[k] for k in range(k0) if k in s)
    for k in (k0, k0 + 5):
        assert s[k]["host"]["mounts_hung"] == 1
        [m] = s[k]["checks"]["mounts"]
        assert (m["path"], m["problem"], m["fstype"]) == ("/lustre", "hung", "lustre")
    assert s[k0 + 1]["host"]["procs_d_state"] >= 12  # processes stuck on the mount
    assert truths[0]["hardware"] is False


def check_blockdev_readonly(sim, ticks, s, b, k0, fk, truths) -> None:
    assert s[k0 - 1]["host"]["blockdevs_readonly"] == 0
    assert s[k0]["host"]["blockdevs_readonly"] == 1
    assert s[k0]["checks"] == {"blockdevs": [{"name": "nvme0n1", "problem": "readonly"}]}


def check_pcie_downtrain(sim, ticks, s, b, k0, fk, truths) -> None:
    assert gpu(s[k0 - 1])["pcie_link_width"] == 16
    busy = [k for k in range(k0, k0 + 20) if gpu(s[k])["util"] >= 10]
    assert busy and all(gpu(s[k])["pcie_link_width"] == 8 for k in range(k0, k0 + 20))
    assert all(gpu(s[k], 0)["pcie_link_width"] == 16 for k in range(k0, k0 + 20))  # its siblings


def check_hca_missing(sim, ticks, s, b, k0, fk, truths) -> None:
    before, after = s[k0 - 1]["net"]["ib"], s[k0]["net"]["ib"]
    assert len(after) == len(before) - 1 and before[-1]["device"] not in {p["device"] for p in after}
    assert failed_jobs_at(ticks, k0)


def check_d_state_stuck(sim, ticks, s, b, k0, fk, truths) -> None:
    assert all(s[k]["host"]["procs_d_state"] >= 20 for k in range(k0, k0 + 20))
    assert all(b[k]["host"]["procs_d_state"] <= 2 for k in range(k0, k0 + 20))


def check_disk_full(sim, ticks, s, b, k0, fk, truths) -> None:
    disk = [s[k]["host"]["disk_used_frac"] for k in range(k0, fk + 1) if k in s]
    assert disk[0] < 0.7 and disk[-1] >= 0.99 and disk == sorted(disk)
    assert failed_jobs_at(ticks, fk)


def test_an_idle_gpus_link_runs_at_a_lower_generation_and_a_busy_ones_at_its_maximum() -> None:
    """As real GPUs do (nvidia-smi shows Gen1 on an idle H100): the node checks must judge a GPU's
    link generation only while it is busy."""
    doc = scenario_doc([])
    doc["jobs"] = {**doc["jobs"], "idle_fraction": 0.5}
    _sim, ticks = run(doc)
    entries = [g for t in ticks for k, _, m in t if k == topics.TELEMETRY for g in m["gpus"]]
    assert {g["pcie_link_gen"] for g in entries if g["util"] >= 10} == {5}
    assert {g["pcie_link_gen"] for g in entries if g["util"] < 5} == {1}
    assert all(g["pcie_link_width"] == g["pcie_link_width_max"] == 16 for g in entries)


def check_ib_link_flapping(sim, ticks, s, b, k0, fk, truths) -> None:
    def recovered(k: int) -> list[int]:
        return [p["link_error_recovery"] for p in s[k]["net"]["ib"]]

    assert recovered(k0 - 1) == [0] * 8 and recovered(k0)[2] == 1  # fault_entry's port 2
    later = recovered(k0 + 60)
    assert later[2] >= 4 and sum(later) == later[2]
    assert all(p["state"] == "ACTIVE" for p in s[k0 + 60]["net"]["ib"])  # up at every sample


def check_eth_flapping(sim, ticks, s, b, k0, fk, truths) -> None:
    def changes(k: int) -> int:
        return s[k]["net"]["eth"][0]["carrier_changes"]

    assert changes(k0 - 1) == 2 and changes(k0) == 4 and changes(k0 + 60) >= 8
    assert b[k0 + 60]["net"]["eth"][0]["carrier_changes"] == 2


CHECKS = {
    "xid79": check_xid79,
    "xid119": check_xid119,
    "xid48": _ecc(nv.XID_DOUBLE_BIT_ECC, pending=False),
    "xid94": _ecc(nv.XID_CONTAINED_ECC, pending=True),
    "xid95": _ecc(nv.XID_UNCONTAINED_ECC, pending=True),
    "ib_link_down": check_ib_link_down,
    "node_down": check_node_down,
    "sw_crash": check_sw_crash,
    "ecc_sbe_rising": check_ecc_sbe_rising,
    "row_remap_pending": check_row_remap_pending,
    "nvlink_crc": check_nvlink_crc,
    "pcie_replay": check_pcie_replay,
    "thermal": check_thermal,
    "ib_symbol_errors": check_ib_symbol_errors,
    "straggler": check_straggler,
    "lemon": check_lemon,
    "nvswitch_fatal": check_nvswitch_fatal,
    "pcie_aer_fatal": check_pcie_aer_fatal,
    "fallen_off_bus": check_fallen_off_bus,
    "nvlink5_fatal": check_nvlink5_fatal,
    "kmsg_overrun": check_kmsg_overrun,
    "mount_hung": check_mount_hung,
    "blockdev_readonly": check_blockdev_readonly,
    "pcie_downtrain": check_pcie_downtrain,
    "hca_missing": check_hca_missing,
    "d_state_stuck": check_d_state_stuck,
    "disk_full": check_disk_full,
    "ib_link_flapping": check_ib_link_flapping,
    "eth_flapping": check_eth_flapping,
}


def test_every_xid_is_in_the_kernel_log_too_with_the_same_gpu() -> None:
    """A node runs the kernel source next to NVML: each XID NVML reports is a kernel-log event of
    the same code and GPU, with the PCI address the GPU has (as the real source names it)."""
    _sim, ticks = run(scenario_doc([fault_entry("lemon")]))
    s = node_series(ticks)
    pairs = 0
    for m in s.values():
        nvml = sorted((g["index"], x) for g in m["gpus"] for x in g.get("xids", []))
        logged = sorted((e["gpu"], e["code"]) for e in _kernel(m) for _ in range(e["count"]))
        assert nvml == logged
        pairs += len(nvml)
        for e in _kernel(m):
            assert e["pci"] == gpu_pci(e["gpu"]) and e["text"].startswith("NVRM: Xid (PCI:")
    assert pairs >= 5


def test_every_kind_has_a_check() -> None:
    assert set(CHECKS) == set(KINDS)


def test_fault_end_is_reported_and_effects_clear() -> None:
    entry = {"kind": "xid79", "node": NODE, "gpu": GPU, "onset_s": ONSET, "duration_s": 20}
    sim, ticks = run(scenario_doc([entry]))
    truths = [m for tick in ticks for t, _, m in tick if t == topics.TRUTH]
    assert [("end_ts" in m) for m in truths] == [False, True]
    assert truths[0]["id"] == truths[1]["id"] and truths[1]["end_ts"] == sim.tick_ts(int(ONSET + 20))
    s = node_series(ticks)
    assert "util" in gpu(s[int(ONSET + 20)])  # the GPU answers again


# ---------------------------------------------------------------- stragglers


def _steps_by_iteration(ticks, after_k: int):
    by: dict[tuple[str, int], dict[str, dict[str, Any]]] = defaultdict(dict)
    for tick in ticks[after_k:]:
        for t, _, m in tick:
            if t == topics.STEPS:
                by[(m["job"], m["step"])][m["node"]] = m
    return [v for v in by.values() if NAME in v]


@pytest.mark.parametrize(
    ("slowdown", "cause"), [(0.05, "none"), (0.30, "none"), (0.15, "thermal"), (0.10, "power")]
)
def test_straggler_step_time_and_waiting_peers(slowdown: float, cause: str) -> None:
    entry = {
        "kind": "straggler",
        "node": NODE,
        "onset_s": 10,
        "slowdown": slowdown,
        "cause": cause,
        "gpu": GPU,
    }
    sim, ticks = run(scenario_doc([entry], duration_s=80))
    iterations = _steps_by_iteration(ticks, 12)
    assert len(iterations) > 30
    ratios, peer_waits, own_waits = [], [], []
    for ranks in iterations:
        me = ranks[NAME]
        peers = [m for n, m in ranks.items() if n != NAME]
        ratios.append(me["step_time_s"] / statistics.median(p["step_time_s"] for p in peers))
        peer_waits += [p["wait_time_s"] for p in peers]
        own_waits.append(me["wait_time_s"])
    # Its own compute is `slowdown` above its peers'; the peers, not the straggler, do the waiting.
    assert statistics.mean(ratios) == pytest.approx(1 + slowdown, abs=0.01)
    assert statistics.median(peer_waits) == pytest.approx(slowdown * 1.0, rel=0.3)
    assert statistics.median(own_waits) < 0.2 * statistics.median(peer_waits)

    # Telemetry: the waiting peers' GPUs run at lower util than the GPUs that make the node slow
    # (all of them without a cause; the throttled one otherwise). Without a cause the straggler
    # also draws more power; a clock-capped GPU draws less per unit of work, so not there.
    job_nodes = next(
        m["nodes"] for tick in ticks for t, _, m in tick if t == topics.JOBS and NAME in m["nodes"]
    )
    slow_gpus = range(8) if cause == "none" else [GPU]
    mine: dict[str, list[float]] = defaultdict(list)
    theirs: dict[str, list[float]] = defaultdict(list)
    for n in job_nodes:
        for m in node_series(ticks[20:], n).values():
            for g in slow_gpus if n == NAME else range(8):
                for f in ("util", "power_w"):
                    (mine if n == NAME else theirs)[f].append(gpu(m, g)[f])
    assert statistics.mean(mine["util"]) > statistics.mean(theirs["util"]) + 100 * slowdown / 3
    if cause == "none":
        assert statistics.mean(mine["power_w"]) > statistics.mean(theirs["power_w"])

    # A hardware cause shows on the slow GPU: capped SM clock and the throttle reason.
    s = node_series(ticks)
    g = gpu(s[40])
    if cause == "thermal":
        assert g["throttle_reasons"] & nv.THROTTLE_SW_THERMAL
    if cause == "power":
        assert g["throttle_reasons"] & nv.THROTTLE_HW_POWER_BRAKE
    if cause != "none":
        assert g["sm_clock_mhz"] <= sim.scenario.hardware.max_sm_clock_mhz / (1 + slowdown) + 1
    else:
        assert g["throttle_reasons"] & ~nv.THROTTLE_SW_POWER_CAP == 0
