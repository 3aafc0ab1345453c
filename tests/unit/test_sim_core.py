"""Simulation core: reproducibility, schema validity, monotonic counters, healthy behaviour."""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

import numpy as np
import pytest

from fleetwatch import schemas, topics
from fleetwatch.collectors.sim import Simulation, load_scenario, packaged_path
from fleetwatch.collectors.sim.cluster import BENIGN_POWER_CAP_P
from fleetwatch.collectors.sim.nvidia import THROTTLE_GPU_IDLE, THROTTLE_SW_POWER_CAP

IB_COUNTERS = ("symbol_errors", "link_downed", "rcv_errors", "xmit_discards", "tx_bytes", "rx_bytes")
ETH_COUNTERS = ("rx_bytes", "tx_bytes", "rx_errors", "tx_errors", "rx_dropped", "tx_dropped")


def _all(sim: Simulation) -> list[tuple[str, str, dict[str, Any]]]:
    return list(sim.run())


@pytest.fixture(scope="module")
def default_run() -> tuple[Simulation, list[tuple[str, str, dict[str, Any]]]]:
    sim = Simulation(load_scenario(None))
    return sim, _all(sim)


@pytest.fixture(scope="module")
def healthy_run() -> tuple[Simulation, list[tuple[str, str, dict[str, Any]]]]:
    sim = Simulation(load_scenario(packaged_path("healthy.yaml")))
    return sim, _all(sim)


def test_same_seed_gives_byte_identical_messages() -> None:
    sc = load_scenario(None, {"duration": 120, "nodes": 16})
    a = [(t, k, schemas.encode(m)) for t, k, m in Simulation(sc).run()]
    b = [(t, k, schemas.encode(m)) for t, k, m in Simulation(sc).run()]
    assert a == b
    other = [
        (t, k, schemas.encode(m))
        for t, k, m in Simulation(
            load_scenario(None, {**dict(duration=120, nodes=16), "seed": sc.seed + 1})
        ).run()
    ]
    assert other != a


def test_every_message_validates_and_is_keyed_by_its_topic(default_run) -> None:
    _, msgs = default_run
    expected = {
        topics.TELEMETRY: (schemas.TELEMETRY, "node"),
        topics.JOBS: (schemas.JOB, "job"),
        topics.STEPS: (schemas.STEP, "job"),
        topics.TRUTH: (schemas.TRUTH, "node"),
    }
    seen = set()
    for topic, key, m in msgs:
        schema, key_field = expected[topic]
        assert schemas.validate(m, schema) is m
        assert key == m[key_field]
        schemas.decode(schemas.encode(m), schema)  # survives the wire as well
        seen.add(topic)
    assert seen == set(expected)


def test_ticks_follow_epoch_and_interval() -> None:
    sc = load_scenario(None, {"duration": 5, "nodes": 3})
    epoch = 1_800_000_000.5
    sim = Simulation(sc, epoch=epoch)
    for k, tick in enumerate(sim.ticks()):
        tel = [m for t, _, m in tick if t == topics.TELEMETRY]
        assert [m["node"] for m in tel] == sim.nodes
        assert {m["seq"] for m in tel} == {k}
        assert {m["ts"] for m in tel} == {epoch + k * sc.interval_s}
    assert sim.k == sc.n_ticks == 5
    assert sim.nodes[0] == "gpu-node-0001"


def test_counters_are_monotonic(default_run) -> None:
    _, msgs = default_run
    last: dict[tuple, int] = {}
    checked = 0
    for topic, _, m in msgs:
        if topic != topics.TELEMETRY:
            continue
        node = m["node"]
        items: list[tuple[tuple, int]] = []
        for g in m["gpus"]:
            items += [((node, "gpu", g["index"], c), g[c]) for c in schemas.GPU_COUNTERS if c in g]
        for p in m["net"]["ib"]:
            items += [((node, "ib", p["device"], c), p[c]) for c in IB_COUNTERS]
        for e in m["net"]["eth"]:
            items += [((node, "eth", e["iface"], c), e[c]) for c in ETH_COUNTERS]
        for key, value in items:
            assert value >= last.get(key, 0), (key, last[key], value, m["ts"])
            last[key] = value
            checked += 1
    assert checked > 100_000


def _busy_gpus(msgs) -> list[dict[str, Any]]:
    return [
        g
        for topic, _, m in msgs
        if topic == topics.TELEMETRY
        for g in m["gpus"]
        if "util" in g and g["util"] >= 85
    ]


