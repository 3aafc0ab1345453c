"""Per-entity state over a batch: cumulative counters -> deltas/rates, decaying event counts, and
run lengths of a boolean condition.

An *entity* is whatever owns a counter (a GPU of a node, an IB port of a node) and has a dense row
number; state lives in numpy arrays indexed by that row and grows as new entities appear.

One batch can hold several samples of the same entity, which must be processed in order. The
updates run one compiled pass over the batch in arrival order (detectors/counter_kernels.py), so
the results are by construction those of feeding the samples one at a time; the tests check them
against plain-Python versions of the rules below. `Segments` and `increasing_in_group` group a
batch by entity with whole-array numpy, for callers that need the grouping itself (the hardware
detector keeps each node's newest messages in order with them).

Counter semantics (CounterTracker):
- first sample of an entity/counter: no delta, no rate (NaN).
- out of order or duplicate (ts <= the latest accepted ts of that entity): ignored, state untouched.
  Order is *arrival* order, as Kafka keeps it per node key; a sample older than one already seen is
  a replay or a clock step and must not produce a negative dt.
- value < previous (driver reload, reboot, GPU reset, `perfquery -x` clearing IB counters): a reset.
  The new value becomes the baseline and there is no delta (NaN): a counter that steps back once
  (3 -> 2, or a garbled read) must not count as 2 new uncorrectable errors and drain a node. The
  price is the events between the reset and the first sample after it, which go uncounted.
  `reset` marks these elements (the hardware detector reports them as info, never a drain).
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

from fleetwatch.detectors import counter_kernels as kernels
from fleetwatch.detectors.rows import Compaction, grow

NAN = np.nan


# ---------------------------------------------------------------- helpers


def encode_array(a: np.ndarray) -> dict[str, Any]:
    """numpy array -> JSON-safe dict (NaN survives because it travels as raw bytes)."""
    a = np.ascontiguousarray(a)
    return {"dtype": a.dtype.str, "shape": list(a.shape), "b64": base64.b64encode(a.tobytes()).decode()}


def decode_array(d: dict[str, Any]) -> np.ndarray:
    raw = base64.b64decode(d["b64"])
    return np.frombuffer(raw, dtype=np.dtype(d["dtype"])).reshape(d["shape"]).copy()


def _ints(a: np.ndarray) -> np.ndarray:
    """Entity rows as the kernels take them (one compiled signature: C-contiguous int64)."""
    return np.ascontiguousarray(a, dtype=np.int64)


def _floats(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float64)


@dataclass(slots=True)
class Segments:
    """Elements grouped by entity row (stable: arrival order kept within a group).

    Positions below are in *sorted* order; `order[i]` is the original index of sorted element i.
    """

    order: np.ndarray
    rows: np.ndarray
    first: np.ndarray  # per element: is the first of its group
    gid: np.ndarray  # per element: group number 0..ngroups-1

    @classmethod
    def of(cls, rows: np.ndarray) -> Segments:
        order = np.argsort(rows, kind="stable")
        r = rows[order]
        first = np.ones(len(r), dtype=bool)
        first[1:] = r[1:] != r[:-1]
        return cls(order, r, first, np.cumsum(first) - 1)


def positions_in(order: np.ndarray, size: int, rows: np.ndarray) -> np.ndarray:
    """For entries of message rows `rows` (XIDs, ports, sections) of a batch of `size` messages:
    each one's message's position in `order` (e.g. Segments.order, or the rows admission
    accepted), -1 where `order` leaves the message out."""
    where = np.full(size, -1, dtype=np.int64)
    where[order] = np.arange(len(order))
    return where[rows]


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

    def _ensure(self, n: int) -> None:
        if len(self.row_ts) < n:
            self.last_val = grow(self.last_val, n, NAN)
            self.last_ts = grow(self.last_ts, n, NAN)
            self.row_ts = grow(self.row_ts, n, -np.inf)

    def update(self, rows: np.ndarray, ts: np.ndarray, values: np.ndarray) -> CounterUpdate:
        rows, ts, values = _ints(rows), _floats(ts), _floats(values)
        n, c = values.shape
        out = CounterUpdate(
            np.zeros(n, dtype=bool),
            np.full((n, c), NAN),
            np.full((n, c), NAN),
            np.zeros((n, c), dtype=bool),
            np.zeros((n, c), dtype=bool),
        )
        if n == 0:
            return out
        self._ensure(int(rows.max()) + 1)
        kernels.counter_pass(
            rows, ts, values, self._sat, self._wrap, self.last_val, self.last_ts, self.row_ts,
            out.accepted, out.delta, out.dt, out.reset, out.saturated,
        )  # fmt: skip
        return out

    def compact(self, rows: Compaction) -> None:
        """Keep only the entities `rows` keeps (the rest were forgotten), renumbered."""
        self.last_val = rows.take(self.last_val, NAN)
        self.last_ts = rows.take(self.last_ts, NAN)
        self.row_ts = rows.take(self.row_ts, -np.inf)

    def to_state(self, rows: int | None = None) -> dict[str, Any]:
        """rows: the entities in use (the owner knows): the spare rows after them are left out."""
        return {
            "names": list(self.names),
            "limits": {k: [b, m] for k, (b, m) in self.limits.items()},
            "last_val": encode_array(self.last_val[:rows]),
            "last_ts": encode_array(self.last_ts[:rows]),
            "row_ts": encode_array(self.row_ts[:rows]),
        }

    @classmethod
    def from_state(cls, d: dict[str, Any], names: tuple[str, ...] | None = None) -> CounterTracker:
        """The tracker of a snapshot. With `names` (the counters this version tracks), columns are
        matched by name: a counter the snapshot lacks (a field added since) starts with no value,
        one it has that is no longer tracked is dropped."""
        saved = tuple(d["names"])
        names = saved if names is None else names
        limits = {k: (int(b), m) for k, (b, m) in d["limits"].items()}
        # a counter's width as NVML types have them: 2**bits of a number off the state topic could
        # take all the worker's memory (issue 23, item 4)
        if any(not 1 <= b <= 64 or m not in ("saturate", "wrap") for b, m in limits.values()):
            raise ValueError(f"counter limits out of range: {str(d['limits'])[:200]}")
        self = cls(names, limits)
        self.row_ts = decode_array(d["row_ts"])
        last_val, last_ts = decode_array(d["last_val"]), decode_array(d["last_ts"])
        if names == saved:
            self.last_val, self.last_ts = last_val, last_ts
            return self
        self.last_val = np.full((len(last_val), len(names)), NAN)
        self.last_ts = np.full((len(last_ts), len(names)), NAN)
        for j, name in enumerate(names):
            if name in saved:
                self.last_val[:, j] = last_val[:, saved.index(name)]
                self.last_ts[:, j] = last_ts[:, saved.index(name)]
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
        self, rows: np.ndarray, ts: np.ndarray, deltas: np.ndarray, spread: np.ndarray | None = None
    ) -> np.ndarray:
        """Decayed counts after each element (original order), shape (n, K).

        `spread` (n, K), optional: the seconds over which each delta accumulated (CounterUpdate.dt).
        A delta is then taken as spread evenly over that interval and enters with weight
        tau/dt * (1 - exp(-dt/tau)): ~1 for dt << tau, tau/dt for dt >> tau. Without it, 50 PCIe
        replays reported after a 10-minute collector gap would count as 50 in the last minute; with
        it, a steady rate r converges to exactly r * tau whatever the sampling interval.
        """
        rows, ts, deltas = _ints(rows), _floats(ts), _floats(deltas)
        out = np.zeros(deltas.shape)
        if len(rows) == 0:
            return out
        self._ensure(int(rows.max()) + 1)
        has_spread = spread is not None
        spread = _floats(spread) if has_spread else deltas
        kernels.decay_pass(rows, ts, deltas, spread, has_spread, self.tau, self.s, self.t, out)
        return out

    def current(self, rows: np.ndarray, ts: np.ndarray) -> np.ndarray:
        """Decayed counts of `rows` as of time `ts` (no new events), shape (n, K)."""
        dt = np.maximum(ts - self.t[rows], 0.0)
        return self.s[rows] * np.exp(-dt[:, None] / self.tau[None, :])

    def compact(self, rows: Compaction) -> None:
        """Keep only the entities `rows` keeps (the rest were forgotten), renumbered."""
        self.s = rows.take(self.s, 0.0)
        self.t = rows.take(self.t, NAN)

    def to_state(self, rows: int | None = None) -> dict[str, Any]:
        """The counts of the first `rows` entities (default all); the time constants are the
        owner's configuration (from_state)."""
        return {"s": encode_array(self.s[:rows]), "t": encode_array(self.t[:rows])}

    @classmethod
    def from_state(cls, d: dict[str, Any], taus: tuple[float, ...]) -> DecayingCount:
        """Counts from a snapshot, time constants from the deployment (an old snapshot's "tau" is
        ignored). A changed tau keeps the counts as they are, faded so far at the old rate: they
        fade at the new one from the restore on, so for a steady error rate r a count moves from
        r * old tau to r * new tau within a few new taus; a window rule reads old/new times the rate
        at first (too high where the window was shortened, too low where it was lengthened)."""
        self = cls(taus)
        s = decode_array(d["s"])
        if s.shape[1:] != (len(taus),):
            raise ValueError(f"decaying counts of {s.shape[1:]} columns, expected {len(taus)}")
        self.s = s
        self.t = decode_array(d["t"])
        return self


