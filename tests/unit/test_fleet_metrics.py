"""What the detect worker exports for Grafana: fleet state read from the live tasks at scrape, and
the counts the tasks keep, through the collector a task is given (issue 24, item 7: none by
default, so eval, benchmarks and tests leave the global registry alone)."""

from __future__ import annotations

import re

from prometheus_client import REGISTRY, CollectorRegistry, generate_latest

from fleetwatch.detectors.batch import TelemetryBatch
from fleetwatch.pipeline.fleet_metrics import FleetStateCollector
from fleetwatch.pipeline.job_stage import JobTask
from fleetwatch.pipeline.job_table import JobTable
from fleetwatch.pipeline.node_stage import NodeTask
from tests.helpers.detector_inputs import job_start, steps
from tests.helpers.messages import telemetry


def _value(text: str, name: str, **labels: str) -> float | None:
    for line in text.splitlines():
        if not (line.startswith(name + "{") or line.startswith(name + " ")):
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', line))
        if all(got.get(k) == v for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


def _scraped(collector: FleetStateCollector) -> tuple[CollectorRegistry, str]:
    """A registry of its own holding only `collector` (the global one is left alone)."""
    registry = CollectorRegistry()
    registry.register(collector)
    return registry, generate_latest(registry).decode()


def _samples(text: str) -> list[str]:
    """fleetwatch's sample lines of a scrape (the process and GC collectors change by themselves),
    without the counters' creation times."""
    lines = text.splitlines()
    return [ln for ln in lines if ln.startswith("fleetwatch_") and "_created" not in ln.split(" ")[0]]


def _node_samples() -> list[dict[str, object]]:
    msgs = [telemetry(node=n, seq=s, ts=1_764_000_000.0 + s) for s in range(3) for n in ("mx-ok", "mx-bad")]
    msgs[-1]["gpus"][4]["xids"] = [79]  # the last sample of mx-bad: GPU fell off the bus
    return msgs


def test_node_health_state_and_gpu_signals() -> None:
    collector = FleetStateCollector()
    task = NodeTask(JobTable(), metrics=collector)
    msgs = _node_samples()
    task.process("fleet.telemetry.v1", TelemetryBatch.from_messages([*msgs, msgs[0]]))  # one duplicate
    registry, text = _scraped(collector)
    assert _value(text, "fleetwatch_node_health_score", node="mx-ok") == 1.0
    assert _value(text, "fleetwatch_node_health_score", node="mx-bad") == 0.1
    assert _value(text, "fleetwatch_node_state", node="mx-bad", state="degraded") == 1.0
    assert _value(text, "fleetwatch_node_state", node="mx-ok", state="healthy") == 1.0
    assert _value(text, "fleetwatch_gpu_signal", node="mx-ok", gpu="3", signal="temp_c") == 61.0
    assert (_value(text, "fleetwatch_open_findings", kind="xid", severity="critical") or 0) >= 1
    # the task's counts go to its collector too
    assert _value(text, "fleetwatch_detect_new_nodes_total") == 2
    assert _value(text, "fleetwatch_detect_stale_samples_total") == 1
    task.close()  # the partition moved away: its nodes are no longer exported
    text = generate_latest(registry).decode()
    assert _value(text, "fleetwatch_node_health_score", node="mx-ok") is None


def test_job_step_times() -> None:
    collector = FleetStateCollector()
    task = JobTask(metrics=collector)
    task.process("fleet.jobs.v1", [job_start(4, "mx-job")])
    task.process("fleet.steps.v1", steps(4, 40, slow={2: 0.2}, job="mx-job"))
    registry, text = _scraped(collector)
    slow = _value(text, "fleetwatch_job_node_slowdown", job="mx-job", node="node-02")
    assert slow is not None and 0.15 < slow < 0.25
    assert 0.95 < (_value(text, "fleetwatch_job_step_time_median_seconds", job="mx-job") or 0) < 1.1
    task.process("fleet.steps.v1", steps(4, 1, job="mx-job"))  # the first step again: stale
    assert _value(generate_latest(registry).decode(), "fleetwatch_detect_stale_job_records_total") == 4
    # the job ends; its nodes' last samples, still naming it, are held for a new run, then dropped
    end = steps(4, 41, job="mx-job")[-1]["ts"]
    task.process("fleet.jobs.v1", [{**job_start(4, "mx-job"), "state": "failed", "ts": end}])
    late = [{**m, "ts": end} for m in steps(4, 1, job="mx-job")]
    task.process("fleet.steps.v1", late)
    task.process("fleet.steps.v1", [{**m, "ts": end + 200.0} for m in steps(4, 1, job="other-job")])
    assert task.refused == []
    assert _value(generate_latest(registry).decode(), "fleetwatch_detect_stale_job_records_total") == 4 + 4
    task.close()
    assert _value(generate_latest(registry).decode(), "fleetwatch_job_node_slowdown", job="mx-job") is None


def test_tasks_without_a_collector_leave_the_global_registry_alone() -> None:
    """As eval, benchmarks and tests build them: a task given no collector exports nothing, and
    building, running, snapshotting, restoring and closing it changes no sample of the registry
    that /metrics serves; restored with a collector, the same task is reported by it."""
    before = _samples(generate_latest(REGISTRY).decode())
    task = NodeTask(JobTable())
    msgs = _node_samples()
    task.process("fleet.telemetry.v1", TelemetryBatch.from_messages([*msgs, msgs[0]]))
    restored = NodeTask.from_bytes(task.to_bytes(), JobTable(), task.config)
    job = JobTask()
    job.process("fleet.jobs.v1", [job_start(4, "mx-quiet")])
    job.process("fleet.steps.v1", steps(4, 40, job="mx-quiet") + steps(4, 1, job="mx-quiet"))
    assert _samples(generate_latest(REGISTRY).decode()) == before
    for t in (task, restored, job):
        t.close()
    assert _samples(generate_latest(REGISTRY).decode()) == before

    collector = FleetStateCollector()
    again = NodeTask.from_bytes(task.to_bytes(), JobTable(), task.config, collector)
    _, text = _scraped(collector)
    assert _value(text, "fleetwatch_node_health_score", node="mx-bad") == 0.1
    again.close()
    assert _samples(generate_latest(REGISTRY).decode()) == before
