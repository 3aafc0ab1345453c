"""The scorecard's matching rules, on hand-made truth and findings."""

from __future__ import annotations

from typing import Any

import pytest

from fleetwatch.detectors.findings import make_finding
from fleetwatch.pipeline.scorecard import format_table, score

T0 = 1_000_000.0
NODES = ["n1", "n2", "n3", "n4"]


def finding(
    node: str,
    kind: str,
    ts: float,
    *,
    gpu: int | None = None,
    severity: str = "critical",
    resolved: bool = False,
    first_seen: float | None = None,
) -> dict[str, Any]:
    return make_finding(
        node=node,
        kind=kind,
        rule="r",
        severity=severity,
        score=0.9,
        summary="s",
        evidence={},
        first_seen=first_seen if first_seen is not None else ts,
        ts=ts,
        gpu=gpu,
        resolved=resolved,
    )


def truth(
    node: str,
    fault: str,
    onset: float,
    *,
    gpu: int | None = None,
    end: float | None = None,
    failure: float | None = None,
    category: str = "sudden",
) -> dict[str, Any]:
    m: dict[str, Any] = {
        "schema": "truth/1",
        "id": f"{node}-{fault}",
        "node": node,
        "fault": fault,
        "onset_ts": onset,
        "category": category,
    }
    if gpu is not None:
        m["gpu"] = gpu
    if end is not None:
        m["end_ts"] = end
    if failure is not None:
        m["failure_ts"] = failure
    return m


def test_detection_delay_precision_and_false_rate() -> None:
    truths = [
        truth("n1", "xid79", T0 + 10, gpu=3),
        truth("n2", "ecc_sbe_rising", T0 + 20, gpu=1, failure=T0 + 100, category="gradual"),
    ]
    findings = [
        finding("n1", "xid", T0 + 11, gpu=3),
        finding("n1", "xid", T0 + 11, gpu=3),  # the same finding again (at-least-once): counted once
        finding("n1", "pcie", T0 + 12, gpu=3),  # another angle on the same fault: true, not a detection
        finding("n2", "ecc", T0 + 50, gpu=1, severity="warning"),
        finding("n3", "thermal", T0 + 30),  # a healthy node: false
        finding("n4", "thermal", T0 + 40, severity="info"),  # info does not count
        finding("n3", "thermal", T0 + 90, resolved=True, first_seen=T0 + 30),  # resolutions do not count
    ]
    card = score(findings, truths, NODES, T0, T0 + 3600, 1.0)
    k = card.per_kind
    assert k["xid79"]["recall"] == 1.0 and k["xid79"]["delay_median_s"] == 1.0
    assert k["ecc_sbe_rising"]["delay_median_s"] == 30.0 and k["ecc_sbe_rising"]["before_failure"] == 1
    assert card.per_finding_kind["thermal"] == {"findings": 1, "true": 0, "precision": 0.0}
    assert card.per_finding_kind["xid"]["precision"] == 1.0
    j = card.to_json()
    assert j["findings"] == 4 and j["true_findings"] == 3
    assert j["false_findings_on_healthy_nodes"] == 1
    assert j["false_per_1000_healthy_node_hours"] == pytest.approx(1000 / 2)  # n3, n4 healthy for 1 h


def test_wrong_gpu_wrong_time_and_wrong_kind_do_not_detect() -> None:
    truths = [truth("n1", "xid48", T0 + 100, gpu=2, end=T0 + 200)]
    findings = [
        finding("n1", "ecc", T0 + 50, gpu=2),  # before onset
        finding("n1", "ecc", T0 + 150, gpu=5),  # other GPU
        finding("n1", "thermal", T0 + 150, gpu=2),  # right place, a kind that does not describe it
        finding("n1", "ecc", T0 + 400, gpu=2),  # after end + grace
    ]
    card = score(findings, truths, NODES, T0, T0 + 3600, 1.0, grace_s=120)
    assert card.per_kind["xid48"]["recall"] == 0.0
    assert card.true_ids == {findings[2]["id"]}  # it matches the fault's place and time, so it is not false


def test_a_drain_storm_is_on_the_scorecard_only_when_one_held_drains() -> None:
    card = score(
        [finding("n1", "xid", T0 + 11, gpu=3)],
        [truth("n1", "xid79", T0 + 10, gpu=3)],
        NODES,
        T0,
        T0 + 60,
        1.0,
    )
    assert "drain_storm" not in card.to_json() and "storm" not in format_table(card)  # eval: no act
    storm = {
        "node_count": 6,
        "threshold": 6,
        "window_s": 60.0,
        "drains_held": 6,
        "nodes": ["n1"],
        "declared_t": 95.0,
    }
    card.drain_storm = storm
    assert card.to_json()["drain_storm"] == storm
    assert format_table(card).splitlines()[-1] == (
        "drain storm: 6 nodes became drain-worthy within 60 s (storm threshold 6), a likely shared cause: "
        "6 drains held"
    )


def test_a_run_without_a_healthy_node_says_so_instead_of_none() -> None:
    truths = [truth(n, "xid79", T0 + 10, gpu=0) for n in NODES]  # every node has a fault
    card = score([finding(NODES[0], "xid", T0 + 11, gpu=0)], truths, NODES, T0, T0 + 60, 1.0)
    assert card.to_json()["false_per_1000_healthy_node_hours"] is None
    assert format_table(card).splitlines()[-1].endswith("(no healthy node)")  # it printed "None per 1000"
