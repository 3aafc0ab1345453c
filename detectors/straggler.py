"""Straggler detection by peer comparison inside each job.

Synchronous training runs at the pace of its slowest rank, so one slow node costs the whole
job. For every job we keep, per node, a short window of a signal and compare the node's
window median with the median of its PEERS (the job's other nodes: leave-one-out, so a
2-node job still compares a node with the other one):

- `step_time_s` of `step/1` (higher is worse). It is each rank's own compute time, without
  the time it waited for peers (`wait_time_s`): ranks that wait for a straggler look slow in
  wall time, and blaming them is the classic mistake (docs/contract.md 7.1; NVIDIA's straggler tool
  likewise excludes NCCL kernels).
- `sm_clock_mhz` of the per-node features (lower is worse), from samples whose GPUs are busy
  (util >= busy_util_pct): a throttled node is slow even when the job emits no step times.
  Utilisation itself is NOT compared: a straggler's GPUs are the busy ones while its peers
  idle in collectives, so low utilisation points at the victims.

slowdown = node_median / peer_median - 1 (or the inverse for lower-is-worse). Peers alone
cannot see a node that slows down beside a peer that was already slow (two stragglers in a
2-node job), so each node also keeps a reference: its own median over its first
min_samples samples (the job's start). Its self slowdown (median / reference - 1) is compared
with its peers' self slowdowns the same leave-one-out way, so a job-wide change (a slower
phase of training) blames nobody. A node is a straggler when either slowdown >=
min_slowdown continuously for persist_s of event time; the
finding escalates to critical once it has persisted critical_after_s (a persistent straggler
is worth a drain), and resolves after clear_after_s without slowdown, or when the job ends.
All timing is event time (message ts), so a replay gives the same findings.

Only the nodes the scheduler put in the job are judged: the job stage passes on the records of
those nodes alone (pipeline/job_members.py), and a job record that lists the job's nodes makes the
detector drop the windows of any other node it holds, resolving that node's findings in the job
(a snapshot of a release that took every node, or a job whose nodes changed).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from fleetwatch.config import knob
from fleetwatch.detectors.findings import ForgottenJob, Incident, IncidentBook, severity_score
from fleetwatch.detectors.job_batch import FEATURES_RECORD, JOB_RECORD, STEP_RECORD, JobBatch

NAN = np.nan


@dataclass(frozen=True)
class StragglerConfig:
    window: int = knob(12, "samples per node in the rolling median", ge=1)
    min_samples: int = knob(6, "a node needs this many before it is judged", ge=1)
    min_slowdown: float = knob(
        0.05, "slowdown against the job's median that counts (5%: least worth acting on, above jitter)", gt=0
    )
    persist_s: float = knob(15.0, "seconds of event time a node must stay that slow before a finding", ge=0)
    critical_after_s: float = knob(300.0, "a straggler persisting this long (s) becomes critical", ge=0)
    clear_after_s: float = knob(60.0, "a straggler finding resolves after this many seconds at speed", gt=0)
    eval_every_s: float = knob(
        5.0, "judge on a fixed event-time grid (s), so batch boundaries do not matter", gt=0
    )
    busy_util_pct: float = knob(
        80.0,
        "SM clocks are compared only while the GPUs are this busy: during startup, checkpoints or a "
        "wait for peers the clock idles down, which says nothing about the node's speed",
        ge=0,
        le=100,
    )


@dataclass(frozen=True)
class Signal:
    name: str
    higher_is_worse: bool
    unit: str


STEP_TIME = Signal("step_time_s", True, "s")
SM_CLOCK = Signal("sm_clock_mhz", False, "MHz")
SIGNALS = (STEP_TIME, SM_CLOCK)  # what a job's windows are keyed by, beside the job


def loo_median(values: np.ndarray) -> np.ndarray:
    """For each element, the median of all the OTHER elements (NaN where fewer than 1 remain)."""
    n = len(values)
    out = np.full(n, NAN)
    if n < 2:
        return out
    order = np.argsort(values, kind="stable")
    s = values[order]
    m = n - 1  # size of each leave-one-out set
    j = np.empty(n, dtype=np.int64)
    j[order] = np.arange(n)  # sorted position of each element

    def kth(k: int) -> np.ndarray:  # k-th smallest of the set without element at sorted position j
        return np.where(k < j, s[k], s[np.minimum(k + 1, n - 1)])

    if m % 2:
        out[:] = kth((m - 1) // 2)
    else:
        out[:] = 0.5 * (kth(m // 2 - 1) + kth(m // 2))
    return out


@dataclass
class JobWindow:
    """Rolling windows of one signal for the nodes of one job."""

    nodes: dict[str, int] = field(default_factory=dict)
    ring: np.ndarray = field(default_factory=lambda: np.empty((0, 0)))
    count: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    bad_since: np.ndarray = field(default_factory=lambda: np.zeros(0))
    ref: np.ndarray = field(default_factory=lambda: np.zeros(0))  # each node's own first-window median
    next_eval: float = NAN  # the next grid point of event time at which this job is judged

    def rows(self, names: Sequence[str], window: int) -> np.ndarray:
        for n in names:
            if n not in self.nodes:
                self.nodes[n] = len(self.nodes)
        size = len(self.nodes)
        if self.ring.shape[0] < size:
            grow = size - self.ring.shape[0]
            self.ring = np.vstack([self.ring.reshape(-1, window), np.full((grow, window), NAN)])
            self.count = np.concatenate([self.count, np.zeros(grow, dtype=np.int64)])
            self.bad_since = np.concatenate([self.bad_since, np.full(grow, NAN)])
            self.ref = np.concatenate([self.ref, np.full(grow, NAN)])
        return np.fromiter((self.nodes[n] for n in names), dtype=np.int64, count=len(names))

    def push(self, rows: np.ndarray, values: np.ndarray, window: int) -> None:
        """Append values in message order; several values of one node in a batch keep their order."""
        order = np.argsort(rows, kind="stable")
        r = rows[order]
        starts = np.r_[0, np.flatnonzero(np.diff(r)) + 1]
        occurrence = np.arange(len(r)) - np.repeat(starts, np.diff(np.r_[starts, len(r)]))
        pos = (self.count[r] + occurrence) % window
        self.ring[r, pos] = values[order]
        np.add.at(self.count, r, 1)

    def keep_only(self, keep: frozenset[str]) -> None:
        """Drop the rows of every node not in `keep`; the others keep their order."""
        stay = [i for n, i in self.nodes.items() if n in keep]
        self.nodes = {n: k for k, n in enumerate(n for n in self.nodes if n in keep)}
        self.ring = self.ring[stay] if len(self.ring) else self.ring
        self.count, self.bad_since, self.ref = self.count[stay], self.bad_since[stay], self.ref[stay]

    def to_state(self) -> dict[str, Any]:
        return {
            "nodes": list(self.nodes),
            "ring": self.ring.tolist(),
            "count": self.count.tolist(),
            "bad_since": self.bad_since.tolist(),
            "ref": self.ref.tolist(),
            "next_eval": None if np.isnan(self.next_eval) else self.next_eval,
        }

    @classmethod
    def from_state(cls, d: dict[str, Any], window: int) -> JobWindow:
        """window: the deployment's StragglerConfig.window, which may differ from the snapshot's."""
        w = cls()
        w.nodes = {n: i for i, n in enumerate(d["nodes"])}
        w.ring = np.array(d["ring"], dtype=float).reshape(len(w.nodes), -1) if w.nodes else np.empty((0, 0))
        w.count = np.array(d["count"], dtype=np.int64)
        if w.nodes and w.ring.shape[1] != window:
            w.ring = _rewindow(w.ring, w.count, window)
        w.bad_since = np.array(d["bad_since"], dtype=float)
        w.ref = np.array(d["ref"], dtype=float)
        w.next_eval = NAN if d["next_eval"] is None else float(d["next_eval"])
        return w


def _rewindow(ring: np.ndarray, count: np.ndarray, window: int) -> np.ndarray:
    """Rings of another width as `push` would have filled them with `window`: each node's newest
    min(count, old width, window) values at their slots, the rest NaN. A longer window therefore
    starts with only the old window's values (the medians are nanmedians, `count` still says how
    many samples the node had), and a shorter one keeps the newest values only."""
    n, old = ring.shape
    out = np.full((n, window), NAN)
    rows = np.arange(n)
    for back in range(1, min(old, window) + 1):
        i = count - back  # push number of each node's back-th newest value
        has = i >= 0
        out[rows[has], i[has] % window] = ring[rows[has], i[has] % old]
    return out


class StragglerDetector:
    def __init__(self, config: StragglerConfig | None = None) -> None:
        self.cfg = config or StragglerConfig()
        self.windows: dict[tuple[str, str], JobWindow] = {}  # (job, signal) -> windows
        self.book = IncidentBook()

    # ------------------------------------------------------------ inputs

    def observe(self, batch: JobBatch) -> list[dict[str, Any]]:
        """The JobDetector protocol (detectors/protocol.py): step times, node features and job
        ends, each run of one kind handled together, in order."""
        out: list[dict[str, Any]] = []
        for kind, idx in batch.runs():
            if kind == STEP_RECORD:
                out += self._process(STEP_TIME, batch, idx, batch.step_time_s)
            elif kind == FEATURES_RECORD:
                # absent util counts as idle: a clock is only compared while the GPUs are busy
                busy = np.nan_to_num(batch.util[idx], nan=0.0) >= self.cfg.busy_util_pct
                take = idx[busy & ~np.isnan(batch.sm_clock_mhz[idx])]
                out += self._process(SM_CLOCK, batch, take, batch.sm_clock_mhz)
            elif kind == JOB_RECORD:
                for i in idx.tolist():
                    if batch.ended[i]:
                        out += self.job_ended(batch.job[i], float(batch.ts[i]))
                    else:
                        out += self.job_nodes(batch.job[i], batch.listed[i], float(batch.ts[i]))
        return out

    def job_ended(self, job: str, ts: float) -> list[dict[str, Any]]:
        """Resolve the job's open straggler findings and forget its windows."""
        return self._close_jobs({job: lambda inc: inc.finding(max(ts, inc.last_bad), resolved=True)})

    def forget(self, gone: Sequence[ForgottenJob]) -> list[dict[str, Any]]:
        """The JobDetector protocol: the stage forgot these running jobs (past its bounds): their
        findings resolve as forgotten, their windows go."""
        return self._close_jobs(
            {
                j.job: lambda inc, j=j: inc.finding(
                    max(j.at, inc.last_bad), resolved=True, unseen_for_s=j.unseen_for_s, why=j.why
                )
                for j in gone
            }
        )

    def _close_jobs(
        self, resolve: Mapping[str, Callable[[Incident], dict[str, Any]]]
    ) -> list[dict[str, Any]]:
        """Each job's open findings resolved as `resolve[job]` says, and its windows dropped (by
        key, not a scan: a flood past the stage's bounds forgets a job per record)."""
        out = [resolve[k[2]](self.book.open.pop(k)) for k in [k for k in self.book.open if k[2] in resolve]]
        for job in resolve:
            for sig in SIGNALS:
                self.windows.pop((job, sig.name), None)
        return out

    def job_nodes(self, job: str, nodes: Sequence[str], ts: float) -> list[dict[str, Any]]:
        """The job runs on `nodes` (its job/1): forget any other node's windows in it and resolve
        that node's findings in it."""
        keep = frozenset(nodes)
        for (j, _s), w in self.windows.items():
            if j == job and not keep.issuperset(w.nodes):
                w.keep_only(keep)
        out = []
        for key in [k for k in self.book.open if k[2] == job and k[0] not in keep]:
            inc = self.book.open.pop(key)
            out.append(inc.finding(max(ts, inc.last_bad), resolved=True))
        return out

    # ------------------------------------------------------------ core

    def _process(
        self, sig: Signal, batch: JobBatch, idx: np.ndarray, column: np.ndarray
    ) -> list[dict[str, Any]]:
        """The records `idx` of the batch, each a sample of `sig` (its value in `column`), job by
        job in order of first appearance, each job's in ts order (ties: as they arrived)."""
        by_job: dict[str, list[int]] = {}
        for i in idx.tolist():
            by_job.setdefault(batch.job[i], []).append(i)
        out: list[dict[str, Any]] = []
        step = self.cfg.eval_every_s
        for job, rows in by_job.items():
            w = self.windows.get((job, sig.name))
            if w is None:
                w = self.windows[(job, sig.name)] = JobWindow()
            mine = np.array(rows, dtype=np.int64)
            mine = mine[np.argsort(batch.ts[mine], kind="stable")]
            ts = batch.ts[mine]
            r = w.rows([batch.node[i] for i in mine.tolist()], self.cfg.window)
            values = column[mine]
            if np.isnan(w.next_eval):
                w.next_eval = (np.floor(ts[0] / step) + 1) * step
            lo = 0
            # Push what precedes each grid point, judge at the grid point, and go on; what comes
            # after the last grid point waits in the windows for the next batch.
            while lo < len(ts) and ts[-1] >= w.next_eval:
                hi = int(np.searchsorted(ts, w.next_eval, side="left"))
                if hi > lo:
                    w.push(r[lo:hi], values[lo:hi], self.cfg.window)
                out.extend(self._judge(job, sig, w, float(w.next_eval)))
                lo = hi
                w.next_eval = max(w.next_eval + step, (np.floor(ts[lo] / step) + 1) * step)
            if lo < len(ts):
                w.push(r[lo:], values[lo:], self.cfg.window)
        return out

    def _judge(self, job: str, sig: Signal, w: JobWindow, now: float) -> list[dict[str, Any]]:
        cfg = self.cfg
        ready = w.count >= cfg.min_samples
        if ready.sum() < 2:
            return []
        med = np.full(len(w.count), NAN)
        med[ready] = np.nanmedian(w.ring[ready], axis=1)
        peer = np.full(len(w.count), NAN)
        peer[ready] = loo_median(med[ready])
        full = np.isnan(w.ref) & ready
        w.ref[full] = med[full]
        with np.errstate(divide="ignore", invalid="ignore"):
            peer_slow = (med / peer - 1.0) if sig.higher_is_worse else (peer / med - 1.0)
            own = (med / w.ref - 1.0) if sig.higher_is_worse else (w.ref / med - 1.0)
        has_ref = ready & ~np.isnan(own)
        self_slow = np.full(len(w.count), NAN)
        if has_ref.sum() >= 2:
            self_slow[has_ref] = own[has_ref] - loo_median(own[has_ref])
        slowdown = np.fmax(peer_slow, self_slow)
        bad = ready & (slowdown >= cfg.min_slowdown)
        newly = bad & np.isnan(w.bad_since)
        w.bad_since[newly] = now
        w.bad_since[~bad] = NAN
        confirmed = bad & (now - w.bad_since >= cfg.persist_s)
        names = list(w.nodes)
        out: list[dict[str, Any]] = []
        for i in np.flatnonzero(confirmed):
            persisted = float(now - w.bad_since[i])
            severity = "critical" if persisted >= cfg.critical_after_s else "warning"
            s = float(slowdown[i])
            evidence = {
                "signal": sig.name,
                "slowdown": round(s, 4),
                "vs_peers": round(float(peer_slow[i]), 4),
                "vs_own_start": None if np.isnan(self_slow[i]) else round(float(self_slow[i]), 4),
                "node_median": round(float(med[i]), 6),
                "peer_median": round(float(peer[i]), 6),
                "peers": int(ready.sum() - 1),
                "persisted_s": round(persisted, 1),
                "threshold": cfg.min_slowdown,
            }
            summary = (
                f"{names[i]} is {100 * s:.0f}% slower than its {int(ready.sum() - 1)} peers in {job} "
                f"({sig.name} {med[i]:.4g} {sig.unit} vs peer median {peer[i]:.4g} {sig.unit})"
            )
            out.extend(
                self.book.observe(
                    node=names[i],
                    job=job,
                    kind="straggler",
                    rule=f"peer_{sig.name}",
                    ts=now,
                    severity=severity,
                    score=severity_score(severity, s / cfg.min_slowdown),
                    summary=summary,
                    evidence=evidence,
                    clear_after=cfg.clear_after_s,
                    next_ts=lambda _n, t: t,
                )
            )
        # Resolve this job's incidents of this signal that have been fine for clear_after_s.
        for key in [k for k in self.book.open if k[2] == job and k[4] == f"peer_{sig.name}"]:
            done = self.book.expire(key, now, lambda _n, t: t)
            if done is not None:
                out.append(done)
        return out

    # ------------------------------------------------------------ what Prometheus reads

    def step_times(self) -> list[tuple[str, str | None, float, float]]:
        """Per running job: (job, node, its median step time, its slowdown against the others'
        median) for each node with enough samples, and (job, None, the job's median, 0.0)."""
        out: list[tuple[str, str | None, float, float]] = []
        for (job, signal), w in list(self.windows.items()):
            if signal != STEP_TIME.name or len(w.count) < 2:
                continue
            ready = w.count >= self.cfg.min_samples
            if ready.sum() < 2:
                continue
            names = [n for n, i in sorted(w.nodes.items(), key=lambda kv: kv[1])]
            med = np.nanmedian(w.ring[ready], axis=1)
            peer = loo_median(med)
            for n, m, p in zip(
                [names[i] for i in np.flatnonzero(ready)], med.tolist(), peer.tolist(), strict=True
            ):
                out.append((job, n, m, m / p - 1.0))
            out.append((job, None, float(np.median(med)), 0.0))
        return out

    # ------------------------------------------------------------ state

    def to_state(self) -> dict[str, Any]:
        return {
            "windows": [[j, s, w.to_state()] for (j, s), w in self.windows.items()],
            "book": self.book.to_state(),
        }

    @classmethod
    def from_state(cls, d: dict[str, Any], config: StragglerConfig | None = None) -> StragglerDetector:
        """Windows and incidents from the snapshot, configuration from `config` (the deployment's)."""
        self = cls(config)
        window = self.cfg.window
        self.windows = {(j, s): JobWindow.from_state(w, window) for j, s, w in d["windows"]}
        self.book = IncidentBook.from_state(d["book"], self.cfg.clear_after_s)
        return self

    def to_bytes(self) -> bytes:
        return orjson.dumps(self.to_state(), option=orjson.OPT_SERIALIZE_NUMPY)

    @classmethod
    def from_bytes(cls, raw: bytes, config: StragglerConfig | None = None) -> StragglerDetector:
        return cls.from_state(orjson.loads(raw), config)