# ---------------------------------------------------------------- run lengths


class RunLength:
    """Consecutive samples for which a condition holds, per (entity, column), carried across batches."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.run = np.zeros((0, k), dtype=np.int64)

    def update(self, rows: np.ndarray, flags: np.ndarray) -> np.ndarray:
        """Run length ending at each element (0 where the flag is False), original order, (n, K)."""
        rows, flags = _ints(rows), np.ascontiguousarray(flags, dtype=np.bool_)
        out = np.zeros((len(rows), self.k), dtype=np.int64)
        if len(rows) == 0:
            return out
        self.run = grow(self.run, int(rows.max()) + 1, 0)
        kernels.run_pass(rows, flags, self.run, out)
        return out

    def compact(self, rows: Compaction) -> None:
        """Keep only the entities `rows` keeps (the rest were forgotten), renumbered."""
        self.run = rows.take(self.run, 0)

    def to_state(self, rows: int | None = None) -> dict[str, Any]:
        """The runs of the first `rows` entities (default all)."""
        return {"k": self.k, "run": encode_array(self.run[:rows])}

    @classmethod
    def from_state(cls, d: dict[str, Any]) -> RunLength:
        self = cls(int(d["k"]))
        self.run = decode_array(d["run"])
        if self.run.ndim != 2 or self.run.shape[1] != self.k:  # k sizes every update's output
            raise ValueError(f"run lengths of shape {self.run.shape} for k={str(d['k'])[:40]}")
        return self
