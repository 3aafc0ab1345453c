"""Lemon-node scoring from per-node incident history."""

from __future__ import annotations

import numpy as np

from fleetwatch import schemas
from fleetwatch.detectors.lemon import LemonConfig, LemonScorer

DAY = 86400.0
T0 = 1_764_000_000.0


def _fleet_history(seed: int, n_nodes: int = 300, lemons: tuple[int, ...] = (7, 123, 250), days: int = 30):
    """Daily samples for every node; incidents at RSC-1's rate (6.5 per 1000 node-days), lemons at 40x."""
    rng = np.random.default_rng(seed)
    nodes = [f"node-{i:04d}" for i in range(n_nodes)]
    rate = np.full(n_nodes, 6.5 / 1000)
    rate[list(lemons)] *= 40
    scorer = LemonScorer()
    findings = []
    for d in range(days):
        ts = T0 + d * DAY
        scorer.observe_samples(nodes, np.full(n_nodes, ts))
        k = rng.poisson(rate)
        hit = [nodes[i] for i in np.flatnonzero(k) for _ in range(k[i])]
        scorer.observe_events(hit, [ts + 3600.0 * j for j in range(len(hit))])
        findings += scorer.judge(ts + DAY - 1)
    return nodes, lemons, scorer, findings


def test_lemons_are_found_and_healthy_nodes_are_not() -> None:
    caught, false = 0, 0
    for seed in range(5):
        nodes, lemons, _, findings = _fleet_history(seed)
        flagged = {f["node"] for f in findings if not f["resolved"]}
        caught += len(flagged & {nodes[i] for i in lemons})
        false += len(flagged - {nodes[i] for i in lemons})
        for f in findings:
            schemas.validate(f)
            assert f["kind"] == "lemon"
    assert caught >= 12  # of 15 lemons over five fleets (13 measured)
    assert false <= 1  # of 1,485 healthy node histories


def test_one_fault_with_several_findings_is_one_episode() -> None:
    s = LemonScorer(LemonConfig(min_events=3))
    nodes = [f"n{i}" for i in range(20)]
    s.observe_samples(nodes, np.full(20, T0))
    # SBE warning, DBE critical and its XID 48, seconds apart: one episode
    s.observe_events(["n3", "n3", "n3"], [T0 + 10, T0 + 11, T0 + 12])
    s.observe_samples(nodes, np.full(20, T0 + DAY))
    assert s.judge(T0 + DAY) == []
    _, _, ev, _ = s.scores()
    assert ev[s.index.rows["n3"]] < 1.01


def test_state_round_trip_gives_the_same_scores() -> None:
    _, _, scorer, _ = _fleet_history(1, n_nodes=50, lemons=(3,), days=10)
    restored = LemonScorer.from_state(scorer.to_state())
    a, b = scorer.scores(), restored.scores()
    assert a[0] == b[0]
    assert np.allclose(a[1], b[1]) and np.allclose(a[2], b[2])
