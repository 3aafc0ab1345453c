"""Counter state: deltas/rates, resets, saturation, ordering, batching invariance, snapshots."""

from __future__ import annotations

import math

import numpy as np
import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetwatch.detectors.counters import (
    CounterTracker,
    DecayingCount,
    RunLength,
    Segments,
    increasing_in_group,
)


def one(tracker: CounterTracker, row: int, ts: float, *values: float):
    return tracker.update(np.array([row]), np.array([ts]), np.array([values], dtype=float))


def test_first_sample_has_no_rate_then_rate_per_second() -> None:
    c = CounterTracker(("a",))
    u = one(c, 0, 10.0, 5)
    assert u.accepted[0] and math.isnan(u.delta[0, 0]) and math.isnan(u.rate[0, 0])
    u = one(c, 0, 12.0, 9)
    assert u.delta[0, 0] == 4 and u.dt[0, 0] == 2.0 and u.rate[0, 0] == 2.0
    assert not u.reset[0, 0]


def test_a_reset_rebaselines_without_a_delta() -> None:
    c = CounterTracker(("a",))
    one(c, 0, 1.0, 1000)
    u = one(c, 0, 2.0, 3)  # driver reload (or a garbled read): the new value is the new baseline
    assert u.reset[0, 0] and math.isnan(u.delta[0, 0])
    u = one(c, 0, 3.0, 5)
    assert not u.reset[0, 0] and u.delta[0, 0] == 2


def test_saturating_counter_is_reported_and_does_not_look_like_a_reset() -> None:
    c = CounterTracker(("symbol_errors",), {"symbol_errors": (16, "saturate")})
    one(c, 0, 1.0, 65530)
    u = one(c, 0, 2.0, 65535)
    assert u.saturated[0, 0] and u.delta[0, 0] == 5
    u = one(c, 0, 3.0, 65535)  # stuck at the maximum: no further events measurable
    assert u.saturated[0, 0] and u.delta[0, 0] == 0 and not u.reset[0, 0]
    u = one(c, 0, 4.0, 2)  # someone cleared it (perfquery -x)
    assert u.reset[0, 0] and not u.saturated[0, 0] and math.isnan(u.delta[0, 0])


def test_wrapping_counter() -> None:
    c = CounterTracker(("x",), {"x": (32, "wrap")})
    top = 2**32 - 1
    one(c, 0, 1.0, top - 10)
    u = one(c, 0, 2.0, 5)  # wrapped: 10 to the top, 1 to zero, 5 more
    assert not u.reset[0, 0] and u.delta[0, 0] == 16
    u = one(c, 0, 3.0, 2)  # a decrease in the middle of the range is a reset, not a wrap
    assert u.reset[0, 0] and math.isnan(u.delta[0, 0])


def test_out_of_order_and_duplicates_are_ignored() -> None:
    c = CounterTracker(("a",))
    one(c, 0, 10.0, 100)
    for ts in (10.0, 9.0):
        u = one(c, 0, ts, 50)
        assert not u.accepted[0] and math.isnan(u.delta[0, 0])
    u = one(c, 0, 11.0, 101)
    assert u.delta[0, 0] == 1 and u.dt[0, 0] == 1.0  # measured from the last accepted sample


def test_absent_value_keeps_the_previous_one() -> None:
    c = CounterTracker(("a", "b"))
    one(c, 0, 1.0, 10, 10)
    u = one(c, 0, 2.0, math.nan, 12)
    assert math.isnan(u.delta[0, 0]) and u.delta[0, 1] == 2
    u = one(c, 0, 4.0, 16, 13)
    assert u.delta[0, 0] == 6 and u.dt[0, 0] == 3.0 and u.rate[0, 0] == 2.0


