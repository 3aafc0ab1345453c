"""Vectorised per-entity state over a batch: cumulative counters -> deltas/rates, decaying event
counts, and run lengths of a boolean condition.

An *entity* is whatever owns a counter (a GPU of a node, an IB port of a node) and has a dense row
number; state lives in numpy arrays indexed by that row and grows as new entities appear.

The tricky part of vectorising is that one batch can hold several samples of the same entity,
which must be processed in order. Every update therefore groups the elements by row with a
*stable* sort (arrival order kept inside a group), then uses cumulative ufuncs
(`np.maximum.accumulate`, `np.cumsum`) with group boundaries, so the results are exactly those of
feeding the samples one at a time (a property the tests check with hypothesis).

Counter semantics (CounterTracker):
- first sample of an entity/counter: no delta, no rate (NaN).
- out of order or duplicate (ts <= the latest accepted ts of that entity): ignored, state untouched.
  Order is *arrival* order, as Kafka keeps it per node key; a sample older than one already seen is
  a replay or a clock step and must not produce a negative dt.
- value < previous (driver reload, reboot, GPU reset, `perfquery -x` clearing IB counters): a reset.
  The delta is the new value: counters restart from zero, so it is the count of events since the
  reset, a lower bound on what happened in the interval (zero would hide errors right after a
  reset, exactly when a flaky GPU tends to show them). `reset` marks these elements.
- fixed-width counters: IB PortCounters error fields are 16-bit (link_downed 8-bit) and SATURATE at
  their maximum per the IB spec instead of wrapping; `saturated` marks values at the maximum, whose
  delta/rate is then only a lower bound (the counter is stuck until someone clears it). Counters
  declared `wrap` (e.g. 32-bit NIC counters) add 2**bits when a decrease looks like a wrap (old value
  in the top quarter of the range, new in the bottom quarter); any other decrease is a reset. NVML
  counters are 64-bit and are neither: a decrease there is always a reset.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

NAN = np.nan


# ---------------------------------------------------------------- helpers


def encode_array(a: np.ndarray) -> dict[str, Any]:
    """numpy array -> JSON-safe dict (NaN survives because it travels as raw bytes)."""
    a = np.ascontiguousarray(a)
    return {"dtype": a.dtype.str, "shape": list(a.shape), "b64": base64.b64encode(a.tobytes()).decode()}


def decode_array(d: dict[str, Any]) -> np.ndarray:
    raw = base64.b64decode(d["b64"])
    return np.frombuffer(raw, dtype=np.dtype(d["dtype"])).reshape(d["shape"]).copy()


def grow(a: np.ndarray, n: int, fill: Any) -> np.ndarray:
    """Return `a` with at least n rows (doubling, so appends stay amortised O(1))."""
    if len(a) >= n:
        return a
    cap = max(n, 2 * len(a), 16)
    out = np.full((cap, *a.shape[1:]), fill, dtype=a.dtype)
    out[: len(a)] = a
    return out


@dataclass(slots=True)
class Segments:
    """Elements grouped by entity row (stable: arrival order kept within a group).

    Positions below are in *sorted* order; `order[i]` is the original index of sorted element i.
    """

    order: np.ndarray
    rows: np.ndarray
    start: np.ndarray  # per element: sorted position of its group's first element
    first: np.ndarray  # per element: is the first of its group
    last: np.ndarray  # per element: is the last of its group
    gid: np.ndarray  # per element: group number 0..ngroups-1

    @classmethod
    def of(cls, rows: np.ndarray) -> Segments:
        order = np.argsort(rows, kind="stable")
        r = rows[order]
        n = len(r)
        first = np.ones(n, dtype=bool)
        first[1:] = r[1:] != r[:-1]
        last = np.ones(n, dtype=bool)
        last[:-1] = first[1:]
        pos = np.arange(n)
        start = np.maximum.accumulate(np.where(first, pos, 0)) if n else pos
        gid = np.cumsum(first) - 1
        return cls(order, r, start, first, last, gid)

    def subset(self, mask: np.ndarray) -> Segments:
        """The sorted elements where mask holds (mask in sorted order), regrouped."""
        sel = np.flatnonzero(mask)
        r = self.rows[sel]
        n = len(r)
        first = np.ones(n, dtype=bool)
        first[1:] = r[1:] != r[:-1]
        last = np.ones(n, dtype=bool)
        last[:-1] = first[1:]
        pos = np.arange(n)
        start = np.maximum.accumulate(np.where(first, pos, 0)) if n else pos
        return Segments(self.order[sel], r, start, first, last, np.cumsum(first) - 1)


def increasing_in_group(seg: Segments, ts_sorted: np.ndarray, floor: np.ndarray) -> np.ndarray:
    """Sorted-order mask: ts strictly above the state's floor and above every earlier ts in its group.

    Segmented running max without a Python loop: dense-rank the timestamps, offset each group's
    ranks by gid * (n + 1) so groups cannot see each other, then one np.maximum.accumulate.
    """
    n = len(ts_sorted)
    if n == 0:
        return np.zeros(0, dtype=bool)
    _, rank = np.unique(ts_sorted, return_inverse=True)
    key = seg.gid.astype(np.int64) * (n + 1) + rank.astype(np.int64)
    run = np.maximum.accumulate(key)
    prev = np.empty(n, dtype=np.int64)
    prev[0] = -1
    prev[1:] = run[:-1]
    prev = np.where(seg.first, -1, prev - seg.gid * (n + 1))
    return (rank > prev) & (ts_sorted > floor)


# ---------------------------------------------------------------- cumulative counters

Mode = Literal["saturate", "wrap"]


@dataclass(slots=True)
class CounterUpdate:
    """Per input element (original order), per counter column."""

    accepted: np.ndarray  # (n,) bool: in order and new; rejected elements have NaN everywhere
    delta: np.ndarray  # (n, C) events since the previous valid value (NaN: first sample/absent)
    dt: np.ndarray  # (n, C) seconds since that previous value
    reset: np.ndarray  # (n, C) bool: the counter went down (reset), delta = new value
    saturated: np.ndarray  # (n, C) bool: value at the saturation maximum

    @property
    def rate(self) -> np.ndarray:
        """(n, C) delta / dt, per second (computed on demand: the rules use decayed counts)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(self.dt > 0, self.delta / self.dt, NAN)


