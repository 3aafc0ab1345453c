"""Statistical detector for gradual GPU degradation that no hardware rule names yet.

Training moves every GPU of a node together (startup, checkpoints, a new phase, a new job,
the node's own airflow), so a GPU's raw signal is mostly workload and place. The detector
therefore scores each GPU's signal RELATIVE TO ITS SIBLINGS in the same sample: the robust z
of the value against the median/MAD of the same signal over the node's GPUs, floored by a
per-signal resolution. That residual is stationary for a healthy GPU whatever the job does;
a GPU that runs hotter, clocks lower or draws differently than the GPUs beside it drifts
away from zero. (Comparing with the job's GPUs was tried first: a node changing jobs moved
all its residuals at once and read as drift.)

The residuals of every (node, GPU, signal) are fed to one vectorised `RobustScorer`
(detectors/statistical.py): an online baseline per series plus point and CUSUM drift
statistics, calibrated per signal to score = 1 - p (score >= 0.999 flags at most ~0.1% of
healthy points). One unusual point is not a finding: a series must stay at or above
`threshold`, and at least `min_peer_z` robust sigmas from its siblings, for
`persist_samples` consecutive samples, which turns the per-point rate into a
per-incident one. Findings are kind `statistical`, severity warning, and resolve after
`clear_after_s` below the threshold.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fleetwatch.config import knob
from fleetwatch.detectors.batch import GPU_COL, TelemetryBatch
from fleetwatch.detectors.counters import decode_array, encode_array
from fleetwatch.detectors.findings import Forgotten, IncidentBook, severity_score
from fleetwatch.detectors.node_index import NodeIndex
from fleetwatch.detectors.protocol import NodeContext
from fleetwatch.detectors.rows import Compaction
from fleetwatch.detectors.statistical import RobustScorer, sibling_robust_z

# signal -> resolution below which peers count as equal (no MAD = 0 blow-ups on quantised values)
SIGNALS: dict[str, float] = {"temp_c": 1.0, "power_w": 10.0, "sm_clock_mhz": 15.0}
_COLS = [GPU_COL[s] for s in SIGNALS]
_RES = np.array(list(SIGNALS.values()))
_PER_NODE = 8 * len(SIGNALS)  # series per node: 8 GPU slots x signals
_SERIES_STATE = ("n", "level", "scale", "cusum_pos", "cusum_neg")  # RobustScorer's per-series arrays


@dataclass(frozen=True)
class GpuStatsConfig:
    threshold: float = knob(
        0.999, "anomaly score (0-1) above which a GPU's sample is unusual for it", gt=0, le=1
    )
    persist_samples: int = knob(
        30, "unusual samples in a row before a finding: single spikes are normal", ge=1
    )
    clear_after_s: float = knob(
        60.0, "a GPU-statistics finding resolves after this many normal seconds", gt=0
    )
    min_peers: int = knob(6, "sibling GPUs with a value needed for a residual", ge=1)
    min_peer_z: float = knob(
        3.0, "and a flagged sample must be this many robust sigmas from its siblings (not node-wide)", ge=0
    )


def _rounds(rows: np.ndarray) -> np.ndarray:
    """Occurrence index of each message among its node's messages in the batch (0, 1, ...)."""
    order = np.argsort(rows, kind="stable")
    r = rows[order]
    starts = np.r_[0, np.flatnonzero(np.diff(r)) + 1]
    occ = np.empty(len(r), dtype=np.int64)
    occ[order] = np.arange(len(r)) - np.repeat(starts, np.diff(np.r_[starts, len(r)]))
    return occ


