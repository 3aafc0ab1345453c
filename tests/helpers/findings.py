"""finding/1 messages for the action layer's tests: an XID 79 drain-worthy critical by default,
any kind, rule, severity and evidence on request; the same finding resolved; and a finding's bytes
as detect writes them (signed with detect's key), which a real `fleetwatch act` requires."""

from __future__ import annotations

from typing import Any

from fleetwatch.detectors.findings import make_finding
from fleetwatch.signing import encode_signed

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


def signed(f: dict[str, Any], key: bytes | str) -> bytes:
    """`f` on fleet.findings.v1 as `fleetwatch detect` writes it with `key` (its census key)."""
    return encode_signed(f, key.encode() if isinstance(key, str) else key)