class CounterTracker:
    """Last value and time of every (entity, counter); turns raw cumulative values into deltas."""

    def __init__(self, names: tuple[str, ...], limits: dict[str, tuple[int, Mode]] | None = None) -> None:
        self.names = names
        self.limits = dict(limits or {})
        c = len(names)
        self.last_val = np.full((0, c), NAN)
        self.last_ts = np.full((0, c), NAN)
        self.row_ts = np.full(0, -np.inf)
        sat = np.full(c, np.inf)
        wrap = np.full(c, np.inf)
        for i, name in enumerate(names):
            if name in self.limits:
                bits, mode = self.limits[name]
                (sat if mode == "saturate" else wrap)[i] = float(2**bits - 1)
        self._sat = sat
        self._wrap = wrap
        self._has_sat = bool(np.isfinite(sat).any())
        self._has_wrap = bool(np.isfinite(wrap).any())

    def _ensure(self, n: int) -> None:
        if len(self.row_ts) < n:
            self.last_val = grow(self.last_val, n, NAN)
            self.last_ts = grow(self.last_ts, n, NAN)
            self.row_ts = grow(self.row_ts, n, -np.inf)

    def update(
        self,
        rows: np.ndarray,
        ts: np.ndarray,
        values: np.ndarray,
        *,
        seg: Segments | None = None,
        in_order: bool = False,
    ) -> CounterUpdate:
        """seg: Segments.of(rows), if the caller already has it. in_order: the caller guarantees
        every element is new (ts above its row's state and increasing within the batch), as the
        hardware detector does after dropping stale messages; the check is then skipped."""
        n, c = values.shape
        out_delta = np.full((n, c), NAN)
        out_dt = np.full((n, c), NAN)
        out_reset = np.zeros((n, c), dtype=bool)
        out_sat = np.zeros((n, c), dtype=bool)
        accepted = np.zeros(n, dtype=bool)
        if n == 0:
            return CounterUpdate(accepted, out_delta, out_dt, out_reset, out_sat)
        self._ensure(int(rows.max()) + 1)
        seg = seg if seg is not None else Segments.of(rows)
        fresh = None if in_order else increasing_in_group(seg, ts[seg.order], self.row_ts[seg.rows])
        a = seg if fresh is None else seg.subset(fresh)
        na = len(a.order)
        if na == 0:
            return CounterUpdate(accepted, out_delta, out_dt, out_reset, out_sat)
        r, t, v = a.rows, ts[a.order], values[a.order]

        valid = ~np.isnan(v)
        if valid.all():
            prev_val, prev_ts = self._previous_dense(a, r, t, v)
        else:
            prev_val, prev_ts = self._previous_sparse(a, r, t, v, valid)

        delta = v - prev_val
        down = delta < 0  # NaN compares False: first samples and absent values are never resets
        if self._has_wrap:
            wrapped = down & (prev_val > 0.75 * self._wrap) & (v < 0.25 * self._wrap)
            delta = np.where(wrapped, delta + self._wrap + 1.0, delta)
            reset = down & ~wrapped
        else:
            reset = down
        delta = np.where(reset, v, delta)
        dt = t[:, None] - prev_ts
        saturated = valid & (v >= self._sat) if self._has_sat else np.zeros_like(valid)
        self.row_ts[r[a.last]] = t[a.last]

        o = a.order
        accepted[o] = True
        out_delta[o] = delta
        out_dt[o] = dt
        out_reset[o] = reset
        out_sat[o] = saturated
        return CounterUpdate(accepted, out_delta, out_dt, out_reset, out_sat)

    def _previous_dense(
        self, a: Segments, r: np.ndarray, t: np.ndarray, v: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Previous value and time per element when every value is present (the usual batch): the
        element before it in its group, or the stored state for a group's first. Stores the state."""
        n, c = v.shape
        prev = np.arange(-1, n - 1)
        prev_val = v[prev]
        prev_ts = np.broadcast_to(t[prev][:, None], (n, c)).copy()
        first = a.first
        prev_val[first] = self.last_val[r[first]]
        prev_ts[first] = self.last_ts[r[first]]
        lr = r[a.last]
        self.last_val[lr] = v[a.last]
        self.last_ts[lr] = t[a.last][:, None]
        return prev_val, prev_ts

    def _previous_sparse(
        self, a: Segments, r: np.ndarray, t: np.ndarray, v: np.ndarray, valid: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """As _previous_dense, where some values are absent (NaN): the previous *valid* value of each
        column is the last non-NaN earlier in the group, else the state; the state keeps the group's
        last valid value per column (only where the group had one)."""
        na, c = v.shape
        pos = np.arange(na)
        last_incl = np.maximum.accumulate(np.where(valid, pos[:, None], -1), axis=0)
        prev = np.empty_like(last_incl)
        prev[0] = -1
        prev[1:] = last_incl[:-1]
        in_group = prev >= a.start[:, None]
        pc = np.maximum(prev, 0)
        cols = np.arange(c)[None, :]
        prev_val = np.where(in_group, v[pc, cols], self.last_val[r])
        prev_ts = np.where(in_group, t[pc], self.last_ts[r])
        li = last_incl[a.last]
        lr = r[a.last]
        has = li >= a.start[a.last][:, None]
        lic = np.maximum(li, 0)
        self.last_val[lr] = np.where(has, v[lic, cols], self.last_val[lr])
        self.last_ts[lr] = np.where(has, t[lic], self.last_ts[lr])
        return prev_val, prev_ts

    def to_state(self) -> dict[str, Any]:
        return {
            "names": list(self.names),
            "limits": {k: [b, m] for k, (b, m) in self.limits.items()},
            "last_val": encode_array(self.last_val),
            "last_ts": encode_array(self.last_ts),
            "row_ts": encode_array(self.row_ts),
        }

    @classmethod
    def from_state(cls, d: dict[str, Any]) -> CounterTracker:
        self = cls(tuple(d["names"]), {k: (int(b), m) for k, (b, m) in d["limits"].items()})
        self.last_val = decode_array(d["last_val"])
        self.last_ts = decode_array(d["last_ts"])
        self.row_ts = decode_array(d["row_ts"])
        return self


# ---------------------------------------------------------------- decaying event counts


class DecayingCount:
    """Exponentially decaying event count per (entity, column): S <- S * exp(-dt / tau) + delta.

    S approximates "events in the last tau seconds" without keeping event history (a sliding window
    would need a ring buffer per entity). One error is worth 1 right away and fades to 1/e after tau,
    so thresholds read as "more than X events per tau". Callers pass only accepted (strictly
    increasing per entity) elements; NaN deltas count as zero.
    """

    def __init__(self, taus: tuple[float, ...]) -> None:
        self.tau = np.asarray(taus, dtype=np.float64)
        self.s = np.zeros((0, len(taus)))
        self.t = np.full(0, NAN)

    def _ensure(self, n: int) -> None:
        if len(self.t) < n:
            self.s = grow(self.s, n, 0.0)
            self.t = grow(self.t, n, NAN)

    def update(
        self,
        rows: np.ndarray,
        ts: np.ndarray,
        deltas: np.ndarray,
        spread: np.ndarray | None = None,
        *,
        seg: Segments | None = None,
    ) -> np.ndarray:
        """Decayed counts after each element (original order), shape (n, K).

        `spread` (n, K), optional: the seconds over which each delta accumulated (CounterUpdate.dt).
        A delta is then taken as spread evenly over that interval and enters with weight
        tau/dt * (1 - exp(-dt/tau)): ~1 for dt << tau, tau/dt for dt >> tau. Without it, 50 PCIe
        replays reported after a 10-minute collector gap would count as 50 in the last minute; with
        it, a steady rate r converges to exactly r * tau whatever the sampling interval.
        """
        n, k = deltas.shape
        out = np.zeros((n, k))
        if n == 0:
            return out
        self._ensure(int(rows.max()) + 1)
        seg = seg if seg is not None else Segments.of(rows)
        r, t = seg.rows, ts[seg.order]
        d = np.nan_to_num(deltas[seg.order], nan=0.0)
        if spread is not None:
            dt = spread[seg.order]
            x = np.where(np.isfinite(dt) & (dt > 0), dt, 0.0) / self.tau[None, :]
            with np.errstate(invalid="ignore", divide="ignore"):
                weight = np.where(x > 1e-9, -np.expm1(-x) / x, 1.0)
            d = d * weight
        # Each element is the affine map S -> A*S + B with A = exp(-dt/tau), B = delta. A group's
        # first element folds in the stored state and gets A = 0, which cuts it off from the
        # previous group. An inclusive scan of the maps (Hillis-Steele, log2(longest group) rounds
        # of whole-array operations) then yields S at every element. Only products of factors <= 1
        # and sums of non-negative terms appear: no overflow and no cancellation, whatever the span.
        prev_t = np.empty(n)
        prev_t[1:] = t[:-1]
        t0 = self.t[r]
        first = seg.first
        prev_t[first] = np.where(np.isnan(t0[first]), t[first], t0[first])
        a = np.exp(-(t - prev_t)[:, None] / self.tau[None, :])
        s0 = np.where(np.isnan(t0)[:, None], 0.0, self.s[r])
        b = np.where(first[:, None], s0 * a + d, d)
        a[first] = 0.0
        longest = int(np.max(np.diff(np.r_[np.flatnonzero(first), n])))
        step = 1
        while step < longest:
            b_new = b.copy()
            b_new[step:] += b[:-step] * a[step:]
            a_new = a.copy()
            a_new[step:] *= a[:-step]
            a, b = a_new, b_new
            step *= 2
        lr = r[seg.last]
        self.s[lr] = b[seg.last]
        self.t[lr] = t[seg.last]
        out[seg.order] = b
        return out

    def current(self, rows: np.ndarray, ts: np.ndarray) -> np.ndarray:
        """Decayed counts of `rows` as of time `ts` (no new events), shape (n, K)."""
        dt = np.maximum(ts - self.t[rows], 0.0)
        return self.s[rows] * np.exp(-dt[:, None] / self.tau[None, :])

    def to_state(self) -> dict[str, Any]:
        return {"tau": self.tau.tolist(), "s": encode_array(self.s), "t": encode_array(self.t)}

    @classmethod
    def from_state(cls, d: dict[str, Any]) -> DecayingCount:
        self = cls(tuple(d["tau"]))
        self.s = decode_array(d["s"])
        self.t = decode_array(d["t"])
        return self


# ---------------------------------------------------------------- run lengths


class RunLength:
    """Consecutive samples for which a condition holds, per (entity, column), carried across batches."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.run = np.zeros((0, k), dtype=np.int64)

    def update(self, rows: np.ndarray, flags: np.ndarray, *, seg: Segments | None = None) -> np.ndarray:
        """Run length ending at each element (0 where the flag is False), original order, (n, K)."""
        n = len(rows)
        out = np.zeros((n, self.k), dtype=np.int64)
        if n == 0:
            return out
        self.run = grow(self.run, int(rows.max()) + 1, 0)
        seg = seg if seg is not None else Segments.of(rows)
        f = flags[seg.order]
        pos = np.arange(n)[:, None]
        last_false = np.maximum.accumulate(np.where(f, -1, pos), axis=0)
        begun = last_false >= seg.start[:, None]  # a False earlier in this group broke the carry
        run = np.where(begun, pos - last_false, pos - seg.start[:, None] + 1 + self.run[seg.rows])
        run = np.where(f, run, 0)
        self.run[seg.rows[seg.last]] = run[seg.last]
        out[seg.order] = run
        return out

    def to_state(self) -> dict[str, Any]:
        return {"k": self.k, "run": encode_array(self.run)}

    @classmethod
    def from_state(cls, d: dict[str, Any]) -> RunLength:
        self = cls(int(d["k"]))
        self.run = decode_array(d["run"])
        return self
