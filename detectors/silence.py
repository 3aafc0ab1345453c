"""Nodes that stop reporting.

A node that crashes, hangs or loses its network sends nothing, so no rule on its telemetry
can fire. Time still moves on through the other nodes' samples: a node not heard from for more
than `silent_after_s` while its partition goes on is reported (kind host, critical), and the
finding resolves when the node reports again.

Silence is judged on a clock no node can move (issue 23, item 8: one node 55 s ahead had pulled
the partition's clock, and nodes reporting every second were reported silent). Where the broker's
append time is known (telemetry keeps LogAppendTime; the batch's `received`), the partition's clock
is the append time of its newest record and a node's "last heard" the append time of its latest
sample: a node's own clock, ahead or behind, moves neither. A stretch of more than silent_after_s
in which the partition received nothing from any node is the pipeline pausing (a broker outage,
the agents' spools sending afterwards), not a silence: every node is judged from the end of it
(`resumed`). So is a restore, since these broker times are not snapshotted: after one, a node
already silent is found up to silent_after_s later than it would have been (the open incidents
themselves are restored).

Samples sent faster than they were taken (the demo at --speed N, a recording replayed at N x) reach
the broker N times closer together than their own clock says: arrival_speed = N reads the broker's
spans as N times longer, so a 60 s outage sent in 6 s is still a silence of 60 s.

Where no broker time is known (`fleetwatch eval`, dicts in tests) the clock is the nodes' own,
taken robustly: the 90th percentile of their latest sample times, and never more than the second
newest (reference_time), so no single node can move it, in a partition of two or three nodes as
in one of a hundred. (A rack going quiet stays visible: up to 90% of the nodes can fall behind.)
A node's "last sample" in findings (evidence last_sample_ts, and so the finding's first_seen and
id) is always its event time (pipeline/node_stage.py), whichever clock found the silence.

A worker catching up on a backlog sees a silence and its end in one batch: the gaps inside the
batch are judged by the same rule, at the moment the node reported again, so a silence is found
(with the same finding id and times) however the stream was cut into batches.

A node that stays silent is forgotten after the node stage's forget_after_s (one day by default,
pipeline/node_stage.py): its silence then resolves with evidence `resolution: forgotten` and
`unseen_for_s`, and the node leaves the census, so act ends the page and no longer counts the
node in the fleet (nor resumes it if it had drained it). A node silent for longer than
forget_after_s is therefore no longer paged about; if it reports again it is a new node. Until
it is forgotten a departed node still counts among the nodes whose 90th percentile is the clock
without broker time: where more than a tenth of a partition's nodes have gone quiet for good
(heavy churn), that clock, and so every new silence, lags by up to about forget_after_s / 10 (the
forgetting itself runs on the clock of the nodes still reporting, which does not lag).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fleetwatch.config import knob
from fleetwatch.detectors.batch import TelemetryBatch
from fleetwatch.detectors.findings import Forgotten, IncidentBook
from fleetwatch.detectors.node_index import NodeIndex
from fleetwatch.detectors.protocol import NodeContext
from fleetwatch.detectors.rows import Compaction, grow


@dataclass(frozen=True)
class SilenceConfig:
    silent_after_s: float = knob(
        10.0, "seconds without a sample that make a node silent: 10 missed 1 s samples, past jitter", gt=0
    )
    min_nodes: int = knob(2, "nodes a partition needs: one node has no other clock to judge it by", ge=1)
    reference_percentile: float = knob(
        90.0, "the partition's clock: this percentile of its nodes' latest sample times", ge=0, le=100
    )
    arrival_speed: float = knob(
        1.0,
        "how many times faster than the nodes' own clocks their samples reach the broker: 1 live; "
        "N for a recording or simulation sent at N x (the demo's --speed). Spans on the broker's "
        "clock are read as N times longer",
        gt=0,
    )

    @property
    def silent_after_broker_s(self) -> float:
        """silent_after_s on the broker's clock."""
        return self.silent_after_s / self.arrival_speed