class GpuStats:
    def __init__(self, config: GpuStatsConfig | None = None, index: NodeIndex | None = None) -> None:
        self.cfg = config or GpuStatsConfig()
        self.index = NodeIndex() if index is None else index  # node rows (the task's, shared)
        self.cap = 0  # node rows the series arrays have room for (_PER_NODE series each)
        self.scorer = RobustScorer(0, groups=np.zeros(0, dtype=np.int64))
        self.run = np.zeros(0, dtype=np.int64)
        self.book = IncidentBook()
        self.last_score = np.zeros(0)
        self.last_value = np.zeros(0)

    # ------------------------------------------------------------ series layout

    def _series(self, node_rows: np.ndarray, g: int) -> np.ndarray:
        """Series ids (M, G, S): ((node * G + gpu) * S + signal), G fixed at 8 slots per node."""
        s = len(SIGNALS)
        gpu = np.arange(g)
        return (node_rows[:, None, None] * 8 + gpu[None, :, None]) * s + np.arange(s)[None, None, :]

    def _ensure(self, n_nodes: int) -> None:
        if n_nodes <= self.cap:
            return
        cap = max(64, self.cap * 2, n_nodes)
        if self.cap == 0:
            k = cap * _PER_NODE
            groups = np.tile(np.arange(len(SIGNALS), dtype=np.int64), cap * 8)
            self.scorer = RobustScorer(k, groups=groups, min_scale=1e-3)
            self.run = np.zeros(k, dtype=np.int64)
            self.last_score = np.full(k, np.nan)
            self.last_value = np.full(k, np.nan)
            self.cap = cap
        else:
            self._relayout(Compaction.keeping(self.cap, np.arange(self.cap)), cap)

    def _relayout(self, nodes: Compaction, cap: int) -> None:
        """Every per-series array with the node rows `nodes` keeps, in their new places, room for
        `cap` nodes; the calibration histograms (one per signal, fleet-wide) stay as they are."""
        kept = nodes.keep[nodes.keep < self.cap]  # rows past the arrays' end have no series yet
        series = Compaction.keeping(
            self.cap * _PER_NODE, (kept[:, None] * _PER_NODE + np.arange(_PER_NODE)).ravel()
        )
        k = cap * _PER_NODE
        self.scorer.relayout(series, np.tile(np.arange(len(SIGNALS), dtype=np.int64), cap * 8))
        self.run = series.take(self.run, 0, k)
        self.last_score = series.take(self.last_score, np.nan, k)
        self.last_value = series.take(self.last_value, np.nan, k)
        self.cap = cap

    def forget(self, gone: Forgotten, nodes: Compaction | None) -> list[dict[str, Any]]:
        """Forgotten nodes (pipeline/node_stage.py): their statistical findings resolve, saying so,
        and their series go (baselines, runs, latest values: what fleet_metrics exports); `nodes`
        is the index's compaction."""
        out = self.book.forget(gone)
        if nodes is None or self.cap == 0:
            return out
        # room for as many nodes until they are down to a quarter of it (Compaction.take)
        left = len(nodes.keep)
        self._relayout(nodes, self.cap if 4 * left > self.cap else max(64, 2 * left))
        return out

    # ------------------------------------------------------------ main entry

    def observe(self, batch: TelemetryBatch, ctx: NodeContext) -> list[dict[str, Any]]:
        """The NodeDetector protocol (detectors/protocol.py)."""
        return self._process(batch, ctx.rows, ctx.nodes)

    def _process(self, batch: TelemetryBatch, rows: np.ndarray, nodes: list[str]) -> list[dict[str, Any]]:
        """rows, nodes: each message's node row and name. Returns findings; `self.last_score`
        holds each series' latest score."""
        if batch.size == 0 or batch.gpu.shape[1] == 0:
            return []
        self._ensure(len(self.index))
        g = min(batch.gpu.shape[1], 8)
        values = batch.gpu[:, :g, :][:, :, _COLS]  # (M, G, S)
        series = self._series(rows, g)
        # each (message, gpu, signal) against the same sample's GPUs for that signal
        z_all = sibling_robust_z(values, min_peers=self.cfg.min_peers, min_scale=_RES)

        out: list[dict[str, Any]] = []
        occ = _rounds(rows)
        for r in range(int(occ.max()) + 1):
            m = np.flatnonzero(occ == r)
            v, z = values[m].ravel(), z_all[m].ravel()
            ids = series[m].ravel()
            sc = self.scorer.update_ids(ids, z)  # only this batch's series: O(batch), not O(cluster)
            # Unusual for this series AND clearly apart from its siblings now: an idle node's
            # residuals are so steady that a tiny shift scores high on its own scale.
            hot = (sc >= self.cfg.threshold) & (np.abs(z) >= self.cfg.min_peer_z)
            seen = ~np.isnan(sc)
            self.run[ids[seen & ~hot]] = 0
            self.run[ids[hot]] += 1
            self.last_score[ids[seen]] = sc[seen]
            has = ~np.isnan(v)
            self.last_value[ids[has]] = v[has]
            out += self._findings(batch, nodes, m, ids, sc, v, z, g)
        return out

    def _findings(
        self,
        batch: TelemetryBatch,
        nodes: list[str],
        m: np.ndarray,
        ids: np.ndarray,
        sc: np.ndarray,
        v: np.ndarray,
        z: np.ndarray,
        g: int,
    ) -> list[dict[str, Any]]:
        cfg, s = self.cfg, len(SIGNALS)
        out: list[dict[str, Any]] = []
        names = list(SIGNALS)
        for j in np.flatnonzero(self.run[ids] >= cfg.persist_samples):
            msg = int(m[j // (g * s)])
            gpu, sig = (j // s) % g, names[j % s]
            node, ts = nodes[msg], float(batch.ts[msg])
            out += self.book.observe(
                node=node,
                gpu=int(gpu),
                kind="statistical",
                rule=f"peer_drift:{sig}",
                ts=ts,
                severity="warning",
                score=severity_score("warning", 1.0),
                summary=(
                    f"{node} GPU{gpu}: {sig} {v[j]:.4g} drifts from its sibling GPUs (robust z {z[j]:+.1f}, "
                    f"anomaly score {sc[j]:.4f} for {int(self.run[ids[j]])} samples)"
                ),
                evidence={
                    "signal": sig,
                    "value": round(float(v[j]), 3),
                    "peer_z": round(float(z[j]), 3),
                    "anomaly_score": round(float(sc[j]), 6),
                    "threshold": cfg.threshold,
                    "samples_above": int(self.run[ids[j]]),
                },
                clear_after=cfg.clear_after_s,
                next_ts=lambda _n, t: t,
            )
        if self.book.open:
            now = float(batch.ts[m].max())
            for key in list(self.book.open):
                done = self.book.expire(key, now, lambda _n, t: t)
                if done is not None:
                    out.append(done)
        return out

    def latest(self) -> list[tuple[str, int, str, float, float]]:
        """(node, gpu, signal, latest value, latest score or NaN) of every series with a value."""
        s = len(SIGNALS)
        names, sigs = self.index.names, list(SIGNALS)
        n = len(names) * 8 * s
        ids = np.flatnonzero(~np.isnan(self.last_value[:n]))
        vals, scores = self.last_value[ids].tolist(), self.last_score[ids].tolist()
        return [
            (names[k // (8 * s)], (k // s) % 8, sigs[k % s], v, a)
            for k, v, a in zip(ids.tolist(), vals, scores, strict=True)
        ]

    # ------------------------------------------------------------ state

    def to_state(self) -> dict[str, Any]:
        n = len(self.index) * _PER_NODE  # rows past self.cap (never seen here) are left out
        st = self.scorer.to_state()
        series = {k: encode_array(st[k][:n]) for k in _SERIES_STATE}
        hists = {k: encode_array(st[k]) for k in ("hist_point", "hist_drift", "hist_fleet")}
        return {  # no "config": a restore takes it from the deployment (from_state)
            # the node rows' names, as the previous release reads them (the task's index)
            "nodes": list(self.index.names),
            "series": series,
            "hists": hists,
            "run": encode_array(self.run[:n]),
            "book": self.book.to_state(),
        }

    @classmethod
    def from_state(
        cls, d: dict[str, Any], config: GpuStatsConfig | None = None, index: NodeIndex | None = None
    ) -> GpuStats:
        """Baselines, runs and incidents from the snapshot; threshold, persistence and clear-after
        from `config`, the deployment's (an old snapshot's "config" is ignored); node rows from
        `index` (the task's, restored; without one, the snapshot's own). No state array is shaped
        by the config: a run already longer than a lowered persist_samples fires on the series'
        next flagged sample."""
        saved = d["nodes"]
        self = cls(config, NodeIndex(saved) if index is None else index)
        self._ensure(max(1, len(self.index)))

        def place(values: np.ndarray, into: np.ndarray) -> None:  # per node row: _PER_NODE series
            self.index.place(saved, values.reshape(-1, _PER_NODE), into.reshape(-1, _PER_NODE))

        st = self.scorer.to_state()
        for k, enc in d["series"].items():
            place(decode_array(enc), st[k])
        for k, enc in d["hists"].items():
            st[k] = decode_array(enc)
        self.scorer = RobustScorer.from_state(st)
        place(decode_array(d["run"]), self.run)
        self.book = IncidentBook.from_state(d["book"], self.cfg.clear_after_s)
        return self
