"""Nodes that stop reporting.

A node that crashes, hangs or loses its network sends nothing, so no rule on its telemetry
can fire. Time still moves on through the other nodes' samples (event time): a node whose
last sample is more than `silent_after_s` older than the newest samples of its partition is
reported (kind host, critical), and the finding resolves when the node reports again. "Newest"
is the 90th percentile of the nodes' latest sample times, so one node with a clock running ahead
cannot make the others look silent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from detectors.findings import IncidentBook


@dataclass(frozen=True)
class SilenceConfig:
    silent_after_s: float = 10.0  # 10 missed 1 s samples; well past scheduling jitter of an agent
    min_nodes: int = 2  # a partition with one node has no other clock to judge it by
    reference_percentile: float = 90.0


class SilenceDetector:
    def __init__(self, config: SilenceConfig | None = None) -> None:
        self.cfg = config or SilenceConfig()
        self.book = IncidentBook()

    def process(self, last_ts: dict[str, float], seen: set[str], now: float) -> list[dict[str, Any]]:
        """last_ts: every node's latest sample time; seen: the nodes that reported in this batch."""
        out: list[dict[str, Any]] = []
        for key in [k for k in self.book.open if k[0] in seen]:
            inc = self.book.open.pop(key)
            out.append(inc.finding(max(last_ts[key[0]], inc.last_bad), resolved=True))
        if len(last_ts) < self.cfg.min_nodes:
            return out
        names = list(last_ts)
        ts = np.fromiter(last_ts.values(), dtype=float, count=len(names))
        # The clock to judge by is the 90th percentile of the nodes' latest samples, not the newest
        # one: a single node whose clock runs ahead would otherwise make every other node "silent".
        # (A rack going quiet stays visible: up to 90% of the nodes can fall behind.)
        now = min(now, float(np.percentile(ts, self.cfg.reference_percentile)))
        for i in np.flatnonzero(now - ts > self.cfg.silent_after_s):
            node = names[i]
            gap = float(now - ts[i])
            if (node, None, None, "host", "silent") in self.book.open:
                continue  # one finding per silence; it resolves when the node reports again
            out.extend(
                self.book.observe(
                    node=node,
                    kind="host",
                    rule="silent",
                    ts=float(ts[i]) + self.cfg.silent_after_s,
                    severity="critical",
                    score=0.9,
                    summary=f"{node} stopped reporting: no telemetry for {gap:.0f} s",
                    evidence={"last_sample_ts": float(ts[i]), "silent_for_s": round(gap, 1)},
                    clear_after=self.cfg.silent_after_s,
                    next_ts=lambda _n, _t: None,
                )
            )
        return out

    def to_state(self) -> list[dict[str, Any]]:
        return self.book.to_state()

    @classmethod
    def from_state(cls, items: list[dict[str, Any]], config: SilenceConfig | None = None) -> SilenceDetector:
        self = cls(config)
        self.book = IncidentBook.from_state(items)
        return self