class SilenceDetector:
    def __init__(self, config: SilenceConfig | None = None, index: NodeIndex | None = None) -> None:
        # every node's latest event time is the index's, given with each batch; what this keeps is
        # the broker's side: each node's row -> the append time of its latest sample (NaN: not
        # heard since this task was made or restored), the partition's newest append time, and
        # when the partition last resumed after receiving nothing for silent_after_s (NaN: never)
        self.cfg = config or SilenceConfig()
        self.book = IncidentBook()
        self.heard = np.full(0, np.nan)
        self.clock = np.nan
        self.resumed = np.nan

    def observe(self, batch: TelemetryBatch, ctx: NodeContext) -> list[dict[str, Any]]:
        """The NodeDetector protocol (detectors/protocol.py): every node's latest sample and the
        batch's nodes' samples before it, from the task. On broker time where the batch has it."""
        if batch.size and bool(np.isfinite(batch.received).all()):
            return self._by_broker(batch, ctx)
        return self._on_node_clocks(
            ctx.index, ctx.seen, float(batch.ts.max()), batch=batch, prev_ts=ctx.prev_ts
        )

    # ------------------------------------------------------------ on the broker's clock

    def _by_broker(self, batch: TelemetryBatch, ctx: NodeContext) -> list[dict[str, Any]]:
        sa, speed = self.cfg.silent_after_broker_s, self.cfg.arrival_speed
        index = ctx.index
        self.heard = grow(self.heard, len(index), np.nan)
        resolved, out = self._resolve(index, ctx.seen, batch)
        rec = np.sort(batch.received)
        # Where the partition received nothing from anyone for more than silent_after_s (or where
        # this detector has no broker time yet: made or restored), every node starts afresh.
        before = self.clock if np.isfinite(self.clock) else -np.inf
        starts = rec[np.diff(rec, prepend=before) > sa]
        resumes = starts if np.isnan(self.resumed) else np.r_[self.resumed, starts]
        if len(index) >= self.cfg.min_nodes:
            # No gap can exceed the span from the earliest time a node of the batch is counted from
            # to the newest record here: the usual batch (a second or two of a live stream) stops.
            prev = self.heard[ctx.rows]
            lo = min(float(rec[0]), float(np.fmin.reduce(prev, initial=np.inf)))
            if len(resumes) and np.isnan(prev).any():
                lo = min(lo, float(resumes[0]))
            if float(rec[-1]) - lo > sa:
                out += self._gaps_by_broker(batch, ctx, resumes, resolved)
        np.fmax.at(self.heard, ctx.rows, batch.received)
        self.clock = float(np.fmax(self.clock, rec[-1]))
        if len(resumes):
            self.resumed = float(resumes[-1])
        if len(index) < self.cfg.min_nodes:
            return out
        n = len(index)
        quiet = self.clock - np.fmax(self.heard[:n], self.resumed)  # NaN: not judged (never heard)
        names, last = index.names, index.last_ts
        with np.errstate(invalid="ignore"):
            silent = np.flatnonzero(quiet > sa)
        for i in silent.tolist():
            if (names[i], None, None, "host", "silent") in self.book.open:
                continue  # one finding per silence; it resolves when the node reports again
            gap = float(quiet[i]) * speed  # in the nodes' seconds, as every other span of a finding
            out.extend(self._open(names[i], float(last[i]), f"no telemetry for {gap:.0f} s", round(gap, 1)))
        return out

    def _gaps_by_broker(
        self, batch: TelemetryBatch, ctx: NodeContext, resumes: np.ndarray, resolved: set[str]
    ) -> list[dict[str, Any]]:
        """Silences inside the batch on broker time: a node's samples (or its sample before the
        batch and its first in it) more than silent_after_s apart, counted from the later of its
        previous sample and the partition's last resumption before it came back."""
        sa, speed = self.cfg.silent_after_broker_s, self.cfg.arrival_speed
        order = np.lexsort((batch.received, ctx.rows))
        rows, rec, ts = ctx.rows[order], batch.received[order], batch.ts[order]
        first = np.r_[True, rows[1:] != rows[:-1]]
        prev_rec, prev_ts = np.empty(len(rec)), np.empty(len(ts))
        prev_rec[1:], prev_ts[1:] = rec[:-1], ts[:-1]
        prev_rec[first] = self.heard[rows[first]]
        prev_ts[first] = ctx.prev_ts[batch.node_idx[order][first]]  # NaN: a new node
        at = np.searchsorted(resumes, rec, side="right") - 1
        resumed = (
            np.where(at >= 0, resumes[np.maximum(at, 0)], -np.inf)
            if len(resumes)
            else np.full(len(rec), -np.inf)
        )
        since = np.maximum(np.nan_to_num(prev_rec, nan=-np.inf), resumed)
        with np.errstate(invalid="ignore"):
            cand = np.flatnonzero(~np.isnan(prev_ts) & (rec - since > sa))
        out: list[dict[str, Any]] = []
        names = ctx.index.names
        for c in cand.tolist():
            node = names[rows[c]]
            if first[c] and node in resolved:
                continue  # the silence already open before this batch, resolved above
            gap, back = float(rec[c] - since[c]) * speed, float(ts[c])
            out += self._open(
                node,
                float(prev_ts[c]),
                f"no telemetry for {gap:.0f} s (reported again at {back:.0f})",
                round(gap, 1),
            )
            inc = self.book.open.pop((node, None, None, "host", "silent"), None)
            if inc is not None:
                out.append(inc.finding(back, resolved=True))
        return out

    # ------------------------------------------------------------ on the nodes' clocks

    def _on_node_clocks(
        self,
        nodes: NodeIndex,
        seen: set[str],
        now: float,
        *,
        batch: TelemetryBatch | None = None,
        prev_ts: np.ndarray | None = None,
    ) -> list[dict[str, Any]]:
        """Judged on the nodes' own clocks (no broker time: reference_time). nodes: every node the
        task holds, with its latest sample time; seen: the nodes that reported in this batch. With
        the batch (its new samples) and prev_ts, each of batch.node_names' latest ts before it (NaN
        for a new node), silences that began and ended inside the batch are found too."""
        ts = nodes.last_ts
        resolved, out = self._resolve(nodes, seen, batch)
        if len(nodes) < self.cfg.min_nodes:
            return out
        if batch is not None and prev_ts is not None and batch.size:
            # No gap can exceed the span from the oldest previous sample to the newest one here:
            # the usual batch (a second or two of a live stream) stops at this test.
            lo = min(float(batch.ts.min()), float(np.fmin.reduce(prev_ts, initial=np.inf)))
            if float(batch.ts.max()) - lo > self.cfg.silent_after_s:
                out += self._backlog(nodes, batch, prev_ts, resolved)
        names = nodes.names
        now = min(now, reference_time(ts, self.cfg))
        for i in np.flatnonzero(now - ts > self.cfg.silent_after_s):
            node = names[i]
            gap = float(now - ts[i])
            if (node, None, None, "host", "silent") in self.book.open:
                continue  # one finding per silence; it resolves when the node reports again
            out.extend(self._open(node, float(ts[i]), f"no telemetry for {gap:.0f} s", round(gap, 1)))
        return out

    def _resolve(
        self, nodes: NodeIndex, seen: set[str], batch: TelemetryBatch | None
    ) -> tuple[set[str], list[dict[str, Any]]]:
        """The open silences of the nodes that reported: resolved at each one's first sample."""
        reporting = [k for k in self.book.open if k[0] in seen]
        first = _first_sample(batch) if reporting and batch is not None else {}
        out: list[dict[str, Any]] = []
        for key in reporting:
            inc = self.book.open.pop(key)
            back = first.get(key[0], float(nodes.last_ts[nodes.rows[key[0]]]))
            out.append(inc.finding(max(back, inc.last_bad), resolved=True))
        return {k[0] for k in reporting}, out

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
        reference clock (reference_time, of every node's latest sample before the node
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
                ref = refs[back] = reference_time(known, self.cfg)
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
        if rows is not None:
            self.heard = rows.take(self.heard, np.nan)
        return self.book.forget(gone)

    def to_state(self) -> list[dict[str, Any]]:
        # The open silences only, as before issue 23 (a rolling upgrade moves partitions either
        # way): the broker times start afresh on a restore (see the module's doc).
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
    """The partition's clock on its nodes' own clocks, to judge silences by where there is no
    broker time (and forgetting, pipeline/node_stage.py): the 90th percentile of the nodes' latest
    sample times, and at most the second newest of them, so that no single node, whatever its
    clock says, can move it forward, in a partition of two or three nodes as in a big one (the
    percentile alone is the newest time's to pull below 11 nodes). One node alone is its own clock.
    (A rack going quiet stays visible: up to 90% of the nodes can fall behind.)"""
    known = latest[~np.isnan(latest)]
    if len(known) < 2:
        return float(known[0]) if len(known) else -np.inf
    second = float(np.partition(known, len(known) - 2)[len(known) - 2])
    return min(float(np.percentile(known, cfg.reference_percentile)), second)


def _first_sample(batch: TelemetryBatch) -> dict[str, float]:
    """Each node's earliest sample time in the batch."""
    first = np.full(len(batch.node_names), np.inf)
    np.minimum.at(first, batch.node_idx, batch.ts)
    return dict(zip(batch.node_names, first.tolist(), strict=True))