def test_several_samples_of_one_entity_in_a_batch() -> None:
    c = CounterTracker(("a",))
    rows = np.array([0, 1, 0, 1, 0])
    ts = np.array([1.0, 1.0, 2.0, 2.0, 4.0])
    vals = np.array([[0], [100], [3], [100], [9]], dtype=float)
    u = c.update(rows, ts, vals)
    assert np.isnan(u.delta[[0, 1], 0]).all()
    assert u.delta[[2, 3, 4], 0].tolist() == [3, 0, 6]
    assert u.rate[4, 0] == 3.0


# ---------------------------------------------------------------- batching invariance

samples = st.lists(
    st.tuples(
        st.integers(0, 3),  # row
        st.integers(-2, 3),  # ts step (<= 0: duplicate / out of order)
        st.one_of(st.integers(0, 70000).map(float), st.just(math.nan)),
        st.integers(0, 5).map(float),
    ),
    min_size=1,
    max_size=60,
)


def _stream(spec):
    clock = {r: 100.0 for r in range(4)}
    rows, ts, vals = [], [], []
    for r, step, v, w in spec:
        clock[r] += step
        rows.append(r)
        ts.append(clock[r])
        vals.append([v, w])
    return np.array(rows), np.array(ts), np.array(vals)


# Saturating, wrapping and unlimited counters take different code paths (as do batches with and
# without absent values), so each shape is checked.
LIMITS = st.sampled_from([{"a": (16, "saturate")}, {"a": (16, "wrap"), "b": (2, "saturate")}, {}])


FIELDS = ("accepted", "delta", "dt", "reset", "saturated")


def _reference(spec, limits: dict) -> tuple[dict[str, list], dict[int, list[list[float]]]]:
    """The rules in detectors/counters.py's docstring, written out sample by sample in Python.
    Returns the outputs per field and, per row, each column's last present [value, ts]."""
    clock = dict.fromkeys(range(4), 100.0)
    row_ts: dict[int, float] = {}
    last: dict[int, list[list[float]]] = {}
    out: dict[str, list] = {f: [] for f in FIELDS}
    for r, step, *values in spec:
        clock[r] += step
        t = clock[r]
        if t <= row_ts.get(r, -math.inf):  # duplicate or older: nothing, state untouched
            for f, x in zip(
                FIELDS, (False, [math.nan] * 2, [math.nan] * 2, [False] * 2, [False] * 2), strict=True
            ):
                out[f].append(x)
            continue
        row_ts[r] = t
        state = last.setdefault(r, [[math.nan, math.nan], [math.nan, math.nan]])
        row = {f: [] for f in FIELDS[1:]}
        for name, v, col in zip(("a", "b"), values, state, strict=True):
            bits, mode = limits.get(name, (0, ""))
            top = 2**bits - 1
            d, reset = v - col[0], False
            if d < 0 and mode == "wrap" and col[0] > 0.75 * top and v < 0.25 * top:
                d += top + 1
            elif d < 0:
                d, reset = math.nan, True
            row["delta"].append(d)
            row["dt"].append(t - col[1])
            row["reset"].append(reset)
            row["saturated"].append(mode == "saturate" and v >= top)
            if not math.isnan(v):
                col[:] = [v, t]
        out["accepted"].append(True)
        for f, x in row.items():
            out[f].append(x)
    return out, last


