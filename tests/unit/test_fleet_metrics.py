"""What the detect worker exports for Grafana: fleet state read from the live tasks at scrape."""

from __future__ import annotations

import re

from prometheus_client import REGISTRY, generate_latest

from fleetwatch.pipeline.job_stage import JobTask
from fleetwatch.pipeline.job_table import JobTable
from fleetwatch.pipeline.node_stage import NodeTask
from tests.helpers.detector_inputs import job_start, steps
from tests.helpers.messages import telemetry


def _value(text: str, name: str, **labels: str) -> float | None:
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', line))
        if all(got.get(k) == v for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_node_health_state_and_gpu_signals() -> None:
    task = NodeTask(JobTable())
    msgs = [telemetry(node=n, seq=s, ts=1_764_000_000.0 + s) for s in range(3) for n in ("mx-ok", "mx-bad")]
    msgs[-1]["gpus"][4]["xids"] = [79]  # the last sample of mx-bad: GPU fell off the bus
    task.process("fleet.telemetry.v1", msgs)
    text = generate_latest(REGISTRY).decode()
    assert _value(text, "fleetwatch_node_health_score", node="mx-ok") == 1.0
    assert _value(text, "fleetwatch_node_health_score", node="mx-bad") == 0.1
    assert _value(text, "fleetwatch_node_state", node="mx-bad", state="degraded") == 1.0
    assert _value(text, "fleetwatch_node_state", node="mx-ok", state="healthy") == 1.0
    assert _value(text, "fleetwatch_gpu_signal", node="mx-ok", gpu="3", signal="temp_c") == 61.0
    assert (_value(text, "fleetwatch_open_findings", kind="xid", severity="critical") or 0) >= 1
    task.close()  # the partition moved away: its nodes are no longer exported
    text = generate_latest(REGISTRY).decode()
    assert _value(text, "fleetwatch_node_health_score", node="mx-ok") is None


def test_job_step_times() -> None:
    task = JobTask()
    task.process("fleet.jobs.v1", [job_start(4, "mx-job")])
    task.process("fleet.steps.v1", steps(4, 40, slow={2: 0.2}, job="mx-job"))
    text = generate_latest(REGISTRY).decode()
    slow = _value(text, "fleetwatch_job_node_slowdown", job="mx-job", node="node-02")
    assert slow is not None and 0.15 < slow < 0.25
    assert 0.95 < (_value(text, "fleetwatch_job_step_time_median_seconds", job="mx-job") or 0) < 1.1
    task.close()
    assert _value(generate_latest(REGISTRY).decode(), "fleetwatch_job_node_slowdown", job="mx-job") is None
