"""Background faults follow the published rates (rates.py) and scale with `acceleration`."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import numpy as np
import pytest

from fleetwatch import schemas, topics
from fleetwatch.collectors.sim import KINDS, Simulation, background, rates
from fleetwatch.collectors.sim.scenario import parse_scenario


def scenario(**bg: Any):
    return parse_scenario(
        {"nodes": 1024, "duration_s": 3600, "background": {"enabled": True, **bg}, "faults": []}
    )


def test_rate_is_the_cited_figure_times_acceleration() -> None:
    per_node_day = lambda sc: background.node_fault_rate(sc) * rates.SECONDS_PER_DAY * 1000  # noqa: E731
    assert per_node_day(scenario()) == pytest.approx(6.50)  # RSC-1, Kokolis et al. HPCA 2025
    assert per_node_day(scenario(node_failure_rate=rates.RSC2_FAILURES_PER_1000_NODE_DAYS)) == pytest.approx(
        2.34
    )
    base = background.expected_node_faults(scenario(acceleration=1))
    assert base == pytest.approx(1024 * 3600 * 6.50 / 1000 / 86400)
    for a in (10, 250, 4000):
        assert background.expected_node_faults(scenario(acceleration=a)) == pytest.approx(a * base)
    assert background.expected_node_faults(scenario(acceleration=0)) == 0
    off = parse_scenario({"nodes": 1024, "duration_s": 3600, "background": {"acceleration": 1000}})
    assert background.draw(off, np.random.default_rng(0)) == []


@pytest.mark.parametrize("acceleration", [200.0, 2000.0])
def test_drawn_counts_and_kind_mix_match(acceleration: float) -> None:
    sc = scenario(acceleration=acceleration, lemon_fraction=0)
    expected = background.expected_node_faults(sc)
    counts = [len(background.draw_node_faults(sc, np.random.default_rng(s))) for s in range(40)]
    # The mean of 40 Poisson draws is within 5 standard errors of the expectation.
    assert abs(np.mean(counts) - expected) < 5 * math.sqrt(expected / 40)

    big = scenario(acceleration=acceleration * 20, lemon_fraction=0)
    faults = background.draw_node_faults(big, np.random.default_rng(1))
    mix = rates.kind_mix()
    assert set(mix) <= set(KINDS) and sum(mix.values()) == pytest.approx(1.0)
    got = Counter(f.kind for f in faults)
    n = len(faults)
    for kind, p in mix.items():
        assert abs(got[kind] / n - p) < 5 * math.sqrt(p * (1 - p) / n), kind
    assert all(f.source == "background" and 0 <= f.onset_s < big.duration_s for f in faults)
    assert all((f.gpu is not None) == KINDS[f.kind].per_gpu for f in faults)


def test_llama3_mix_is_renormalised_over_the_cited_causes() -> None:
    mix = rates.kind_mix()
    total = sum(rates.LLAMA3_ROOT_CAUSES.values())
    hbm = sum(mix[k] for k in rates.CAUSE_TO_KINDS["gpu_hbm3"])
    assert hbm == pytest.approx(rates.LLAMA3_ROOT_CAUSES["gpu_hbm3"] / total)
    assert mix["sw_crash"] == pytest.approx(12.9 / total)


def test_lemons_are_the_cited_fraction_and_fail_more_often() -> None:
    sc = parse_scenario(
        {"nodes": 20000, "duration_s": 60, "background": {"enabled": True, "acceleration": 100}}
    )
    lemons = background.draw_lemons(sc, np.random.default_rng(5))
    p = rates.LEMON_NODE_FRACTION
    assert abs(len(lemons) / sc.nodes - p) < 5 * math.sqrt(p * (1 - p) / sc.nodes)
    rate = 1 / lemons[0].params["incident_interval_s"]
    assert rate == pytest.approx(background.node_fault_rate(sc) * rates.LEMON_RATE_MULTIPLIER)


def test_straggler_fraction_of_jobs() -> None:
    sc = scenario()
    rng = np.random.default_rng(9)
    nodes = np.arange(8)
    drawn = [background.straggler_for_job(sc, rng, nodes, 0.0) for _ in range(20000)]
    got = [d for d in drawn if d is not None]
    p = rates.STRAGGLER_JOB_FRACTION
    assert abs(len(got) / len(drawn) - p) < 5 * math.sqrt(p * (1 - p) / len(drawn))
    lo, hi = sc.background.straggler_slowdown
    assert all(lo <= d.params["slowdown"] <= hi and d.node in nodes for d in got)


def test_background_run_emits_valid_truth_and_stragglers_end_with_their_job() -> None:
    sc = parse_scenario(
        {
            "nodes": 64,
            "duration_s": 240,
            "seed": 4,
            "jobs": {"sizes": [2, 4], "duration_s": [40, 80], "startup_s": [2, 4]},
            "background": {"enabled": True, "acceleration": 30000, "ramp_s": [20, 60], "repair_s": 60},
        }
    )
    sim = Simulation(sc)
    truths = [m for t, _, m in sim.run() if t == topics.TRUTH]
    for m in truths:
        schemas.validate(m, schemas.TRUTH)
    opened = {m["id"]: m for m in truths if "end_ts" not in m}
    assert {m["source"] for m in truths} == {"background"}
    kinds = {m["fault"] for m in opened.values()}
    assert "straggler" in kinds and len(kinds) >= 5
    planned = sum(f.spec.kind != "straggler" and f.spec.kind != "lemon" for f in sim.faults)
    assert planned > 0.5 * background.expected_node_faults(sc)
    stragglers = [m for m in truths if m["fault"] == "straggler" and "end_ts" in m]
    assert stragglers and all("job" in m for m in stragglers)
