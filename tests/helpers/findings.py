"""finding/1 messages for the action layer's tests: an XID 79 drain-worthy critical by default,
any kind, rule, severity and evidence on request; and the same finding resolved."""

from __future__ import annotations

from typing import Any

from fleetwatch.detectors.findings import make_finding

T0 = 1_800_000_000.0


def finding(
    node: str,
    kind: str = "xid",
    severity: str = "critical",
    rule: str = "xid_burst",
    ts: float = T0,
    resolved: bool = False,
    first_seen: float | None = None,
    gpu: int | None = 0,
    job: str | None = None,
    **evidence: Any,
) -> dict[str, Any]:
    if kind == "xid" and not evidence:
        evidence = {"xids": {"79": 1}, "worst_xid": 79, "action": "drain_node"}
    return make_finding(
        node=node,
        kind=kind,
        rule=rule,
        severity=severity,
        score=0.9,
        summary=f"{node} {kind}",
        evidence=evidence,
        first_seen=first_seen if first_seen is not None else ts,
        ts=ts,
        gpu=gpu,
        job=job,
        resolved=resolved,
    )


def resolve(f: dict[str, Any], ts: float) -> dict[str, Any]:
    return {**f, "ts": ts, "resolved": True, "summary": "resolved: " + f["summary"]}
