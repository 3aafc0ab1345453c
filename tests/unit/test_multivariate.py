"""The multivariate scorer (detectors/multivariate.py): calibrated on healthy data, and able to see
what the per-metric scorer could not: one strong metric, a short event, a broken relationship."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from fleetwatch.detectors.multivariate import (
    STAT_NAMES,
    MultivariateParams,
    MultivariateScorer,
    bonferroni_metric_p,
)
from fleetwatch.detectors.multivariate_kernels import N_STATS, cauchy_p, cauchy_term, tail_model, tail_p

M = 8


def healthy(t: int, rng: np.random.Generator, m: int = M) -> np.ndarray:
    """m metrics driven by two shared factors plus noise (metrics that move together), quantised."""
    # slow wandering load: two AR(1) factors around 0.5
    factors = np.empty((t, 2))
    f = np.full(2, 0.5)
    for i, e in enumerate(rng.normal(0, 0.01, (t, 2))):
        f = 0.5 + 0.99 * (f - 0.5) + e
        factors[i] = f
    mix = rng.uniform(0.2, 1.0, (2, m))
    x = 0.3 + 0.4 * factors @ mix / mix.sum(axis=0) + rng.normal(0, 0.02, (t, m))
    return np.round(x, 3)


def stream(scorer: MultivariateScorer, rows: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One sample per batch, as a node's samples arrive: (p (T,), per-statistic p (T, m, N_STATS))."""
    p, sp = np.full(len(x), np.nan), np.full((len(x), x.shape[1], N_STATS), np.nan)
    for t in range(len(x)):
        out = scorer.update(rows, x[t : t + 1])
        p[t], sp[t] = out.p[0], out.stat_p[0]
    return p, sp


def trained(seed: int = 0, t: int = 6000) -> tuple[MultivariateScorer, np.ndarray, np.random.Generator]:
    rng = np.random.default_rng(seed)
    sc = MultivariateScorer(M, floor=0.001)
    rows = sc.add_groups(np.zeros(1, dtype=np.int64))
    stream(sc, rows, healthy(t, rng))
    return sc, rows, rng


def test_healthy_data_is_flagged_at_about_the_nominal_rate() -> None:
    sc, rows, rng = trained()
    p, _ = stream(sc, rows, healthy(6000, rng))
    assert not np.isnan(p).any()
    rate = float(np.mean(p <= 0.001))
    assert rate <= 0.003, rate  # nominal 0.1 %: calibrated, not a flood
    assert float(np.mean(p <= 0.05)) == pytest.approx(0.05, abs=0.03)  # and not dead either


def test_one_strong_metric_speaks_at_its_first_sample() -> None:
    sc, rows, rng = trained()
    x = healthy(50, rng)
    x[20, 3] += 0.5  # one metric, one sample, 25 noise sds: every other metric is ordinary
    p, sp = stream(sc, rows, x)
    assert p[20] <= 1e-4, p[20]  # not capped near 1 / history as the per-metric scorer's was
    metric, stat = np.unravel_index(np.nanargmin(sp[20]), sp[20].shape)
    assert metric == 3 and STAT_NAMES[stat] in ("point", "relation")


def test_a_short_moderate_event_crosses_the_threshold_within_three_samples() -> None:
    sc, rows, rng = trained()
    x = healthy(60, rng)
    x[30:33, :4] += 0.07  # 3.5 noise sds on half the metrics for three samples
    p, _ = stream(sc, rows, x)
    assert (p[30:33] <= 0.001).any(), p[28:36]
    assert not (p[:30] <= 0.001).any()


