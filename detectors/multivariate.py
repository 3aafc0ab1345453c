"""Online multivariate scoring of groups of metrics that belong together (a node's host metrics, an
ASD or SMD machine's 19 or 38): short events, broken relationships and single strong metrics, with
one calibrated score per sample.

``MultivariateScorer(m)`` holds K groups of the same m metrics (K grows as groups appear) and is
fed batches of samples: ``update(rows, x)`` with rows (n,) each sample's group and x (n, m), NaN =
absent. Each sample gets a p-value: "a healthy group gives a p this small at most this often", so
``p <= 0.001`` (score >= 0.999) flags at most ~0.1 % of a healthy group's samples, as every other
statistical score here (detectors/calibration.py). What goes into it is described with the
compiled pass (detectors/multivariate_kernels.py): per metric a robust baseline and five
statistics (point, short window, drift, relation to the other metrics, step since the last
sample), each calibrated against its own history with an exponential tail beyond the seen range
(a metric that never moved: the unit exponential, so its first far move is not capped at its
history's 1 / (history + 1)), and their smallest p calibrated again as the metric's; three
families of evidence (the strongest metric, several metrics at once, the levels' joint
distance) combined by Cauchy's combination, and that calibrated again.

Calibration pools: the histograms are shared by the groups of one pool (``pools``): one pool per
group is "each machine against its own past" (the benchmarks, one machine each); a fleet puts its
nodes in a few pools so that the histograms cost nothing per node. Every statistic is already in
units of its own series' scale, so sharing a histogram compares like with like.

Memory per group: 7 m floats of baselines, m x warmup (20) of warm-up values and 2 m^2 of
covariance and its inverse (m = 19: 9.8 kB, 520 B a metric); per pool 6 m + 3 histograms of
(bins + 2) floats. ``nbytes()`` counts both.

The parameters are chosen by principle (benchmarks/README.md, "Choosing the parameters"); one,
the calibration's halflife, was settled after the first dev-set figures, as that README says.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

import numpy as np

from fleetwatch.detectors.calibration import DEFAULT_BINS, DEFAULT_HI, DEFAULT_LO
from fleetwatch.detectors.multivariate_kernels import N_ROWS, N_STATS, STAT_NAMES, multivariate_pass
from fleetwatch.detectors.rows import Compaction

__all__ = ["STAT_NAMES", "MultivariateParams", "MultivariateScorer", "Scores", "bonferroni_metric_p"]


BASELINE_MEMORY_S = 86_400.0  # what the baseline and the relation model remember (for_interval)


@dataclass(frozen=True)
class MultivariateParams:
    # the baseline, as RobustScorer's: ~1 / alpha samples of memory, warm-up, poisoning guard
    alpha: float = 0.02
    beta: float = 0.02
    warmup: int = 20
    clip: float = 3.0
    cusum_k: float = 1.0  # CUSUM allowance, in scales
    # the relation model: an EW covariance over ~1 / cov_alpha complete samples, shrunk towards
    # independence by `shrink` (m^2 / 2 numbers from a finite window), inverted every `refresh`
    # complete samples, used once it has `min_complete`
    cov_alpha: float = 0.001
    shrink: float = 0.1
    refresh: int = 50
    min_complete: int = 200
    # calibration, as TailCalibrator's, but with a shorter memory: as short as a 0.999 threshold
    # allows. Inside its history a conformal p cannot go below 1 / (history + 1), so the history
    # must hold well over 1 / (1 - 0.999) = 1,000 samples; a halflife of 2,000 keeps about 2,900
    # (halflife / ln 2), three times that, and forgets a past regime (a training period's own
    # anomalies) in days, not weeks. The tail above the top q_tail of each row is fitted once it
    # holds min_tail of weight (SPOT's and POT's usual 98 % threshold).
    halflife: float = 2_000.0
    min_weight: float = 30.0
    bins: int = DEFAULT_BINS
    lo: float = DEFAULT_LO
    hi: float = DEFAULT_HI
    q_tail: float = 0.02
    min_tail: float = 10.0

    @classmethod
    def for_interval(
        cls, interval_s: float, memory_s: float = BASELINE_MEMORY_S, **other: float
    ) -> MultivariateParams:
        """The parameters for samples every `interval_s` seconds: the baseline and the relation
        model remember about `memory_s` (a day: a server's daily cycle is its usual range), the
        rest as given or by default. What the pipeline and the benchmarks run."""
        if not (interval_s > 0 and memory_s >= interval_s):
            raise ValueError("need 0 < interval_s <= memory_s")
        rate = interval_s / memory_s
        return cls(**{"alpha": rate, "beta": rate, "cov_alpha": rate, **other})

    def __post_init__(self) -> None:
        if not (0 < self.alpha <= 1 and 0 < self.beta <= 1 and 0 < self.cov_alpha <= 1):
            raise ValueError("alpha, beta and cov_alpha must be in (0, 1]")
        if not (0 < self.shrink <= 1 and 0 < self.q_tail < 1 and self.hi > self.lo and self.bins > 0):
            raise ValueError("need 0 < shrink <= 1, 0 < q_tail < 1, hi > lo, bins > 0")
        if self.warmup < 1 or self.refresh < 1 or self.min_complete < 1 or self.halflife <= 0:
            raise ValueError("warmup, refresh, min_complete and halflife must be positive")


@dataclass(slots=True)
class Scores:
    """One batch's output, each row a sample."""

    p: np.ndarray  # (n,) calibrated combined p-value, NaN while the group is still learning
    stat_p: np.ndarray  # (n, m, 5) each metric's statistics' p-values (STAT_NAMES), NaN absent
    metric_p: np.ndarray  # (n, m) each metric's own p: its statistics' smallest, calibrated
    joint_p: np.ndarray  # (n,) the p-value of the levels' joint distance, NaN before the model
    z: np.ndarray  # (n, m) each metric's deviation from its baseline, in scales

    @property
    def score(self) -> np.ndarray:
        """1 - p: the project's score scale (>= 0.999: at most ~0.1 % of healthy samples)."""
        return 1.0 - self.p

    def strongest(self) -> tuple[np.ndarray, np.ndarray]:
        """(metric, statistic) of each sample's smallest p (-1, -1 where none), the evidence."""
        n, m, s = self.stat_p.shape  # m >= 1 and s = N_STATS: never empty
        flat = np.where(np.isnan(self.stat_p), np.inf, self.stat_p).reshape(n, m * s)
        best = np.argmin(flat, axis=1)
        none = ~np.isfinite(flat[np.arange(n), best])
        return np.where(none, -1, best // s), np.where(none, -1, best % s)


EARLIER_ROWS = 4  # calibration rows per metric of the release before the step and the metric's row


def bonferroni_metric_p(stat_p: np.ndarray) -> np.ndarray:
    """Each metric's p by Bonferroni's bound, (n, m) from stat_p (n, m, N_STATS): the smallest of its
    statistics' p-values times their number, at most 1; NaN where it has none. Judged against no
    history of its own, unlike Scores.metric_p: what a series' own persistent anomaly, filling its
    pool's row of the metric's smallest p, cannot raise."""
    return np.minimum(1.0, N_STATS * np.fmin.reduce(stat_p, axis=2))


_STATE = (
    "count", "level", "scale", "cusum_pos", "cusum_neg", "z1", "z2", "complete", "mean", "cov", "prec",
    "warm",
)  # fmt: skip


class MultivariateScorer:
    def __init__(self, n_metrics: int, *, floor: float | np.ndarray = 1e-9,
                 params: MultivariateParams | None = None) -> None:  # fmt: skip
        """n_metrics: m, the metrics of every group. floor: the least scale of each metric (scalar or
        (m,)), e.g. its resolution: a metric that never moved is not infinitely surprised by its
        first step of one quantum."""
        self.m = int(n_metrics)
        if self.m < 1:
            raise ValueError("n_metrics must be at least 1")
        self.params = params or MultivariateParams()
        self.floor = np.broadcast_to(np.asarray(floor, dtype=np.float64), (self.m,)).copy()
        if not (np.all(np.isfinite(self.floor)) and np.all(self.floor > 0)):
            raise ValueError("floor must be positive and finite")
        self.k = 0
        self.pools = np.zeros(0, dtype=np.int64)
        self._alloc_groups(0)
        cols = self.params.bins + 2
        self.hist = np.zeros((0, self.m, N_ROWS, cols))
        self.comb = np.zeros((0, 3, cols))  # per pool: joint distance, truncated product, combination

    # -- layout ---------------------------------------------------------------------------------
    def _alloc_groups(self, k: int) -> None:
        m = self.m
        self.count = np.zeros((k, m), dtype=np.int64)
        self.complete = np.zeros(k, dtype=np.int64)
        for name in ("level", "scale", "cusum_pos", "cusum_neg", "z1", "z2", "mean"):
            setattr(self, name, np.zeros((k, m)))
        self.cov = np.zeros((k, m, m))
        self.prec = np.zeros((k, m, m))
        # each metric's warm-up values, from which its baseline starts (NaN once it has); float64:
        # float32's 7 digits made 1e8 + noise 20 equal values, a spread of 0 (480 B a GPU)
        self.warm = np.full((k, m, self.params.warmup), np.nan)

    def add_groups(self, pools: np.ndarray) -> np.ndarray:
        """Room for len(pools) more groups in these calibration pools; returns their rows."""
        pools = np.asarray(pools, dtype=np.int64).reshape(-1)
        if pools.size and pools.min() < 0:
            raise ValueError("pools must be non-negative")
        new = np.arange(self.k, self.k + len(pools))
        self.relayout(Compaction.keeping(self.k, np.arange(self.k)), self.k + len(pools),
                      np.concatenate([self.pools, pools]))  # fmt: skip
        return new

    def relayout(self, groups: Compaction, k: int, pools: np.ndarray | None = None) -> None:
        """Keep the groups `groups` keeps, renumbered, among k groups (the owner's new layout after
        forgetting some or growing; new groups in pool 0 unless `pools` (k,) says otherwise). The
        histograms, per pool, stay."""
        for name in _STATE:
            setattr(self, name, groups.take(getattr(self, name), np.nan if name == "warm" else 0, k))
        kept = groups.take(self.pools, 0, k)
        self.pools = kept if pools is None else np.asarray(pools, dtype=np.int64).copy()
        self.k = k
        self._pool_rows(int(self.pools.max()) + 1 if k else 0)

    def _pool_rows(self, need: int) -> None:
        """Histogram rows (empty) up to `need` pools: the compiled pass indexes them by pool
        without bounds checks."""
        if need > self.hist.shape[0]:
            grow = need - self.hist.shape[0]
            self.hist = np.concatenate([self.hist, np.zeros((grow, *self.hist.shape[1:]))])
            self.comb = np.concatenate([self.comb, np.zeros((grow, *self.comb.shape[1:]))])

    # -- the batch ------------------------------------------------------------------------------
    def update(self, rows: np.ndarray, x: np.ndarray, *, sequential: bool = False) -> Scores:
        """Score, then learn, a batch: rows (n,) group rows (add_groups), x (n, m) the samples in
        each group's order. Samples are scored against the calibration as it was before the batch;
        `sequential`: as it was before each sample (exactly as one call per sample, for one stream
        read at once)."""
        rows = np.ascontiguousarray(rows, dtype=np.int64).reshape(-1)
        x = np.ascontiguousarray(x, dtype=np.float64)
        if x.shape != (len(rows), self.m):
            raise ValueError(f"expected x of shape ({len(rows)}, {self.m}), got {x.shape}")
        if len(rows) and (rows.min() < 0 or rows.max() >= self.k):
            raise ValueError(f"group rows must be in 0..{self.k - 1}")
        n = len(rows)
        out = Scores(np.full(n, np.nan), np.full((n, self.m, N_STATS), np.nan), np.full((n, self.m), np.nan),
                     np.full(n, np.nan), np.full((n, self.m), np.nan))  # fmt: skip
        if n == 0:
            return out
        # inf would poison a baseline for good: an absent value, as the batch decoder makes it
        x = np.where(np.isfinite(x), x, np.nan)
        p = self.params
        state = (
            self.count,
            self.level,
            self.scale,
            self.cusum_pos,
            self.cusum_neg,
            self.z1,
            self.z2,
            self.complete,
            self.warm,
        )
        rel = (self.mean, self.cov, self.prec)
        params = (
            p.warmup,
            p.alpha,
            p.beta,
            p.clip,
            p.cusum_k,
            p.cov_alpha,
            p.shrink,
            p.refresh,
            p.min_complete,
        )
        width = (p.hi - p.lo) / p.bins
        decay = 0.5 ** (1.0 / p.halflife)
        cal = (self.hist, self.comb, p.lo, width, p.min_weight, decay, p.q_tail, p.min_tail)
        multivariate_pass(
            rows,
            x,
            self.pools,
            self.floor,
            state,
            rel,
            params,
            cal,
            out.p,
            out.joint_p,
            out.stat_p,
            out.metric_p,
            out.z,
            sequential,
        )
        return out

    # -- state ----------------------------------------------------------------------------------
    def to_state(self) -> dict[str, np.ndarray]:
        """Plain arrays (np.savez- and msgpack-friendly); ``from_state`` inverts it exactly."""
        st = {name: getattr(self, name).copy() for name in _STATE}
        st.update(
            pools=self.pools.copy(), floor=self.floor.copy(), hist=self.hist.copy(), comb=self.comb.copy()
        )
        for f in fields(MultivariateParams):
            st[f"param_{f.name}"] = np.asarray(getattr(self.params, f.name), dtype=np.float64)
        return st

    @classmethod
    def from_state(
        cls, st: dict[str, np.ndarray], params: MultivariateParams | None = None
    ) -> MultivariateScorer:
        """The scorer a snapshot holds; `params` (the deployment's) override the snapshot's, as
        every detector takes its configuration from the deployment. The histogram shape is the
        snapshot's (its bins)."""
        saved = {f.name: st[f"param_{f.name}"].item() for f in fields(MultivariateParams)}
        for name in ("warmup", "bins", "refresh", "min_complete"):
            saved[name] = int(saved[name])
        chosen = params or MultivariateParams(**saved)
        if chosen.bins != saved["bins"] or chosen.lo != saved["lo"] or chosen.hi != saved["hi"]:
            chosen = MultivariateParams(
                **{**asdict(chosen), "bins": saved["bins"], "lo": saved["lo"], "hi": saved["hi"]}
            )
        obj = cls(len(st["floor"]), floor=st["floor"], params=chosen)
        obj.add_groups(st["pools"])
        for name in _STATE:
            if name == "warm" and (name not in st or st[name].shape != obj.warm.shape):
                continue  # an earlier release's snapshot, or another warm-up length: running estimates
            getattr(obj, name)[...] = st[name]  # a wrong shape raises here
        # The compiled pass indexes the histograms by pool without bounds checks: a snapshot's
        # must have this scorer's shape, and a row for every pool (a snapshot written before any
        # group existed holds none: its pools start empty here).
        cols = chosen.bins + 2
        hist, comb = np.asarray(st["hist"], dtype=np.float64), np.asarray(st["comb"], dtype=np.float64)
        if hist.ndim == 4 and hist.shape[1:] == (obj.m, EARLIER_ROWS, cols):
            # an earlier release's (point, short, drift, relation): the step's and the metric's rows
            # learn afresh, the metric's p Bonferroni's bound until its row has history
            new_rows = np.zeros((len(hist), obj.m, N_ROWS - EARLIER_ROWS, cols))
            hist = np.concatenate([hist, new_rows], axis=2)
        if hist.shape[1:] != (obj.m, N_ROWS, cols) or comb.shape[1:] != (3, cols) or len(hist) != len(comb):
            raise ValueError(f"snapshot histograms {hist.shape} and {comb.shape} do not fit {obj.m} metrics")
        obj._pool_rows(len(hist))  # pools no group is in are kept, as relayout keeps them
        obj.hist[: len(hist)] = hist
        obj.comb[: len(comb)] = comb
        return obj

    def nbytes(self) -> int:
        """Bytes of state held: every group's arrays and every pool's histograms."""
        arrays = [getattr(self, name) for name in _STATE] + [self.pools, self.hist, self.comb]
        return int(sum(a.nbytes for a in arrays))
