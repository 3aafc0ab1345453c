"""Attribution: each job end gets its category and, for a failure, the cause and its evidence.

The rule (docs/reliability.md, "Attribution"), after Kokolis et al.: a failure is attributed to a
cause detected on one of the job's nodes from `before_s` (10 min) before the job's end to
`after_s` (5 min) after it. A finding counts when it was open at any moment of that window (it
opened before the window's end and had not resolved before its start), at `min_severity` or above
(critical by default: the paper counts the high-severity health checks). Among several, the most
severe wins, then the most specific component (taxonomy.KIND_CAUSE's priority), then the earliest.

- COMPLETED: `completed`. Ends that are nobody's failure (CANCELLED, TIMEOUT, PREEMPTED, ...): `other`.
- NODE_FAIL, BOOT_FAIL: never the user's. `hardware` (or `system_software`) by the winning finding,
  else `hardware` / `node` with no evidence: the node stopped answering and nothing else was seen.
- FAILED, OUT_OF_MEMORY: the winning finding's domain, else `user`.

Every attribution keeps the ids of all the cause findings in its window (the winner first), so a
figure can always be traced back to the findings behind it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from fleetwatch.pipeline.reliability.taxonomy import COMPLETED_ENDS, FAILED_ENDS, NODE_ENDS, Category

SEVERITY_RANK = {"info": 0, "warning": 1, "critical": 2}


@dataclass(frozen=True)
class Window:
    before_s: float = 600.0
    after_s: float = 300.0
    min_severity: str = "critical"

    def __post_init__(self) -> None:
        if not (self.before_s >= 0 and self.after_s >= 0):
            raise ValueError("the attribution window's before_s and after_s must be >= 0")
        if self.min_severity not in SEVERITY_RANK:
            raise ValueError(f"min_severity must be one of {sorted(SEVERITY_RANK)}")


@dataclass(frozen=True)
class Candidate:
    """A cause finding seen in a failed run's window."""

    run: int  # index of the run in the batch being attributed
    finding: str
    severity: str
    domain: str
    component: str
    priority: int
    first_seen: float


@dataclass
class Attribution:
    category: Category
    component: str | None = None  # for hardware / system_software
    evidence: list[str] = field(default_factory=list)  # finding ids, the winner first


def base_category(end_state: str) -> Category:
    """The category an end state gives before any finding is looked at."""
    if end_state in COMPLETED_ENDS:
        return "completed"
    if end_state in NODE_ENDS:
        return "hardware"
    if end_state in FAILED_ENDS:
        return "user"
    return "other"


def is_failure(end_state: str) -> bool:
    return end_state in NODE_ENDS or end_state in FAILED_ENDS


def attribute(
    end_states: Sequence[str], candidates: Sequence[Candidate], window: Window
) -> list[Attribution]:
    """One Attribution per end state (run i is end_states[i]); `candidates` are the cause findings
    open in each failed run's window on its nodes, at any severity (those below the window's
    min_severity are dropped here)."""
    out = [Attribution(base_category(s)) for s in end_states]
    for i, s in enumerate(end_states):
        if s in NODE_ENDS:
            out[i].component = "node"
    floor = SEVERITY_RANK[window.min_severity]
    kept = [
        c for c in candidates if SEVERITY_RANK.get(c.severity, -1) >= floor and is_failure(end_states[c.run])
    ]
    if not kept:
        return out
    run = np.array([c.run for c in kept], dtype=np.int64)
    sev = np.array([SEVERITY_RANK[c.severity] for c in kept], dtype=np.int64)
    prio = np.array([c.priority for c in kept], dtype=np.int64)
    first = np.array([c.first_seen for c in kept], dtype=np.float64)
    # the winner of each run first: most severe, then lowest priority number, then earliest; the
    # finding id breaks the last ties so that the same inputs always give the same answer
    ids = np.array([c.finding for c in kept])
    order = np.lexsort((ids, first, prio, -sev, run))
    seen: set[tuple[int, str]] = set()
    for j in order:  # per candidate, not per value: a window holds a handful of findings
        c = kept[j]
        a = out[c.run]
        if not a.evidence:
            a.category = "hardware" if c.domain == "hardware" else "system_software"
            a.component = c.component
        if (c.run, c.finding) not in seen:
            seen.add((c.run, c.finding))
            a.evidence.append(c.finding)
    return out
