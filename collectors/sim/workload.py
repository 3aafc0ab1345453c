"""A cluster's workload over weeks, with its failures and their truth, drawn in one go (no
wall-clock time, no telemetry): the input of the reliability benchmarks.

Jobs arrive uniformly over the period with the RSC-1-like size mix (rates.RSC1_JOB_MIX) and
exponential planned runtimes. Every node has faults at r_f (a lemon `lemon_multiplier` times as
often), each of one component (rates.RSC1_COMPONENT_MIX); a fault ends every job running on its
node a few minutes after it shows, so a job on n nodes meets them at n x r_f. A job ends at its
first fault, its application's own failure, a cancellation or a timeout, whichever comes first.
A job the infrastructure ended is requeued under the same id after a short queue, for the rest of
its planned time (as Slurm requeues a job a health check ended), up to `max_requeues` times.
Nodes are contiguous blocks (a job of fewer GPUs than a node takes one node); jobs may overlap on
a node, which changes no rate here: every fault is a per-node-time event.

Every run carries its truth: the component of an infrastructure failure and the node it came
from, when the fault showed (a little before the end, as a health check sees it), its first
training step and last checkpoint (the training jobs, of 8 GPUs or more, report them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fleetwatch import schemas
from fleetwatch.collectors.sim import rates

DAY = 86400.0
MARGIN_DAYS = 30.0  # faults are drawn this long past the period: runs started in it may end after it


@dataclass(frozen=True)
class WorkloadConfig:
    nodes: int = 2000
    days: float = 30.0
    gpus_per_node: int = 8
    r_f: float = rates.RSC1_FAILURES_PER_1000_NODE_DAYS  # per 1000 node-days
    jobs_per_day: float | None = None  # default: RSC-1's 7,200 a day scaled to `nodes`
    lemon_fraction: float = 0.0
    lemon_multiplier: float = 20.0
    lemons_fixed_at: float | None = None  # from then on the lemons fail as often as any node
    max_requeues: int = 5
    queue_s: float = 300.0  # mean wait before a requeued run starts
    checkpoint_s: float = 3600.0
    checkpoint_write_s: float = 60.0
    seed: int = 0
    start: float = 1_780_000_000.0


@dataclass
class Workload:
    """One row per run; node blocks are [first_node, first_node + n_nodes)."""

    cfg: WorkloadConfig
    job: np.ndarray  # int: the job id
    start: np.ndarray
    end: np.ndarray
    gpus: np.ndarray
    first_node: np.ndarray
    n_nodes: np.ndarray
    end_state: np.ndarray  # object: Slurm end state
    component: np.ndarray  # object: the infrastructure failure's component, else None
    failed_node: np.ndarray  # int: node the failure came from, else -1
    fault_ts: np.ndarray  # when the fault showed (NaN: none)
    first_step: np.ndarray  # NaN: the job reports no steps
    ckpt_ts: np.ndarray  # NaN: no checkpoint in this run
    lemons: np.ndarray  # node indices of the lemon nodes
    # every node fault in the period, whether a job was on the node or not
    fault_node: np.ndarray
    fault_time: np.ndarray
    fault_component: np.ndarray

    def __len__(self) -> int:
        return len(self.job)

    def nodes_of(self, i: int) -> list[int]:
        first, n = int(self.first_node[i]), int(self.n_nodes[i])
        return [(first + k) % self.cfg.nodes for k in range(n)]

    def job_messages(self) -> list[tuple[float, str, dict[str, Any]]]:
        """(time, job, job/1) of every run's start and end, as `fleetwatch slurm-jobs` publishes
        them (start time, GPUs per node, Slurm's end state)."""
        out = []
        for i in range(len(self)):
            job = f"j{int(self.job[i])}"
            nodes = [node_name(n) for n in self.nodes_of(i)]
            start, end = float(self.start[i]), float(self.end[i])
            base = {
                "schema": schemas.JOB,
                "job": job,
                "nodes": nodes,
                "gpus": [int(min(self.gpus[i], self.cfg.gpus_per_node))] * len(nodes),
                "start_ts": start,
                "source": "slurm",
            }
            out.append((start, job, {**base, "state": "started", "ts": start}))
            state = "finished" if self.end_state[i] in ("COMPLETED", "CANCELLED", "TIMEOUT") else "failed"
            out.append((end, job, {**base, "state": state, "ts": end, "end_state": str(self.end_state[i])}))
        return out

    @property
    def true_r_f(self) -> float:
        """The failure rate a node-day of a job meets, on average over the period's nodes and
        lemons included (per 1000 node-days)."""
        c = self.cfg
        end = c.start + c.days * DAY
        fixed = min(c.lemons_fixed_at, end) if c.lemons_fixed_at is not None else end
        share = (fixed - c.start) / (end - c.start)
        return c.r_f * (1 + (c.lemon_multiplier - 1) * len(self.lemons) / c.nodes * share)


def node_name(i: int) -> str:
    """Node `i`'s name in the workload's messages."""
    return f"gpu{i:05d}"


def draw(cfg: WorkloadConfig) -> Workload:
    rng = np.random.default_rng(cfg.seed)
    per_day = cfg.jobs_per_day or rates.RSC1_JOBS_PER_DAY * cfg.nodes / 2048
    n = rng.poisson(per_day * cfg.days)
    sizes = np.array(list(rates.RSC1_JOB_MIX))
    share = np.array([v[0] for v in rates.RSC1_JOB_MIX.values()])
    mean_h = np.array([v[1] for v in rates.RSC1_JOB_MIX.values()])
    which = rng.choice(len(sizes), n, p=share / share.sum())
    gpus = np.minimum(sizes[which], cfg.nodes * cfg.gpus_per_node)
    n_nodes = np.maximum(gpus // cfg.gpus_per_node, 1)
    planned = rng.exponential(mean_h[which] * 3600)
    start = cfg.start + np.sort(rng.uniform(0, cfg.days * DAY, n))
    first_node = rng.integers(0, cfg.nodes, n)
    lemons = np.sort(rng.choice(cfg.nodes, round(cfg.lemon_fraction * cfg.nodes), replace=False))
    is_lemon = np.zeros(cfg.nodes, dtype=bool)
    is_lemon[lemons] = True

    comps = np.array(list(rates.RSC1_COMPONENT_MIX), dtype=object)
    comp_p = np.array(list(rates.RSC1_COMPONENT_MIX.values()))
    rate_s = cfg.r_f / 1000 / DAY  # per node-second

    # Node faults: a Poisson process on every node (a lemon's `lemon_multiplier` times faster),
    # over the period and a margin for runs that end after it. A fault ends every job running on
    # its node, a few minutes after it shows.
    horizon = (cfg.days + MARGIN_DAYS) * DAY
    per_node = rng.poisson(rate_s * horizon, cfg.nodes)
    ev_node = np.repeat(np.arange(cfg.nodes), per_node)
    ev_time = cfg.start + rng.uniform(0, horizon, len(ev_node))
    # a lemon's excess, until it is repaired (`lemons_fixed_at`: an operator drained it)
    lemon_span = (cfg.lemons_fixed_at - cfg.start) if cfg.lemons_fixed_at is not None else horizon
    extra = rng.poisson(rate_s * (cfg.lemon_multiplier - 1) * lemon_span, len(lemons))
    ev_node = np.concatenate([ev_node, np.repeat(lemons, extra)])
    ev_time = np.concatenate([ev_time, cfg.start + rng.uniform(0, lemon_span, int(extra.sum()))])
    order = np.lexsort((ev_time, ev_node))
    ev_node, ev_time = ev_node[order], ev_time[order]
    ev_comp = comps[rng.choice(len(comps), len(ev_node), p=comp_p)]
    # sorted by node, then time; the stride leaves room for runs starting past the horizon (long
    # requeue chains), which then find no fault on their node rather than the next node's
    stride = 4 * horizon
    ev_key = ev_node * stride + (ev_time - cfg.start)

    rows: list[dict[str, np.ndarray]] = []
    job = np.arange(n)
    remaining = planned
    for generation in range(cfg.max_requeues + 1):
        k = len(job)
        if k == 0:
            break
        # the first fault on any of the run's nodes after its start: one row per (run, node)
        run_of = np.repeat(np.arange(k), n_nodes)
        offset = np.arange(len(run_of)) - np.repeat(np.cumsum(n_nodes) - n_nodes, n_nodes)
        node_of = (first_node[run_of] + offset) % cfg.nodes
        pos = np.searchsorted(ev_key, node_of * stride + (start[run_of] - cfg.start))
        hit = pos < len(ev_key)
        hit[hit] = ev_node[pos[hit]] == node_of[hit]
        at = np.where(hit, ev_time[np.minimum(pos, len(ev_key) - 1)], np.inf)
        by_time = np.lexsort((at, run_of))
        first_row = by_time[np.unique(run_of[by_time], return_index=True)[1]]  # each run's earliest
        fault_at = at[first_row]
        fault_event = np.where(np.isfinite(fault_at), pos[first_row], -1)
        to_fail = fault_at - start + rng.uniform(0, 300, k)  # the job dies minutes after the fault shows
        user_at = np.where(rng.uniform(size=k) < rates.RSC1_USER_FAILURE, rng.uniform(0, remaining), np.inf)
        cancel_at = np.where(rng.uniform(size=k) < rates.RSC1_CANCELLED, rng.uniform(0, remaining), np.inf)
        timeout = rng.uniform(size=k) < rates.RSC1_TIMEOUT
        first_at = np.minimum.reduce([to_fail, user_at, cancel_at, remaining])
        infra = to_fail == first_at
        comp = np.where(infra, ev_comp[np.maximum(fault_event, 0)], None)
        failed = np.where(infra, ev_node[np.maximum(fault_event, 0)], -1)
        state = np.full(k, "COMPLETED", dtype=object)
        state[timeout & ~infra & (first_at == remaining)] = "TIMEOUT"
        state[cancel_at == first_at] = "CANCELLED"
        state[user_at == first_at] = "FAILED"
        state[infra] = np.where(comp[infra] == "node", "NODE_FAIL", "FAILED")
        end = start + first_at
        fault_ts = np.where(infra, fault_at, np.nan)
        trains = gpus >= cfg.gpus_per_node
        first_step = np.where(trains, start + np.minimum(rng.uniform(60, 300, k), first_at), np.nan)
        done_ckpts = np.floor((end - first_step) / cfg.checkpoint_s)
        ckpt = np.where(trains & (done_ckpts >= 1), first_step + done_ckpts * cfg.checkpoint_s, np.nan)
        rows.append(
            {
                "job": job,
                "start": start,
                "end": end,
                "gpus": gpus,
                "first_node": first_node,
                "n_nodes": n_nodes,
                "end_state": state,
                "component": comp,
                "failed_node": failed,
                "fault_ts": fault_ts,
                "first_step": first_step,
                "ckpt_ts": ckpt,
            }
        )
        # the infrastructure's failures run again, for the rest of their planned time
        again = infra & (remaining - first_at > 60) & (generation < cfg.max_requeues)
        job, gpus, n_nodes = job[again], gpus[again], n_nodes[again]
        remaining = (remaining - first_at)[again]
        start = end[again] + rng.exponential(cfg.queue_s, int(again.sum()))
        first_node = rng.integers(0, cfg.nodes, len(job))
    cols = {key: np.concatenate([r[key] for r in rows]) for key in rows[0]}
    order = np.argsort(cols["start"], kind="stable")
    in_period = ev_time < cfg.start + cfg.days * DAY
    return Workload(
        cfg=cfg,
        lemons=lemons,
        fault_node=ev_node[in_period],
        fault_time=ev_time[in_period],
        fault_component=ev_comp[in_period],
        **{key: v[order] for key, v in cols.items()},
    )
