"""Nodes that stop reporting.

A node that crashes, hangs or loses its network sends nothing, so no rule on its telemetry
can fire. Time still moves on through the other nodes' samples (event time): a node whose
last sample is more than `silent_after_s` older than the newest samples of its partition is
reported (kind host, critical), and the finding resolves when the node reports again. "Newest"
is the 90th percentile of the nodes' latest sample times, so one node with a clock running ahead
cannot make the others look silent.

A worker catching up on a backlog sees a silence and its end in one batch: the gaps inside the
batch are judged by the same rule, at the moment the node reported again, so a silence is found
(with the same finding id and times) however the stream was cut into batches.

A node that stays silent is forgotten after the node stage's forget_after_s (one day by default,
pipeline/node_stage.py): its silence then resolves with evidence `resolution: forgotten` and
`unseen_for_s`, and the node leaves the census, so act ends the page and no longer counts the
node in the fleet (nor resumes it if it had drained it). A node silent for longer than
forget_after_s is therefore no longer paged about; if it reports again it is a new node. Until
it is forgotten a departed node still counts among the nodes whose 90th percentile is the clock:
where more than a tenth of a partition's nodes have gone quiet for good (heavy churn), the clock,
and so every new silence, lags by up to about forget_after_s / 10 (the forgetting itself runs on
the clock of the nodes still reporting, which does not lag).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fleetwatch.detectors.batch import TelemetryBatch
from fleetwatch.detectors.findings import Forgotten, IncidentBook
from fleetwatch.detectors.node_index import NodeIndex
from fleetwatch.detectors.protocol import NodeContext
from fleetwatch.detectors.rows import Compaction


@dataclass(frozen=True)
class SilenceConfig:
    silent_after_s: float = 10.0  # 10 missed 1 s samples; well past scheduling jitter of an agent
    min_nodes: int = 2  # a partition with one node has no other clock to judge it by
    reference_percentile: float = 90.0


class SilenceDetector:
    def __init__(self, config: SilenceConfig | None = None, index: NodeIndex | None = None) -> None:
        # no per-node state of its own: every node's latest ts is the index's, given with each batch
        self.cfg = config or SilenceConfig()
        self.book = IncidentBook()

    def observe(self, batch: TelemetryBatch, ctx: NodeContext) -> list[dict[str, Any]]:
        """The NodeDetector protocol (detectors/protocol.py): every node's latest sample and the
        batch's nodes' samples before it, from the task."""
        return self.process(ctx.index, ctx.seen, float(batch.ts.max()), batch=batch, prev_ts=ctx.prev_ts)

    def process(
        self,
        nodes: NodeIndex,
        seen: set[str],
        now: float,
        *,
        batch: TelemetryBatch | None = None,
        prev_ts: np.ndarray | None = None,
    ) -> list[dict[str, Any]]:
        """nodes: every node the task holds, with its latest sample time; seen: the nodes that
        reported in this batch. With the batch (its new samples) and prev_ts, each of
        batch.node_names' latest ts before it (NaN for a new node), silences that began and ended
        inside the batch are found too."""
        out: list[dict[str, Any]] = []
        ts = nodes.last_ts
        reporting = [k for k in self.book.open if k[0] in seen]
        first = _first_sample(batch) if reporting and batch is not None else {}
        for key in reporting:
            inc = self.book.open.pop(key)
            # the node's first sample after the silence
            back = first.get(key[0], float(ts[nodes.rows[key[0]]]))
            out.append(inc.finding(max(back, inc.last_bad), resolved=True))
        if len(nodes) < self.cfg.min_nodes:
            return out
        if batch is not None and prev_ts is not None and batch.size:
            # No gap can exceed the span from the oldest previous sample to the newest one here:
            # the usual batch (a second or two of a live stream) stops at this test.
            lo = min(float(batch.ts.min()), float(np.fmin.reduce(prev_ts, initial=np.inf)))
            if float(batch.ts.max()) - lo > self.cfg.silent_after_s:
                out += self._backlog(nodes, batch, prev_ts, {k[0] for k in reporting})
        names = nodes.names
        now = min(now, reference_time(ts, self.cfg))
        for i in np.flatnonzero(now - ts > self.cfg.silent_after_s):
            node = names[i]
            gap = float(now - ts[i])
            if (node, None, None, "host", "silent") in self.book.open:
                continue  # one finding per silence; it resolves when the node reports again
            out.extend(self._open(node, float(ts[i]), f"no telemetry for {gap:.0f} s", round(gap, 1)))
        return out

    def _open(self, node: str, last: float, what: str, silent_for: float) -> list[dict[str, Any]]:
        return self.book.observe(
            node=node,
            kind="host",
            rule="silent",
            ts=last + self.cfg.silent_after_s,
            severity="critical",
            score=0.9,
            summary=f"{node} stopped reporting: {what}",
            evidence={"last_sample_ts": last, "silent_for_s": silent_for},
            clear_after=self.cfg.silent_after_s,
            next_ts=lambda _n, _t: None,
        )

    def _backlog(
        self, nodes: NodeIndex, batch: TelemetryBatch, before_batch: np.ndarray, resolved: set[str]
    ) -> list[dict[str, Any]]:
        """Silences inside the batch: a node's gap between two of its samples (or from its sample
        before the batch to its first in it) longer than silent_after_s, at a time when the
        reference clock (the same 90th percentile, of every node's latest sample before the node
        reported again) had moved on by that much. Gaps are rare; only they cost more than a sort."""
        sa = self.cfg.silent_after_s
        uniq = batch.node_names
        order = np.lexsort((batch.ts, batch.node_idx))
        si, st = batch.node_idx[order], batch.ts[order]
        start = np.r_[True, si[1:] != si[:-1]]
        starts = np.flatnonzero(start)
        prev = np.empty(len(st))
        prev[1:] = st[:-1]
        prev[starts] = before_batch[si[starts]]
        with np.errstate(invalid="ignore"):
            cand = np.flatnonzero(st - prev > sa)
        if len(cand) == 0:
            return []
        elsewhere = np.ones(len(nodes), dtype=bool)
        elsewhere[[nodes.rows[n] for n in uniq]] = False
        others = nodes.last_ts[elsewhere]  # the latest sample of every node not in the batch
        floor = np.nan_to_num(before_batch, nan=-np.inf)
        refs: dict[float, float] = {}  # reference clock by return time (a paused fleet returns at once)
        out: list[dict[str, Any]] = []
        for c in cand.tolist():
            node, p, back = uniq[si[c]], float(prev[c]), float(st[c])
            if start[c] and node in resolved:
                continue  # the silence already open before this batch, resolved above
            ref = refs.get(back)
            if ref is None:
                latest = np.maximum(np.maximum.reduceat(np.where(st < back, st, -np.inf), starts), floor)
                known = np.r_[latest[np.isfinite(latest)], others]
                ref = refs[back] = float(np.percentile(known, self.cfg.reference_percentile))
            if ref - p <= sa:
                continue  # the whole partition paused: not this node's silence
            gap = back - p
            out += self._open(
                node, p, f"no telemetry for {gap:.0f} s (reported again at {back:.0f})", round(gap, 1)
            )
            inc = self.book.open.pop((node, None, None, "host", "silent"), None)
            if inc is not None:
                out.append(inc.finding(back, resolved=True))
        return out

    def forget(self, gone: Forgotten, rows: Compaction | None) -> list[dict[str, Any]]:
        """Forgotten nodes (pipeline/node_stage.py): their silences resolve, saying so. A node
        silent for longer than the task's forget_after_s is no longer paged about."""
        return self.book.forget(gone)

    def to_state(self) -> list[dict[str, Any]]:
        return self.book.to_state()

    @classmethod
    def from_state(
        cls, items: list[dict[str, Any]], config: SilenceConfig | None = None, index: NodeIndex | None = None
    ) -> SilenceDetector:
        self = cls(config, index)
        # the open silences only; a restored incident's clear-after is this deployment's, like a new one's
        self.book = IncidentBook.from_state(items, self.cfg.silent_after_s)
        return self


def reference_time(latest: np.ndarray, cfg: SilenceConfig) -> float:
    """The partition's clock to judge silences (and forgetting, pipeline/node_stage.py) by: the
    90th percentile of the nodes' latest sample times, not the newest one, so a single node whose
    clock runs ahead cannot make every other node silent. (A rack going quiet stays visible: up
    to 90% of the nodes can fall behind.)"""
    return float(np.percentile(latest, cfg.reference_percentile))


def _first_sample(batch: TelemetryBatch) -> dict[str, float]:
    """Each node's earliest sample time in the batch."""
    first = np.full(len(batch.node_names), np.inf)
    np.minimum.at(first, batch.node_idx, batch.ts)
    return dict(zip(batch.node_names, first.tolist(), strict=True))
