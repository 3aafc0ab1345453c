"""Simple baselines for the real-data benchmarks (benchmarks/anomaly_eval.py), each a function
(train (T1, M), test (T2, M), context) -> (train scores, test scores), higher = more anomalous.
Train scores are what a threshold fixed in advance is taken from (their 99.9 % quantile); NaN
where a streaming baseline is still warming up.

- robust_z_static: per metric, |x - median| / (1.4826 MAD) against train (MAD floored at the data's
  resolution), the largest over the metrics.
- robust_z_trailing: the same against the trailing window of the last `day` samples (one day of
  the dataset's samples), the scale from the window's interquartile range (IQR / 1.349: the MAD
  of a moving window is not a moving window itself, the IQR is), computed online.
- tippett: per metric the empirical two-sided tail p of |x - median| among train's, the smallest
  over the metrics (Tippett's minimum-p), scored as -ln p.
- pca: standardised on train (std floored at the resolution), PCA keeping 95 % of train's
  variance, the squared reconstruction error.
- half_space_trees: river's HalfSpaceTrees (10 trees, height 8, window 250, seed 0, its defaults),
  online over train then test, inputs clipped to [0, 1] (the data are min-max scaled).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numba import njit

from fleetwatch.detectors.stat_kernels import MAD_TO_SIGMA

IQR_TO_SIGMA = 1.349  # the interquartile range of a normal distribution is 1.349 sigma


@dataclass(frozen=True)
class Context:
    resolution: float  # the data's quantum: the least scale
    day: int  # samples per day


Baseline = Callable[[np.ndarray, np.ndarray, Context], tuple[np.ndarray, np.ndarray]]


def robust_z_static(train: np.ndarray, test: np.ndarray, ctx: Context) -> tuple[np.ndarray, np.ndarray]:
    med = np.median(train, axis=0)
    mad = np.maximum(MAD_TO_SIGMA * np.median(np.abs(train - med), axis=0), ctx.resolution)
    return np.max(np.abs(train - med) / mad, axis=1), np.max(np.abs(test - med) / mad, axis=1)


@njit(cache=True)
def _trailing_z(x: np.ndarray, window: int, floor: float) -> np.ndarray:
    """Per metric, |x_t - median| / (IQR / 1.349) of the previous `window` values (a sorted
    window kept by insertion and deletion); the largest over metrics, NaN for t < window."""
    t_n, m = x.shape
    out = np.full(t_n, np.nan)
    best = np.zeros(t_n)
    srt = np.empty(window)
    for i in range(m):
        k = 0
        for t in range(t_n):
            v = x[t, i]
            if k == window:
                med = 0.5 * (srt[(window - 1) // 2] + srt[window // 2])
                iqr = srt[(3 * window) // 4] - srt[window // 4]
                scale = max(iqr / IQR_TO_SIGMA, floor)
                z = abs(v - med) / scale
                if z > best[t]:
                    best[t] = z
                old = x[t - window, i]  # leaves the window: find and remove it
                j = 0
                while srt[j] != old:
                    j += 1
                for q in range(j, k - 1):
                    srt[q] = srt[q + 1]
                k -= 1
            j = k  # insert v in order
            while j > 0 and srt[j - 1] > v:
                srt[j] = srt[j - 1]
                j -= 1
            srt[j] = v
            k += 1
    for t in range(window, t_n):
        out[t] = best[t]
    return out


def robust_z_trailing(train: np.ndarray, test: np.ndarray, ctx: Context) -> tuple[np.ndarray, np.ndarray]:
    s = _trailing_z(np.ascontiguousarray(np.vstack([train, test])), ctx.day, ctx.resolution)
    return s[: len(train)], s[len(train) :]


def tippett(train: np.ndarray, test: np.ndarray, ctx: Context) -> tuple[np.ndarray, np.ndarray]:
    med = np.median(train, axis=0)
    dev_train = np.sort(np.abs(train - med), axis=0)
    n = len(train)

    def score(x: np.ndarray) -> np.ndarray:
        dev = np.abs(x - med)
        # per metric: train deviations >= this one, +1 (the point itself), over n + 1
        at_least = np.stack(
            [n - np.searchsorted(dev_train[:, i], dev[:, i], side="left") for i in range(x.shape[1])], 1
        )
        p = (at_least + 1.0) / (n + 1.0)
        return -np.log(p.min(axis=1))

    return score(train), score(test)


def pca(train: np.ndarray, test: np.ndarray, ctx: Context) -> tuple[np.ndarray, np.ndarray]:
    from sklearn.decomposition import PCA

    mu = train.mean(axis=0)
    sd = np.maximum(train.std(axis=0), ctx.resolution)
    model = PCA(n_components=0.95, svd_solver="full").fit((train - mu) / sd)

    def score(x: np.ndarray) -> np.ndarray:
        z = (x - mu) / sd
        return np.sum((z - model.inverse_transform(model.transform(z))) ** 2, axis=1)

    return score(train), score(test)


def half_space_trees(train: np.ndarray, test: np.ndarray, ctx: Context) -> tuple[np.ndarray, np.ndarray]:
    from river.anomaly import HalfSpaceTrees

    model = HalfSpaceTrees(n_trees=10, height=8, window_size=250, seed=0)
    data = np.clip(np.vstack([train, test]), 0.0, 1.0)
    keys = [f"m{i}" for i in range(data.shape[1])]
    out = np.empty(len(data))
    for t, row in enumerate(data.tolist()):
        x = dict(zip(keys, row, strict=True))
        out[t] = model.score_one(x)
        model.learn_one(x)
    out[: 2 * 250] = np.nan  # its first windows are its warm-up (reference mass not yet built)
    return out[: len(train)], out[len(train) :]


BASELINES: dict[str, Baseline] = {
    "robust-z(train)": robust_z_static,
    "robust-z(trailing)": robust_z_trailing,
    "tippett(train)": tippett,
    "pca(train)": pca,
    "half-space-trees": half_space_trees,
}