def test_a_broken_relationship_is_seen_while_every_metric_stays_in_its_range() -> None:
    rng = np.random.default_rng(1)
    sc = MultivariateScorer(4, floor=0.001)
    rows = sc.add_groups(np.zeros(1, dtype=np.int64))
    load = 0.5 + 0.3 * np.sin(np.arange(8000) / 150.0)  # every metric follows the load
    x = np.stack([load, load, 1.0 - load, load], axis=1) + rng.normal(0, 0.01, (8000, 4))
    stream(sc, rows, x[:7000])
    y = x[7000:7060].copy()
    y[30:40, 1] = 1.0 - y[30:40, 1]  # metric 1 mirrors the load: inside its usual range
    assert y[:, 1].min() >= x[:, 1].min() - 0.05 and y[:, 1].max() <= x[:, 1].max() + 0.05
    p, sp = stream(sc, rows, y)
    first = int(np.flatnonzero(p <= 0.001)[0])
    assert 30 <= first <= 32, p[28:42]
    assert np.nanargmin(sp[first, :, 3]) == 1  # the relation statistic names the metric


def test_snapshot_restore_continues_exactly() -> None:
    sc, rows, rng = trained(t=1500)
    more = healthy(300, rng)
    copy = MultivariateScorer.from_state({k: v.copy() for k, v in sc.to_state().items()})
    a, sa = stream(sc, rows, more)
    b, sb = stream(copy, rows, more)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(sa, sb)


def test_one_wild_value_in_the_warm_up_does_not_blind_the_series() -> None:
    """NVML's 4294967295 ("not available") as the 6th sample of a series: the running mean and
    mean absolute deviation took it at full weight, and the clipped updates after shrank the scale
    by beta a sample; spikes of 100 x the level 100-600 samples later scored ~0.52. The baseline now
    starts from the warm-up's median and trimmed deviation: each spike scores as without it."""
    rng = np.random.default_rng(7)
    x = rng.normal(10.0, 1.0, 700)
    spikes = np.arange(100, 700, 100)
    x[spikes] = 1000.0

    def scores(series: np.ndarray) -> np.ndarray:
        sc = MultivariateScorer(1, floor=0.01)
        sc.add_groups(np.zeros(1, dtype=np.int64))
        return sc.update(np.zeros(len(series), dtype=np.int64), series.reshape(-1, 1), sequential=True).p

    clean = scores(x)
    x[5] = 4294967295.0
    wild = scores(x)
    # the spikes' p as on the clean series, give or take the count of one past spike in the
    # histories (their own past spikes in a short history set the bar: 0.001-0.06, and the warm-up
    # moves the baseline a little, which can reorder two spikes); with the running start the
    # first two came out at 0.47
    np.testing.assert_allclose(wild[spikes], clean[spikes], rtol=0.7)
    assert (wild[spikes] < 0.1).all(), wild[spikes]


def one_series(series: np.ndarray, floor: float = 1e-9) -> np.ndarray:
    sc = MultivariateScorer(1, floor=floor)
    sc.add_groups(np.zeros(1, dtype=np.int64))
    return sc.update(np.zeros(len(series), dtype=np.int64), series.reshape(-1, 1), sequential=True).p


def test_the_warm_up_keeps_the_precision_of_a_large_offset() -> None:
    # 1e8 + noise: in float32 the 20 warm-up values were one number, a spread of 0 (a review's find)
    rng = np.random.default_rng(5)
    x = rng.normal(0.0, 1.0, 700)
    x[[300, 600]] += 10.0
    np.testing.assert_allclose(one_series(x + 1e8)[[300, 600]], one_series(x)[[300, 600]], rtol=1e-6)


def test_a_quantised_series_is_flagged_at_about_the_nominal_rate() -> None:
    # whole degrees, nine tenths at one value: the trimmed spread is 0, the steps are the noise
    flagged = total = 0
    for seed in range(20):
        x = np.round(60.0 + np.random.default_rng(seed).normal(0.0, 0.3, 2000))
        p = one_series(x)[100:]
        flagged += int(np.sum(p <= 1e-3))
        total += int(np.sum(~np.isnan(p)))
    assert flagged / total <= 0.001, flagged / total


