"""Online statistical detectors: calibration meaning, detection of injected faults, NaN handling,
snapshot/restore, vectorised == separate runs, fleet-relative scoring, memory."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetwatch.detectors.calibration import ScalarTailCalibrator, TailCalibrator
from fleetwatch.detectors.statistical import (
    NodeCombiner,
    RobustScorer,
    UnivariateScorer,
    fleet_robust_z,
    sibling_robust_z,
)


def run(scorer: RobustScorer, xs: np.ndarray) -> np.ndarray:
    return np.array([scorer.update(x) for x in xs])


def healthy_rates(noise: np.ndarray, burn: int = 2000) -> tuple[float, float]:
    """Share of healthy scored points >= 0.99 and >= 0.999 after the calibration has history."""
    s = run(RobustScorer(noise.shape[1]), noise)[burn:]
    s = s[~np.isnan(s)]
    assert s.size > 0.9 * noise[burn:].size
    assert ((s >= 0.0) & (s <= 1.0)).all()
    return float(np.mean(s >= 0.99)), float(np.mean(s >= 0.999))


@pytest.mark.parametrize("kind", ["gaussian", "student_t3"])
def test_calibration_meaning_on_healthy_noise(kind: str) -> None:
    rng = np.random.default_rng(1)
    shape = (6000, 40)
    noise = rng.standard_normal(shape) if kind == "gaussian" else rng.standard_t(3, shape)
    r99, r999 = healthy_rates(noise)
    # the documented bound is P(score >= t) <= 1 - t; Bonferroni makes it a bit conservative
    assert 0.004 <= r99 <= 0.0125, r99
    assert 0.0002 <= r999 <= 0.0016, r999


def test_injected_spike_shift_ramp_scored_high_soon_after_onset() -> None:
    rng = np.random.default_rng(3)
    t0, t = 3000, 3300
    x = rng.standard_normal((t, 4))
    x[t0, 0] += 8.0  # spike
    x[t0:, 1] += 4.0  # level shift
    x[t0:, 2] += 0.05 * np.arange(t - t0)  # slow ramp: 0.05 sigma per tick
    s = run(RobustScorer(4), x)[t0:]  # series 3 stays healthy
    assert s[0, 0] >= 0.999
    assert s[:3, 1].max() >= 0.999
    assert np.nanmax(s[:40, 2]) >= 0.999  # within 40 ticks, i.e. before the ramp is 2 sigma high
    assert np.mean(s[:, 3] >= 0.999) < 0.01
    # the shift stays flagged for a while: the guard keeps it from being absorbed at once
    assert np.mean(s[:20, 1] >= 0.99) >= 0.8


def test_poisoning_guard_limits_baseline_move() -> None:
    rng = np.random.default_rng(4)
    sc = RobustScorer(1, alpha=0.02, clip=3.0)
    run(sc, rng.standard_normal((500, 1)))
    level, scale = sc.level[0], sc.scale[0]
    sc.update(np.array([1e6]))
    assert abs(sc.level[0] - level) <= 0.02 * 3.0 * scale + 1e-12
    assert sc.scale[0] <= scale * (1 + 0.02 * 3.0)


def test_nan_is_no_update_and_no_score() -> None:
    rng = np.random.default_rng(5)
    sc = RobustScorer(3)
    run(sc, rng.standard_normal((300, 3)))
    before = sc.to_state()
    out = sc.update(np.array([np.nan, 0.1, np.nan]))
    after = sc.to_state()
    assert math.isnan(out[0]) and math.isnan(out[2]) and not math.isnan(out[1])
    for key in ("n", "level", "scale", "cusum_pos", "cusum_neg"):
        assert after[key][0] == before[key][0] and after[key][2] == before[key][2]
        assert key == "n" or after[key][1] != before[key][1] or key.startswith("cusum")
    # warm-up: no score for the first `warmup` samples nor before the calibration has history
    fresh = RobustScorer(2, warmup=20, min_weight=30)
    s = run(fresh, rng.standard_normal((60, 2)))
    assert np.isnan(s[:50]).all() and not np.isnan(s[51:]).any()  # (decay: 30 samples weigh < 30)


def test_snapshot_restore_gives_identical_scores() -> None:
    rng = np.random.default_rng(6)
    x = rng.standard_normal((1500, 5))
    x[rng.random(x.shape) < 0.05] = np.nan
    groups = np.array([0, 0, 1, 1, 2])
    a = RobustScorer(5, groups=groups, peer_groups=np.zeros(5, dtype=np.int64), min_peers=3)
    run(a, x[:1000])
    st = {k: np.array(v) for k, v in a.to_state().items()}  # plain arrays only
    b = RobustScorer.from_state(st)
    np.testing.assert_array_equal(run(a, x[1000:]), run(b, x[1000:]))


def test_vectorised_equals_separate_runs_and_scalar_path() -> None:
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3000, 4)) * np.array([1.0, 10.0, 0.1, 3.0]) + np.array([0, 5, -2, 100])
    x[rng.random(x.shape) < 0.1] = np.nan
    x[2900, 1] = 205.0
    together = run(RobustScorer(4), x)
    for k in range(4):
        alone = run(RobustScorer(1), x[:, k : k + 1])[:, 0]
        np.testing.assert_allclose(together[:, k], alone, rtol=0, atol=1e-12)
        scalar = np.array(UnivariateScorer().score_many(x[:, k].tolist()))
        np.testing.assert_allclose(scalar, alone, rtol=0, atol=1e-9)
    assert together[2900, 1] >= 0.999  # needs ~2000 scored values of history


def test_scalar_and_vector_calibrators_agree() -> None:
    rng = np.random.default_rng(8)
    d = np.abs(rng.standard_t(2, 5000))
    d[::97] = 0.0  # ties at zero, as in quantised data
    vec = TailCalibrator(1, halflife=500.0)
    sca = ScalarTailCalibrator(halflife=500.0)
    g = np.zeros(1, dtype=np.int64)
    for v in d:
        a = vec.score_add(g, np.array([v]))[0]
        b = sca.score_add(float(v))
        assert (math.isnan(a) and math.isnan(b)) or abs(a - b) < 1e-9


class _NumpyTailCalibrator:
    """TailCalibrator's definition in whole-array numpy (what it computed before its compiled
    pass): suffix sums of the decayed histogram, the fraction of a regular bin above d, groups
    decayed once per batch and then given their counts."""

    def __init__(self, n_groups: int, halflife: float, min_weight: float) -> None:
        self.ref = TailCalibrator(n_groups, halflife=halflife, min_weight=min_weight)
        self.hist = self.ref.hist.copy()

    def score_add(self, g: np.ndarray, d: np.ndarray, score: bool = True, add: bool = True) -> np.ndarray:
        c = self.ref
        out = np.full(d.shape, np.nan)
        ok = ~np.isnan(d)
        g, d = g[ok], d[ok]
        with np.errstate(divide="ignore"):
            u = (np.log(d) - c.lo) / ((c.hi - c.lo) / c.bins)
        col = (np.minimum(np.maximum(np.floor(u), -1.0), float(c.bins)) + 1.0).astype(np.int64)
        regular = (col >= 1) & (col <= c.bins)
        if score:
            suffix = np.zeros((self.hist.shape[0], c.bins + 3))
            suffix[:, :-1] = np.cumsum(self.hist[:, ::-1], axis=1)[:, ::-1]
            h, total, above = self.hist[g, col], suffix[g, 0], suffix[g, col + 1]
            tail = above + np.where(regular, h * (1.0 - np.where(regular, u - (col - 1), 0.0)), h)
            s = 1.0 - (tail + 1.0) / (total + 1.0)
            out[ok] = np.where(total >= c.min_weight, np.maximum(s, 0.0), np.nan)
        if add:
            present = np.bincount(g, minlength=self.hist.shape[0]) > 0
            self.hist[present] *= c.decay
            self.hist += np.bincount(g * (c.bins + 2) + col, minlength=self.hist.size).reshape(
                self.hist.shape
            )
        return out


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 4),  # calibration groups
    st.lists(
        st.tuples(
            st.sampled_from(["score", "add", "score_add"]),
            st.lists(
                st.tuples(
                    st.integers(0, 3),
                    st.one_of(
                        st.floats(0.0, 1e5),  # statistics are >= 0
                        st.sampled_from([0.0, math.nan, math.inf, 1.0, 2.5]),  # ties, gaps, overflow
                    ),
                ),
                max_size=40,
            ),
        ),
        min_size=1,
        max_size=25,
    ),
)
def test_tail_calibrator_keeps_its_numpy_definition(n_groups: int, calls: list[Any]) -> None:
    """The compiled pass holds the same histograms as the whole-array definition, and scores to
    within a few ulps (its ln may round differently in the last bit)."""
    cal = TailCalibrator(n_groups, halflife=5.0, min_weight=3.0)
    ref = _NumpyTailCalibrator(n_groups, halflife=5.0, min_weight=3.0)
    for kind, pairs in calls:
        g = np.array([p[0] % n_groups for p in pairs], dtype=np.int64)
        d = np.array([p[1] for p in pairs], dtype=np.float64)
        if kind == "score":
            got, want = cal.score(g, d), ref.score_add(g, d, add=False)
        elif kind == "add":
            cal.add(g, d)
            got = want = ref.score_add(g, d, score=False)
        else:
            got, want = cal.score_add(g, d), ref.score_add(g, d)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
        np.testing.assert_array_equal(cal.hist, ref.hist)


def test_tail_calibrator_refuses_unknown_groups_and_skips_negative_statistics() -> None:
    cal = TailCalibrator(2, min_weight=0.0)
    with pytest.raises(ValueError, match="calibration groups"):
        cal.score_add(np.array([2]), np.array([1.0]))
    with pytest.raises(ValueError, match="same 1-d shape"):
        cal.score_add(np.array([0, 1]), np.array([1.0]))
    before = cal.hist.copy()
    assert np.isnan(cal.score_add(np.array([0]), np.array([-1.0]))).all()  # no column: unscored
    np.testing.assert_array_equal(cal.hist, before)


def test_update_ids_refuses_series_outside_the_scorer() -> None:
    sc = RobustScorer(4)
    with pytest.raises(ValueError, match=r"series ids must be in 0\.\.3"):
        sc.update_ids(np.array([4]), np.array([1.0]))
    with pytest.raises(ValueError, match="same 1-d shape"):
        sc.update_ids(np.array([0, 1]), np.array([1.0]))
    assert (sc.n == 0).all()  # nothing was applied


def test_fleet_score_finds_gpu_unlike_its_peers() -> None:
    rng = np.random.default_rng(9)
    n_gpu, t = 256, 1500
    x = rng.standard_normal((t, n_gpu)) + 300.0
    x[:, 17] += 6.0  # always off: its own baseline learns that, its peers do not share it
    metric = np.zeros(n_gpu, dtype=np.int64)  # one metric: one calibration group
    sc = RobustScorer(n_gpu, groups=metric, peer_groups=np.arange(n_gpu) // 64)  # 4 jobs of 64 GPUs
    fleet, point = [], []
    for row in x:
        b = sc.update_detailed(row)
        fleet.append(b.fleet)
        point.append(b.point)
    f, p = np.array(fleet)[500:], np.array(point)[500:]
    # The fleet statistic is calibrated over the whole metric group, the outlier included (1 of
    # 256 GPUs, so its own persistent deviation is ~0.4 % of the history it is compared with).
    assert np.mean(f[:, 17] >= 0.99) > 0.9
    assert np.mean(p[:, 17] >= 0.99) < 0.05  # own-history score sees nothing unusual
    assert np.mean(np.delete(f, 17, axis=1) >= 0.99) < 0.012


def test_fleet_robust_z_against_explicit_median() -> None:
    x = np.array([1.0, 2.0, 3.0, 4.0, 100.0, 10.0, 10.0, 10.0, 10.0, 11.0, np.nan])
    g = np.array([0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1])
    z = fleet_robust_z(x, g, min_peers=5, min_scale=0.5)
    # group 0: median 3, MAD 1 -> scale 1.4826; group 1: MAD 0 -> floor 0.5
    np.testing.assert_allclose(z[:5], (x[:5] - 3.0) / 1.4826)
    np.testing.assert_allclose(z[5:10], [0, 0, 0, 0, 2.0])
    assert math.isnan(z[10])
    assert np.isnan(fleet_robust_z(x, g, min_peers=6)[:5]).all()


@settings(max_examples=150, deadline=None)
@given(
    st.integers(1, 6),  # messages
    st.integers(1, 8),  # GPUs
    st.integers(1, 3),  # signals
    st.integers(1, 9),  # min_peers
    st.data(),
)
def test_sibling_robust_z_equals_fleet_robust_z(m: int, g: int, s: int, min_peers: int, data: Any) -> None:
    """The gpu detector's dense form gives exactly the grouped form's numbers, gaps and ties included."""
    cell = st.one_of(st.just(math.nan), st.sampled_from([0.0, 1.0, 5.0]), st.floats(-1e6, 1e6))
    x = np.array(data.draw(st.lists(cell, min_size=m * g * s, max_size=m * g * s))).reshape(m, g, s)
    floor = np.array(data.draw(st.lists(st.floats(0.0, 10.0), min_size=s, max_size=s)))
    groups = (np.arange(m)[:, None, None] * s + np.arange(s)[None, None, :]).repeat(g, axis=1)
    want = fleet_robust_z(
        x.ravel(), groups.ravel(), min_peers=min_peers, min_scale=np.broadcast_to(floor, x.shape).ravel()
    )
    got = sibling_robust_z(x, min_peers=min_peers, min_scale=floor)
    np.testing.assert_array_equal(got.ravel(), want)


@pytest.mark.parametrize("method", ["fisher", "tippett"])
def test_node_combiner_keeps_meaning_and_sees_bad_metrics(method: str) -> None:
    rng = np.random.default_rng(10)
    t, m = 5000, 8
    x = rng.standard_normal((t, m))
    x[4500, 3] += 9.0  # one metric far off: Tippett's case
    x[4700, :4] += 2.5  # half the metrics moderately off at once: Fisher's case
    sc, comb = RobustScorer(m), NodeCombiner(1, method=method)  # type: ignore[arg-type]
    node = np.array([comb.update(sc.update(row)[None, :])[0] for row in x])
    healthy = np.delete(node, [4500, 4700])[1500:]
    healthy = healthy[~np.isnan(healthy)]
    assert ((healthy >= 0) & (healthy <= 1)).all()
    assert np.mean(healthy >= 0.99) <= 0.015
    assert np.mean(healthy >= 0.999) <= 0.002
    assert node[4700] >= 0.999
    if method == "tippett":
        assert node[4500] >= 0.999
        assert comb.top_metric[0] in range(m)
    else:  # Fisher dilutes one bad metric among seven healthy ones: high, not extreme
        assert node[4500] >= 0.95


def test_memory_per_gpu_well_below_2kib() -> None:
    nodes, gpus, signals = 256, 8, 8
    k = nodes * gpus * signals
    metric = np.arange(k) % signals
    node_of = np.arange(k) // (gpus * signals)
    sc = RobustScorer(k, groups=metric, peer_groups=metric + signals * (node_of // 16))
    per_gpu = sc.nbytes() / (nodes * gpus)
    assert per_gpu < 1024, per_gpu
    sc.update(np.random.default_rng(0).standard_normal(k))  # and it runs at this size
