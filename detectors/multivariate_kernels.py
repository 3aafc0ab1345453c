"""The compiled pass of the multivariate scorer (detectors/multivariate.py): one call per batch of
samples, each a vector of M metrics of one group (a node, a machine).

Per sample, in the group's order (state carried across batches):
1. per metric, a robust baseline as RobustScorer's (EW level and mean absolute deviation, updates
   clipped to `clip` scales), started from its warm-up's median and trimmed mean absolute
   deviation (_robust_start), and its z;
2. five statistics per metric, each a deviation >= 0:
   - point  |z|                                  (one sample far out)
   - short  |mean of the last 3 z|               (a short event: 3 samples of a moderate shift
                                                  stand out as one sample of sqrt(3) x the shift)
   - drift  two-sided CUSUM of the clipped z     (a sustained shift or ramp)
   - relation |(P y)_i| / sqrt(P_ii)             (the metric against what the others predict)
   - step   |z_t - z_(t-1)|                      (the change since the last sample, whatever the
                                                  baseline: a short event's first sample, or a
                                                  series that turns rough while it stays in range)
   where y is each metric's level against its slow EW mean (~1 / cov_alpha samples) in EW
   standard deviations (clipped at 2 x clip), P the inverse of the group's shrunk EW correlation
   of those levels (refreshed every `refresh` complete samples): (P y)_i / sqrt(P_ii) is the
   standardised residual of regressing metric i on all the others (the levels, as a PCA fitted
   on history models them, not the fast baseline's deviations), so it is large when a metric
   leaves its usual relationship even while every metric stays in its range;
3. each statistic turned into a p-value against its calibration row (pool, metric, statistic):
   the decayed histogram's conformal tail, extrapolated beyond the row's top `q_tail` by an
   exponential tail fitted to the weight above it (tail_model, tail_p), so a far-out value is not
   capped at 1 / (history + 1) (the saturation that kept one strong metric from speaking);
4. per metric, the smallest of its statistics' p-values, calibrated against the metric's own row
   (out_metric_p): the smallest p's distribution under the dependence of this metric's
   statistics, which move together (a jump is far from the baseline, from the last sample and
   from the short window at once), where Bonferroni's bound (the smallest times their number,
   used while that row has too little history) charged each metric for five independent tests;
5. three families of evidence, each a p-value: the metrics' p combined by Cauchy's combination
   (Liu and Xie, JASA 2020; each p taken at most 0.5, cauchy_term: valid under dependence for
   small p, led by the smallest, so one strong metric speaks); several metrics at once (the
   truncated product of the metrics' p below TPM_TAU, calibrated); the levels' joint Mahalanobis
   distance (calibrated). Their Cauchy combination's -ln p, calibrated again per pool in the same
   way, is the output p.

Every statistic is scored against the histograms as they were before the batch, then all are
added (one decay per present row): a batch never sees its own samples (no look-ahead). A
sequential pass (one stream read at once, `fleetwatch score`) learns each sample before the next,
which is what a batch of one sample at a time gives.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

TPM_TAU = 0.05  # the truncated product's truncation (Zaykin et al.'s usual choice)
N_STATS = 5  # point, short, drift, relation, step (the last axis of stat_p)
STAT_NAMES = ("point", "short", "drift", "relation", "step")
# calibration rows per metric: one per statistic, then the metric's own (its statistics' smallest p)
N_ROWS = N_STATS + 1


@njit(cache=True, inline="always")
def _column(d: float, lo: float, width: float, bins: int) -> tuple[int, float]:
    """(column, u): column 0 underflow (d == 0 too), 1..bins regular, bins + 1 overflow; u the
    position in bins of ln d from lo."""
    u = (math.log(d) - lo) / width if d > 0.0 else -np.inf
    f = np.floor(u)
    return int(min(max(f, -1.0), float(bins))) + 1, u


@njit(cache=True)
def tail_model(hist: np.ndarray, suffix: np.ndarray, lo: float, width: float, q_tail: float,
               min_tail: float, model: np.ndarray, unit: np.ndarray) -> None:  # fmt: skip
    """Per row of hist (R, cols): suffix (R, cols + 1) the weight at or above each column, and
    model (R, 3): (u, weight at or above u, scale) of the row's exponential tail, the scale 0
    where the tail holds less than min_tail weight (no extrapolation).

    u is the lower edge of the highest regular column with at least q_tail of the row's weight at
    or above it. The scale is the median excess over u divided by ln 2 (the exponential's own
    ratio), the median read off the histogram within its bin: one series that keeps drifting
    fills the top of its pool's histogram with its own values (and a single-group pool's with its
    past), and a mean excess follows them until the drifting series no longer looks unusual; the
    median holds while less than half the tail is one series'. Exponential (a generalised
    Pareto tail of shape 0): the tail of every statistic here, a |z| of noise, a CUSUM, a -ln p,
    is that or lighter, so beyond the history it errs towards larger p; a Pareto tail was tried
    first and was ten times too conservative at 0.999.

    A statistic's row (`unit`: one in units of its metric's scale) with a full history (q_tail of
    it at least min_tail), no tail to fit, and less than half a sample's weight at one scale or
    more (no move of a whole scale within the calibration's halflife) is a series that never moved
    beyond its noise floor, and the conformal p of its first move, however large, stopped at
    1 / (history + 1) (3.6e-4 at the pipeline's halflife; times the five statistics, a
    never-moving GPU signal could not flag on its own at 0.999 whatever it did). Its model is the
    unit exponential from zero, p = e^-d: the tail of |z| for Laplace noise at the metric's scale,
    here its floor (the resolution, since it did not move), the heaviest of the usual noise models
    and heavier than Gaussian; tail_p takes it only where it is below the conformal p, so only a
    move beyond ln(history + 1), ~8 scales, is judged by it. A row that has seen larger moves, too
    few to fit a tail (9 spikes of 100 scales), keeps the conformal p: a unit tail from zero would
    ignore them. The other rows (the metric's smallest p, the group's) are not in scales."""
    rows, cols = hist.shape
    bins = cols - 2
    for r in range(rows):
        acc = 0.0
        for c in range(cols - 1, -1, -1):
            acc += hist[r, c]
            suffix[r, c] = acc
        suffix[r, cols] = 0.0
        total = suffix[r, 0]
        model[r, 0] = 0.0
        model[r, 1] = 0.0
        model[r, 2] = 0.0
        if not total > 0.0:
            continue
        cu = 0
        for c in range(bins, 0, -1):
            if suffix[r, c] >= q_tail * total:
                cu = c
                break
        if cu == 0 or suffix[r, cu] < min_tail:
            one = min(max(math.floor(-lo / width) + 1, 1), bins + 1)  # the column holding 1
            if unit[r] and min_tail <= q_tail * total and suffix[r, one] < 0.5:
                # a series that never moved a whole scale: the unit exponential from zero, e^-d
                model[r, 0] = math.exp(lo)
                model[r, 1] = total
                model[r, 2] = 1.0
            continue
        ln_u = lo + (cu - 1) * width
        half = 0.5 * suffix[r, cu]
        below = 0.0
        ln_med = lo + bins * width + 0.5 * width  # the overflow's, if the median is there
        for c in range(cu, bins + 1):
            h = hist[r, c]
            if below + h >= half and h > 0.0:
                ln_med = lo + (c - 1 + (half - below) / h) * width
                break
            below += h
        excess = math.exp(ln_med) - math.exp(ln_u)
        if excess > 0.0:
            model[r, 0] = math.exp(ln_u)
            model[r, 1] = suffix[r, cu]
            model[r, 2] = excess / math.log(2.0)


@njit(cache=True, inline="always")
def tail_p(hist_row: np.ndarray, suffix_row: np.ndarray, model_row: np.ndarray, d: float, lo: float,
           width: float, min_weight: float) -> float:  # fmt: skip
    """The p-value of deviation d >= 0 against one calibration row; NaN with too little history.

    Below the tail threshold u: the conformal tail (W(D >= d) + 1) / (W + 1), as TailCalibrator.
    Above it: the fitted tail p_u exp(-(d - u) / scale), never below the weight actually
    seen at or above d (W(D >= d) / (W + 1)) and never above the conformal value, so it only
    resolves what the finite history cannot (p below 1 / (W + 1)) and can flag no more of a
    history like the past than the conformal p would, give or take one point."""
    total = suffix_row[0]
    if not (d >= 0.0 and total >= min_weight):
        return np.nan
    bins = len(hist_row) - 2
    col, u = _column(d, lo, width, bins)
    h = hist_row[col]
    tail = suffix_row[col + 1] + (h * (1.0 - (u - (col - 1))) if 1 <= col <= bins else h)
    p = (tail + 1.0) / (total + 1.0)
    excess = model_row[2]
    if excess > 0.0 and d > model_row[0]:
        p_ext = (model_row[1] + 1.0) / (total + 1.0) * math.exp(-(d - model_row[0]) / excess)
        p_seen = tail / (total + 1.0)
        p = min(p, max(p_ext, p_seen))
    return p


# The warm-up's scale, a mean absolute deviation from the median with the largest tenth of the
# deviations left out, times this: consistent with the running mean absolute deviation (E|x - mu| =
# 0.798 sigma) for Gaussian noise, whose lower nine tenths of |x - mu| average 0.657 sigma.
TRIMMED_TO_MEAN_ABS = 0.7979 / 0.6573


@njit(cache=True)
def _robust_start(values: np.ndarray, level: np.ndarray, scale: np.ndarray) -> None:
    """At the end of a metric's warm-up, its baseline from the warm-up's values (`values`, then
    cleared to NaN): the median and a trimmed mean absolute deviation. The running mean and mean
    absolute deviation kept during the warm-up take one wild value at full weight (NVML's
    4294967295 "not available", a unit slip), and the clipped updates after it shrink an inflated
    scale by only beta a sample: one such value among the first 20 left a series blind for ~650
    samples. Both estimates ignore a tenth of the values (the spread takes them all where nine
    tenths sit at the median: a quantised series' rare steps are its noise); a buffer not filled in
    full (a snapshot of an earlier release taken mid-warm-up) keeps the running ones."""
    n = len(values)
    if not np.all(np.isfinite(values)):
        values[:] = np.nan
        return
    med = np.median(values)
    dev = np.sort(np.abs(values - med))
    spread = np.mean(dev[: n - n // 10]) * TRIMMED_TO_MEAN_ABS
    if spread == 0.0:  # a quantised series, nine tenths at its median: the rare steps are its spread
        spread = np.mean(dev)
    if math.isfinite(spread):  # values near the float's limits of both signs overflow: keep the running
        level[0] = med
        scale[0] = spread
    values[:] = np.nan


@njit(cache=True, inline="always")
def cauchy_term(p: float) -> float:
    """tan((0.5 - p) pi), written as cot(p pi) so that a tiny p keeps its precision, with p taken
    at most 0.5 (a term >= 0): the conformal p of a quantised metric is 1 at every tie with its
    past, and tan(-pi / 2) would let one such metric outvote any evidence. What it costs (the
    combination no longer exactly Cauchy) the calibration of the combination gives back."""
    p = min(max(p, 1e-300), 0.5)
    if p < 1e-8:
        return 1.0 / (p * math.pi)  # cot(x) = 1/x - x/3 ...: exact to 1e-16 here
    return 1.0 / math.tan(p * math.pi)


@njit(cache=True, inline="always")
def cauchy_p(t: float) -> float:
    """The upper tail of a standard Cauchy at t: 0.5 - atan(t) / pi, accurate for large t."""
    if t > 1.0:
        return math.atan(1.0 / t) / math.pi
    return 0.5 - math.atan(t) / math.pi


@njit(cache=True, nogil=True, error_model="numpy")
def multivariate_pass(  # state and histograms updated in place; outputs NaN-filled by the caller
    rows: np.ndarray,  # (n,) each sample's group
    x: np.ndarray,  # (n, M) its metrics, NaN = absent
    pools: np.ndarray,  # (K,) each group's calibration pool
    floor: np.ndarray,  # (M,) the least scale of each metric (its resolution)
    # (count (K, M), level, scale, cusum_pos, cusum_neg, z1, z2 (K, M), complete (K,), warm (K, M, warmup))
    state: tuple,
    rel: tuple,  # (mean (K, M), cov (K, M, M), prec (K, M, M))
    params: tuple,  # (warmup, alpha, beta, clip, cusum_k, cov_alpha, shrink, refresh, min_complete)
    # (hist (P, M, S, cols), comb (P, 3, cols), lo, width, min_weight, decay, q_tail, min_tail)
    calibration: tuple,
    out_p: np.ndarray,  # (n,) the calibrated combined p-value
    out_joint_p: np.ndarray,  # (n,) the joint distance's p-value
    out_stat_p: np.ndarray,  # (n, M, S) each statistic's p-value
    out_metric_p: np.ndarray,  # (n, M) each metric's p: its statistics' smallest, calibrated
    out_z: np.ndarray,  # (n, M) each metric's z
    sequential: bool,  # learn each sample before scoring the next (one stream), not once a batch
) -> None:
    count, level, scale, cusum_pos, cusum_neg, z1, z2, complete, warm = state
    mean, cov, prec = rel
    warmup, alpha, beta, clip, cusum_k, cov_alpha, shrink, refresh, min_complete = params
    hist, comb, lo, width, min_weight, decay, q_tail, min_tail = calibration
    n, m = x.shape
    n_pools = hist.shape[0]
    cols = hist.shape[3]
    bins = cols - 2
    rows_n = hist.shape[2]  # N_ROWS: the statistics' rows, then the metric's own
    s_n = rows_n - 1

    unit = np.empty(m * rows_n, dtype=np.bool_)  # a pool's rows that are a statistic, in scales
    for r in range(m * rows_n):
        unit[r] = r % rows_n < s_n
    present = np.zeros(n_pools, dtype=np.bool_)
    for j in range(n):
        present[pools[rows[j]]] = True
    # the tails of every row of the present pools, as they were before this batch
    flat = hist.reshape(n_pools * m * rows_n, cols)
    suffix = np.zeros((n_pools * m * rows_n, cols + 1))
    model = np.zeros((n_pools * m * rows_n, 3))
    # per pool: row 0 the joint distance, 1 the truncated product, 2 the combination
    grp = comb.reshape(n_pools * 3, cols)
    grp_suffix = np.zeros((n_pools * 3, cols + 1))
    grp_model = np.zeros((n_pools * 3, 3))
    for q in range(n_pools):
        if present[q]:
            _pool_models(
                flat, grp, suffix, model, grp_suffix, grp_model, q, unit, lo, width, q_tail, min_tail
            )
    # what this batch adds, per row
    counts = np.zeros((n_pools * m * rows_n, cols))
    grp_counts = np.zeros((n_pools * 3, cols))

    zt = np.empty(m)
    sd = np.empty(m)
    for j in range(n):
        g = rows[j]
        q = pools[g]
        whole = True
        for i in range(m):  # the relation's input: each metric's level against its slow mean, in sds
            sd[i] = math.sqrt(max(cov[g, i, i], floor[i] * floor[i]))
            v = x[j, i]
            if math.isnan(v) or complete[g] == 0:
                zt[i] = 0.0
            else:
                zt[i] = min(max((v - mean[g, i]) / sd[i], -2.0 * clip), 2.0 * clip)
        for i in range(m):
            v = x[j, i]
            if math.isnan(v):
                whole = False
                continue
            c = count[g, i]
            if c < warmup:
                if c == 0:
                    level[g, i] = v
                    scale[g, i] = 0.0
                else:
                    e = v - level[g, i]
                    level[g, i] += e / (c + 1.0)
                    scale[g, i] += (abs(e) - scale[g, i]) / c
                warm[g, i, c] = v
                count[g, i] = c + 1
                if c + 1 == warmup:
                    _robust_start(warm[g, i], level[g, i : i + 1], scale[g, i : i + 1])
                whole = False
                continue
            s_eff = max(scale[g, i], floor[i])
            zi = (v - level[g, i]) / s_eff
            out_z[j, i] = zi
            zc = min(max(zi, -clip), clip)
            cp = max(0.0, cusum_pos[g, i] + zc - cusum_k)
            cn = max(0.0, cusum_neg[g, i] - zc - cusum_k)
            cusum_pos[g, i] = cp
            cusum_neg[g, i] = cn
            # the deviations for now (the relation's below); their p-values once all are known
            out_stat_p[j, i, 0] = abs(zi)
            out_stat_p[j, i, 1] = abs(zi + z1[g, i] + z2[g, i]) / 3.0 if c >= warmup + 2 else np.nan
            out_stat_p[j, i, 2] = max(cp, cn)
            out_stat_p[j, i, 4] = abs(zi - z1[g, i]) if c >= warmup + 1 else np.nan
            z2[g, i] = z1[g, i]
            z1[g, i] = zi
            ec = zc * s_eff
            # a plain running mean until the memory is filled (1 / alpha samples), then EW: a long
            # memory (a day of 1 s samples) is not left to its first samples for a day
            level[g, i] += max(alpha, 1.0 / (c + 1.0)) * ec
            scale[g, i] += max(beta, 1.0 / c) * (abs(ec) - scale[g, i])
            count[g, i] = c + 1
        # the relation: the standardised residual of each metric on all the others, and the
        # levels' joint distance y' P y (a Mahalanobis distance: a combination of levels the
        # group has not shown, even where each metric's own relation holds)
        joint = np.nan
        if complete[g] >= min_complete:
            joint = 0.0
            for i in range(m):
                acc = 0.0
                for k in range(m):
                    acc += prec[g, i, k] * zt[k]
                joint += acc * zt[i]
                if not math.isnan(out_z[j, i]):
                    out_stat_p[j, i, 3] = abs(acc) / math.sqrt(prec[g, i, i])
            joint = math.sqrt(max(joint, 0.0))
        if whole:  # the EW mean and covariance of the levels, and now and then the shrunk inverse
            if complete[g] == 0:  # from the baselines' robust levels, not this one sample's values
                for i in range(m):
                    mean[g, i] = level[g, i]
            else:
                dev = np.empty(m)
                for i in range(m):  # the poisoning guard: a deviation counts at most `clip` sds
                    dev[i] = min(max(x[j, i] - mean[g, i], -clip * sd[i]), clip * sd[i])
                rate = max(cov_alpha, 1.0 / (complete[g] + 1.0))  # running, then EW, as the baseline
                for i in range(m):
                    mean[g, i] += rate * dev[i]
                    for k in range(m):
                        cov[g, i, k] = (1.0 - rate) * (cov[g, i, k] + rate * dev[i] * dev[k])
            complete[g] += 1
            if complete[g] >= min_complete and (complete[g] - min_complete) % refresh == 0:
                sds = np.empty(m)
                for i in range(m):
                    sds[i] = math.sqrt(max(cov[g, i, i], floor[i] * floor[i]))
                corr = np.empty((m, m))
                for i in range(m):
                    for k in range(m):
                        r = cov[g, i, k] / (sds[i] * sds[k])
                        corr[i, k] = (1.0 - shrink) * r + (shrink if i == k else 0.0)
                prec[g] = np.linalg.inv(corr)
        # each deviation to its p-value, and learnt: every sample, flagged or not (leaving flags
        # out thins the tail they come from, which flags more, which thins it more: tried, a
        # healthy group ran away to 1-3 %); per metric the smallest of its statistics' p,
        # calibrated against the metric's own row (Bonferroni's bound while that row is short)
        t = 0.0
        n_p = 0
        tpm = 0.0
        for i in range(m):
            best = np.nan
            for s in range(s_n):
                dv = out_stat_p[j, i, s]
                if math.isnan(dv):
                    continue
                r = (q * m + i) * rows_n + s
                p = tail_p(flat[r], suffix[r], model[r], dv, lo, width, min_weight)
                col, _u = _column(dv, lo, width, bins)
                counts[r, col] += 1.0
                out_stat_p[j, i, s] = p
                if not math.isnan(p) and not p >= best:
                    best = p
            if not math.isnan(best):
                dm = -math.log(max(best, 1e-300))
                r = (q * m + i) * rows_n + s_n
                pm = tail_p(flat[r], suffix[r], model[r], dm, lo, width, min_weight)
                col, _u = _column(dm, lo, width, bins)
                counts[r, col] += 1.0
                if math.isnan(pm):  # the metric's row is short of history: Bonferroni's bound
                    pm = min(1.0, s_n * best)
                elif model[r, 2] == 0.0:  # no tail: beyond its history the bound still resolves
                    pm = min(pm, s_n * best)
                # the smallest of several p-values is never rarer than the smallest itself (the
                # row's extrapolated tail could say so, beyond its history)
                pm = max(pm, best)
                out_metric_p[j, i] = pm
                t += cauchy_term(pm)
                n_p += 1
                if pm < TPM_TAU:
                    tpm += math.log(TPM_TAU / pm)
        if n_p:
            # three families of evidence, each calibrated, combined by Cauchy with equal weights:
            # one metric's (the Cauchy combination over metrics, led by the strongest), several
            # metrics' at once (the truncated product: the sum of ln(tau / p) over the metrics
            # with p < tau, Zaykin et al. 2002, blind to the many ordinary ones), and the levels'
            # joint distance from what the group has shown
            terms = cauchy_term(cauchy_p(t / n_p))
            weight = 1.0
            rt = 3 * q + 1
            pt = tail_p(grp[rt], grp_suffix[rt], grp_model[rt], tpm, lo, width, min_weight)
            col, _u = _column(tpm, lo, width, bins)
            grp_counts[rt, col] += 1.0
            if not math.isnan(pt):
                terms += cauchy_term(pt)
                weight += 1.0
            if not math.isnan(joint):
                rj = 3 * q
                pj = tail_p(grp[rj], grp_suffix[rj], grp_model[rj], joint, lo, width, min_weight)
                col, _u = _column(joint, lo, width, bins)
                grp_counts[rj, col] += 1.0
                out_joint_p[j] = pj
                if not math.isnan(pj):
                    terms += cauchy_term(pj)
                    weight += 1.0
            dc = -math.log(max(cauchy_p(terms / weight), 1e-300))
            rc = 3 * q + 2
            out_p[j] = tail_p(grp[rc], grp_suffix[rc], grp_model[rc], dc, lo, width, min_weight)
            col, _u = _column(dc, lo, width, bins)
            grp_counts[rc, col] += 1.0
        if sequential:  # the next sample sees this one in its calibration: a stream's exact order
            _pool_learn(flat, grp, counts, grp_counts, q, m * rows_n, decay)
            _pool_models(
                flat, grp, suffix, model, grp_suffix, grp_model, q, unit, lo, width, q_tail, min_tail
            )

    if not sequential:
        for q in range(n_pools):
            if present[q]:
                _pool_learn(flat, grp, counts, grp_counts, q, m * rows_n, decay)


@njit(cache=True)
def _pool_models(flat: np.ndarray, grp: np.ndarray, suffix: np.ndarray, model: np.ndarray,
                 grp_suffix: np.ndarray, grp_model: np.ndarray, q: int, unit: np.ndarray, lo: float,
                 width: float, q_tail: float, min_tail: float) -> None:  # fmt: skip
    """The tail models of pool q's rows: its metrics' statistics and its three group rows; `unit`
    (a pool's rows) says which are a statistic in scales (tail_model)."""
    per_pool = len(unit)
    a, b = q * per_pool, (q + 1) * per_pool
    tail_model(flat[a:b], suffix[a:b], lo, width, q_tail, min_tail, model[a:b], unit)
    tail_model(grp[3 * q : 3 * q + 3], grp_suffix[3 * q : 3 * q + 3], lo, width, q_tail, min_tail,
               grp_model[3 * q : 3 * q + 3], np.zeros(3, dtype=np.bool_))  # fmt: skip


@njit(cache=True)
def _pool_learn(flat: np.ndarray, grp: np.ndarray, counts: np.ndarray, grp_counts: np.ndarray, q: int,
                per_pool: int, decay: float) -> None:  # fmt: skip
    """Pool q's histograms decayed once and the counts added (and cleared)."""
    cols = flat.shape[1]
    for r in range(q * per_pool, (q + 1) * per_pool):
        for c in range(cols):
            flat[r, c] = flat[r, c] * decay + counts[r, c]
            counts[r, c] = 0.0
    for r in range(3 * q, 3 * q + 3):
        for c in range(cols):
            grp[r, c] = grp[r, c] * decay + grp_counts[r, c]
            grp_counts[r, c] = 0.0
