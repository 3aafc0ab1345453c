"""Online statistical detectors for gradual degradation and unknown anomalies.

One ``RobustScorer`` holds K parallel series (in production K = nodes x GPUs x signals, e.g.
16,384 x 8 x 8 = 1M) as numpy arrays of shape (K,) and is fed one tick at a time: ``update(x)``
with ``x`` of shape (K,), NaN = missing (no update, no score for that series).

Per series (one compiled pass over the series of a tick or batch, detectors/stat_kernels.py):
- *baseline*: an EWMA of the level (``alpha``) and an EW mean absolute deviation as the scale
  (``beta``); the first ``warmup`` samples only build the baseline (plain running mean / mean
  absolute deviation, no score).
- *poisoning guard*: the update uses the deviation clipped to ``clip`` scales, so a spike moves
  the baseline by at most ``alpha * clip`` scales and a level shift is absorbed gradually (over
  ~``1 / alpha`` ticks) instead of at once; it stays flagged meanwhile.
- *point statistic*: ``|z|``, ``z = (x - level) / max(scale, min_scale)``.
- *drift statistic* (gradual degradation): a two-sided CUSUM (vectorised Page-Hinkley) of the
  clipped ``z`` with allowance ``cusum_k``: it grows on a sustained one-sided deviation such as a
  ramp or a small shift that a point test misses, and a single spike adds at most ``clip``.
  river's ADWIN/PageHinkley are per-value Python calls (~µs each) and do not belong in a loop
  over 1M series; this CUSUM is the same idea in a few operations per value.
- *fleet statistic* (optional, ``peer_groups``): robust z of the value against the median/MAD of
  its peers at the same tick (e.g. all GPUs' power draw within one job): a GPU unlike its peers
  right now, whatever its own history says. ``fleet_robust_z`` does this for any grouping.

Meaning of the scores (see ``detectors.calibration`` for the full statement)
-------------------------------------------------------------------------
Every statistic is calibrated online in its calibration group (``groups``: one per series by
default, one per metric for a large fleet) to ``score = 1 - p`` where ``p`` is a conformal tail
probability of the statistic against that group's own past. If the statistic is stationary,
``P(score >= t) <= 1 - t``: a threshold of 0.999 flags at most ~0.1 % of healthy points, 0.99 at
most ~1 %. The combined ``score`` is ``1 - min(1, m * min_i p_i)`` over the m statistics present
(Bonferroni), so the same bound holds for it: ``score >= t`` still means at most ``1 - t`` false
alarms per healthy point. Alarms of the drift statistic come in runs (it is autocorrelated); the
rate is per point, not per incident. NaN = no score (missing value, warm-up, or calibration
history below ``min_weight``).

Multivariate (a node, or an ASD machine with 19 metrics): ``NodeCombiner`` turns per-metric
scores into one statistic (Fisher: ``-2 sum ln p``; or Tippett: ``-ln min p``) and calibrates that
statistic the same way, so a node score keeps the same false-alarm meaning.

Memory: 5 float64 + 2 int64 per series (56 B), plus ``(bins + 2) * 8`` B per calibration group and
statistic. With one group per metric that is ~450 B per GPU at 8 signals (``nbytes()``).

``UnivariateScorer`` is the same algorithm for one series in plain Python floats (numpy's
per-call overhead would dominate a K = 1 loop); the tests check both give the same scores.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

import numpy as np

from fleetwatch.detectors.calibration import (
    DEFAULT_BINS,
    DEFAULT_HI,
    DEFAULT_LO,
    ScalarTailCalibrator,
    TailCalibrator,
)
from fleetwatch.detectors.rows import Compaction
from fleetwatch.detectors.stat_kernels import MAD_TO_SIGMA, indexed_values, robust_pass, sibling_z_pass

NAN = math.nan

# Parameters that go into the snapshot as 0-d arrays (name -> constructor argument).
_PARAMS = (
    "alpha",
    "beta",
    "warmup",
    "clip",
    "cusum_k",
    "halflife",
    "min_weight",
    "bins",
    "lo",
    "hi",
    "min_peers",
)


@dataclass(slots=True)
class ScoreBreakdown:
    """One tick's scores, all (K,) and NaN where not available."""

    score: np.ndarray  # combined, calibrated [0, 1]
    point: np.ndarray  # calibrated |z| against the series' own baseline
    drift: np.ndarray  # calibrated CUSUM
    fleet: np.ndarray  # calibrated robust z against peers at this tick
    z: np.ndarray  # signed deviation from the baseline in scale units (for evidence)