@settings(max_examples=200, deadline=None)
@given(samples, st.integers(1, 60), LIMITS)
def test_batched_updates_follow_the_rules_sample_by_sample(spec, cut, limits) -> None:
    rows, ts, vals = _stream(spec)
    tracker = CounterTracker(("a", "b"), limits)
    parts = [
        tracker.update(rows[:cut], ts[:cut], vals[:cut]),
        tracker.update(rows[cut:], ts[cut:], vals[cut:]),
    ]
    want, state = _reference(spec, limits)
    for field, expected in want.items():
        got = np.concatenate([getattr(p, field) for p in parts])
        assert np.array_equal(got, np.array(expected), equal_nan=got.dtype.kind == "f"), field
    rate = np.concatenate([p.rate for p in parts])
    with np.errstate(divide="ignore", invalid="ignore"):
        dt = np.array(want["dt"])
        assert np.array_equal(rate, np.where(dt > 0, np.array(want["delta"]) / dt, np.nan), equal_nan=True)
    for r, cols in state.items():
        got = [[tracker.last_val[r, c], tracker.last_ts[r, c]] for c in range(2)]
        assert np.array_equal(got, cols, equal_nan=True), r


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(-2, 3)), min_size=1, max_size=60), st.integers(0, 3))
def test_increasing_in_group_keeps_what_a_loop_keeps(spec, floor_row) -> None:
    """The hardware detector's message filter: new and in arrival order per node, above its floor."""
    clock = dict.fromkeys(range(4), 100.0)
    rows, ts = [], []
    for r, step in spec:
        clock[r] += step
        rows.append(r)
        ts.append(clock[r])
    floor = np.full(4, -np.inf)
    floor[floor_row] = 101.0
    seg = Segments.of(np.array(rows))
    kept = np.zeros(len(rows), dtype=bool)
    kept[seg.order[increasing_in_group(seg, np.array(ts)[seg.order], floor[seg.rows])]] = True
    top = floor.tolist()
    for i, (r, t) in enumerate(zip(rows, ts, strict=True)):
        assert kept[i] == (t > top[r]), (i, r, t)
        top[r] = max(top[r], t)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 3),
            # whole steps and spreads repeat, as a fleet's sampling interval does: the kernel
            # reuses a column's decay factors while dt and spread stay the same
            st.one_of(st.floats(0.1, 500.0), st.sampled_from([10.0, 30.0])),
            st.one_of(st.integers(0, 20).map(float), st.just(math.nan)),
            st.one_of(st.floats(1e-3, 5000.0), st.sampled_from([0.0, -1.0, math.nan, math.inf, 10.0, 30.0])),
        ),
        min_size=1,
        max_size=50,
    ),
    st.integers(1, 50),
    st.booleans(),
)
def test_decaying_count_matches_the_recurrence(spec, cut, spread) -> None:
    """S <- S * exp(-dt / tau) + w * delta, sample by sample; NaN deltas count as zero; with
    `spread`, w = tau / x * (1 - exp(-x / tau)) over the delta's interval x (1 where x is not a
    positive finite number)."""
    clock = dict.fromkeys(range(4), 0.0)
    rows, ts, ds, xs = [], [], [], []
    for r, step, d, x in spec:
        clock[r] += step
        rows.append(r)
        ts.append(clock[r])
        ds.append([d, d])
        xs.append([x, x])
    rows_a, ts_a, ds_a, xs_a = np.array(rows), np.array(ts), np.array(ds), np.array(xs)
    taus = (60.0, 3600.0)
    dc = DecayingCount(taus)
    got = np.concatenate(
        [
            dc.update(rows_a[part], ts_a[part], ds_a[part], xs_a[part] if spread else None)
            for part in (slice(0, cut), slice(cut, None))
        ]
    )
    s = {r: [0.0, 0.0] for r in range(4)}
    last: dict[int, float] = {}
    for i, (r, t, (d, _), (x, _)) in enumerate(zip(rows, ts, ds, xs, strict=True)):
        for k, tau in enumerate(taus):
            w = 1.0
            if spread and 0 < x < math.inf:
                w = tau / x * -math.expm1(-x / tau)
            decay = math.exp(-(t - last[r]) / tau) if r in last else 0.0
            s[r][k] = s[r][k] * decay + w * (0.0 if math.isnan(d) else d)
        last[r] = t
        assert np.allclose(got[i], s[r], rtol=1e-9, atol=1e-9), i


