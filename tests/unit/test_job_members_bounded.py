"""The job stage's running jobs are bounded (pipeline/job_members.py, RunningConfig).

A job whose end the publisher missed stayed running in the stage for good, with its straggler
windows and any open finding (and so its alert); a flood of made-up job/1 records grew the stage
and its snapshot without bound (0.74 MB per 1,000 running jobs, measured by a probe). Now a job
quiet for forget_after_s is forgotten, the least recently active go past max_jobs or
max_members, and each forgotten job's findings resolve as forgotten."""

from __future__ import annotations

from collections.abc import Iterable
from itertools import groupby
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from fleetwatch import topics
from fleetwatch.detectors.findings import CROWDED_OUT, FORGOTTEN, QUIET_JOB
from fleetwatch.pipeline.fleet_metrics import FleetStateCollector
from fleetwatch.pipeline.job_members import JobMembers, RunningConfig
from fleetwatch.pipeline.job_stage import JobTask, JobTaskConfig
from fleetwatch.pipeline.job_table import JobTable
from fleetwatch.pipeline.tasks import Output
from tests.helpers.detector_inputs import T0, job_start, steps

DAY = 86_400.0


def _findings(outputs: Iterable[Output]) -> list[dict[str, Any]]:
    return [m for t, _k, m in outputs if t == topics.FINDINGS and m]


def _job(job: str, nodes: list[str], ts: float, state: str = "running") -> dict[str, Any]:
    return {"schema": "job/1", "job": job, "nodes": nodes, "state": state, "ts": ts}


def _straggling(task: JobTask, job: str = "job-1") -> tuple[list[Output], float]:
    """A job with node-01 30 % slow for 400 steps: (outputs, the last step's ts)."""
    task.process(topics.JOBS, [job_start(4, job=job)])
    recs = steps(4, 400, slow={1: 0.3}, slow_from=10, job=job)
    out: list[Output] = []
    for i in range(0, len(recs), 40):
        out += task.process(topics.STEPS, recs[i : i + 40])
    return out, recs[-1]["ts"]


def test_a_job_whose_end_was_missed_is_forgotten_and_its_finding_resolved_as_forgotten() -> None:
    """The publisher never sent the job's end: its critical straggler finding stayed open (and paged)
    for as long as the worker ran. A day after its last record, while another job reports, it
    resolves as forgotten, at last record + forget_after_s whatever the batching, and the job's
    windows leave the snapshot."""
    metrics = FleetStateCollector()
    task = JobTask(metrics=metrics)
    out, last = _straggling(task)
    opened = [f for f in _findings(out) if not f["resolved"]]
    assert any(f["node"] == "node-01" and f["severity"] == "critical" for f in opened)
    task.process(topics.JOBS, [_job("other", ["node-09"], last + 10.0)])
    # the other job's records move the partition's clock on; job-1 says nothing more
    before = task.process(topics.JOBS, [_job("other", ["node-09"], last + DAY - 1.0)])
    assert _findings(before) == [] and "job-1" in task.members.nodes
    after = task.process(topics.JOBS, [_job("other", ["node-09"], last + DAY + 120.0)])
    resolved = _findings(after)
    assert resolved and all(f["resolved"] and f["job"] == "job-1" for f in resolved)
    assert {f["node"] for f in resolved} == {f["node"] for f in opened}
    for f in resolved:
        assert f["evidence"]["resolution"] == FORGOTTEN
        assert f["ts"] == pytest.approx(last + DAY)
        assert f["summary"].startswith("resolved (job forgotten: no record of it for 86400 s")
    assert "job-1" not in task.members.nodes and "job-1" not in task.last_ts
    state = orjson.loads(task.to_bytes())
    assert "job-1" not in orjson.dumps(state["straggler"]).decode()
    assert "job-1" not in {job for job, _t in state["members"]["active"]}
    text = generate_latest(_registry(metrics)).decode()
    assert f'fleetwatch_detect_jobs_forgotten_total{{reason="{QUIET_JOB}"}} 1.0' in text
    assert f'fleetwatch_detect_jobs_forgotten_total{{reason="{CROWDED_OUT}"}} 0.0' in text
    task.close()


def _registry(metrics: FleetStateCollector) -> CollectorRegistry:
    reg = CollectorRegistry()
    reg.register(metrics)
    return reg


def test_a_job_that_keeps_reporting_is_never_forgotten_however_long_it_runs() -> None:
    task = JobTask(JobTaskConfig(running=RunningConfig(forget_after_s=100.0, forget_every_s=1.0)))
    task.process(topics.JOBS, [job_start(2)])
    recs = steps(2, 1000)  # ~1000 s of event time, a step a second: never 100 s quiet
    out: list[Output] = []
    for i in range(0, len(recs), 10):
        out += task.process(topics.STEPS, recs[i : i + 10])
    assert task.members.forgotten == [] and "job-1" in task.members.nodes
    assert not [f for f in _findings(out) if f["resolved"]]
    task.close()