def test_a_snapshot_without_warm_up_values_restores() -> None:
    """An earlier release's snapshot has no warm-up values: its groups mid-warm-up keep the running
    estimates, the others go on as they were."""
    sc = MultivariateScorer(M, floor=0.01)
    rows = sc.add_groups(np.zeros(2, dtype=np.int64))
    rng = np.random.default_rng(3)
    stream(sc, rows[:1], healthy(400, rng))
    stream(sc, rows[1:], healthy(5, rng))  # the second group mid-warm-up
    old = {k: v.copy() for k, v in sc.to_state().items() if k != "warm"}
    restored = MultivariateScorer.from_state(old)
    assert np.isnan(restored.warm).all()
    more = healthy(100, rng)
    a, _ = stream(sc, rows[:1], more)
    b, _ = stream(restored, rows[:1], more)
    np.testing.assert_array_equal(a, b)
    p, _ = stream(restored, rows[1:], healthy(300, rng))
    assert np.isfinite(restored.level).all() and np.nanmin(p) > 1e-3


def test_restore_takes_the_deployments_parameters() -> None:
    sc, _rows, _ = trained(t=300)
    chosen = MultivariateParams(alpha=0.05, bins=16)  # bins are the snapshot's: its histograms' shape
    restored = MultivariateScorer.from_state(sc.to_state(), chosen)
    assert restored.params.alpha == 0.05 and restored.params.bins == sc.params.bins


def test_state_per_series_is_under_two_kib_with_pooled_calibration() -> None:
    sc = MultivariateScorer(19, floor=0.01)
    sc.add_groups(np.zeros(1000, dtype=np.int64))  # a thousand nodes in one pool
    assert sc.nbytes() / (1000 * 19) <= 2048
    alone = MultivariateScorer(19, floor=0.01)
    alone.add_groups(np.zeros(1, dtype=np.int64))  # one machine with its own histograms (benchmarks)
    assert alone.nbytes() / 19 <= 4096


def test_groups_are_independent_and_pools_share_calibration() -> None:
    rng = np.random.default_rng(2)
    sc = MultivariateScorer(M, floor=0.001)
    rows = sc.add_groups(np.array([0, 0, 1]))
    x = healthy(400, rng)
    for t in range(400):  # three groups in one batch each tick, the third in a pool of its own
        sc.update(rows, np.stack([x[t], x[t], x[t] + 0.1]))
    assert np.array_equal(sc.level[0], sc.level[1]) and not np.array_equal(sc.level[0], sc.level[2])
    assert sc.hist[0].sum() > sc.hist[1].sum()  # pool 0 holds two groups' statistics


def test_for_interval_remembers_a_day() -> None:
    p = MultivariateParams.for_interval(300.0)
    assert p.alpha == pytest.approx(1 / 288) and p.cov_alpha == p.alpha == p.beta
    with pytest.raises(ValueError):
        MultivariateParams.for_interval(0.0)


def test_tail_beyond_the_history_is_extrapolated_not_capped() -> None:
    rng = np.random.default_rng(3)
    d = np.abs(rng.normal(size=20_000))
    bins, lo, hi = 56, -5.0, 9.0
    width = (hi - lo) / bins
    hist = np.zeros((1, bins + 2))
    cols = np.clip(np.floor((np.log(np.maximum(d, 1e-300)) - lo) / width), -1, bins).astype(int) + 1
    np.add.at(hist[0], cols, 1.0)
    suffix, model = np.zeros((1, bins + 3)), np.zeros((1, 3))
    tail_model(hist, suffix, lo, width, 0.02, 10.0, model, np.ones(1, dtype=np.bool_))
    ps = [tail_p(hist[0], suffix[0], model[0], v, lo, width, 30.0) for v in (0.5, 2.0, 3.0, 5.0, 8.0)]
    assert all(a >= b for a, b in itertools.pairwise(ps))  # monotone
    assert ps[0] == pytest.approx(math.erfc(0.5 / math.sqrt(2)), abs=0.02)  # inside: the empirical tail
    assert ps[4] < 0.1 / 20_001 and ps[1] > 1 / 20_001  # beyond the history: below what a cap says
    assert ps[4] >= math.erfc(8.0 / math.sqrt(2))  # exponential tail: never below the normal's