def group_medians(values: np.ndarray, starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Median of each run ``values[starts[i] : starts[i] + counts[i]]`` of a sorted array."""
    lo = values[starts + (counts - 1) // 2]
    hi = values[starts + counts // 2]
    return 0.5 * (lo + hi)


def fleet_robust_z(
    x: np.ndarray, peer_groups: np.ndarray, *, min_peers: int = 5, min_scale: float | np.ndarray = 0.0
) -> np.ndarray:
    """Robust z of every value against its peer group at this tick: ``(x - median) / (1.4826 MAD)``.

    ``peer_groups`` (K,) ints; NaN values take no part. Groups with fewer than ``min_peers``
    present values give NaN (a median of three says little). ``min_scale`` (scalar or (K,))
    floors the scale: when most peers read exactly the same (100 % utilisation) the MAD is 0 and
    any difference would be infinitely unusual. O(K log K) via two sorts.
    """
    out = np.full(x.shape, NAN)
    idx = np.flatnonzero(~np.isnan(x))
    if idx.size == 0:
        return out
    g, v = peer_groups[idx], x[idx]
    order = np.lexsort((v, g))
    gs, vs, idx = g[order], v[order], idx[order]
    _, starts, counts = np.unique(gs, return_index=True, return_counts=True)
    med = np.repeat(group_medians(vs, starts, counts), counts)
    dev = np.abs(vs - med)
    mad = np.repeat(group_medians(dev[np.lexsort((dev, gs))], starts, counts), counts)
    floor = min_scale[idx] if isinstance(min_scale, np.ndarray) else min_scale
    scale = np.maximum(MAD_TO_SIGMA * mad, floor)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        z = np.where(dev > 0, (vs - med) / scale, 0.0)
    z[np.repeat(counts < min_peers, counts)] = NAN
    out[idx] = z
    return out


def sibling_robust_z(x: np.ndarray, *, min_peers: int = 5, min_scale: float | np.ndarray = 0.0) -> np.ndarray:
    """fleet_robust_z for the dense layout where each row's peers sit along axis 1: ``x`` (M, G, S),
    the peer group of ``x[m, :, s]`` is that row's G values of signal s (a sample's sibling GPUs).
    ``min_scale`` broadcasts against (M, G, S). The same numbers as fleet_robust_z with those
    groups, without its two global sorts: each small group is sorted on its own, in compiled
    code (detectors/stat_kernels.py)."""
    x = np.asarray(x, dtype=np.float64)
    out = np.empty(x.shape)
    floor = np.broadcast_to(np.asarray(min_scale, dtype=np.float64), x.shape)
    sibling_z_pass(x, floor, min_peers, out)
    return out


def _combine(*scores: np.ndarray) -> np.ndarray:
    """Bonferroni combination of calibrated scores: ``1 - min(1, m * min p)`` over non-NaN."""
    s = np.vstack(scores)
    m = np.sum(~np.isnan(s), axis=0)
    best = np.max(np.where(np.isnan(s), 0.0, s), axis=0)
    p = np.minimum(1.0, m * (1.0 - best))
    return np.where(m > 0, 1.0 - p, NAN)


class RobustScorer:
    """Vectorised online robust scorer over K series (see module docstring)."""

    def __init__(
        self,
        k: int,
        *,
        groups: np.ndarray | None = None,
        peer_groups: np.ndarray | None = None,
        alpha: float = 0.02,
        beta: float = 0.02,
        warmup: int = 20,
        clip: float = 3.0,
        min_scale: float | np.ndarray = 1e-9,
        cusum_k: float = 1.0,
        halflife: float = 10_000.0,
        min_weight: float = 30.0,
        bins: int = DEFAULT_BINS,
        lo: float = DEFAULT_LO,
        hi: float = DEFAULT_HI,
        min_peers: int = 5,
    ) -> None:
        """
        k: number of series. groups: (K,) calibration group per series (default: one per series;
        pass metric ids for a big fleet). peer_groups: (K,) peer group per series for the fleet
        statistic (default: none). alpha/beta: EW rates of level/scale (~1/alpha ticks memory).
        warmup: samples before the first score. clip: poisoning guard in scales. min_scale:
        floor of the scale (scalar or (K,)), e.g. the resolution of a quantised metric.
        cusum_k: CUSUM allowance in scales. halflife/min_weight/bins/lo/hi: calibration (ticks of
        memory; history needed before scoring; histogram of ln statistic). min_peers: fleet.
        """
        self.k = int(k)
        self.alpha, self.beta, self.clip, self.cusum_k = (
            float(alpha),
            float(beta),
            float(clip),
            float(cusum_k),
        )
        self.warmup = int(warmup)
        self.halflife, self.min_weight = float(halflife), float(min_weight)
        self.bins, self.lo, self.hi, self.min_peers = int(bins), float(lo), float(hi), int(min_peers)
        self.groups = self._ids(groups, "groups")
        self.peer_groups = None if peer_groups is None else self._ids(peer_groups, "peer_groups")
        self.min_scale = (
            np.asarray(min_scale, dtype=np.float64).copy() if np.ndim(min_scale) else float(min_scale)
        )
        self.n = np.zeros(self.k, dtype=np.int64)
        self.level = np.zeros(self.k)
        self.scale = np.zeros(self.k)
        self.cusum_pos = np.zeros(self.k)
        self.cusum_neg = np.zeros(self.k)
        n_groups = int(self.groups.max()) + 1 if self.k else 1
        cal = {"bins": bins, "lo": lo, "hi": hi, "halflife": halflife, "min_weight": min_weight}
        self.cal_point = TailCalibrator(n_groups, **cal)
        self.cal_drift = TailCalibrator(n_groups, **cal)
        self.cal_fleet = TailCalibrator(n_groups, **cal)

    def _ids(self, ids: np.ndarray | None, name: str) -> np.ndarray:
        if ids is None:
            return np.arange(self.k, dtype=np.int64)
        a = np.asarray(ids, dtype=np.int64)
        if a.shape != (self.k,) or (a.size and a.min() < 0):
            raise ValueError(f"{name} must be {self.k} non-negative ints")
        return a.copy()

    # -- the tick ---------------------------------------------------------------------------
    def update(self, x: np.ndarray) -> np.ndarray:
        """Feed one tick (K,) (NaN = missing); returns the combined score (K,) in [0, 1] or NaN."""
        return self.update_detailed(x).score

    def update_detailed(self, x: np.ndarray) -> ScoreBreakdown:
        x = np.asarray(x, dtype=np.float64)
        if x.shape != (self.k,):
            raise ValueError(f"expected shape ({self.k},), got {x.shape}")
        fleet = np.full(self.k, NAN)
        if self.peer_groups is not None:
            zf = fleet_robust_z(x, self.peer_groups, min_peers=self.min_peers, min_scale=self.min_scale)
            df = np.abs(zf)
            fleet = self.cal_fleet.score_add(self.groups, df)
        ids = np.flatnonzero(~np.isnan(x))
        z, point, drift = np.full(self.k, NAN), np.full(self.k, NAN), np.full(self.k, NAN)
        z[ids], point[ids], drift[ids], combined = self._pass(ids, x[ids])
        if self.peer_groups is None:
            score = np.full(self.k, NAN)
            score[ids] = combined
        else:
            score = _combine(point, drift, fleet)
        return ScoreBreakdown(score, point, drift, fleet, z)

    def _pass(self, ids: np.ndarray, xv: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(z, point, drift, combined) of the distinct series ``ids`` at values ``xv``, the state
        updated: warm-up, live statistics and the guarded baseline, calibration (one compiled
        pass, detectors/stat_kernels.robust_pass)."""
        k = len(ids)
        z, point, drift, combined = (np.full(k, NAN) for _ in range(4))
        floor = np.asarray(self.min_scale, dtype=np.float64).reshape(-1)
        state = (self.n, self.level, self.scale, self.cusum_pos, self.cusum_neg, self.groups, floor)
        params = (self.warmup, self.alpha, self.beta, self.clip, self.cusum_k)
        cp, cd = self.cal_point, self.cal_drift  # made with the same parameters (__init__)
        calibration = (cp.hist, cd.hist, cp.lo, cp.width, cp.min_weight, cp.decay)
        robust_pass(ids, xv, state, params, calibration, z, point, drift, combined)
        return z, point, drift, combined

    def update_ids(self, ids: np.ndarray, xv: np.ndarray) -> np.ndarray:
        """``update`` with x NaN everywhere but at the (unique) series ``ids``, in O(len(ids))
        instead of O(K): a worker updates only the series of the batch in hand. Returns the
        combined score of each of ``ids``. Not for scorers with a fleet statistic (it needs the
        whole tick)."""
        if self.peer_groups is not None:
            raise ValueError("update_ids cannot compute the fleet statistic; use update()")
        return self._pass(*indexed_values(ids, xv, self.k, "series ids"))[3]

    def relayout(self, series: Compaction, groups: np.ndarray) -> None:
        """Keep the series `series` keeps, renumbered, among len(groups) series of these calibration
        groups (the owner's new layout after forgetting some or growing); the histograms, per
        group, stay. For scorers without per-series floors or peer groups (GpuStats)."""
        if self.peer_groups is not None or np.ndim(self.min_scale):
            raise ValueError("relayout: per-series min_scale or peer groups are not laid out")
        groups = np.asarray(groups, dtype=np.int64)
        if len(groups) and int(groups.max()) >= self.cal_point.n_groups:
            raise ValueError("relayout: more calibration groups than the scorer has")
        k = len(groups)
        for name in ("n", "level", "scale", "cusum_pos", "cusum_neg"):
            setattr(self, name, series.take(getattr(self, name), 0, k))
        self.k, self.groups = k, groups.copy()

    # -- state ------------------------------------------------------------------------------
    def to_state(self) -> dict[str, np.ndarray]:
        """Plain arrays (np.savez- and msgpack-friendly): series state, calibration histograms,
        group ids and the parameters as 0-d arrays. ``from_state`` inverts it exactly."""
        st: dict[str, np.ndarray] = {
            "n": self.n.copy(),
            "level": self.level.copy(),
            "scale": self.scale.copy(),
            "cusum_pos": self.cusum_pos.copy(),
            "cusum_neg": self.cusum_neg.copy(),
            "groups": self.groups.copy(),
            "min_scale": np.asarray(self.min_scale, dtype=np.float64).copy(),
            "hist_point": self.cal_point.hist.copy(),
            "hist_drift": self.cal_drift.hist.copy(),
            "hist_fleet": self.cal_fleet.hist.copy(),
        }
        if self.peer_groups is not None:
            st["peer_groups"] = self.peer_groups.copy()
        for name in _PARAMS:
            st[f"param_{name}"] = np.asarray(getattr(self, name), dtype=np.float64)
        return st

    @classmethod
    def from_state(cls, st: dict[str, np.ndarray]) -> RobustScorer:
        p = {name: float(st[f"param_{name}"]) for name in _PARAMS}
        for name in ("warmup", "bins", "min_peers"):
            p[name] = int(p[name])
        ms = st["min_scale"]
        obj = cls(
            len(st["n"]),
            groups=st["groups"],
            peer_groups=st.get("peer_groups"),
            min_scale=ms if ms.ndim else float(ms),
            **p,
        )
        obj.n[:] = st["n"]
        obj.level[:] = st["level"]
        obj.scale[:] = st["scale"]
        obj.cusum_pos[:] = st["cusum_pos"]
        obj.cusum_neg[:] = st["cusum_neg"]
        obj.cal_point.hist[:] = st["hist_point"]
        obj.cal_drift.hist[:] = st["hist_drift"]
        obj.cal_fleet.hist[:] = st["hist_fleet"]
        return obj

    def nbytes(self) -> int:
        """Bytes of state held (series arrays + calibration histograms)."""
        arrays = [self.n, self.level, self.scale, self.cusum_pos, self.cusum_neg, self.groups]
        if self.peer_groups is not None:
            arrays.append(self.peer_groups)
        cal = self.cal_point.nbytes() + self.cal_drift.nbytes() + self.cal_fleet.nbytes()
        return int(sum(a.nbytes for a in arrays)) + cal


