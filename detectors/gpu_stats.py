"""Statistical detector for gradual GPU degradation that no hardware rule names yet.

Training moves every GPU of a node together (startup, checkpoints, a new phase, a new job,
the node's own airflow), so a GPU's raw signal is mostly workload and place. The detector
therefore scores each GPU's signal RELATIVE TO ITS SIBLINGS in the same sample: the robust z
of the value against the median/MAD of the same signal over the node's GPUs, floored by a
per-signal resolution. That residual is stationary for a healthy GPU whatever the job does;
a GPU that runs hotter, clocks lower or draws differently than the GPUs beside it drifts
away from zero. (Comparing with the job's GPUs was tried first: a node changing jobs moved
all its residuals at once and read as drift.)

Each GPU's residuals (temperature, power, clock) are one group of the multivariate scorer
(detectors/multivariate.py), the code the real-data benchmarks judge (benchmarks/asd_eval.py,
smd_eval.py): per signal a baseline remembering about a day of samples, point, 3-sample, drift,
relation and step statistics (a GPU hotter than its siblings without drawing more power than
they do breaks the relation its residuals usually keep), calibrated fleet-wide per signal (one
pool) into one p per GPU sample, and one p per signal (its own statistics'). A GPU sample is
unusual when either is at or below 1 - `threshold` (each at most ~0.1% of healthy samples). One
unusual sample is not a finding: a GPU must stay unusual, with at least one signal `min_peer_z`
robust sigmas from its siblings, for `persist_samples` consecutive samples, which turns the
per-sample rate into a per-incident one. The finding
names the signal that was strongest when the run began. Findings are kind `statistical`,
severity warning, and resolve after `clear_after_s` below the threshold.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fleetwatch.config import knob
from fleetwatch.detectors.batch import GPU_COL, TelemetryBatch
from fleetwatch.detectors.counters import decode_array, encode_array
from fleetwatch.detectors.findings import Forgotten, IncidentBook, severity_score
from fleetwatch.detectors.multivariate import (
    STAT_NAMES,
    MultivariateParams,
    MultivariateScorer,
    bonferroni_metric_p,
)
from fleetwatch.detectors.node_index import NodeIndex
from fleetwatch.detectors.protocol import NodeContext
from fleetwatch.detectors.rows import Compaction
from fleetwatch.detectors.statistical import sibling_robust_z

# signal -> resolution below which peers count as equal (no MAD = 0 blow-ups on quantised values)
SIGNALS: dict[str, float] = {"temp_c": 1.0, "power_w": 10.0, "sm_clock_mhz": 15.0}
_COLS = [GPU_COL[s] for s in SIGNALS]
_RES = np.array(list(SIGNALS.values()))
_S = len(SIGNALS)
_PER_NODE = 8 * _S  # series per node: 8 GPU slots x signals
_GROUP_STATE = (
    "count", "level", "scale", "cusum_pos", "cusum_neg", "z1", "z2", "complete", "mean", "cov", "prec",
    "warm",  # absent when no GPU is warming up, and from an earlier release's snapshot (running estimates)
)  # fmt: skip
STATE_VERSION = 2  # 2: the multivariate scorer's groups (one per GPU); 1: RobustScorer's series


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
    sample_interval_s: float = knob(
        1.0,
        "seconds between a node's samples (the agent's --interval): the baseline remembers a day of them",
        gt=0,
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
        self.cap = 0  # node rows the arrays have room for (8 GPU groups, _PER_NODE series each)
        self.scorer = self._scorer()
        self.run = np.zeros(0, dtype=np.int64)  # per GPU: flagged samples in a row
        self.run_signal = np.zeros(0, dtype=np.int64)  # per GPU: the strongest signal when the run began
        self.book = IncidentBook()
        self.last_score = np.zeros(0)  # per series
        self.last_value = np.zeros(0)

    def _scorer(self) -> MultivariateScorer:
        params = MultivariateParams.for_interval(self.cfg.sample_interval_s)
        return MultivariateScorer(_S, floor=1e-3, params=params)  # residuals are in robust sigmas

    # ------------------------------------------------------------ layout

    def _ensure(self, n_nodes: int) -> None:
        if n_nodes <= self.cap:
            return
        cap = max(64, self.cap * 2, n_nodes)
        self._relayout(Compaction.keeping(self.cap, np.arange(self.cap)), cap)

    def _relayout(self, nodes: Compaction, cap: int) -> None:
        """Every per-GPU and per-series array with the node rows `nodes` keeps, in their new
        places, room for `cap` nodes; the calibration histograms (fleet-wide) stay as they are."""
        kept = nodes.keep[nodes.keep < self.cap]  # rows past the arrays' end have no GPUs yet
        gpus = Compaction.keeping(self.cap * 8, (kept[:, None] * 8 + np.arange(8)).ravel())
        series = Compaction.keeping(
            self.cap * _PER_NODE, (kept[:, None] * _PER_NODE + np.arange(_PER_NODE)).ravel()
        )
        self.scorer.relayout(gpus, cap * 8, np.zeros(cap * 8, dtype=np.int64))
        self.run = gpus.take(self.run, 0, cap * 8)
        self.run_signal = gpus.take(self.run_signal, 0, cap * 8)
        self.last_score = series.take(self.last_score, np.nan, cap * _PER_NODE)
        self.last_value = series.take(self.last_value, np.nan, cap * _PER_NODE)
        self.cap = cap

    def forget(self, gone: Forgotten, nodes: Compaction | None) -> list[dict[str, Any]]:
        """Forgotten nodes (pipeline/node_stage.py): their statistical findings resolve, saying so,
        and their state goes (baselines, runs, latest values: what fleet_metrics exports); `nodes`
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
        gpus = rows[:, None] * 8 + np.arange(g)[None, :]  # (M, G) each sample's GPU groups
        # each (message, gpu, signal) against the same sample's GPUs for that signal
        z_all = sibling_robust_z(values, min_peers=self.cfg.min_peers, min_scale=_RES)

        out: list[dict[str, Any]] = []
        occ = _rounds(rows)
        for r in range(int(occ.max()) + 1):  # each node at most once per round: a GPU's order kept
            m = np.flatnonzero(occ == r)
            grp, z = gpus[m].ravel(), z_all[m].reshape(-1, _S)
            v = values[m].reshape(-1, _S)
            sc = self.scorer.update(grp, z)  # only this batch's GPUs: O(batch), not O(cluster)
            signal, stat = sc.strongest()
            # each signal's own p, what the per-series scorer before it judged each series by: the
            # smallest of its statistics' times their number. Not the scorer's calibrated metric p:
            # in a fleet's pool, a GPU that keeps heating fills the top of its signal's row with its
            # own past samples, and that count, not the heat, sets its p (found at 0.999 no more)
            per_signal = bonferroni_metric_p(sc.stat_p)
            # a GPU's sample is unusual when the whole of it is (the combined p: relations, several
            # signals at once) or one of its signals is on its own, each at the threshold: every
            # series keeps the per-series false-alarm rate it had, and the combination adds what
            # no series shows alone. (The combined p alone pays for its breadth: in a young fleet
            # whose calibration holds a few thousand samples, a GPU heating at 0.15 C/s reached it
            # too rarely to stay flagged for persist_samples in a row.)
            p = np.fmin(sc.p, np.fmin.reduce(per_signal, axis=1))  # NaN only where both are
            lone = per_signal <= 1.0 - self.cfg.threshold
            signal = np.where(lone.any(axis=1), np.argmin(np.nan_to_num(per_signal, nan=2.0), axis=1), signal)
            # Unusual for this GPU AND clearly apart from its siblings now: an idle node's
            # residuals are so steady that a tiny shift scores high on its own scale.
            apart = np.abs(np.nan_to_num(z)).max(axis=1) >= self.cfg.min_peer_z
            hot = (p <= 1.0 - self.cfg.threshold) & apart
            seen = ~np.isnan(p)
            self.run[grp[seen & ~hot]] = 0
            starting = hot & (self.run[grp] == 0)
            self.run_signal[grp[starting]] = np.maximum(signal[starting], 0)
            self.run[grp[hot]] += 1
            # the gauge: each series' own score
            ids = (grp[:, None] * _S + np.arange(_S)[None, :]).ravel()
            s_flat = 1.0 - per_signal.ravel()
            has_s = ~np.isnan(s_flat)
            self.last_score[ids[has_s]] = s_flat[has_s]
            v_flat = v.ravel()
            has = ~np.isnan(v_flat)
            self.last_value[ids[has]] = v_flat[has]
            out += self._findings(batch, nodes, m, grp, p, stat, v, z, g)
        return out

    def _findings(
        self,
        batch: TelemetryBatch,
        nodes: list[str],
        m: np.ndarray,
        grp: np.ndarray,
        p: np.ndarray,
        stat: np.ndarray,
        v: np.ndarray,
        z: np.ndarray,
        g: int,
    ) -> list[dict[str, Any]]:
        cfg = self.cfg
        out: list[dict[str, Any]] = []
        names = list(SIGNALS)
        for j in np.flatnonzero(self.run[grp] >= cfg.persist_samples):
            msg = int(m[j // g])
            gpu, k = j % g, int(self.run_signal[grp[j]])
            sig = names[k]
            node, ts = nodes[msg], float(batch.ts[msg])
            score = 1.0 - float(p[j])
            out += self.book.observe(
                node=node,
                gpu=int(gpu),
                kind="statistical",
                rule=f"peer_drift:{sig}",
                ts=ts,
                severity="warning",
                score=severity_score("warning", 1.0),
                summary=(
                    f"{node} GPU{gpu}: {sig} {v[j, k]:.4g} drifts from its sibling GPUs "
                    f"(robust z {z[j, k]:+.1f}, "
                    f"anomaly score {score:.4f} for {int(self.run[grp[j]])} samples)"
                ),
                evidence={
                    "signal": sig,
                    "value": round(float(v[j, k]), 3),
                    "peer_z": round(float(z[j, k]), 3),
                    "anomaly_score": round(score, 6),
                    "p_value": float(f"{float(p[j]):.3g}"),
                    "statistic": STAT_NAMES[int(stat[j])] if stat[j] >= 0 else None,
                    "threshold": cfg.threshold,
                    "samples_above": int(self.run[grp[j]]),
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
        n = len(self.index)  # rows past self.cap (never seen here) are left out
        st = self.scorer.to_state()
        return {  # no "config": a restore takes it from the deployment (from_state)
            "version": STATE_VERSION,
            # the node rows' names, as the previous release reads them (the task's index)
            "nodes": list(self.index.names),
            # the warm-up values only while some GPU is warming up (NaN otherwise: 640 B a GPU)
            "groups": {
                k: encode_array(st[k][: n * 8])
                for k in _GROUP_STATE
                if k != "warm" or not np.isnan(st[k][: n * 8]).all()
            },
            "hists": {k: encode_array(st[k]) for k in ("hist", "comb")},
            "run": encode_array(self.run[: n * 8]),
            "run_signal": encode_array(self.run_signal[: n * 8]),
            "book": self.book.to_state(),
        }

    @classmethod
    def from_state(
        cls, d: dict[str, Any], config: GpuStatsConfig | None = None, index: NodeIndex | None = None
    ) -> GpuStats:
        """Baselines, runs and incidents from the snapshot; threshold, persistence, clear-after and
        the sample interval from `config`, the deployment's (an old snapshot's "config" is
        ignored); node rows from `index` (the task's, restored; without one, the snapshot's own).
        A snapshot of the per-series scorer (version 1, before the multivariate one) keeps its
        incidents; its baselines are learnt again (a day's memory fills from the next samples)."""
        saved = d["nodes"]
        self = cls(config, NodeIndex(saved) if index is None else index)
        self._ensure(max(1, len(self.index)))
        self.book = IncidentBook.from_state(d["book"], self.cfg.clear_after_s)
        if d.get("version", 1) < 2:
            return self

        def place(values: np.ndarray, into: np.ndarray) -> None:  # per node row: 8 GPU groups
            self.index.place(
                saved, values.reshape(-1, 8, *values.shape[1:]), into.reshape(-1, 8, *into.shape[1:])
            )

        st = self.scorer.to_state()
        for k, enc in d["groups"].items():
            values = decode_array(enc)
            if k == "warm" and values.shape[1:] != st[k].shape[1:]:
                continue  # another warm-up length: those GPUs keep their running estimates
            place(values, st[k])
        for k, enc in d["hists"].items():
            st[k] = decode_array(enc)
        self.scorer = MultivariateScorer.from_state(st, self.scorer.params)
        place(decode_array(d["run"]), self.run)
        place(decode_array(d["run_signal"]), self.run_signal)
        return self