def test_decaying_count_spreads_a_delta_over_its_interval() -> None:
    tau = 60.0
    # A steady 5 events/min sampled every 10 s or every 10 min converges to the same 5 per window.
    for step in (10.0, 600.0):
        dc = DecayingCount((tau,))
        ts = np.arange(1, 200) * step
        d = np.full((len(ts), 1), 5.0 * step / 60.0)
        out = dc.update(np.zeros(len(ts), dtype=np.int64), ts, d, np.full_like(d, step))
        assert abs(out[-1, 0] - 5.0) < 1e-6, step
    # 50 events reported after a 10-minute gap are not 50 "in the last minute".
    dc = DecayingCount((tau,))
    out = dc.update(np.array([0]), np.array([600.0]), np.array([[50.0]]), np.array([[600.0]]))
    assert out[0, 0] < 8.0


def test_decaying_count_long_span_in_one_batch_does_not_overflow() -> None:
    dc = DecayingCount((1.0,))
    ts = np.arange(0.0, 5000.0, 1.0)
    d = np.zeros((len(ts), 1))
    d[0] = d[-1] = 7.0
    out = dc.update(np.zeros(len(ts), dtype=np.int64), ts, d)
    assert np.isfinite(out).all()
    assert out[0, 0] == 7.0 and out[-1, 0] == 7.0  # the first event has long decayed away


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.booleans()), min_size=1, max_size=40), st.integers(1, 40))
def test_run_length_matches_a_loop(spec, cut) -> None:
    rows = np.array([r for r, _ in spec])
    flags = np.array([[f] for _, f in spec])
    rl = RunLength(1)
    got = np.concatenate([rl.update(rows[:cut], flags[:cut]), rl.update(rows[cut:], flags[cut:])])
    run = dict.fromkeys(range(3), 0)
    for i, (r, f) in enumerate(spec):
        run[r] = run[r] + 1 if f else 0
        assert got[i, 0] == run[r]


# ---------------------------------------------------------------- snapshots


def test_snapshot_round_trip_resumes_identically() -> None:
    rng = np.random.default_rng(3)
    rows = rng.integers(0, 20, 200)
    ts = np.cumsum(rng.uniform(0.1, 2.0, 200))
    vals = np.cumsum(rng.integers(0, 5, (200, 3)), axis=0).astype(float)
    a = CounterTracker(("x", "y", "z"), {"x": (16, "saturate")})
    a.update(rows[:100], ts[:100], vals[:100])
    b = CounterTracker.from_state(orjson.loads(orjson.dumps(a.to_state())))
    ua, ub = a.update(rows[100:], ts[100:], vals[100:]), b.update(rows[100:], ts[100:], vals[100:])
    assert np.array_equal(ua.delta, ub.delta, equal_nan=True)
    assert np.array_equal(ua.rate, ub.rate, equal_nan=True)
    d = DecayingCount((60.0,))
    d.update(rows[:100], ts[:100], vals[:100, :1])
    e = DecayingCount.from_state(orjson.loads(orjson.dumps(d.to_state())), (60.0,))
    assert np.array_equal(
        d.update(rows[100:], ts[100:], vals[100:, :1]), e.update(rows[100:], ts[100:], vals[100:, :1])
    )


def test_state_is_small_per_gpu() -> None:
    """The brief's budget: below ~2 KiB of state per GPU, counted in array bytes per entity row."""
    from fleetwatch.schemas import GPU_COUNTERS

    n = 4096
    c = CounterTracker(GPU_COUNTERS)
    c.update(np.arange(n), np.ones(n), np.zeros((n, len(GPU_COUNTERS))))
    d = DecayingCount((3600.0, 60.0, 60.0, 60.0))
    d.update(np.arange(n), np.ones(n), np.zeros((n, 4)))
    r = RunLength(2)
    r.update(np.arange(n), np.zeros((n, 2), dtype=bool))
    per_gpu = sum(a.nbytes for a in (c.last_val, c.last_ts, c.row_ts, d.s, d.t, r.run)) / n
    assert per_gpu < 2048
