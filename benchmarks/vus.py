"""VUS-PR: the volume under the range-based precision-recall surface (Paparrizos et al., "Volume
Under the Surface: A New Accuracy Evaluation Measure for Time-Series Anomaly Detection", VLDB
2022), as TSB-AD (NeurIPS 2024) computes it for its leaderboard, so the figures here sit beside
that leaderboard's. Threshold-free: it ranks a score, it does not judge an alarm threshold.

For each buffer length l = 0 .. window:
- every labelled range [s, e] gets a soft buffer of l // 2 points each side, a point at distance
  k weighing sqrt(1 - k / l);
- at each of `thresholds` thresholds (the scores at evenly spaced ranks, highest first), with
  `pred` = score >= threshold: TP = the predicted points' weights (1 inside a range, the buffer's
  weight beside it), counted inside the ranges widened by window // 2; the range recall is
  min(TP / ((P + N) / 2), 1) x the share of buffered ranges with any predicted point, where P is
  the labelled points and N the weight of the labels after prediction (P plus the predicted
  buffer weight); precision is TP / predicted points;
- the average precision: the sum of each recall step times the precision at its threshold.
VUS-PR is the mean of those average precisions over l. tests/unit/test_vus.py checks this code
against values TSB-AD's own implementation computed (tests/fixtures/vus_pr/).

`period(x)`: the buffer window TSB-AD uses, the lag of the highest autocorrelation peak of the
first metric (lags 3 to 400), 125 when that lag is outside 3..300.
"""

from __future__ import annotations

import numpy as np

DEFAULT_THRESHOLDS = 250


def ranges(labels: np.ndarray) -> np.ndarray:
    """Labelled ranges as (R, 2) inclusive [start, end] index pairs."""
    y = np.asarray(labels).astype(np.int8).ravel()
    d = np.diff(np.concatenate([[0], y, [0]]))
    return np.stack([np.flatnonzero(d == 1), np.flatnonzero(d == -1) - 1], axis=1)


def _widened(r: np.ndarray, half: int, n: int) -> np.ndarray:
    """The ranges widened by `half` each side, merged where they meet, clipped to 0..n - 1."""
    out: list[list[int]] = []
    for s, e in r.tolist():
        a, b = s - half, e + half
        if out and a <= out[-1][1]:
            out[-1][1] = b
        else:
            out.append([a, b])
    w = np.asarray(out, dtype=np.int64).reshape(-1, 2)
    return np.clip(w, 0, n - 1)


def _soft_labels(r: np.ndarray, buffer: int, n: int) -> np.ndarray:
    """1 inside the ranges, sqrt(1 - k / buffer) at distance k <= buffer // 2 beside them (summed
    where buffers meet, capped at 1)."""
    w = np.zeros(n)
    for s, e in r:
        w[s : e + 1] += 1.0
        k = np.arange(1, buffer // 2 + 1)
        after, before = e + k, s - k
        w[after[after < n]] += np.sqrt(1.0 - k[after < n] / buffer)
        w[before[before >= 0]] += np.sqrt(1.0 - k[before >= 0] / buffer)
    return np.minimum(w, 1.0)


def vus_pr(labels: np.ndarray, score: np.ndarray, window: int, thresholds: int = DEFAULT_THRESHOLDS) -> float:
    """VUS-PR of `score` (higher = more anomalous) against 0/1 `labels`; NaN without a labelled point."""
    y = np.asarray(labels).astype(np.int64).ravel()
    s = np.asarray(score, dtype=np.float64).ravel()
    if y.shape != s.shape:
        raise ValueError("labels and score must have the same length")
    if not np.all(np.isfinite(s)):
        raise ValueError("score must be finite")
    n, p = len(y), int(y.sum())
    if p == 0 or window < 0:
        return float("nan")
    r = ranges(y)
    order = np.argsort(-s, kind="stable")
    s_desc = s[order]
    thr = s_desc[np.linspace(0, n - 1, thresholds).astype(int)]
    # per threshold, how many scores are at or above it: a prefix of the sorted scores, whose
    # cumulative sums give every count below
    n_pred = np.searchsorted(-s_desc, -thr, side="right")
    true_hit = np.r_[0, np.cumsum(y[order])][n_pred]
    counted = np.zeros(n, dtype=bool)  # TP and N are counted inside the ranges widened by window // 2
    for a, b in _widened(r, window // 2, n):
        counted[a : b + 1] = True
    aps = []
    for buffer in range(window + 1):
        soft = _soft_labels(r, buffer, n)
        buf = np.where(counted & (y == 0), soft, 0.0)  # the buffer's weight a prediction earns
        buf_hit = np.r_[0.0, np.cumsum(buf[order])][n_pred]
        tp = true_hit + buf_hit
        labelled = p + buf_hit
        segs = _widened(r, buffer // 2, n)
        seg_max = np.array([s[a : b + 1].max() for a, b in segs])
        existence = (seg_max[None, :] >= thr[:, None]).sum(axis=1) / len(segs)
        recall = np.minimum(tp / ((p + labelled) / 2.0), 1.0) * existence
        precision = tp / n_pred
        aps.append(float(np.sum(np.diff(np.r_[0.0, recall]) * precision)))
    return float(np.mean(aps))


def period(x: np.ndarray, max_lag: int = 400) -> int:
    """The buffer window TSB-AD derives from a series (see the module docstring)."""
    v = np.asarray(x, dtype=np.float64).ravel()[:20000]
    v = v - v.mean()
    n = len(v)
    denom = float(np.dot(v, v))
    if n < 5 or denom == 0.0:
        return 125
    f = np.fft.rfft(v, 2 * n)
    acf = np.fft.irfft(f * np.conj(f))[: max_lag + 1] / denom
    base = 3
    a = acf[base:]
    peaks = np.flatnonzero((a[1:-1] > a[:-2]) & (a[1:-1] > a[2:])) + 1
    if len(peaks) == 0:
        return 125
    best = int(peaks[np.argmax(a[peaks])])
    return 125 if best < 3 or best > 300 else best + base