class UnivariateScorer:
    """``RobustScorer(1)`` (own calibration group, no fleet) in plain Python, for fast streams."""

    def __init__(
        self,
        *,
        alpha: float = 0.02,
        beta: float = 0.02,
        warmup: int = 20,
        clip: float = 3.0,
        min_scale: float = 1e-9,
        cusum_k: float = 1.0,
        halflife: float = 10_000.0,
        min_weight: float = 30.0,
        bins: int = DEFAULT_BINS,
        lo: float = DEFAULT_LO,
        hi: float = DEFAULT_HI,
    ) -> None:
        self.alpha, self.beta, self.clip, self.cusum_k = alpha, beta, clip, cusum_k
        self.warmup, self.min_scale = int(warmup), float(min_scale)
        cal = {"bins": bins, "lo": lo, "hi": hi, "halflife": halflife, "min_weight": min_weight}
        self.cal_point = ScalarTailCalibrator(**cal)
        self.cal_drift = ScalarTailCalibrator(**cal)
        self.n = 0
        self.level = 0.0
        self.scale = 0.0
        self.cusum_pos = 0.0
        self.cusum_neg = 0.0

    def update(self, x: float) -> float:
        """One value (NaN = missing: no update, NaN score); returns the score in [0, 1] or NaN."""
        if x != x:  # NaN
            return NAN
        n = self.n
        self.n = n + 1
        if n < self.warmup:
            if n == 0:
                self.level, self.scale = x, 0.0
            else:
                e = x - self.level
                self.level += e / (n + 1)
                self.scale += (abs(e) - self.scale) / n
            return NAN
        s_eff = self.scale if self.scale > self.min_scale else self.min_scale
        zi = (x - self.level) / s_eff
        c = self.clip
        zc = c if zi > c else (-c if zi < -c else zi)
        cp = self.cusum_pos + zc - self.cusum_k
        cn = self.cusum_neg - zc - self.cusum_k
        cp = cp if cp > 0.0 else 0.0
        cn = cn if cn > 0.0 else 0.0
        self.cusum_pos, self.cusum_neg = cp, cn
        ec = zc * s_eff
        self.level += self.alpha * ec
        self.scale += self.beta * (abs(ec) - self.scale)
        sp = self.cal_point.score_add(abs(zi))
        sd = self.cal_drift.score_add(cp if cp > cn else cn)
        # Bonferroni over the scores present, as in RobustScorer
        if sp != sp:
            return sd
        if sd != sd:
            return sp
        return 1.0 - min(1.0, 2.0 * (1.0 - max(sp, sd)))

    def score_many(self, values: Iterable[float]) -> list[float]:
        update = self.update
        return [update(v) for v in values]