@pytest.mark.parametrize("shape", ["heavy_tailed", "switching"])
def test_harder_healthy_data_is_flagged_at_about_the_nominal_rate(shape: str) -> None:
    """Noise with Student-t (3) tails (a metric's statistics beyond their history extrapolate an
    exponential, lighter than that), or a load switching between two levels every 50 samples (a
    mixture: every switch moves all metrics at once): the output's own calibration, floored by
    what its history holds, keeps them near nominal (eight seeds of 20,000 samples: 0.076 % and
    0.069 % mean, at most 0.095 %; with that floor off, 0.125 % and 0.150 %)."""
    rng = np.random.default_rng(2)
    x = healthy(16_000, rng)
    if shape == "heavy_tailed":
        x = np.round(x + 0.01 * rng.standard_t(3, x.shape), 3)
    else:
        level = np.repeat(rng.integers(0, 2, len(x) // 50 + 1), 50)[: len(x)]
        x = x + 0.1 * level[:, None] * np.linspace(0.5, 1.5, M)
    sc = MultivariateScorer(M, floor=0.001)
    rows = sc.add_groups(np.zeros(1, dtype=np.int64))
    p, _ = stream(sc, rows, x)
    rate = float(np.mean(p[6000:] <= 0.001))
    assert rate <= 0.002, rate
    assert float(np.mean(p[6000:] <= 0.05)) == pytest.approx(0.05, abs=0.03)  # and not dead either


def test_cauchy_combination_is_led_by_the_smallest_p() -> None:
    assert cauchy_p(cauchy_term(1e-9)) == pytest.approx(1e-9, rel=1e-6)
    assert cauchy_p(cauchy_term(0.3)) == pytest.approx(0.3, rel=1e-9)
    assert cauchy_term(1.0) == cauchy_term(0.5) == pytest.approx(0.0, abs=1e-12)  # ties at 1 outvote nothing
    mean = (cauchy_term(1e-8) + 9 * cauchy_term(0.5)) / 10
    assert cauchy_p(mean) == pytest.approx(1e-7, rel=1e-3)  # one strong p among ten: about m x p


def test_bad_input_is_refused_or_absent() -> None:
    sc = MultivariateScorer(3, floor=0.01)
    rows = sc.add_groups(np.zeros(1, dtype=np.int64))
    with pytest.raises(ValueError):
        sc.update(rows, np.zeros((1, 4)))
    with pytest.raises(ValueError):
        sc.update(np.array([5]), np.zeros((1, 3)))
    with pytest.raises(ValueError):
        MultivariateScorer(3, floor=0.0)
    out = sc.update(rows, np.array([[np.inf, -np.inf, np.nan]]))
    assert np.isnan(out.p).all() and (sc.count == 0).all()  # infinities are absent values


@settings(max_examples=40, deadline=None)
@given(arrays(np.float64, (30, 3), elements=st.floats(allow_nan=True, allow_infinity=True, width=64)))
def test_any_values_give_p_in_range_and_keep_the_state_finite(x: np.ndarray) -> None:
    sc, rows, rng = MultivariateScorer(3, floor=0.01), None, np.random.default_rng(4)
    rows = sc.add_groups(np.zeros(1, dtype=np.int64))
    stream(sc, rows, np.round(rng.normal(0.5, 0.05, (300, 3)), 2))
    p, sp = stream(sc, rows, x)
    ok = ~np.isnan(p)
    assert ((p[ok] >= 0) & (p[ok] <= 1)).all()
    ok = ~np.isnan(sp)
    assert ((sp[ok] >= 0) & (sp[ok] <= 1)).all()
    for name in ("level", "scale", "cusum_pos", "cusum_neg", "mean", "cov", "prec"):
        assert np.isfinite(getattr(sc, name)).all(), name


@settings(max_examples=40, deadline=None)
@given(arrays(np.float64, (30, 3), elements=st.floats(allow_nan=True, allow_infinity=True, width=64)))
def test_any_values_in_the_warm_up_keep_the_state_finite(x: np.ndarray) -> None:
    sc = MultivariateScorer(3, floor=0.01)
    rows = sc.add_groups(np.zeros(1, dtype=np.int64))
    p, _ = stream(sc, rows, x)  # the warm-up (20 values a metric) among them
    ok = ~np.isnan(p)
    assert ((p[ok] >= 0) & (p[ok] <= 1)).all()
    for name in ("level", "scale", "mean"):
        assert not np.isnan(getattr(sc, name)).any(), name


def test_a_sequential_pass_is_one_sample_per_batch() -> None:
    rng = np.random.default_rng(5)
    x = healthy(800, rng)
    x[600:603, 2] += 0.3
    one, whole = MultivariateScorer(M, floor=0.001), MultivariateScorer(M, floor=0.001)
    rows = one.add_groups(np.zeros(1, dtype=np.int64))
    whole.add_groups(np.zeros(1, dtype=np.int64))
    p, sp = stream(one, rows, x)
    out = whole.update(np.zeros(len(x), dtype=np.int64), x, sequential=True)
    np.testing.assert_allclose(out.p, p, rtol=1e-12, equal_nan=True)
    np.testing.assert_allclose(out.stat_p, sp, rtol=1e-12, equal_nan=True)
    assert (p[600:603] <= 0.001).any()


def test_a_snapshot_taken_before_any_group_restores_with_room_for_its_pools() -> None:
    """The detect worker snapshots a partition's task as soon as it is assigned: the scorer then
    has no group and no histogram row. Restored into a layout with groups, every pool gets its
    rows (the compiled pass indexes them without bounds checks: a missing row was a heap
    corruption in a real worker)."""
    empty = MultivariateScorer(M, floor=0.001).to_state()
    assert empty["hist"].shape[0] == 0
    grown = MultivariateScorer(M, floor=0.001)
    grown.add_groups(np.zeros(4, dtype=np.int64))
    st = {**grown.to_state(), "hist": empty["hist"], "comb": empty["comb"]}
    sc = MultivariateScorer.from_state(st)
    assert sc.hist.shape[0] == sc.comb.shape[0] == 1
    rng = np.random.default_rng(6)
    stream(sc, np.array([2]), healthy(50, rng))
    assert sc.hist[0].sum() > 0


def test_a_snapshot_whose_histograms_do_not_fit_is_refused() -> None:
    sc = MultivariateScorer(M, floor=0.001)
    sc.add_groups(np.zeros(2, dtype=np.int64))
    st = sc.to_state()
    with pytest.raises(ValueError, match="histograms"):
        MultivariateScorer.from_state({**st, "hist": np.zeros((1, M + 1, 4, 58))})
    with pytest.raises(ValueError):
        MultivariateScorer.from_state({**st, "count": np.zeros((3, M), dtype=np.int64)})


_BOUNDS_CHECKED = """
import numpy as np
from fleetwatch.detectors.multivariate import MultivariateScorer
rng = np.random.default_rng(7)
x = np.round(rng.normal(0.5, 0.05, (400, 5)), 2)
x[rng.random(x.shape) < 0.05] = np.nan
x[300, 1] = 50.0
empty = MultivariateScorer(5, floor=0.01).to_state()
sc = MultivariateScorer(5, floor=0.01)
sc.add_groups(np.array([0, 1, 1]))
sc = MultivariateScorer.from_state({**sc.to_state(), "hist": empty["hist"], "comb": empty["comb"]})
for t in range(0, 400, 4):  # three groups in two pools, several samples of a group per batch
    rows = np.array([0, 1, 2, 0])
    sc.update(rows, x[t : t + 4])
sc.update(np.zeros(400, dtype=np.int64), x, sequential=True)
from fleetwatch.detectors.rows import Compaction
sc.relayout(Compaction.keeping(3, np.array([0, 2])), 6)
sc.update(np.array([5, 1]), x[:2])
print("ok")
"""


def test_the_compiled_pass_stays_in_bounds() -> None:
    """The pass above (pools, a restore from an empty snapshot, batches, the sequential mode, a
    relayout, missing values and a huge one) under numba's bounds checking: an index out of range
    raises there instead of writing past an array."""
    from tests.helpers.bounds_checked import run_bounds_checked

    done = run_bounds_checked(_BOUNDS_CHECKED, timeout_s=280)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


def test_a_snapshot_of_the_release_before_the_step_restores_its_statistics_rows() -> None:
    """An earlier release's histograms hold four rows per metric (point, short, drift, relation):
    restored, those keep their history, the step's and the metric's own rows start empty, and the
    metric's p is Bonferroni's bound over the five statistics until its row has history."""
    rng = np.random.default_rng(3)
    sc = MultivariateScorer(3, floor=0.01)
    rows = sc.add_groups(np.zeros(1, dtype=np.int64))
    sc.update(np.zeros(400, dtype=np.int64), rng.normal(0, 1, (400, 3)), sequential=True)
    st = sc.to_state()
    st["hist"] = st["hist"][:, :, :4, :]  # as the release before wrote it
    old = MultivariateScorer.from_state(st)
    assert old.hist.shape == sc.hist.shape
    np.testing.assert_array_equal(old.hist[:, :, :4], sc.hist[:, :, :4])
    assert not old.hist[:, :, 4:].any()
    out = old.update(rows, rng.normal(0, 1, (1, 3)))
    np.testing.assert_allclose(out.metric_p, bonferroni_metric_p(out.stat_p))
    assert np.isfinite(out.p).all()
    bad = dict(st, hist=st["hist"][:, :, :3, :])  # neither this release's shape nor the one before's
    with pytest.raises(ValueError, match="do not fit"):
        MultivariateScorer.from_state(bad)


def test_each_metric_p_is_its_smallest_statistic_p_calibrated_not_charged_per_statistic() -> None:
    """On healthy data the metric's own p is calibrated like every other (about its nominal rate
    at 0.001), and where the statistics move together it is no larger than Bonferroni's bound
    charges: a fifth statistic does not make the other four's evidence five fourths weaker."""
    rng = np.random.default_rng(11)
    sc = MultivariateScorer(1, floor=1e-9)
    sc.add_groups(np.zeros(1, dtype=np.int64))
    x = rng.standard_t(5, 30_000).reshape(-1, 1)
    out = sc.update(np.zeros(len(x), dtype=np.int64), x, sequential=True)
    metric, bonf = out.metric_p[5000:, 0], bonferroni_metric_p(out.stat_p)[5000:, 0]
    assert np.mean(metric <= 1e-3) < 2e-3, np.mean(metric <= 1e-3)
    small = bonf < 0.01  # the samples where some statistic is far out
    assert small.sum() > 50 and np.median(metric[small] / bonf[small]) < 1.0


def test_a_metric_p_is_never_rarer_than_its_smallest_statistic_p() -> None:
    # a spike past the metric row's history: its extrapolated tail said 9e-54 where the smallest
    # statistic p was 3e-47 (a review's find); the smallest of several p-values is not rarer
    rng = np.random.default_rng(5)
    x = rng.normal(0, 1, (400, 1))
    x[300:305] = 60.0
    sc = MultivariateScorer(1, floor=1e-9)
    sc.add_groups(np.zeros(1, dtype=np.int64))
    out = sc.update(np.zeros(len(x), dtype=np.int64), x, sequential=True)
    smallest = np.fmin.reduce(out.stat_p, axis=2)
    known = ~np.isnan(out.metric_p)
    assert known.sum() > 300 and (out.metric_p[known] >= smallest[known]).all()


def test_a_metric_that_never_moved_is_not_capped_at_its_history_when_it_moves_far() -> None:
    """ASD omi-6's event at test sample 750: a metric constant over all its history jumped 50
    resolution steps and each of its statistics said 1 / (history + 1), no more, so one metric
    among 19 could not reach 0.999 (found 16 samples later through others). Beyond ~8 scales it
    is now as rare as Laplace noise at its floor would make it; one step is not."""
    x = healthy(6003, np.random.default_rng(0))
    x[:, 5] = 0.5  # a metric that never moves: its rows hold nothing but zeros
    jump, step = x.copy(), x.copy()
    jump[6001, 5] = 0.55  # 50 resolution steps
    step[6001, 5] = 0.501  # one
    out = {}
    for name, series in (("jump", jump), ("step", step)):
        sc = MultivariateScorer(M, floor=0.001)
        out[name] = stream(sc, sc.add_groups(np.zeros(1, dtype=np.int64)), series)
    history = 1.0 / (1.0 + 1.0 / (1.0 - 0.5 ** (1.0 / sc.params.halflife)))  # 1 / (W + 1)
    (p_jump, sp_jump), (_, sp_step) = out["jump"], out["step"]
    point = STAT_NAMES.index("point")
    assert sp_jump[6001, 5, point] < 1e-15 and p_jump[6001] <= 1e-3, (sp_jump[6001, 5], p_jump[6001])
    assert np.nanmin(sp_step[6001, 5]) >= 0.9 * history, (sp_step[6001, 5], history)


def test_the_tail_of_a_row_of_zeros_is_the_unit_exponential_only_with_a_full_history() -> None:
    bins, lo, width = 56, -5.0, 14.0 / 56
    rows = 7
    hist = np.zeros((rows, bins + 2))
    hist[:, 0] = [2885.0, 100.0, 2865.0, 2885.0, 2865.0, 2876.0, 2885.0]
    hist[2, 30] = 20.0  # 20 moves of ~10 scales: too few to fit a tail, too large to ignore
    hist[3, 1] = 5.0  # a few tiny moves: a series that never moved a scale
    hist[4, 20] = 20.0  # 20 moves just under one scale: still within its noise floor
    hist[5, 39] = 9.0  # 9 spikes of ~100 scales (a review's case): no unit tail from zero
    unit = np.array([True, True, True, True, True, True, False])  # the last: not in scales
    suffix, model = np.zeros((rows, bins + 3)), np.zeros((rows, 3))
    tail_model(hist, suffix, lo, width, 0.02, 10.0, model, unit)
    assert model[0].tolist() == [math.exp(lo), 2885.0, 1.0] and model[3, 2] == 1.0 and model[4, 2] == 1.0
    assert model[1, 2] == 0.0 and model[2, 2] == 0.0 and model[5, 2] == 0.0 and model[6, 2] == 0.0
    conformal = 1.0 / 2886.0
    far = tail_p(hist[0], suffix[0], model[0], 30.0, lo, width, 30.0)
    assert far == pytest.approx(math.exp(-(30.0 - math.exp(lo))))
    assert tail_p(hist[0], suffix[0], model[0], 2.0, lo, width, 30.0) == pytest.approx(conformal)
    assert tail_p(hist[1], suffix[1], model[1], 30.0, lo, width, 30.0) == pytest.approx(1.0 / 101.0)
    assert tail_p(hist[5], suffix[5], model[5], 120.0, lo, width, 30.0) == pytest.approx(conformal)
