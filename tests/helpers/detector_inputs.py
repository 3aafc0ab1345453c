"""Input streams for the detector tests, shared with the snapshot and metrics tests: a node's
telemetry series with GPU faults (`series`), a synchronous job's step/1 messages with slow ranks
(`steps`), and a fleet whose GPUs share workload levels, one of them heating (`fleet`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from tests.helpers.batches import gpu_entry, telemetry

T0 = 1_764_000_000.0
NODE = "gpu-node-0007"
GpuFault = Callable[[int], dict[int, dict[str, Any]]]  # sample number -> {gpu index: field overrides}


def gpus_with(over: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """Eight GPUs; an override with "index" replaces the whole entry, otherwise patches fields."""
    return [
        o if (o := over.get(i)) is not None and "index" in o else gpu_entry(i, **(o or {})) for i in range(8)
    ]


def series(
    n: int,
    gpu_fault: GpuFault | None = None,
    *,
    node: str = NODE,
    start: float = 1000.0,
    step: float = 1.0,
    ib: Callable[[int], list[dict[str, Any]]] | None = None,
) -> list[dict[str, Any]]:
    msgs = []
    for k in range(n):
        over = gpu_fault(k) if gpu_fault else {}
        gpus = gpus_with(over)
        msgs.append(telemetry(node, start + k * step, gpus, seq=k, ib=ib(k) if ib else None))
    return msgs


def steps(
    n_nodes: int,
    n_steps: int,
    *,
    slow: dict[int, float] | None = None,
    slow_from: int = 0,
    jitter: float = 0.02,
    seed: int = 0,
    job: str = "job-1",
) -> list[dict[str, Any]]:
    """step/1 messages of a synchronous job: each rank's own compute time, and the wait for the slowest."""
    rng = np.random.default_rng(seed)
    slow = slow or {}
    out = []
    t = T0
    for s in range(n_steps):
        own = 1.0 + jitter * rng.standard_normal(n_nodes)
        for i, f in slow.items():
            if s >= slow_from:
                own[i] *= 1 + f
        wall = own.max()
        t += wall
        for i in range(n_nodes):
            out.append(
                {
                    "schema": "step/1",
                    "job": job,
                    "node": f"node-{i:02d}",
                    "rank": i,
                    "step": s,
                    "step_time_s": float(own[i]),
                    "wait_time_s": float(wall - own[i]),
                    "ts": t,
                }
            )
    return out


def job_start(n_nodes: int, job: str = "job-1", ts: float = T0) -> dict[str, Any]:
    """The job/1 that puts `steps()`' nodes in the job: the job stage judges only listed nodes."""
    return {
        "schema": "job/1",
        "job": job,
        "nodes": [f"node-{i:02d}" for i in range(n_nodes)],
        "state": "running",
        "ts": ts,
    }


def fleet(
    n_nodes: int, n_ticks: int, *, seed: int = 0, hot: tuple[int, int, int] | None = None
) -> list[list[dict[str, Any]]]:
    """Per tick, one telemetry/1 per node. Every node's GPUs share a workload level that jumps
    now and then (job changes, checkpoints); `hot` = (node, gpu, onset tick) heats one GPU by
    0.15 C per tick from onset."""
    rng = np.random.default_rng(seed)
    level = rng.uniform(0.4, 1.0, n_nodes)
    ticks = []
    for t in range(n_ticks):
        jump = rng.random(n_nodes) < 0.01
        level[jump] = rng.uniform(0.05, 1.0, jump.sum())
        msgs = []
        for n in range(n_nodes):
            gpus = []
            for g in range(8):
                temp = 35 + 35 * level[n] + 1.5 * g / 7 + rng.normal(0, 0.6)
                if hot and (n, g) == hot[:2] and t >= hot[2]:
                    temp += 0.15 * (t - hot[2])
                gpus.append(
                    {
                        "index": g,
                        "temp_c": round(temp, 1),
                        "power_w": round(100 + 600 * level[n] + rng.normal(0, 8), 1),
                        "sm_clock_mhz": float(round(1980 - (1 - level[n]) * 600 + rng.normal(0, 5))),
                    }
                )
            msgs.append({"schema": "telemetry/1", "node": f"n{n:03d}", "ts": T0 + t, "seq": t, "gpus": gpus})
        ticks.append(msgs)
    return ticks
