"""Nodes whose clock jumps.

The node stage orders a node's samples by its agent's numbering, not by their timestamps, and
gives each new sample an event time that is never ahead of the broker's time for it and never
before its node's previous sample (detectors/node_index.py). A sample whose own time was off from
that event time by `jump_s` or more is reported here (kind host, rule clock_jump, warning): its
clock jumped ahead (a sample stamped after the broker took it) or back (stamped before the node's
previous sample). The node's samples are still used, at their event times; its clock is not
trusted. The incident resolves after `clear_after_s` of event time without a jump.

A clock is not a hardware failure: these findings never drain a node (alerts/policy.py), and the
registry runs this detector after the lemon's, so that they are not part of a node's lemon
history.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fleetwatch.config import knob
from fleetwatch.detectors.batch import TelemetryBatch
from fleetwatch.detectors.counters import Segments
from fleetwatch.detectors.findings import Forgotten, IncidentBook, SampleTimes, severity_score
from fleetwatch.detectors.node_index import NodeIndex
from fleetwatch.detectors.protocol import NodeContext
from fleetwatch.detectors.rows import Compaction

RULE = "clock_jump"


@dataclass(frozen=True)
class ClockConfig:
    jump_s: float = knob(
        5.0,
        "a clock step this large (s) is set by hand or by a misconfigured time service, not NTP's "
        "slewing (at most 0.5 ms/s) or its default step threshold (128 ms)",
        gt=0,
    )
    clear_after_s: float = knob(600.0, "a clock-jump finding resolves this many seconds after the jump", gt=0)


class ClockDetector:
    def __init__(self, config: ClockConfig | None = None, index: NodeIndex | None = None) -> None:
        # no per-node arrays: the jumps come with each batch (NodeContext.clock_jump)
        self.cfg = config or ClockConfig()
        self.book = IncidentBook()

    def observe(self, batch: TelemetryBatch, ctx: NodeContext) -> list[dict[str, Any]]:
        """The NodeDetector protocol (detectors/protocol.py)."""
        jump = ctx.clock_jump
        bad = np.empty(0, dtype=np.int64)
        if jump is not None:
            with np.errstate(invalid="ignore"):
                bad = np.flatnonzero(np.abs(jump) >= self.cfg.jump_s)
        if len(bad) == 0 and not self.book.open:
            return []  # the usual batch: no jump and nothing to resolve, so no sort of its rows
        seg = Segments.of(ctx.rows)
        times = SampleTimes(ctx.index.names, ctx.index.rows, seg.rows, batch.ts[seg.order])
        out: list[dict[str, Any]] = []
        for i in bad.tolist():
            out += self._jumped(ctx.nodes[i], float(batch.ts[i]), float(jump[i]), int(batch.seq[i]), times)
        out += self.book.sweep(times.next_ts, times.latest)
        return out

    def _jumped(
        self, node: str, ts: float, jump: float, seq: int, times: SampleTimes
    ) -> list[dict[str, Any]]:
        ahead = jump > 0
        against = "the broker's time for it" if ahead else "its previous sample"
        summary = (
            f"{node}: clock {abs(jump):.0f} s {'ahead of' if ahead else 'behind'} {against}; "
            "its samples are ordered by the agent's sequence, at corrected times (check NTP/chrony)"
        )
        return self.book.observe(
            node=node,
            kind="host",
            rule=RULE,
            ts=ts,
            severity="warning",
            score=severity_score("warning", abs(jump) / self.cfg.jump_s),
            summary=summary,
            evidence={"jump_s": round(jump, 3), "direction": "ahead" if ahead else "behind", "seq": seq},
            clear_after=self.cfg.clear_after_s,
            next_ts=times.next_ts,
        )

    def forget(self, gone: Forgotten, rows: Compaction | None) -> list[dict[str, Any]]:
        return self.book.forget(gone)

    def to_state(self) -> dict[str, Any]:
        return {"incidents": self.book.to_state()}

    @classmethod
    def from_state(cls, state: dict[str, Any], config: ClockConfig | None, index: NodeIndex) -> ClockDetector:
        self = cls(config, index)
        self.book = IncidentBook.from_state(state["incidents"], self.cfg.clear_after_s)
        return self
