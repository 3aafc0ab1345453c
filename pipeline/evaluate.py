"""`fleetwatch eval`: simulator -> detectors -> scorecard, in process, without wall-clock waits.

The same task classes the Kafka workers run (pipeline/node_stage.py, pipeline/job_stage.py)
are driven here directly: telemetry goes to the node task, whose node features go to the job
task together with step times and job events, exactly the routes the topics give them.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable
from typing import Any

import orjson

from fleetwatch import topics
from fleetwatch.collectors.sim import Simulation, load_scenario
from fleetwatch.detectors.batch import TelemetryBatch
from fleetwatch.pipeline.job_stage import JobTask
from fleetwatch.pipeline.job_table import JobTable
from fleetwatch.pipeline.node_stage import NodeTask, NodeTaskConfig
from fleetwatch.pipeline.scorecard import Scorecard, busy_spans, format_table, score

log = logging.getLogger(__name__)
PROGRESS_EVERY_S = 10.0


def evaluate(
    scenario_path: str | None = None,
    overrides: dict[str, Any] | None = None,
    *,
    node_config: NodeTaskConfig | None = None,
    ticks_per_batch: int = 1,
    on_finding: Callable[[dict[str, Any]], None] | None = None,
) -> tuple[Scorecard, dict[str, Any]]:
    sc = load_scenario(scenario_path, overrides or {})
    sim = Simulation(sc)
    jobs = JobTable()
    node_task = NodeTask(jobs, node_config or NodeTaskConfig.for_time_scale(sc.detector_time_scale))
    job_task = JobTask()
    findings: list[dict[str, Any]] = []
    truths: list[dict[str, Any]] = []
    counts = {"telemetry": 0, "steps": 0, "jobs": 0}
    t0 = time.perf_counter()
    detect_s = 0.0

    def emit(outputs: list[Any]) -> list[dict[str, Any]]:
        feats = []
        for topic, _key, m in outputs:
            if topic == topics.FINDINGS:
                findings.append(m)
                if on_finding:
                    on_finding(m)
            elif topic == topics.NODE_FEATURES:
                feats.append(m)
        return feats

    pending: dict[str, list[dict[str, Any]]] = {topics.TELEMETRY: [], topics.STEPS: []}
    job_msgs: list[dict[str, Any]] = []
    ticks = 0
    last_report = time.perf_counter()
    for msgs in sim.ticks():
        for topic, _key, m in msgs:
            if topic == topics.TRUTH:
                truths.append(m)
            elif topic == topics.JOBS:
                counts["jobs"] += 1
                jobs.apply(m)
                job_msgs.append(m)
                emit(job_task.process(topics.JOBS, [m]))
            elif topic in pending:
                pending[topic].append(m)
        ticks += 1
        if time.perf_counter() - last_report > PROGRESS_EVERY_S:  # long runs say how far they are
            last_report = time.perf_counter()
            log.info("eval: tick %d/%d, %d findings so far", ticks, sim.n_ticks, len(findings))
        if ticks % ticks_per_batch and not sim.done:
            continue
        d0 = time.perf_counter()
        tel, steps = pending[topics.TELEMETRY], pending[topics.STEPS]
        counts["telemetry"] += len(tel)
        counts["steps"] += len(steps)
        feats = emit(node_task.process(topics.TELEMETRY, TelemetryBatch.from_messages(tel)))
        emit(job_task.process(topics.NODE_FEATURES, feats))
        emit(job_task.process(topics.STEPS, steps))
        detect_s += time.perf_counter() - d0
        pending = {topics.TELEMETRY: [], topics.STEPS: []}

    card = score(
        findings,
        truths,
        sim.nodes,
        sim.tick_ts(0),
        sim.tick_ts(sim.n_ticks - 1),
        sc.interval_s,
        busy=busy_spans(job_msgs),
    )
    info = {
        "scenario": sc.name,
        "nodes": sc.nodes,
        "duration_s": sc.duration_s,
        "messages": counts,
        "wall_s": round(time.perf_counter() - t0, 3),
        "detect_s": round(detect_s, 3),
    }
    return card, info


def run(args: argparse.Namespace) -> int:
    overrides: dict[str, Any] = {}
    if args.nodes:
        overrides["nodes"] = args.nodes
    if args.seed is not None:
        overrides["seed"] = args.seed
    if args.duration:
        overrides["duration_s"] = args.duration
    card, info = evaluate(args.scenario, overrides)
    if args.json:
        sys.stdout.write(
            orjson.dumps({**card.to_json(), "run": info}, option=orjson.OPT_INDENT_2).decode() + "\n"
        )
    else:
        print(
            f"scenario {info['scenario']}: {info['nodes']} nodes, {info['duration_s']:.0f} s simulated, "
            f"{info['messages']['telemetry']} node-samples in {info['wall_s']:.1f} s "
            f"(detectors {info['detect_s']:.1f} s)"
        )
        print(format_table(card))
    return 0
