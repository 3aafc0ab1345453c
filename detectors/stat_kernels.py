"""The compiled inner loops of the statistical detectors (detectors/statistical.py,
detectors/calibration.py), one pass over a batch each.

A worker's batch holds ~1,000 messages x 8 GPUs x 3 signals. numpy did these with a dozen
whole-array temporaries each (~3 us a message of the worker's CPU between them):
- sibling_z_pass: each row's sibling GPUs against their own median and MAD; each group of a few
  values is sorted in place (insertion sort). tests/unit/test_statistical.py checks it against
  fleet_robust_z, gaps and ties included.
- calibrate_pass: TailCalibrator's score-then-add over a batch (conformal tail scores against
  decayed log-histograms). Sums run in numpy's order (suffix sums right to left, counts added
  per bin), so the histograms hold the same numbers.
- robust_pass: RobustScorer's tick over a batch's series (baseline, statistics, both
  calibrators, their combination), elementwise the same operations as numpy's.

Compiled once, cached by numba beside this file (warm_up()); release the GIL.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

MAD_TO_SIGMA = 1.4826  # the MAD of a normal distribution is 0.6745 sigma


def indexed_values(
    index: np.ndarray, values: np.ndarray, size: int, what: str
) -> tuple[np.ndarray, np.ndarray]:
    """index and values as the kernels take them: C-contiguous int64 and float64 of one 1-d
    shape, every index in 0..size - 1 (a compiled loop does not check its bounds)."""
    index = np.ascontiguousarray(index, dtype=np.int64)
    values = np.ascontiguousarray(values, dtype=np.float64)
    if index.shape != values.shape or index.ndim != 1:
        raise ValueError(f"{what} {index.shape} and values {values.shape} must be the same 1-d shape")
    if len(index) and (index.min() < 0 or index.max() >= size):
        raise ValueError(f"{what} must be in 0..{size - 1}")
    return index, values


@njit(cache=True, inline="always")
def _sort_prefix(a: np.ndarray, n: int) -> None:
    for i in range(1, n):
        v = a[i]
        j = i - 1
        while j >= 0 and a[j] > v:
            a[j + 1] = a[j]
            j -= 1
        a[j + 1] = v


# error_model="numpy": a zero scale with a nonzero deviation gives +-inf, as numpy does, not an error
@njit(cache=True, nogil=True, error_model="numpy")
def sibling_z_pass(x: np.ndarray, floor: np.ndarray, min_peers: int, out: np.ndarray) -> None:
    """x (M, G, S): out[m, g, s] = (x - median) / max(MAD_TO_SIGMA * MAD, floor) over the present
    values of x[m, :, s]; 0 where the value is the median, NaN where it is absent or fewer than
    min_peers are present."""
    m_rows, g_n, s_n = x.shape
    vals = np.empty(g_n)
    devs = np.empty(g_n)
    for m in range(m_rows):
        for s in range(s_n):
            n = 0
            for g in range(g_n):
                v = x[m, g, s]
                if not math.isnan(v):
                    vals[n] = v
                    n += 1
            if n == 0 or n < min_peers:
                for g in range(g_n):
                    out[m, g, s] = np.nan
                continue
            _sort_prefix(vals, n)
            med = 0.5 * (vals[(n - 1) // 2] + vals[n // 2])
            for k in range(n):
                devs[k] = abs(vals[k] - med)
            _sort_prefix(devs, n)
            spread = MAD_TO_SIGMA * (0.5 * (devs[(n - 1) // 2] + devs[n // 2]))
            for g in range(g_n):
                v = x[m, g, s]
                if math.isnan(v):
                    out[m, g, s] = np.nan
                    continue
                f = floor[m, g, s]
                scale = spread if spread > f else f  # a NaN floor gives NaN, as np.maximum does
                out[m, g, s] = (v - med) / scale if abs(v - med) > 0 else 0.0


@njit(cache=True, nogil=True)
def calibrate_pass(  # the histogram is updated in place; scores go to out (NaN-filled by the caller)
    hist: np.ndarray,
    groups: np.ndarray,
    d: np.ndarray,
    lo: float,
    width: float,
    min_weight: float,
    decay: float,
    score: bool,
    add: bool,
    out: np.ndarray,
) -> None:
    """TailCalibrator.score (score), add (add) or both, score first, over statistics d >= 0
    (NaN or negative: skipped) in calibration groups `groups` (each in 0..n_groups - 1).
    hist (n_groups, bins + 2): column 0 is the underflow (d == 0 included), 1..bins the regular
    bins of ln d, bins + 1 the overflow."""
    n_groups, cols = hist.shape
    bins = cols - 2
    present = np.zeros(n_groups, dtype=np.bool_)
    for i in range(len(d)):
        if d[i] >= 0.0:
            present[groups[i]] = True
    # suffix[g, c]: weight in columns >= c of a present group (cols + 1: above the overflow)
    suffix = np.zeros((n_groups, cols + 1))
    if score:
        for g in range(n_groups):
            if present[g]:
                acc = 0.0
                for c in range(cols - 1, -1, -1):
                    acc += hist[g, c]
                    suffix[g, c] = acc
    counts = np.zeros((n_groups, cols)) if add else np.zeros((0, 0))
    for i in range(len(d)):
        v = d[i]
        if not v >= 0.0:  # NaN; a negative statistic would have no column: left unscored
            continue
        g = groups[i]
        u = (math.log(v) - lo) / width  # -inf for d == 0: the underflow column
        f = np.floor(u)  # a float: math.floor gives an int, undefined for +-inf
        col = int(min(max(f, -1.0), float(bins))) + 1
        if score:
            h = hist[g, col]
            total = suffix[g, 0]
            # inside a regular bin, the part of its weight above d; under/overflow count as >= d
            tail = suffix[g, col + 1] + (h * (1.0 - (u - (col - 1))) if 1 <= col <= bins else h)
            s = 1.0 - (tail + 1.0) / (total + 1.0)
            out[i] = (s if s > 0.0 else 0.0) if total >= min_weight else np.nan
        if add:
            counts[g, col] += 1.0
    if add:
        for g in range(n_groups):
            if present[g]:
                for c in range(cols):
                    hist[g, c] = hist[g, c] * decay + counts[g, c]


@njit(cache=True, inline="always")
def _maximum(a: float, b: float) -> float:  # np.maximum: NaN if either is
    if math.isnan(a) or math.isnan(b):
        return np.nan
    return a if a >= b else b


@njit(cache=True, inline="always")
def _minimum(a: float, b: float) -> float:  # np.minimum: NaN if either is
    if math.isnan(a) or math.isnan(b):
        return np.nan
    return a if a <= b else b


@njit(cache=True, nogil=True, error_model="numpy")
def robust_pass(  # the scorer's arrays are updated in place; outputs are NaN-filled by the caller
    ids: np.ndarray,
    x: np.ndarray,
    state: tuple,  # (n, level, scale, cusum_pos, cusum_neg, groups, min_scale (K,) or (1,))
    params: tuple,  # (warmup, alpha, beta, clip, cusum_k)
    calibration: tuple,  # (hist_point, hist_drift, lo, width, min_weight, decay)
    z: np.ndarray,
    point: np.ndarray,
    drift: np.ndarray,
    combined: np.ndarray,
) -> None:
    """RobustScorer's tick over the distinct series `ids` with values x (NaN: no sample): the
    warm-up's running mean and mean absolute deviation, then the live statistics against the
    baseline as it was and the guarded baseline update, the point and drift statistics scored
    by their calibrators (calibrate_pass), and their Bonferroni combination."""
    n, level, scale, cusum_pos, cusum_neg, groups, min_scale = state
    warmup, alpha, beta, clip, cusum_k = params
    hist_point, hist_drift, lo, width, min_weight, decay = calibration
    k = len(ids)
    d_point = np.full(k, np.nan)
    d_drift = np.full(k, np.nan)
    g = np.empty(k, dtype=np.int64)
    for j in range(k):
        i = ids[j]
        g[j] = groups[i]
        v = x[j]
        if math.isnan(v):
            continue
        if n[i] < warmup:
            c = float(n[i])
            if c == 0.0:
                level[i] = v
                scale[i] = 0.0
            else:
                e = v - level[i]
                level[i] = level[i] + e / (c + 1.0)
                scale[i] = scale[i] + (abs(e) - scale[i]) / c
        else:
            s_eff = _maximum(scale[i], min_scale[i] if len(min_scale) > 1 else min_scale[0])
            zi = (v - level[i]) / s_eff
            zc = _minimum(_maximum(zi, -clip), clip)
            cp = _maximum(0.0, cusum_pos[i] + zc - cusum_k)
            cn = _maximum(0.0, cusum_neg[i] - zc - cusum_k)
            cusum_pos[i] = cp
            cusum_neg[i] = cn
            # clipped update: an anomaly moves the baseline by at most alpha * clip scales per tick
            ec = zc * s_eff
            level[i] += alpha * ec
            scale[i] += beta * (abs(ec) - scale[i])
            z[j] = zi
            d_point[j] = abs(zi)
            d_drift[j] = _maximum(cp, cn)
        n[i] += 1
    calibrate_pass(hist_point, g, d_point, lo, width, min_weight, decay, True, True, point)
    calibrate_pass(hist_drift, g, d_drift, lo, width, min_weight, decay, True, True, drift)
    for j in range(k):
        m = 0
        best = 0.0
        for p in (point[j], drift[j]):
            if not math.isnan(p):
                m += 1
                best = p if p > best else best
        if m:
            combined[j] = 1.0 - min(1.0, m * (1.0 - best))


def warm_up() -> None:
    """Load the kernels from numba's cache, compiling them first if there is none (~20 s)."""
    x = np.ones((1, 1, 1))
    sibling_z_pass(x, np.broadcast_to(np.zeros(1), x.shape), 1, np.empty_like(x))
    from fleetwatch.detectors.calibration import TailCalibrator
    from fleetwatch.detectors.statistical import RobustScorer

    one = np.zeros(1, dtype=np.int64)
    RobustScorer(1).update_ids(one, np.ones(1))
    TailCalibrator(1).score_add(one, np.ones(1))  # alone too: inside robust_pass it is compiled inline
