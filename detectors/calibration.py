"""Online calibration of a non-negative deviation statistic to a [0, 1] score.

Meaning of the score
--------------------
For a statistic ``d >= 0`` (larger = more unusual) observed in calibration group ``g``:

    p(d)     = (W_g(D >= d) + 1) / (W_g + 1)        # online conformal tail probability
    score(d) = 1 - p(d)

where ``W_g(D >= d)`` is the (exponentially decayed) weight of the *past* statistics of group ``g``
that were at least ``d`` and ``W_g`` the total decayed weight; the newest past point has weight 1,
one ``halflife`` ticks ago weight 0.5. The ``+1`` counts the current point itself, which makes
``p`` a conformal p-value: if the statistic is stationary (exchangeable) in a group, then for
any threshold ``t``

    P(score >= t) <= 1 - t          e.g. t = 0.999 -> at most ~0.1 % of healthy points flagged.

So "score 0.999" reads "more unusual than 99.9 % of what this group has done before". Caveats,
all documented rather than hidden:
- the bound is per point; alarms from an autocorrelated statistic come in clusters.
- ``p >= 1 / (W_g + 1)``: a score above ``t`` needs at least ``1 / (1 - t) - 1`` past samples in the
  group (999 for 0.999); ``min_weight`` withholds scores (NaN) until the group has a minimum of
  history at all.
- the past is held in a fixed histogram of ``ln d`` (``bins`` equal bins over ``[lo, hi]`` plus an
  underflow bin that also holds ``d == 0`` and an overflow bin), linearly interpolated inside a bin,
  so tail weights are exact to within one bin's share; the underflow bin counts as ">= d" for a
  ``d`` inside it (ties with zeros are the norm for quantised metrics) and the overflow bin as ">= d"
  for every ``d`` that falls in it (conservative).
- everything is scored *before* it is added (no look-ahead), and every scored point is added,
  anomalous or not: leaving anomalies out would thin the tail and inflate later scores.

Groups: one group per series is the most faithful ("this signal's own history") but costs
``(bins + 2) * 8`` bytes per series; the fleet scorer uses one group per metric (all GPUs' power
draw share a histogram), which is what keeps its memory per GPU small.

Each ``score`` + ``add`` is one compiled pass over the batch (detectors/stat_kernels.py): O(K + G * bins).
"""

from __future__ import annotations

import math

import numpy as np

from fleetwatch.detectors.stat_kernels import calibrate_pass, indexed_values

# ln(d) range of the histogram: d is in units of the series' own scale, so e^-5 (0.007 scales)
# up to e^9 (8100 scales) covers every deviation worth telling apart; beyond it is "huge".
DEFAULT_LO = -5.0
DEFAULT_HI = 9.0
DEFAULT_BINS = 56  # 0.25 in ln d per bin: a 28 % step in the deviation


class TailCalibrator:
    """Decayed log-histograms of a statistic, one per group, giving conformal tail scores."""

    def __init__(
        self,
        n_groups: int,
        *,
        bins: int = DEFAULT_BINS,
        lo: float = DEFAULT_LO,
        hi: float = DEFAULT_HI,
        halflife: float = 10_000.0,
        min_weight: float = 30.0,
    ) -> None:
        if n_groups <= 0 or bins <= 0 or not hi > lo or not halflife > 0:
            raise ValueError("TailCalibrator: need n_groups > 0, bins > 0, hi > lo, halflife > 0")
        self.bins = int(bins)
        self.lo = float(lo)
        self.hi = float(hi)
        self.halflife = float(halflife)
        self.min_weight = float(min_weight)
        # column 0: underflow (incl. d == 0); 1..bins: regular; bins + 1: overflow
        self.hist = np.zeros((int(n_groups), self.bins + 2), dtype=np.float64)

    @property
    def n_groups(self) -> int:
        return self.hist.shape[0]

    @property
    def decay(self) -> float:
        return 0.5 ** (1.0 / self.halflife)

    @property
    def width(self) -> float:
        """Width of a regular bin, in ln d."""
        return (self.hi - self.lo) / self.bins

    def _pass(self, groups: np.ndarray, d: np.ndarray, score: bool, add: bool) -> np.ndarray:
        """One compiled pass over the batch (detectors/stat_kernels.calibrate_pass)."""
        groups, d = indexed_values(groups, d, self.n_groups, "calibration groups")
        out = np.full(d.shape, np.nan)
        lo, width = self.lo, self.width
        calibrate_pass(self.hist, groups, d, lo, width, self.min_weight, self.decay, score, add, out)
        return out

    def score(self, groups: np.ndarray, d: np.ndarray) -> np.ndarray:
        """Scores in [0, 1] of statistics ``d`` in ``groups`` against the past; NaN where ``d``
        is NaN or the group has less than ``min_weight`` of history. Changes nothing."""
        return self._pass(groups, d, True, False)

    def add(self, groups: np.ndarray, d: np.ndarray) -> None:
        """Decay the groups present in this tick once, then add the non-NaN statistics."""
        self._pass(groups, d, False, True)

    def score_add(self, groups: np.ndarray, d: np.ndarray) -> np.ndarray:
        """``score`` then ``add`` (the online order) in one pass."""
        return self._pass(groups, d, True, True)

    def nbytes(self) -> int:
        return int(self.hist.nbytes)


class ScalarTailCalibrator:
    """The same calibration for a single group fed one value at a time, in plain Python.

    For a univariate stream (``fleetwatch score``) numpy's per-call overhead dominates; this
    keeps the histogram in a list and, instead of multiplying every bin by the decay each tick,
    grows the weight of new points by ``1 / decay`` (rescaling now and then), which is the same
    arithmetic up to rounding. The tests check it agrees with ``TailCalibrator``.
    """

    def __init__(
        self,
        *,
        bins: int = DEFAULT_BINS,
        lo: float = DEFAULT_LO,
        hi: float = DEFAULT_HI,
        halflife: float = 10_000.0,
        min_weight: float = 30.0,
    ) -> None:
        self.bins = int(bins)
        self.lo = float(lo)
        self.width = (float(hi) - float(lo)) / self.bins
        self.growth = 0.5 ** (-1.0 / float(halflife))
        self.min_weight = float(min_weight)
        self.hist = [0.0] * (self.bins + 2)
        self.total = 0.0
        self.w = 1.0  # weight the next point gets (grows instead of decaying the past)

    def _locate(self, d: float) -> tuple[int, float]:
        if d <= 0.0:
            return 0, 0.0
        u = (math.log(d) - self.lo) / self.width
        if u < 0.0:
            return 0, 0.0
        if u >= self.bins:
            return self.bins + 1, 0.0
        b = int(u)
        return b + 1, u - b

    def score_add(self, d: float) -> float:
        """Score ``d`` against the past (NaN during calibration warm-up), then add it."""
        col, frac = self._locate(d)
        hist, w = self.hist, self.w
        h = hist[col]
        tail = sum(hist[col + 1 :]) + (h * (1.0 - frac) if 1 <= col <= self.bins else h)
        # in units where the newest past point weighs 1: divide by the last point's weight
        w_last = w / self.growth
        total = self.total / w_last
        s = 1.0 - (tail / w_last + 1.0) / (total + 1.0)
        score = (0.0 if s < 0.0 else s) if total >= self.min_weight else math.nan
        # add with the current weight
        hist[col] += w
        self.total += w
        self.w = w * self.growth
        if self.w > 1e100:  # rescale so nothing overflows; ratios are unchanged
            k = 1.0 / self.w
            self.hist = [x * k for x in hist]
            self.total *= k
            self.w = 1.0
        return score