class NodeCombiner:
    """Calibrated combination of per-metric scores into one score per node (or machine).

    ``update(scores)`` with ``scores`` (N, M) per-metric scores in [0, 1] (NaN = absent): the
    statistic is Fisher's ``-2 sum ln p`` (sensitive to several moderately unusual metrics) or
    Tippett's ``-ln min p`` (to one very unusual metric), with ``p = 1 - score`` floored at
    ``p_floor``; metrics are correlated, so the statistic is not referred to a chi-square table
    but calibrated online per node exactly like a single statistic (``TailCalibrator``), and the
    returned score has the same meaning: ``P(score >= t) <= 1 - t`` for a healthy node.
    ``top_metric`` holds, per node, the column with the highest score of the last tick.
    """

    def __init__(
        self,
        n_nodes: int,
        *,
        method: Literal["fisher", "tippett"] = "fisher",
        groups: np.ndarray | None = None,
        halflife: float = 10_000.0,
        min_weight: float = 30.0,
        p_floor: float = 1e-9,
    ) -> None:
        if method not in ("fisher", "tippett"):
            raise ValueError(f"unknown method {method!r}")
        self.n_nodes = int(n_nodes)
        self.method = method
        self.p_floor = float(p_floor)
        self.groups = np.arange(self.n_nodes) if groups is None else np.asarray(groups, dtype=np.int64)
        # statistic ranges from ~0 to ~2 M ln(1/p_floor): ln range [-5, 9] as for deviations
        self.cal = TailCalibrator(int(self.groups.max()) + 1, halflife=halflife, min_weight=min_weight)
        self.top_metric = np.full(self.n_nodes, -1, dtype=np.int64)

    def statistic(self, scores: np.ndarray) -> np.ndarray:
        p = np.clip(1.0 - scores, self.p_floor, 1.0)
        present = ~np.isnan(scores)
        with np.errstate(invalid="ignore"):
            if self.method == "fisher":
                t = -2.0 * np.nansum(np.log(p), axis=1)
            else:
                t = -np.log(np.nanmin(np.where(present, p, 1.0), axis=1))
        return np.where(present.any(axis=1), t, NAN)

    def update(self, scores: np.ndarray) -> np.ndarray:
        scores = np.asarray(scores, dtype=np.float64)
        if scores.ndim != 2 or scores.shape[0] != self.n_nodes:
            raise ValueError(f"expected ({self.n_nodes}, M) scores, got {scores.shape}")
        t = self.statistic(scores)
        out = self.cal.score_add(self.groups, t)
        any_present = ~np.isnan(scores).all(axis=1)
        self.top_metric = np.where(any_present, np.argmax(np.nan_to_num(scores, nan=-1.0), axis=1), -1)
        return out

    def to_state(self) -> dict[str, np.ndarray]:
        return {"hist": self.cal.hist.copy(), "groups": self.groups.copy()}

    def load_state(self, st: dict[str, np.ndarray]) -> None:
        self.cal.hist[:] = st["hist"]
        self.groups[:] = st["groups"]
