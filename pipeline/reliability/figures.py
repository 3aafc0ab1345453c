"""The figures, from an attributed History (history.py). docs/reliability.md defines each one.

- r_f: infrastructure failures (hardware or system software: NODE_FAIL, or FAILED with a cause
  finding in the window) of runs of more than `large_gpus` GPUs, per 1000 node-days of those runs'
  runtime, with an exact Poisson 95% interval; by component; and the same over runs of all sizes.
- MTTF by job size: runs in power-of-two GPU buckets; total runtime over infrastructure failures,
  with an exact Poisson interval, beside the series projection 1 / (nodes x r_f).
- ETTR per job (all runs of one job id), measured, and the expected ETTR with its parameters.
- Lost GPU-hours by cause; lemon nodes with their signals.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.stats import chi2, poisson

from fleetwatch.pipeline.reliability.history import History

DAY = 86400.0
HOUR = 3600.0


@dataclass(frozen=True)
class FigureConfig:
    large_gpus: int = 128  # r_f counts runs of more than this many GPUs (the paper's rule)
    gpus_per_node: int = 8
    ckpt_interval_s: float = 3600.0  # assumed where a job reports no checkpoint (the paper's hourly)
    restart_overhead_s: float = 300.0  # u0 assumed where a job reports no steps (the paper's 5 min)
    ckpt_write_s: float = 300.0  # w_cp assumed where a job reports none (the paper's 5 min)
    ettr_min_hours: float = 24.0  # jobs measured for ETTR: at least this long (the paper's long runs)
    # the chance that a fleet of healthy nodes shows even one lemon (family-wise: each node is tested
    # at lemon_fwer / nodes, so a larger fleet does not raise more false lemons)
    lemon_fwer: float = 0.01
    lemon_min_events: int = 3  # episodes
    lemon_episode_gap_s: float = 600.0  # a node's failures and drains this close are one episode
    large_job_gpus: int = 512  # "large jobs" of the lemon before/after comparison (the paper's 512+)
    confidence: float = 0.95


def poisson_rate_ci(k: int, exposure: float, confidence: float = 0.95) -> tuple[float, float]:
    """Exact (Garwood) interval of a Poisson rate: k events over `exposure`."""
    if exposure <= 0:
        return (math.nan, math.nan)
    a = 1.0 - confidence
    lo = chi2.ppf(a / 2, 2 * k) / 2 / exposure if k > 0 else 0.0
    hi = chi2.ppf(1 - a / 2, 2 * k + 2) / 2 / exposure
    return (float(lo), float(hi))


def _num(x: float) -> float | None:
    """JSON has no inf or NaN: an unbounded or unknown value is null."""
    return None if not math.isfinite(x) else round(float(x), 6)


# ---------------------------------------------------------------------- taxonomy


def taxonomy(h: History) -> dict[str, Any]:
    """Job ends by category, and failures by component."""
    cats, counts = np.unique(h.category.astype(str), return_counts=True) if len(h) else ([], [])
    by_cat = {str(c): int(n) for c, n in zip(cats, counts, strict=True)}
    failed = h.infra_failure
    comps, ccounts = (
        np.unique(h.component[failed].astype(str), return_counts=True) if failed.any() else ([], [])
    )
    states, scounts = np.unique(h.end_state.astype(str), return_counts=True) if len(h) else ([], [])
    return {
        "runs": len(h),
        "by_category": by_cat,
        "by_end_state": {str(s): int(n) for s, n in zip(states, scounts, strict=True)},
        "infra_failures_by_component": {str(c): int(n) for c, n in zip(comps, ccounts, strict=True)},
        "gpu_hours_by_category": {
            str(c): round(float((h.runtime_s * h.gpus)[h.category == c].sum() / HOUR), 3) for c in by_cat
        },
    }


def failures_by_day(h: History) -> dict[str, Any]:
    """Infrastructure failures per day and component (the report's stacked series)."""
    failed = h.infra_failure
    if not failed.any():
        return {"days": [], "series": {}}
    day = np.floor(h.end[failed] / DAY).astype(np.int64)
    comp = h.component[failed].astype(str)
    days = np.arange(math.floor(h.since / DAY), math.ceil(h.until / DAY))
    series = {}
    for c in np.unique(comp):
        series[str(c)] = np.bincount(day[comp == c] - days[0], minlength=len(days))[: len(days)].tolist()
    return {"days": (days * DAY).tolist(), "series": series}


# ---------------------------------------------------------------------- r_f


def failure_rate(h: History, cfg: FigureConfig, large_only: bool = True) -> dict[str, Any]:
    keep = h.gpus > cfg.large_gpus if large_only else np.ones(len(h), dtype=bool)
    node_days = float((h.runtime_s[keep] * h.n_nodes[keep]).sum() / DAY)
    failed = keep & h.infra_failure
    k = int(failed.sum())
    rate = k / node_days * 1000 if node_days > 0 else math.nan
    lo, hi = poisson_rate_ci(k, node_days / 1000, cfg.confidence)
    comps, counts = np.unique(h.component[failed].astype(str), return_counts=True) if k else ([], [])
    by_component = {str(c): _num(n / node_days * 1000) for c, n in zip(comps, counts, strict=True)}
    return {
        "total": _num(rate),
        "ci_low": _num(lo),
        "ci_high": _num(hi),
        "failures": k,
        "node_days": round(node_days, 3),
        "jobs": int(keep.sum()),
        "rule": f"runs of more than {cfg.large_gpus} GPUs" if large_only else "runs of every size",
        "by_component": by_component,
    }


# ---------------------------------------------------------------------- MTTF by size


def gpu_bucket(gpus: np.ndarray) -> np.ndarray:
    """Power-of-two buckets: 1, 2, 4, 8, ... (a 24-GPU job is in the 16 bucket)."""
    g = np.maximum(gpus, 1)
    return (2 ** np.floor(np.log2(g))).astype(np.int64)


def mttf_by_gpus(h: History, r_f_per_node_day: float, cfg: FigureConfig) -> list[dict[str, Any]]:
    out = []
    if not len(h):
        return out
    bucket = gpu_bucket(h.gpus)
    for b in np.unique(bucket):
        sel = bucket == b
        hours = float(h.runtime_s[sel].sum() / HOUR)
        k = int((sel & h.infra_failure).sum())
        lo_rate, hi_rate = poisson_rate_ci(k, hours, cfg.confidence)
        nodes = float(h.n_nodes[sel].mean())
        # no nodes (runs whose job/1 listed none): nothing to project from, not a division by 0
        projected = 24.0 / (nodes * r_f_per_node_day) if nodes * r_f_per_node_day > 0 else math.nan
        out.append(
            {
                "gpus": int(b),
                "jobs": int(sel.sum()),
                "failures": k,
                "runtime_h": round(hours, 3),
                "mttf_h": _num(hours / k if k else math.inf),
                "ci_low_h": _num(1 / hi_rate if hi_rate > 0 else math.inf),
                "ci_high_h": _num(1 / lo_rate if lo_rate > 0 else math.inf),
                "mean_nodes": round(nodes, 3),
                "projected_mttf_h": _num(projected),
            }
        )
    return out


# ---------------------------------------------------------------------- ETTR and lost time


@dataclass
class Loss:
    """Per run: GPU-seconds lost to progress since the last checkpoint, and to restart overhead
    (charged to the run that restarts, caused by the run before it)."""

    lost_progress_s: np.ndarray  # wall seconds of the run lost at its end
    restart_s: np.ndarray  # wall seconds from the run's start to its first step, if it is a restart
    queue_s: np.ndarray  # wall seconds between the job's previous end and this start
    assumed: np.ndarray  # bool: the lost progress is the assumption (no checkpoint reported)


def losses(h: History, cfg: FigureConfig) -> Loss:
    n = len(h)
    runtime = h.runtime_s
    failure = (h.category != "completed") & (h.category != "other")
    has_ckpt = np.isfinite(h.ckpt) & (h.ckpt >= h.start)
    # no checkpoint in this run but steps reported: everything since the run's first step is lost
    has_steps = np.isfinite(h.first_step)
    since = np.where(has_ckpt, h.ckpt, np.where(has_steps, h.first_step, np.nan))
    measured = np.clip(h.end - since, 0.0, runtime)
    assumed_loss = np.minimum(runtime, cfg.ckpt_interval_s / 2)
    assumed = failure & ~np.isfinite(since)
    lost = np.where(failure, np.where(np.isfinite(since), measured, assumed_loss), 0.0)
    lost = np.nan_to_num(lost)
    # restarts: a run of a job id that had an earlier run in the range
    order = np.lexsort((h.start, h.job.astype(str)))
    job_sorted = h.job[order].astype(str)
    restart_flag = np.zeros(n, dtype=bool)
    queue = np.zeros(n)
    if n:
        same = job_sorted[1:] == job_sorted[:-1]
        restart_flag[order[1:][same]] = True
        prev_end = h.end[order[:-1]][same]
        queue[order[1:][same]] = np.maximum(h.start[order[1:][same]] - prev_end, 0.0)
    overhead = np.where(
        has_steps, np.clip(h.first_step - h.start, 0.0, runtime), np.minimum(runtime, cfg.restart_overhead_s)
    )
    restart = np.where(restart_flag, overhead, 0.0)
    return Loss(lost, restart, queue, assumed)


def ettr(h: History, loss: Loss, r_f_per_node_day: float, cfg: FigureConfig) -> dict[str, Any]:
    """Per job id: productive time over the time from its first start to its last end."""
    if not len(h):
        return {
            "jobs": [],
            "expected": expected_params(h, loss, r_f_per_node_day, cfg),
            "min_hours": cfg.ettr_min_hours,
        }
    jobs, inverse = np.unique(h.job.astype(str), return_inverse=True)
    first = np.full(len(jobs), np.inf)
    np.minimum.at(first, inverse, h.start)
    last = np.full(len(jobs), -np.inf)
    np.maximum.at(last, inverse, h.end)
    wall = last - first
    bad = np.bincount(
        inverse, weights=loss.lost_progress_s + loss.restart_s + loss.queue_s, minlength=len(jobs)
    )
    interruptions = np.bincount(
        inverse, weights=(h.category != "completed") & (h.category != "other"), minlength=len(jobs)
    )
    nodes = np.zeros(len(jobs), dtype=np.int64)
    np.maximum.at(nodes, inverse, h.n_nodes)
    gpus = np.zeros(len(jobs), dtype=np.int64)
    np.maximum.at(gpus, inverse, h.gpus)
    long_enough = wall >= cfg.ettr_min_hours * HOUR
    value = np.clip(1.0 - bad / np.maximum(wall, 1e-9), 0.0, 1.0)
    rows = [
        {
            "job": str(jobs[i]),
            "gpus": int(gpus[i]),
            "nodes": int(nodes[i]),
            "wall_h": round(float(wall[i] / HOUR), 4),
            "interruptions": int(interruptions[i]),
            "ettr": round(float(value[i]), 6),
        }
        for i in np.flatnonzero(long_enough)
    ]
    return {
        "jobs": rows,
        "expected": expected_params(h, loss, r_f_per_node_day, cfg),
        "min_hours": cfg.ettr_min_hours,
    }


def expected_ettr(
    nodes: np.ndarray | float,
    r_f_per_node_day: float,
    ckpt_interval_s: float,
    restart_s: float,
    write_s: float,
    queue_s: float = 0.0,
) -> np.ndarray:
    """E[ETTR] ~ (1 - lam (u0 + dt/2)) / ((1 + w/dt)(1 + lam q)), lam = nodes x r_f (per second);
    docs/reliability.md says where q enters and why."""
    lam = np.asarray(nodes, dtype=np.float64) * r_f_per_node_day / DAY
    value = (1 - lam * (restart_s + ckpt_interval_s / 2)) / (
        (1 + write_s / ckpt_interval_s) * (1 + lam * queue_s)
    )
    return np.clip(value, 0.0, 1.0)


def young_daly_s(nodes: np.ndarray | float, r_f_per_node_day: float, write_s: float) -> np.ndarray:
    """The optimal checkpoint interval sqrt(2 w MTTF), MTTF = 1 / (nodes r_f)."""
    mttf_s = DAY / (np.asarray(nodes, dtype=np.float64) * max(r_f_per_node_day, 1e-300))
    return np.sqrt(2 * write_s * mttf_s)


def _median_or(values: np.ndarray, default: float) -> tuple[float, bool]:
    v = values[np.isfinite(values)]
    return (float(np.median(v)), True) if len(v) else (default, False)


def expected_params(h: History, loss: Loss, r_f_per_node_day: float, cfg: FigureConfig) -> dict[str, Any]:
    restarts = loss.restart_s[(loss.restart_s > 0) & np.isfinite(h.first_step)] if len(h) else np.array([])
    u0, u0_measured = _median_or(restarts, cfg.restart_overhead_s)
    w, w_measured = _median_or(h.ckpt_write_s if len(h) else np.array([]), cfg.ckpt_write_s)
    queues = loss.queue_s[loss.queue_s > 0] if len(h) else np.array([])
    q, q_measured = _median_or(queues, 0.0)
    dt = cfg.ckpt_interval_s
    sizes = np.unique(gpu_bucket(h.gpus)) if len(h) else np.array([8])
    curve_nodes = np.unique(np.maximum(sizes // cfg.gpus_per_node, 1))
    return {
        "r_f_per_node_day": _num(r_f_per_node_day),
        "ckpt_interval_s": dt,
        "restart_overhead_s": round(u0, 3),
        "restart_overhead_measured": u0_measured,
        "ckpt_write_s": round(w, 3),
        "ckpt_write_measured": w_measured,
        "queue_after_failure_s": round(q, 3),
        "queue_measured": q_measured,
        "curve": [
            {
                "nodes": int(nn),
                "gpus": int(nn * cfg.gpus_per_node),
                "expected_ettr": _num(float(expected_ettr(nn, r_f_per_node_day, dt, u0, w, q))),
                "young_daly_interval_s": _num(float(young_daly_s(nn, r_f_per_node_day, w))),
                "expected_ettr_at_young_daly": _num(
                    float(
                        expected_ettr(
                            nn, r_f_per_node_day, float(young_daly_s(nn, r_f_per_node_day, w)), u0, w, q
                        )
                    )
                ),
            }
            for nn in curve_nodes
        ],
    }


def drained_node_seconds(
    drains: Mapping[str, list[tuple[float, str]]], since: float, until: float
) -> dict[str, float]:
    """Per node, the seconds in [since, until) between an executed drain and the next executed
    resume or the next time Slurm's view showed the node back in service ("returned": lifted by
    hand); a node still drained at `until` counts until then."""
    out: dict[str, float] = {}
    for node, events in drains.items():
        total, drained_at = 0.0, None
        for ts, action in sorted(events):
            if action == "drain" and drained_at is None:
                drained_at = ts
            elif action in ("resume", "returned") and drained_at is not None:
                total += max(0.0, min(ts, until) - max(drained_at, since))
                drained_at = None
        if drained_at is not None:
            total += max(0.0, until - max(drained_at, since))
        if total > 0:
            out[node] = total
    return out


def lost_gpu_hours(h: History, loss: Loss, drained: Mapping[str, float], cfg: FigureConfig) -> dict[str, Any]:
    cause = h.category.astype(object).copy()
    named = np.flatnonzero(h.component != None)  # noqa: E711 (elementwise): the failures, a few
    cause[named] = [f"{h.category[i]}:{h.component[i]}" for i in named]

    def by_cause(seconds: np.ndarray, charged_to: np.ndarray) -> dict[str, float]:
        gh = seconds * h.gpus / HOUR
        out: dict[str, float] = {}
        for c in np.unique(charged_to[gh > 0].astype(str)) if len(h) else []:
            out[str(c)] = round(float(gh[charged_to == c].sum()), 3)
        return out

    # a restart is charged to the cause of the run before it (the interruption that forced it)
    prev_cause = cause.copy()
    if len(h):
        order = np.lexsort((h.start, h.job.astype(str)))
        js = h.job[order].astype(str)
        same = js[1:] == js[:-1]
        prev_cause[order[1:][same]] = cause[order[:-1][same]]
    lost = by_cause(loss.lost_progress_s, cause)
    restart = by_cause(loss.restart_s, prev_cause)
    drained_gh = round(sum(drained.values()) * cfg.gpus_per_node / HOUR, 3)
    return {
        "lost_progress": lost,
        "restart": restart,
        "drained": drained_gh,
        "assumed_lost_progress_runs": int(loss.assumed.sum()),
        "total": round(sum(lost.values()) + sum(restart.values()) + drained_gh, 3),
    }


# ---------------------------------------------------------------------- lemons


def lemons(
    h: History,
    xid_counts: Mapping[str, int],
    drains_executed: Mapping[str, list[float]],
    lemon_findings: Mapping[str, list[str]],
    nodes_seen: int,
    cfg: FigureConfig,
) -> dict[str, Any]:
    """Nodes whose count of episodes blamed on them (single- and multi-node job failures, and
    drains, those within `lemon_episode_gap_s` of each other as one) is improbable at the fleet's
    rate (Poisson tail below `lemon_fwer` / nodes, at least `lemon_min_events`), plus those
    detect's lemon detector named. The fleet rate leaves out the lemons themselves, so that they
    do not raise it (lemon_rate)."""
    fail = h.infra_failure & (h.blamed_node != None)  # noqa: E711
    single = fail & (h.n_nodes == 1)
    multi = fail & (h.n_nodes > 1)
    nodes_1, single_jobs = np.unique(h.single_node[h.single_node != None].astype(str), return_counts=True)  # noqa: E711
    single_runs = dict(zip(nodes_1.tolist(), single_jobs.tolist(), strict=True))
    sf = _count(h.blamed_node[single])
    mf = _count(h.blamed_node[multi])
    outs = {n: len(v) for n, v in drains_executed.items()}
    # the test counts episodes: one fault often ends several jobs on its node and is drained
    # minutes later, which is one piece of evidence against the node, not three
    drain_nodes = [n for n, v in drains_executed.items() for _ in v]
    drain_times = [t for v in drains_executed.values() for t in v]
    episodes = _episodes(
        np.concatenate([h.blamed_node[fail].astype(str), np.array(drain_nodes, dtype=str)]),
        np.concatenate([h.end[fail], np.array(drain_times, dtype=np.float64)]),
        cfg.lemon_episode_gap_s,
    )
    names = sorted(set(sf) | set(mf) | set(outs) | set(lemon_findings))
    events = np.array([episodes.get(n, 0) for n in names], dtype=np.float64)
    population = max(nodes_seen, len(names), 1)
    rate, lemon = lemon_rate(events, population, cfg)
    tail = poisson.sf(events - 1, rate) if len(events) else np.array([])
    out = []
    for i, n in enumerate(names):
        by_stats = bool(lemon[i])
        if not (by_stats or n in lemon_findings):
            continue
        out.append(
            {
                "node": n,
                "single_node_fails": sf.get(n, 0),
                "single_node_jobs": single_runs.get(n, 0),
                "single_node_failure_rate": _num(sf.get(n, 0) / single_runs[n])
                if single_runs.get(n)
                else None,
                "multi_node_fails": mf.get(n, 0),
                "out_count": outs.get(n, 0),
                "episodes": int(events[i]),
                "xid_count": int(xid_counts.get(n, 0)),
                "tail_p": float(tail[i]),
                "by": "statistics" if by_stats else "detector",
                "lemon_findings": lemon_findings.get(n, []),
                "drained_at": min(drains_executed[n]) if drains_executed.get(n) else None,
                **_around_drain(h, fail, n, min(drains_executed[n]) if drains_executed.get(n) else None),
            }
        )
    out.sort(key=lambda r: (r["tail_p"], r["node"]))
    return {
        "fleet_rate_per_node": round(rate, 6),
        "nodes": population,
        "lemons": out,
        "before_after": before_after(h, [r["drained_at"] for r in out if r["drained_at"]], cfg),
    }


def lemon_rate(events: np.ndarray, population: int, cfg: FigureConfig) -> tuple[float, np.ndarray]:
    """(the fleet's episodes per node, which of `events` are lemons at it): the rate of the nodes
    that are not lemons (those without episodes included), the lemons found again at each new rate
    until they stop changing. It starts from the mean without the top 2% of nodes, so that many
    lemons cannot hide one another by raising the rate (RSC-1's 15 lemons in 500 nodes, 3% of them,
    were found 8 from the plain mean), and moves to where no node left out is a lemon and every
    lemon is one at that rate: a healthy fleet's rate is then its plain mean. The top 2% alone was
    the rate before, which in a sparse fleet (most nodes without an episode) leaves out every node
    with one: too low, and 2.5-3% of healthy 2,000-node fleets at 0.05 episodes a node showed a
    false lemon against the 1% promised (0-0.7% now, with the same power)."""
    floor = 1.0 / population / 10  # a fleet with no episode at all: not a rate of zero
    everyone = np.concatenate([events, np.zeros(population - len(events))])
    rate = max(float(np.sort(everyone)[: max(1, math.floor(population * 0.98))].mean()), floor)
    total = float(events.sum())

    def lemons_at(r: float) -> np.ndarray:
        return (events >= cfg.lemon_min_events) & (poisson.sf(events - 1, r) < cfg.lemon_fwer / population)

    for _ in range(len(events) + 2):  # the rate moves one way only (a monotone map): it settles
        lemon = lemons_at(rate)
        new = max((total - float(events[lemon].sum())) / max(population - int(lemon.sum()), 1), floor)
        if new == rate:
            break
        rate = new
    return rate, lemons_at(rate)


def _around_drain(h: History, fail: np.ndarray, node: str, drained_at: float | None) -> dict[str, Any]:
    """The node's own failures per node-day before its first drain in the range and after it
    (None where it was not drained, or no time is left on a side)."""
    if drained_at is None:
        return {"failures_per_day_before_drain": None, "failures_per_day_after_drain": None}
    mine = fail & (h.blamed_node == node)
    ends = h.end[mine]
    before_days = (drained_at - h.since) / DAY
    after_days = (h.until - drained_at) / DAY
    return {
        "failures_per_day_before_drain": _num(np.sum(ends < drained_at) / before_days)
        if before_days > 0
        else None,
        "failures_per_day_after_drain": _num(np.sum(ends >= drained_at) / after_days)
        if after_days > 0
        else None,
    }


def _episodes(nodes: np.ndarray, times: np.ndarray, gap_s: float) -> dict[str, int]:
    """Per node, its events grouped into episodes: times closer than `gap_s` are one."""
    if not len(nodes):
        return {}
    order = np.lexsort((times, nodes))
    n, t = nodes[order], times[order]
    new = np.ones(len(n), dtype=bool)
    new[1:] = (n[1:] != n[:-1]) | (np.diff(t) > gap_s)
    names, counts = np.unique(n[new], return_counts=True)
    return dict(zip(names.tolist(), (int(c) for c in counts), strict=True))


def _count(values: np.ndarray) -> dict[str, int]:
    if not len(values):
        return {}
    names, counts = np.unique(values.astype(str), return_counts=True)
    return dict(zip(names.tolist(), (int(c) for c in counts), strict=True))


def before_after(h: History, drained_at: list[float], cfg: FigureConfig) -> dict[str, Any] | None:
    """Infrastructure failure share of large jobs (at least `large_job_gpus`) that ended before the
    first lemon drain and after the last one."""
    if not drained_at or not len(h):
        return None
    large = h.gpus >= cfg.large_job_gpus
    first, last = min(drained_at), max(drained_at)

    def share(sel: np.ndarray) -> dict[str, Any]:
        n = int(sel.sum())
        k = int((sel & h.infra_failure).sum())
        return {"jobs": n, "failures": k, "failure_share": _num(k / n) if n else None}

    return {
        "large_job_gpus": cfg.large_job_gpus,
        "first_drain": first,
        "last_drain": last,
        "before": share(large & (h.end < first)),
        "after": share(large & (h.start >= last)),
    }
