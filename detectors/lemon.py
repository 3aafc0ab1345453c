"""Lemon nodes: nodes whose own history shows a repeatedly elevated failure rate.

Meta's RSC clusters found ~1.2% of nodes to be lemons from per-node history (failed jobs,
XIDs, tickets, single-node failure rates); removing them cut large-job failures from 14% to
4% (Kokolis et al., HPCA 2025). One bad day is not a lemon: the signal is a node that keeps
having incidents while its peers do not.

Per node we keep exponentially decayed counts (time constant `tau_s`, default 30 days) of
hardware incidents opened on it and of failed jobs it took part in, plus its decayed exposure
(time observed). The fleet rate is the mean rate over nodes without the top 2% (so the
lemons themselves do not raise it; a median would be 0 where most nodes had no incident),
and a node's score is the Poisson tail probability of seeing at least its count at the fleet
rate: score = 1 - P(X >= k | lambda * exposure). A node is a lemon when its
events reach `min_events` and the tail probability falls below `p_lemon` (score above
1 - p_lemon). With per-node counts this is a one-sided test per node; `p_lemon` = 1e-4 keeps
the expected false lemons below one in 10,000 healthy nodes per evaluation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.stats import poisson

from fleetwatch.config import knob
from fleetwatch.detectors.batch import TelemetryBatch
from fleetwatch.detectors.findings import Forgotten, IncidentBook
from fleetwatch.detectors.node_index import NodeIndex
from fleetwatch.detectors.protocol import NodeContext
from fleetwatch.detectors.rows import Compaction, grow


@dataclass(frozen=True)
class LemonConfig:
    tau_s: float = knob(30 * 86400.0, "decay time (s) of a node's incident history: 30 days", gt=0)
    min_events: float = knob(3.0, "decayed event count a node needs before it can be a lemon", ge=0)
    p_lemon: float = knob(
        1e-4, "a lemon's incident count has at most this chance at the fleet's rate", gt=0, lt=1
    )
    job_failure_weight: float = knob(1.0, "a failed job counts like this many incidents", ge=0)
    floor_rate_per_s: float = knob(
        2.34 / 1000 / 86400, "floor on the fleet's rate: RSC-2's 2.34 failures per 1000 node-days", gt=0
    )
    clear_after_s: float = knob(
        86400.0, "a lemon finding resolves this long (s) after it was last judged one", gt=0
    )
    episode_gap_s: float = knob(
        600.0,
        "findings on one node closer together than this (s) are one episode (one fault often raises "
        "several findings: SBE rate, then DBE, then its XID) and count once",
        ge=0,
    )
    judge_every_s: float = knob(60.0, "event-time period (s) of the judgements", gt=0)


class LemonScorer:
    def __init__(self, config: LemonConfig | None = None, index: NodeIndex | None = None) -> None:
        self.cfg = config or LemonConfig()
        self.index = NodeIndex() if index is None else index  # node rows (the task's, shared)
        # per node row (grown to the index by _ensure)
        self.events = np.zeros(0)
        self.exposure = np.zeros(0)  # decayed seconds observed
        self.last_ts = np.zeros(0)
        self.last_event = np.zeros(0)
        self.book = IncidentBook()
        self.next_judgement = 0.0  # event time of the next judgement (state)

    def observe(self, batch: TelemetryBatch, ctx: NodeContext) -> list[dict[str, Any]]:
        """The NodeDetector protocol (detectors/protocol.py): the batch's samples are exposure; a
        node's history is its XIDs (Meta's lemon signal counts them), the findings that open on it
        (those of the detectors before this one) and the failed jobs it was in (ctx.job_failures);
        events close in time are one episode. Judged every judge_every_s of event time."""
        nodes, ts = ctx.nodes, batch.ts
        self._samples(ctx.rows, ts)
        events = [(float(ts[m]), nodes[m], 1.0) for m in batch.xid_msg.tolist()]
        events += [
            (f["ts"], f["node"], 1.0)
            for f in ctx.findings
            if not f["resolved"]
            and f["ts"] == f["first_seen"]
            and f["kind"] != "lemon"
            and f["severity"] != "info"
        ]
        events += ctx.job_failures
        if events:
            events.sort()
            self.observe_events([e[1] for e in events], [e[0] for e in events], [e[2] for e in events])
        now = float(ts.max())
        if now < self.next_judgement:
            return []
        self.next_judgement = now + self.cfg.judge_every_s
        return self.judge(now)

    def _ensure(self) -> None:
        """Room for every node of the index (new rows: no history)."""
        n = len(self.index)
        if len(self.events) < n:
            self.events = grow(self.events, n, 0.0)
            self.exposure = grow(self.exposure, n, 0.0)
            self.last_ts = grow(self.last_ts, n, np.nan)
            self.last_event = grow(self.last_event, n, -np.inf)

    def _advance(self, rows: np.ndarray, ts: np.ndarray) -> None:
        """Decay counts and add exposure up to `ts` for the given node rows (vectorised)."""
        last = self.last_ts[rows]
        dt = np.where(np.isnan(last), 0.0, np.maximum(0.0, ts - last))
        decay = np.exp(-dt / self.cfg.tau_s)
        self.events[rows] *= decay
        # exposure integrates exp(-age/tau): its decayed increment over dt is tau * (1 - decay)
        self.exposure[rows] = self.exposure[rows] * decay + self.cfg.tau_s * (1 - decay)
        self.last_ts[rows] = np.where(np.isnan(last), ts, np.maximum(last, ts))

    def observe_samples(self, nodes: Sequence[str], ts: np.ndarray) -> None:
        """Nodes seen at these times (telemetry): they accrue exposure."""
        self._samples(self.index.lookup(nodes), ts)

    def _samples(self, rows: np.ndarray, ts: np.ndarray) -> None:
        self._ensure()
        # keep the latest ts per node of this batch; np.maximum.at handles repeats
        latest = np.full(len(self.index), -np.inf)
        np.maximum.at(latest, rows, ts)
        uniq = np.unique(rows)
        self._advance(uniq, latest[uniq])

    def observe_events(self, nodes: list[str], ts: list[float], weights: list[float] | None = None) -> None:
        """Incidents (or failed jobs) on these nodes; events are rare, so a plain loop is fine."""
        rows = self.index.lookup(nodes).tolist()
        self._ensure()
        for i, (r, t) in enumerate(zip(rows, ts, strict=True)):
            self._advance(np.array([r]), np.array([t]))
            if t - self.last_event[r] >= self.cfg.episode_gap_s:
                self.events[r] += 1.0 if weights is None else weights[i]
            self.last_event[r] = max(self.last_event[r], t)

    def scores(self) -> tuple[list[str], np.ndarray, np.ndarray, float]:
        """(nodes, score in [0,1], decayed events, fleet rate per s)."""
        self._ensure()
        n = len(self.index)
        ev, ex = self.events[:n], self.exposure[:n]
        with np.errstate(divide="ignore", invalid="ignore"):
            rates = np.where(ex > 0, ev / ex, np.nan)
        fleet = 0.0
        finite = rates[np.isfinite(rates)]
        if len(finite):
            fleet = float(finite[finite <= np.quantile(finite, 0.98)].mean())
        fleet = max(fleet, self.cfg.floor_rate_per_s)
        mu = fleet * ex
        # P(X >= k) for a non-integer decayed k: use the survival function at ceil(k) - 1
        tail = poisson.sf(np.ceil(ev) - 1, mu)
        return self.index.names, 1.0 - tail, ev, fleet

    def judge(self, ts: float) -> list[dict[str, Any]]:
        nodes, score, ev, fleet = self.scores()
        out: list[dict[str, Any]] = []
        # Decay leaves 3 episodes a few minutes apart at 2.99: judge the count to the nearest event.
        lemon = (ev >= self.cfg.min_events - 0.5) & (score >= 1 - self.cfg.p_lemon)
        for i in np.flatnonzero(lemon):
            node = nodes[i]
            ratio = ev[i] / max(fleet * self.exposure[i], 1e-12)
            out.extend(
                self.book.observe(
                    node=node,
                    kind="lemon",
                    rule="poisson_rate",
                    ts=ts,
                    severity="warning",
                    score=round(float(score[i]), 6),
                    summary=(
                        f"{node} is a lemon candidate: {ev[i]:.1f} incidents (decayed) vs "
                        f"{fleet * self.exposure[i]:.2f} expected at the fleet rate ({ratio:.0f}x)"
                    ),
                    evidence={
                        "events": round(float(ev[i]), 3),
                        "expected": round(float(fleet * self.exposure[i]), 4),
                        "fleet_rate_per_day": round(fleet * 86400, 6),
                        "tail_p": float(1 - score[i]),
                        "tau_days": self.cfg.tau_s / 86400,
                    },
                    clear_after=self.cfg.clear_after_s,
                    next_ts=lambda _n, t: t,
                )
            )
        for key in list(self.book.open):
            done = self.book.expire(key, ts, lambda _n, t: t)
            if done is not None:
                out.append(done)
        return out

    def forget(self, gone: Forgotten, rows: Compaction | None) -> list[dict[str, Any]]:
        """Forgotten nodes (pipeline/node_stage.py): their lemon findings resolve, saying so, and
        their history goes (a node that comes back starts a new one); `rows` is the index's
        compaction."""
        out = self.book.forget(gone)
        if rows is None:
            return out
        self.events = rows.take(self.events, 0.0)
        self.exposure = rows.take(self.exposure, 0.0)
        self.last_ts = rows.take(self.last_ts, np.nan)
        self.last_event = rows.take(self.last_event, -np.inf)
        return out

    def to_state(self) -> dict[str, Any]:
        self._ensure()
        n = len(self.index)
        return {
            # the node rows' names, as the previous release reads them (the task's index)
            "nodes": list(self.index.names),
            "events": self.events[:n].tolist(),
            "exposure": self.exposure[:n].tolist(),
            "last_ts": [None if math.isnan(x) else x for x in self.last_ts[:n].tolist()],
            "last_event": [None if math.isinf(x) else x for x in self.last_event[:n].tolist()],
            "book": self.book.to_state(),
            "next_judgement": self.next_judgement,
        }

    @classmethod
    def from_state(
        cls, d: dict[str, Any], config: LemonConfig | None = None, index: NodeIndex | None = None
    ) -> LemonScorer:
        """History from the snapshot, configuration from `config` (the deployment's). A changed
        tau_s keeps the decayed events and exposure as they are and decays them at the new rate
        from the restore on; both fade alike, so their ratio (the node's rate) carries over, while
        the counts that min_events and the Poisson tail judge reach the new window's sizes within
        a few new taus. Node rows from `index` (the task's, restored; without one, the snapshot's)."""
        saved = d["nodes"]
        self = cls(config, NodeIndex(saved) if index is None else index)
        self._ensure()
        place = self.index.place
        place(saved, np.array(d["events"], dtype=np.float64), self.events)
        place(saved, np.array(d["exposure"], dtype=np.float64), self.exposure)
        last_ts = [np.nan if x is None else x for x in d["last_ts"]]  # JSON has no NaN or inf
        last_event = [-np.inf if x is None else x for x in d["last_event"]]
        place(saved, np.array(last_ts, dtype=np.float64), self.last_ts)
        place(saved, np.array(last_event, dtype=np.float64), self.last_event)
        self.book = IncidentBook.from_state(d["book"], self.cfg.clear_after_s)
        self.next_judgement = d.get("next_judgement", 0.0)  # older snapshots: the task's next_lemon
        return self