def test_a_flood_of_running_jobs_keeps_at_most_max_jobs_the_least_recently_active_going_first() -> None:
    """10,000 made-up running jobs with max_jobs 100: 100 stay, and the genuine job, active between
    the flood's batches of 50, is one of them with its straggler finding open; the snapshot stays
    small. (A flood of more than max_jobs jobs between two of a genuine job's records pushes it out
    too: the bound is on memory, the topic's ACL is what keeps the records out.)"""
    task = JobTask(JobTaskConfig(running=RunningConfig(max_jobs=100)))
    out, last = _straggling(task)
    recs = steps(4, 2000, slow={1: 0.3}, job="job-1")
    gone = 0
    for b in range(200):
        flood = [_job(f"fake-{b}-{i}", [f"x-{i}"], last + b) for i in range(50)]
        # the genuine job reports between the flood's batches
        out += task.process(topics.STEPS, [{**r, "ts": last + b + 0.5} for r in recs[4 * b : 4 * b + 4]])
        out += task.process(topics.JOBS, flood)
        gone += len(task.members.forgotten)
        assert len(task.members.nodes) <= 100 and len(task.members.active) <= 100
    assert gone == 10_000 + 1 - 100
    assert "job-1" in task.members.nodes
    still_open = [f for f in _findings(out) if f["job"] == "job-1" and not f["resolved"]]
    assert still_open and not [f for f in _findings(out) if f["job"] == "job-1" and f["resolved"]]
    assert len(task.to_bytes()) < 60_000
    task.close()


def test_a_job_pushed_out_by_the_bound_resolves_as_forgotten_and_its_next_record_brings_it_back() -> None:
    """The least recently active job goes when a new one comes past max_jobs; its findings resolve
    as forgotten (the bound, not a missed end), and its next record, its job known to the worker's
    job table, starts it afresh instead of being refused."""
    table = JobTable()
    table.apply(job_start(4))
    task = JobTask(JobTaskConfig(running=RunningConfig(max_jobs=1)), jobs=table)
    out, last = _straggling(task)
    assert [f for f in _findings(out) if not f["resolved"]]
    pushed = task.process(topics.JOBS, [_job("newer", ["node-09"], last + 1.0)])
    resolved = _findings(pushed)
    assert resolved and {f["job"] for f in resolved} == {"job-1"}
    assert all(f["evidence"]["resolution"] == FORGOTTEN and "running jobs" in f["summary"] for f in resolved)
    assert [(j.job, j.reason) for j in task.members.forgotten] == [("job-1", CROWDED_OUT)]
    back = steps(4, 1, job="job-1")[0]
    task.process(topics.STEPS, [{**back, "ts": last + 2.0}])
    assert task.refused == [] and set(task.members.nodes) == {"job-1"}
    assert [(j.job, j.reason) for j in task.members.forgotten] == [("newer", CROWDED_OUT)]
    task.close()


def test_the_nodes_listed_by_running_jobs_are_bounded_in_all() -> None:
    task = JobTask(JobTaskConfig(running=RunningConfig(max_members=1000)))
    task.process(topics.JOBS, [_job("small", ["a", "b"], T0)])
    task.process(topics.JOBS, [_job("big", [f"n{i}" for i in range(999)], T0 + 1)])
    assert [j.job for j in task.members.forgotten] == ["small"] and task.members.n_members == 999
    # a job/1 listing fewer nodes than before frees its place
    task.process(topics.JOBS, [_job("big", ["n0"], T0 + 2), _job("small", ["a", "b"], T0 + 3)])
    assert task.members.forgotten == [] and task.members.n_members == 3
    task.close()


def test_the_running_jobs_survive_a_snapshot_and_a_tighter_bound_applies_at_the_next_batch() -> None:
    members = JobMembers()
    for i in range(5):
        members.admit([_job(f"j{i}", [f"n{i}"], T0 + i)])
    members.admit([{**steps(1, 1, job="j0")[0], "node": "n0", "ts": T0 + 10}])  # j0 active last
    state = orjson.loads(orjson.dumps(members.to_state()))
    again = JobMembers.from_state(state)
    assert list(again.active) == ["j1", "j2", "j3", "j4", "j0"] and again.clock == T0 + 10
    tight = JobMembers.from_state(state, running=RunningConfig(max_jobs=2))
    tight.admit([])
    assert [j.job for j in tight.forgotten] == ["j1", "j2", "j3"] and set(tight.nodes) == {"j4", "j0"}


def test_a_snapshot_without_activity_forgets_its_jobs_only_after_a_new_record_and_a_quiet_day() -> None:
    """An earlier release's snapshot knew no job's last record: its running jobs are not forgotten at
    the first sweep, but a day after their next record (or never, while they report)."""
    members = JobMembers()
    members.admit([_job("old", ["n0"], T0), _job("older", ["n1"], T0)])
    state = orjson.loads(orjson.dumps(members.to_state()))
    del state["active"], state["clock"]
    restored = JobMembers.from_state(state)
    restored.admit([_job("other", ["n9"], T0 + 2 * DAY)])
    assert restored.forgotten == [] and {"old", "older"} <= set(restored.nodes)
    restored.admit([{**steps(1, 1, job="old")[0], "node": "n0", "ts": T0 + 2 * DAY + 1}])
    restored.admit([_job("other", ["n9"], T0 + 3 * DAY + 100)])
    assert [(j.job, j.at) for j in restored.forgotten] == [("old", T0 + 3 * DAY + 1)]
    assert "older" in restored.nodes


def test_forgetting_does_not_depend_on_how_the_stream_was_batched() -> None:
    recs = [job_start(4), *steps(4, 300, slow={2: 0.3}, slow_from=10)]
    tail = [_job("other", ["node-09"], recs[-1]["ts"] + t) for t in (10.0, 50_000.0, DAY + 30.0, DAY + 900.0)]
    stream = recs + tail

    def run(size: int) -> list[dict[str, Any]]:
        task = JobTask()
        out: list[Output] = []
        for i in range(0, len(stream), size):
            # each topic's records together, as the worker polls them
            for topic, run_ in groupby(stream[i : i + size], key=lambda m: m["schema"] == "job/1"):
                out += task.process(topics.JOBS if topic else topics.STEPS, list(run_))
        task.close()
        return _findings(out)

    one, many = run(1), run(97)
    assert one == many and [f for f in one if f["resolved"] and f["evidence"].get("resolution") == FORGOTTEN]
