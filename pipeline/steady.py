"""How long each node has reported without a break, on the broker's clock (issue 23, item 9).

The census (fleetwatch/census.py) says, per node, when its current unbroken run of telemetry began
(`steady_since`) and when its latest sample reached the broker (`seen_at`); act counts a node in
the fleet that sizes the drain budget only once that run is long enough (its warm-up), and detect
exports per-node metric series for warm nodes (pipeline/fleet_metrics.py). Both times are the
telemetry topic's LogAppendTime, which a node cannot set: a sample stamped a day in the past does
not make a new name look old. Where the broker's time is not known (`fleetwatch eval`, tests that
hand dicts), the sample's own time stands in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

MAX_PAUSES = 16  # the partition's latest pauses kept (older ones lie before any node's last sample)


@dataclass
class Pauses:
    """When a whole partition received nothing for longer than the gap (a broker outage, the agents
    spooling): a node's gap across such a pause is not a break in its reporting, or every node
    would start its warm-up again after each outage (and the fleet that sizes the drain budget
    would be empty for a warm-up)."""

    latest: float = float("nan")  # the partition's latest broker time
    spans: list[tuple[float, float]] = field(default_factory=list)

    def note(self, t: np.ndarray, gap_s: float) -> None:
        """A batch's broker times: a quiet stretch before it longer than gap_s is a pause."""
        first, last = float(np.min(t)), float(np.max(t))
        if first - self.latest > gap_s:  # NaN (nothing seen yet): False
            self.spans = [*self.spans, (self.latest, first)][-MAX_PAUSES:]
        self.latest = float(np.fmax(self.latest, last))

    def within(self, start: np.ndarray, end: np.ndarray) -> np.ndarray:
        """Seconds of pauses inside each [start, end]."""
        out = np.zeros(len(start))
        for a, b in self.spans:
            out += np.clip(np.minimum(end, b) - np.maximum(start, a), 0.0, None)
        return out

    def to_state(self) -> dict[str, Any]:
        return {"latest": None if np.isnan(self.latest) else self.latest, "spans": self.spans}

    @classmethod
    def from_state(cls, d: dict[str, Any] | None) -> Pauses:
        """Older snapshots have none: the first batch after the restore is not taken as one."""
        if not d:
            return cls()
        latest = d.get("latest")
        spans = [(float(a), float(b)) for a, b in d.get("spans", [])]
        if len(spans) > MAX_PAUSES:  # a made-up snapshot would cost a pass per span on every batch
            raise ValueError(f"{len(spans)} pauses in the snapshot (at most {MAX_PAUSES})")
        return cls(float("nan") if latest is None else float(latest), spans)


def broker_times(ts: np.ndarray, received: np.ndarray) -> np.ndarray:
    """Each sample's broker time, or its own time where the broker's is not known."""
    return np.where(np.isnan(received), ts, received)


def track(
    seen_at: np.ndarray,
    steady_since: np.ndarray,
    rows: np.ndarray,
    t: np.ndarray,
    gap_s: float,
    pauses: Pauses | None = None,
) -> np.ndarray:
    """Fold a batch's samples (node rows, broker times) into the per-row arrays, in place: a row
    not seen before (seen_at NaN), or a gap of more than gap_s between consecutive samples of a
    row (not counting the partition's pauses), starts a new run at that sample. Returns the rows
    whose run (re)started in this batch."""
    if not len(rows):
        return rows
    if pauses is not None:
        pauses.note(t, gap_s)
    order = np.lexsort((t, rows))  # by row, then time
    r, tt = rows[order], t[order]
    first = np.ones(len(r), dtype=bool)
    first[1:] = r[1:] != r[:-1]
    prev = np.empty_like(tt)
    prev[1:] = tt[:-1]
    prev[first] = seen_at[r[first]]
    gap = tt - prev
    if pauses is not None and pauses.spans:
        gap = gap - pauses.within(prev, tt)
    breaks = np.isnan(prev) | (gap > gap_s)
    at = np.flatnonzero(breaks)
    if len(at):
        last = np.ones(len(at), dtype=bool)  # each row's last break in the batch starts its run
        last[:-1] = r[at[1:]] != r[at[:-1]]
        steady_since[r[at[last]]] = tt[at[last]]
    ends = np.flatnonzero(np.r_[first[1:], True])  # each row's latest sample
    seen_at[r[ends]] = np.fmax(seen_at[r[ends]], tt[ends])
    return np.unique(r[at])


def warm(seen_at: np.ndarray, steady_since: np.ndarray, warm_up_s: float) -> np.ndarray:
    """Rows that have reported without a break for at least warm_up_s."""
    with np.errstate(invalid="ignore"):
        return (seen_at - steady_since) >= warm_up_s  # NaN (never seen): False