def test_healthy_cluster_looks_healthy(healthy_run) -> None:
    sim, msgs = healthy_run
    sc = sim.scenario
    tel = [m for t, _, m in msgs if t == topics.TELEMETRY]
    assert len(tel) == sc.nodes * sc.n_ticks  # nobody goes silent
    assert not [m for t, _, m in msgs if t == topics.TRUTH]
    assert not [m for t, _, m in msgs if t == topics.JOBS and m["state"] == "failed"]
    for m in tel:
        assert len(m["gpus"]) == sc.gpus_per_node
        for g in m["gpus"]:
            assert g["xids"] == []
            assert (
                g["ecc_dbe_volatile"] == 0
                and g["remapped_rows_pending"] == 0
                and g["remapped_rows_failure"] == 0
            )
            # Only the benign reasons: idle, or the SW power cap of a GPU at its power limit.
            assert g["throttle_reasons"] & ~(THROTTLE_GPU_IDLE | THROTTLE_SW_POWER_CAP) == 0
            assert g["temp_c"] <= 80
        assert all(
            p["state"] == "ACTIVE" and p["rate_gbps"] == sc.hardware.ib_rate_gbps for p in m["net"]["ib"]
        )

    busy = _busy_gpus(msgs)
    assert len(busy) > 0.7 * sc.nodes * sc.gpus_per_node * sc.n_ticks  # the cluster is mostly training
    utils = [g["util"] for g in busy]
    assert 90 <= statistics.median(utils) <= 100
    assert statistics.pstdev(utils) > 0.5  # jitter, not a flat line
    temps = sorted(g["temp_c"] for g in busy)
    assert temps[len(temps) // 100] >= 55 and temps[-len(temps) // 100] <= 75  # 1st..99th percentile
    power = [g["power_w"] for g in busy]
    assert 0.85 * sc.hardware.tdp_w <= statistics.median(power) <= sc.hardware.tdp_w
    clocks = [g["sm_clock_mhz"] for g in busy if not g["throttle_reasons"]]
    assert statistics.median(clocks) == sc.hardware.max_sm_clock_mhz
    capped = sum(1 for g in busy if g["throttle_reasons"] & THROTTLE_SW_POWER_CAP) / len(busy)
    assert 0.3 * BENIGN_POWER_CAP_P < capped < 2 * BENIGN_POWER_CAP_P


def test_network_counters_grow_with_traffic(healthy_run) -> None:
    sim, msgs = healthy_run
    first: dict[str, dict[str, Any]] = {}
    last: dict[str, dict[str, Any]] = {}
    for t, _, m in msgs:
        if t == topics.TELEMETRY:
            first.setdefault(m["node"], m)
            last[m["node"]] = m
    span = sim.scenario.duration_s - sim.scenario.interval_s
    line_rate = sim.scenario.hardware.ib_rate_gbps * 1e9 / 8
    rates = []
    for node, m in last.items():
        for p0, p1 in zip(first[node]["net"]["ib"], m["net"]["ib"], strict=True):
            rates.append((p1["tx_bytes"] - p0["tx_bytes"]) / span)
            assert p1["rx_bytes"] > p0["rx_bytes"]
    # Training traffic: a good share of line rate on average, never above it.
    assert 0.05 * line_rate < statistics.median(rates) < line_rate


def test_steps_and_jobs_are_consistent(default_run) -> None:
    _, msgs = default_run
    members: dict[str, list[str]] = {}
    states: dict[str, list[str]] = defaultdict(list)
    for t, _, m in msgs:
        if t == topics.JOBS:
            members.setdefault(m["job"], m["nodes"])
            assert m["nodes"] == members[m["job"]]
            states[m["job"]].append(m["state"])
            assert 2 <= len(m["nodes"]) <= 16
    for seq in states.values():
        assert seq[0] == "started"
        assert all(s == "running" for s in seq[1:-1])
    assert any(s[-1] == "failed" for s in states.values())
    assert any("running" in s for s in states.values())

    by_step: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for t, _, m in msgs:
        if t == topics.STEPS:
            assert m["node"] == members[m["job"]][m["rank"]]
            by_step[(m["job"], m["step"])].append(m)
    assert by_step
    for group in by_step.values():
        # Synchronous data parallel: one iteration time for all ranks, the slowest rank waits ~0.
        iterations = {round(s["step_time_s"] + s["wait_time_s"], 3) for s in group}
        assert max(iterations) - min(iterations) <= 0.002
        assert min(s["wait_time_s"] for s in group) <= 0.0001
        assert len({s["ts"] for s in group}) == 1


def test_single_use_and_step_after_done() -> None:
    sim = Simulation(load_scenario(None, {"duration": 2, "nodes": 2}))
    assert len(list(sim.ticks())) == 2
    assert list(sim.ticks()) == []
    with pytest.raises(RuntimeError, match="finished"):
        sim.step()


def test_cordoned_node_gets_no_new_job() -> None:
    sc = load_scenario(packaged_path("healthy.yaml"), {"duration": 30, "nodes": 8})
    sim = Simulation(sc)
    sim.cordon("gpu-node-0002")
    jobs = [m for t, _, m in sim.run() if t == topics.JOBS]
    assert jobs and all("gpu-node-0002" not in m["nodes"] for m in jobs)
    assert {n for m in jobs for n in m["nodes"]} >= set(sim.nodes) - {"gpu-node-0002"} - {sim.nodes[-1]}


@pytest.mark.parametrize("speed", [0.0, 0.5, 1.0, 10.0, 25.0])
def test_a_live_simulation_never_stamps_a_sample_in_the_future(speed: float) -> None:
    """`fleetwatch simulate` sends tick k at wall0 + k*dt/speed (all at once flat out): from the
    default epoch on, no tick is stamped after the wall time it is sent at, however fast the
    simulation runs (a detector refuses samples from the future), and the last is within a tick
    of it when the simulation is at least as fast as real time."""
    from fleetwatch.collectors.sim.cli import live_epoch

    now, duration, dt = 1_764_000_000.0, 300.0, 1.0
    epoch = live_epoch(now, duration, speed)
    ticks = np.arange(0, duration + dt, dt)
    sent = now + (ticks / speed if speed else np.zeros_like(ticks))
    stamped = epoch + ticks
    assert (stamped <= sent + 1e-6).all()
    if speed == 0 or speed >= 1:
        assert sent[-1] - stamped[-1] <= dt
