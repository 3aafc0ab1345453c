"""Scoring findings against the simulator's ground truth (truth/1).

Honest, per incident, no point adjustment:
- A finding counts once: its first emission (by id) at severity warning or above. Resolutions
  and re-emissions of the same id are not new findings.
- A fault is DETECTED when a counted finding of an accepted kind (`ACCEPTED`) lands on its
  node (and GPU, where both name one) between its onset and its end plus `grace_s`.
  Detection delay = that finding's ts - onset. A gradual fault counts as found early only if
  the finding precedes its simulated failure (`failure_ts`).
- A counted finding is TRUE if it matches any fault on its node (any kind, same window),
  else FALSE. Precision of a finding kind = true / all counted findings of that kind.
- False findings per 1000 node-hours are counted on nodes with no fault at all.
- A straggler is only observable while its node runs a job (peers are what it is compared
  with), so a straggler's delay counts only the time its node spent in running jobs between
  onset and detection (`busy` spans; a job killed by another node's fault restarts the clock).
  A straggler observable for less than `min_straggler_s` (60 samples: its job ended or the run
  did) is reported as `unobservable` and left out of recall, not counted as found or missed.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fleetwatch.detectors.findings import SEVERITY_RANK

# Which finding kinds count as detecting each fault kind. The first is the expected one; the
# others describe the same fault from another angle (an ECC XID is also an `xid` finding, a GPU
# off the bus is also a lost-GPU `pcie` finding, a heating GPU drifts from its siblings).
ACCEPTED: dict[str, tuple[str, ...]] = {
    "xid79": ("xid", "pcie"),
    "xid48": ("ecc", "xid"),
    "xid94": ("ecc", "xid"),
    "xid95": ("ecc", "xid"),
    "xid119": ("xid",),
    "ib_link_down": ("ib_link",),
    "node_down": ("host",),
    "sw_crash": ("xid",),
    "nvswitch_fatal": ("nvswitch",),
    "pcie_aer_fatal": ("pcie",),
    "fallen_off_bus": ("pcie", "xid"),
    "nvlink5_fatal": ("xid", "nvlink"),
    "kmsg_overrun": ("kernel_log",),
    "mount_hung": ("mount", "hung_tasks"),
    "blockdev_readonly": ("block_device",),
    "pcie_downtrain": ("pcie_link", "straggler"),
    "hca_missing": ("device_count", "ib_link"),
    "d_state_stuck": ("hung_tasks",),
    "disk_full": ("disk",),
    "ib_link_flapping": ("ib_link",),
    "eth_flapping": ("eth_link",),
    "ecc_sbe_rising": ("ecc", "xid"),
    "row_remap_pending": ("row_remap", "ecc", "xid"),
    "nvlink_crc": ("nvlink", "xid"),
    "pcie_replay": ("pcie", "xid"),
    "thermal": ("thermal", "statistical"),  # the GPU running hotter than its siblings, before it throttles
    "ib_symbol_errors": ("ib_link",),
    "straggler": ("straggler",),
    "lemon": ("lemon",),
}


@dataclass
class Fault:
    id: str
    node: str
    fault: str
    category: str
    onset_ts: float
    gpu: int | None = None
    end_ts: float | None = None
    failure_ts: float | None = None
    detected_ts: float | None = None
    detected_by: str | None = None

    @classmethod
    def from_truth(cls, m: Mapping[str, Any]) -> Fault:
        return cls(
            id=m.get("id") or f"{m['node']}:{m['fault']}:{m['onset_ts']}",
            node=m["node"],
            fault=m["fault"],
            category=m.get("category", "unknown"),
            onset_ts=m["onset_ts"],
            gpu=m.get("gpu"),
            end_ts=m.get("end_ts"),
            failure_ts=m.get("failure_ts"),
        )


@dataclass
class Scorecard:
    faults: list[Fault]
    findings: list[dict[str, Any]]  # counted findings (first emission, warning+)
    true_ids: set[str]
    node_hours_healthy: float
    false_on_healthy: int
    interval_s: float
    per_kind: dict[str, dict[str, Any]] = field(default_factory=dict)
    per_finding_kind: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Set by a run with the action layer (the demo) when its storm guard held drains: node_count,
    # threshold, window_s, drains_held, nodes, declared_t / over_t (simulated seconds).
    drain_storm: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        storm = {} if self.drain_storm is None else {"drain_storm": self.drain_storm}
        return {
            "per_fault_kind": self.per_kind,
            "per_finding_kind": self.per_finding_kind,
            "findings": len(self.findings),
            "true_findings": len(self.true_ids),
            "false_findings_on_healthy_nodes": self.false_on_healthy,
            "healthy_node_hours": round(self.node_hours_healthy, 3),
            "false_per_1000_healthy_node_hours": round(
                1000 * self.false_on_healthy / self.node_hours_healthy, 2
            )
            if self.node_hours_healthy
            else None,
            "interval_s": self.interval_s,
            **storm,
        }


def busy_spans(jobs: Iterable[Mapping[str, Any]]) -> dict[str, list[tuple[float, float]]]:
    """node -> [(job start, job end)] from job/1 messages (an unfinished job ends at infinity)."""
    busy: dict[str, list[tuple[float, float]]] = {}
    for m in sorted(jobs, key=lambda j: j["ts"]):
        for n in m["nodes"]:
            if m["state"] == "started":
                busy.setdefault(n, []).append((m["ts"], float("inf")))
            elif m["state"] in ("finished", "failed") and busy.get(n):
                busy[n][-1] = (busy[n][-1][0], m["ts"])
    return busy


def _matches(f: Mapping[str, Any], fault: Fault, end_of_run: float, grace_s: float) -> bool:
    if f["node"] != fault.node:
        return False
    if fault.gpu is not None and f.get("gpu") is not None and f["gpu"] != fault.gpu:
        return False
    end = fault.end_ts if fault.end_ts is not None else end_of_run
    return fault.onset_ts <= f["ts"] <= end + grace_s


def score(
    findings: Iterable[Mapping[str, Any]],
    truths: Iterable[Mapping[str, Any]],
    nodes: list[str],
    start_ts: float,
    end_ts: float,
    interval_s: float,
    grace_s: float = 120.0,
    busy: Mapping[str, list[tuple[float, float]]] | None = None,
    min_straggler_s: float = 60.0,
) -> Scorecard:
    faults: dict[str, Fault] = {}
    for t in truths:
        f = Fault.from_truth(t)
        if f.id in faults:  # the end-of-fault truth message completes the onset one
            faults[f.id].end_ts = f.end_ts
        else:
            faults[f.id] = f
    seen: set[str] = set()
    counted: list[dict[str, Any]] = []
    for f in findings:
        if f["id"] in seen or f["resolved"] or SEVERITY_RANK[f["severity"]] < SEVERITY_RANK["warning"]:
            continue
        seen.add(f["id"])
        counted.append(dict(f))
    counted.sort(key=lambda f: f["ts"])

    by_node: dict[str, list[Fault]] = defaultdict(list)
    for fault in faults.values():
        by_node[fault.node].append(fault)
    true_ids: set[str] = set()
    for f in counted:
        for fault in by_node.get(f["node"], ()):
            if _matches(f, fault, end_ts, grace_s):
                true_ids.add(f["id"])
                if fault.detected_ts is None and f["kind"] in ACCEPTED.get(fault.fault, (f["kind"],)):
                    fault.detected_ts, fault.detected_by = f["ts"], f["kind"]

    healthy = [n for n in nodes if n not in by_node]
    false_on_healthy = sum(1 for f in counted if f["node"] in healthy)
    card = Scorecard(
        faults=list(faults.values()),
        findings=counted,
        true_ids=true_ids,
        node_hours_healthy=len(healthy) * (end_ts - start_ts) / 3600.0,
        false_on_healthy=false_on_healthy,
        interval_s=interval_s,
    )
    kinds: dict[str, list[Fault]] = defaultdict(list)
    for fault in faults.values():
        kinds[fault.fault].append(fault)
    for fk in sorted({f["kind"] for f in counted}):
        of_kind = [f for f in counted if f["kind"] == fk]
        card.per_finding_kind[fk] = {
            "findings": len(of_kind),
            "true": sum(f["id"] in true_ids for f in of_kind),
            "precision": round(sum(f["id"] in true_ids for f in of_kind) / len(of_kind), 4),
        }

    def busy_s(f: Fault, until: float) -> float:
        spans = (busy or {}).get(f.node, [])
        return sum(max(0.0, min(e, until) - max(s, f.onset_ts)) for s, e in spans)

    def delay(f: Fault) -> float:
        assert f.detected_ts is not None
        if f.category != "straggler" or busy is None:
            return f.detected_ts - f.onset_ts
        return busy_s(f, f.detected_ts)

    def observable(f: Fault) -> bool:
        """A straggler whose node ran a job for less than `min_straggler_s` of its life (its job
        died, or the run ended) cannot be judged; it is counted apart, not as a miss."""
        if f.category != "straggler" or busy is None or f.detected_ts is not None:
            return True
        return busy_s(f, min(f.end_ts if f.end_ts is not None else end_ts, end_ts)) >= min_straggler_s

    for name, fs in sorted(kinds.items()):
        delays = np.array([delay(f) for f in fs if f.detected_ts is not None])
        expected = ACCEPTED.get(name, ("?",))[0]
        early = [f for f in fs if f.failure_ts is not None]
        judged = [f for f in fs if observable(f)]
        card.per_kind[name] = {
            "category": fs[0].category,
            "faults": len(fs),
            "unobservable": len(fs) - len(judged),
            "detected": len(delays),
            "recall": round(len(delays) / len(judged), 4) if judged else None,
            "precision": card.per_finding_kind.get(expected, {}).get("precision"),
            "delay_median_s": round(float(np.median(delays)), 2) if len(delays) else None,
            "delay_p95_s": round(float(np.percentile(delays, 95)), 2) if len(delays) else None,
            "delay_median_samples": round(float(np.median(delays)) / interval_s, 2) if len(delays) else None,
            "before_failure": (
                sum(1 for f in early if f.detected_ts is not None and f.detected_ts < f.failure_ts)
                if early
                else None
            ),
        }
    return card


def format_table(card: Scorecard) -> str:
    """The scorecard as a fixed-width text table."""
    head = ("fault kind", "cat", "n", "unobs", "recall", "prec", "med s", "p95 s", "early")
    fmt = "{:<19} {:<9} {:>4} {:>5} {:>6} {:>5} {:>6} {:>6} {:>5}"
    rows = [fmt.format(*head)]
    for name, k in card.per_kind.items():
        prec = "-" if k["precision"] is None else f"{k['precision']:.2f}"
        med = "-" if k["delay_median_s"] is None else f"{k['delay_median_s']:.1f}"
        p95 = "-" if k["delay_p95_s"] is None else f"{k['delay_p95_s']:.1f}"
        early = "-" if k["before_failure"] is None else f"{k['before_failure']}/{k['faults']}"
        recall = "-" if k["recall"] is None else f"{k['recall']:.2f}"
        cells = (name, k["category"], k["faults"], k["unobservable"], recall, prec, med, p95, early)
        rows.append(fmt.format(*cells))
    j = card.to_json()
    rate = j["false_per_1000_healthy_node_hours"]  # None: no healthy node in the run
    rows.append(
        f"findings: {j['findings']} ({j['true_findings']} true); false on healthy nodes: "
        f"{j['false_findings_on_healthy_nodes']} in {j['healthy_node_hours']:.1f} node-hours "
        f"({'no healthy node' if rate is None else f'{rate} per 1000 node-hours'})"
    )
    if card.drain_storm is not None:
        rows.append(storm_line(card.drain_storm))
    return "\n".join(rows)


def storm_line(storm: Mapping[str, Any]) -> str:
    """The storm guard's verdict in one line: how many nodes, within which window, what threshold."""
    return (
        f"drain storm: {storm['node_count']} nodes became drain-worthy within {storm['window_s']:g} s "
        f"(storm threshold {storm['threshold']}), a likely shared cause: {storm['drains_held']} drains held"
    )
