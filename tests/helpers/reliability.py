"""Builders of the accounting stage's inputs, as their writers make them (signed where the real
ones are), for the reliability tests."""

from __future__ import annotations

from typing import Any

from fleetwatch import schemas, signing
from fleetwatch.alerts import drain_result
from fleetwatch.census import node_message
from fleetwatch.detectors.findings import make_finding

CENSUS_KEY = b"k" * 32
DRAIN_KEY = b"d" * 32
T0 = 1_780_000_000.0  # 2026-05-28: a fixed clock


def job(
    job: str,
    nodes: list[str],
    state: str,
    ts: float,
    *,
    end_state: str | None = None,
    start_ts: float | None = None,
    gpus: list[int] | None = None,
) -> dict[str, Any]:
    m: dict[str, Any] = {"schema": schemas.JOB, "job": job, "nodes": nodes, "state": state, "ts": ts}
    if end_state is not None:
        m["end_state"] = end_state
    if start_ts is not None:
        m["start_ts"] = start_ts
    if gpus is not None:
        m["gpus"] = gpus
    schemas.validate_job(m)
    return m


def finding(
    node: str,
    kind: str,
    ts: float,
    *,
    severity: str = "critical",
    rule: str = "r",
    resolved: bool = False,
    first_seen: float | None = None,
    evidence: dict[str, Any] | None = None,
    key: bytes = CENSUS_KEY,
) -> dict[str, Any]:
    f = make_finding(
        node=node,
        kind=kind,
        rule=rule,
        severity=severity,
        score=1.0,
        summary=f"{kind} on {node}",
        evidence=evidence or {},
        first_seen=ts if first_seen is None else first_seen,
        ts=ts,
        resolved=resolved,
    )
    return signing.signed(f, key)


def result(
    node: str, action: str, ts: float, request_id: str, outcome: str = "executed", key: bytes = DRAIN_KEY
) -> dict[str, Any]:
    return drain_result.make_result(
        request_id=request_id,
        node=node,
        action=action,
        outcome=outcome,
        detail=outcome,
        ts=ts,
        request_signature="0" * 64,
        key=key,
    )


def census(node: str, ts: float, key: bytes = CENSUS_KEY) -> dict[str, Any]:
    return signing.signed(node_message(node, ts, ts), key)


def step(job: str, node: str, ts: float, n: int, **extra: Any) -> dict[str, Any]:
    m = {
        "schema": schemas.STEP,
        "job": job,
        "node": node,
        "rank": 0,
        "step": n,
        "step_time_s": 1.0,
        "ts": ts,
        **extra,
    }
    schemas.validate_step(m)
    return m
