"""Random background faults drawn from the published figures in rates.py.

Node faults arrive as a Poisson process of rate r_f x acceleration per node (r_f from Kokolis et
al.), at uniform times and nodes, their kind drawn from the Llama 3 root-cause mix. Lemon nodes
are a fixed share of nodes (1.2%) whose incident rate is LEMON_RATE_MULTIPLIER x r_f x
acceleration. Stragglers are decided per job at its start (42.5% of jobs, ByteDance), so they
are drawn by the simulation when the scheduler starts a job, with `straggler_for_job()`.

`acceleration` exists because real rates are tiny: 32 nodes x 300 s at r_f = 6.5 / 1000
node-days expect 7e-4 faults. Gradual faults keep their simulated ramp (minutes, not the days a
real one can take), so acceleration compresses time between faults, not within one.
"""

from __future__ import annotations

import numpy as np

from fleetwatch.collectors.sim import kinds, rates
from fleetwatch.collectors.sim.scenario import FaultSpec, Scenario


def node_fault_rate(sc: Scenario) -> float:
    """Background node faults per node-second (0 when background faults are off)."""
    bg = sc.background
    return rates.per_node_second(bg.node_failure_rate) * bg.acceleration if bg.enabled else 0.0


def expected_node_faults(sc: Scenario) -> float:
    return node_fault_rate(sc) * sc.nodes * sc.duration_s


def _params(kind: str, sc: Scenario, rng: np.random.Generator) -> dict[str, object]:
    spec = kinds.KINDS[kind]
    bg = sc.background
    params: dict[str, object] = {name: p.default for name, p in spec.params.items()}
    if spec.category == "gradual":
        params["ramp_s"] = float(rng.uniform(*bg.ramp_s))
    if "duration_s" in params:
        if bg.repair_s is None:
            params["duration_s"] = None
        else:
            params["duration_s"] = bg.repair_s + float(params.get("ramp_s", 0.0))  # type: ignore[arg-type]
    if "port" in params:
        params["port"] = int(rng.integers(0, sc.hardware.ib_ports))
    return params


def draw_node_faults(sc: Scenario, rng: np.random.Generator) -> list[FaultSpec]:
    count = int(rng.poisson(expected_node_faults(sc)))
    if count == 0:
        return []
    mix = rates.kind_mix()
    names = list(mix)
    chosen = rng.choice(len(names), size=count, p=np.array(list(mix.values())))
    onsets = np.sort(rng.uniform(0.0, sc.duration_s, count))
    nodes = rng.integers(0, sc.nodes, count)
    out = []
    for i in range(count):
        kind = names[int(chosen[i])]
        gpu = int(rng.integers(0, sc.gpus_per_node)) if kinds.KINDS[kind].per_gpu else None
        out.append(
            FaultSpec(kind, int(nodes[i]), float(onsets[i]), gpu, _params(kind, sc, rng), "background")
        )
    return out


def draw_lemons(sc: Scenario, rng: np.random.Generator) -> list[FaultSpec]:
    bg = sc.background
    if not bg.enabled or bg.lemon_fraction <= 0:
        return []
    lemons = np.flatnonzero(rng.random(sc.nodes) < bg.lemon_fraction)
    rate = rates.per_node_second(bg.node_failure_rate) * bg.lemon_rate_multiplier * bg.acceleration
    if rate <= 0:
        return []
    params = {"incident_interval_s": 1.0 / rate, "duration_s": None}
    # A lemon is a lemon from the start of the run: its history is what makes it one.
    return [FaultSpec("lemon", int(n), 0.0, None, dict(params), "background") for n in lemons]


def draw(sc: Scenario, rng: np.random.Generator) -> list[FaultSpec]:
    """Every background fault known at the start of the run (stragglers come per job)."""
    if not sc.background.enabled:
        return []
    return draw_node_faults(sc, rng) + draw_lemons(sc, rng)


def straggler_for_job(
    sc: Scenario, rng: np.random.Generator, nodes: np.ndarray, onset_s: float
) -> FaultSpec | None:
    """With probability straggler_job_fraction, one of the job's nodes straggles for the whole job."""
    bg = sc.background
    if not bg.enabled or rng.random() >= bg.straggler_job_fraction:
        return None
    node = int(nodes[int(rng.integers(len(nodes)))])
    slowdown = float(rng.uniform(*bg.straggler_slowdown))
    return FaultSpec(
        "straggler",
        node,
        onset_s,
        None,
        {"slowdown": slowdown, "cause": "none", "duration_s": None},
        "background",
    )
