"""The job stage's running jobs are bounded (pipeline/job_members.py, RunningConfig).

job/1 records are unsigned (the topic's ACL guards them): a flood of made-up running jobs grew the
stage and its snapshot without bound (0.74 MB per 1,000 running jobs, measured by a probe). Now past
max_jobs running jobs, or max_members nodes listed by them, the least recently active job is
forgotten at the record that went past the bound, and its findings resolve as forgotten."""

from __future__ import annotations

import math
from collections.abc import Iterable
from itertools import groupby
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from fleetwatch import topics
from fleetwatch.detectors.findings import FORGOTTEN, TOO_MANY_JOBS, TOO_MANY_MEMBERS, ForgottenJob
from fleetwatch.pipeline.fleet_metrics import FleetStateCollector
from fleetwatch.pipeline.job_members import JobMembers, RunningConfig
from fleetwatch.pipeline.job_stage import JobTask, JobTaskConfig
from fleetwatch.pipeline.job_table import JobTable
from fleetwatch.pipeline.tasks import Output
from tests.helpers.detector_inputs import T0, job_start, steps


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


def _registry(metrics: FleetStateCollector) -> CollectorRegistry:
    reg = CollectorRegistry()
    reg.register(metrics)
    return reg


def test_a_flood_of_running_jobs_keeps_at_most_max_jobs_the_least_recently_active_going_first() -> None:
    """10,000 made-up running jobs with max_jobs 100: 100 stay, and the genuine job, active between
    the flood's batches of 50, is one of them with its straggler finding open; the snapshot stays
    small. (A flood of more than max_jobs jobs between two of a genuine job's records pushes it out
    too: the bound is on memory, the topic's ACL is what keeps the records out.)"""
    metrics = FleetStateCollector()
    task = JobTask(JobTaskConfig(running=RunningConfig(max_jobs=100)), metrics=metrics)
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
    # 100 running jobs, and the last 4096 forgotten remembered by name, start and newest record
    assert len(task.members.gone) == 4096 and len(task.to_bytes()) < 250_000
    text = generate_latest(_registry(metrics)).decode()
    assert f'fleetwatch_detect_jobs_forgotten_total{{reason="{TOO_MANY_JOBS}"}} 9901.0' in text
    assert f'fleetwatch_detect_jobs_forgotten_total{{reason="{TOO_MANY_MEMBERS}"}} 0.0' in text
    task.close()


def test_a_job_pushed_out_by_the_bound_resolves_as_forgotten_and_its_next_record_brings_it_back() -> None:
    """The least recently active job goes when a new one comes past max_jobs, at the new one's time;
    its findings resolve as forgotten (act ends the alert without taking the node for repaired), its
    windows and its stale-record marks go, and its next record, its job known to the worker's job
    table, starts it afresh instead of being refused."""
    table = JobTable()
    table.apply(job_start(4))
    task = JobTask(JobTaskConfig(running=RunningConfig(max_jobs=1)), jobs=table)
    out, last = _straggling(task)
    opened = {f["node"] for f in _findings(out) if not f["resolved"]}
    assert opened == {"node-01"}
    pushed = task.process(topics.JOBS, [_job("newer", ["node-09"], last + 100.0)])
    resolved = _findings(pushed)
    assert {(f["node"], f["job"], f["resolved"]) for f in resolved} == {("node-01", "job-1", True)}
    for f in resolved:
        assert f["evidence"]["resolution"] == FORGOTTEN and f["ts"] == last + 100.0
        assert f["evidence"]["unseen_for_s"] == pytest.approx(100.0)
        assert (
            "job forgotten: the least recently active when its partition passed max_jobs running jobs"
            in f["summary"]
        )
    assert [(j.job, j.reason) for j in task.members.forgotten] == [("job-1", TOO_MANY_JOBS)]
    state = orjson.loads(task.to_bytes())
    assert "job-1" not in orjson.dumps(state["straggler"]).decode() and "job-1" not in task.last_ts
    back = steps(4, 1, job="job-1")[0]
    task.process(topics.STEPS, [{**back, "ts": last + 101.0}])
    assert task.refused == [] and set(task.members.nodes) == {"job-1"}
    assert [(j.job, j.reason) for j in task.members.forgotten] == [("newer", TOO_MANY_JOBS)]
    task.close()


def test_the_nodes_listed_by_running_jobs_are_bounded_in_all() -> None:
    task = JobTask(JobTaskConfig(running=RunningConfig(max_members=1000)))
    task.process(topics.JOBS, [_job("small", ["a", "b"], T0)])
    task.process(topics.JOBS, [_job("big", [f"n{i}" for i in range(999)], T0 + 1)])
    assert [(j.job, j.reason, j.at) for j in task.members.forgotten] == [("small", TOO_MANY_MEMBERS, T0 + 1)]
    assert task.members.n_members == 999
    # a job/1 listing fewer nodes than before frees its place
    task.process(topics.JOBS, [_job("big", ["n0"], T0 + 2), _job("small", ["a", "b"], T0 + 3)])
    assert task.members.forgotten == [] and task.members.n_members == 3
    # one job listing more than the bound stays alone: the job just learnt is never the one to go
    task.process(topics.JOBS, [_job("huge", [f"h{i}" for i in range(1500)], T0 + 4)])
    assert {j.job for j in task.members.forgotten} == {"big", "small"} and set(task.members.nodes) == {"huge"}
    task.close()


def test_a_forgotten_job_goes_in_its_place_among_the_batchs_records() -> None:
    """A job forgotten in the middle of a batch, whose records come again later in the same batch
    (its job known to the table): the detectors learn what came before, forget it, and start it
    afresh from what came after, as one record at a time would; the members and the detectors
    agree on it at the end."""
    table = JobTable()
    table.apply(job_start(2, job="a"))
    cfg = JobTaskConfig(running=RunningConfig(max_jobs=1))
    a = steps(2, 20, job="a")
    stream = [job_start(2, job="a"), *a[:10], _job("b", ["node-05"], a[9]["ts"]), *a[10:]]
    whole, single = JobTask(cfg, jobs=table), JobTask(cfg, jobs=table)
    out_whole = whole.process(topics.STEPS, stream)  # one batch, as a worker catching up reads it
    out_single = [o for m in stream for o in single.process(topics.STEPS, [m])]
    assert out_whole == out_single
    assert whole.to_bytes() == single.to_bytes()
    assert set(whole.members.nodes) == {"a"}
    assert [j for j, _signal in whole.straggler.windows] == ["a"]  # what came after the forget is learnt
    whole.close()
    single.close()


def test_which_jobs_go_does_not_depend_on_how_the_stream_was_batched() -> None:
    recs = [job_start(4), *steps(4, 300, slow={2: 0.3}, slow_from=10)]
    flood = [_job(f"f{i}", [f"x{i}"], recs[-1]["ts"] + i) for i in range(5)]
    stream = recs[:700] + flood[:2] + recs[700:] + flood[2:]
    cfg = JobTaskConfig(running=RunningConfig(max_jobs=2))

    def run(size: int) -> tuple[list[dict[str, Any]], bytes]:
        task = JobTask(cfg)
        out: list[Output] = []
        for i in range(0, len(stream), size):
            # each topic's records together, as the worker polls them
            for is_job, group in groupby(stream[i : i + size], key=lambda m: m["schema"] == "job/1"):
                out += task.process(topics.JOBS if is_job else topics.STEPS, list(group))
        state = task.to_bytes()
        task.close()
        return _findings(out), state

    one, many = run(1), run(97)
    assert one == many
    assert [f for f in one[0] if f["resolved"] and f["evidence"].get("resolution") == FORGOTTEN]


def test_the_running_jobs_survive_a_snapshot_and_a_tighter_bound_applies_at_the_next_job() -> None:
    members = JobMembers()
    for i in range(5):
        members.admit([_job(f"j{i}", [f"n{i}"], T0 + i)])
    members.admit([{**steps(1, 1, job="j0")[0], "node": "n0", "ts": T0 + 10}])  # j0 active last
    state = orjson.loads(orjson.dumps(members.to_state()))
    again = JobMembers.from_state(state)
    assert list(again.active.items()) == [
        ("j1", T0 + 1),
        ("j2", T0 + 2),
        ("j3", T0 + 3),
        ("j4", T0 + 4),
        ("j0", T0 + 10),
    ]
    assert orjson.dumps(again.to_state()) == orjson.dumps(state)
    tight = JobMembers.from_state(state, running=RunningConfig(max_jobs=2))
    taken, _refused = tight.admit([_job("j5", ["n5"], T0 + 20)])
    assert [j.job for j in tight.forgotten] == ["j1", "j2", "j3", "j4"] and set(tight.nodes) == {"j0", "j5"}
    assert [t.job for t in taken if isinstance(t, ForgottenJob)] == ["j1", "j2", "j3", "j4"]


def test_a_snapshot_of_an_earlier_release_puts_its_jobs_first_in_its_own_order() -> None:
    """It knew no job's last record: its running jobs are the least recently active, in the order
    the snapshot lists them (not a set's, which changes with the hash seed)."""
    members = JobMembers()
    members.admit([_job(f"j{i}", [f"n{i}"], T0) for i in (3, 1, 4, 0, 2)])
    state = orjson.loads(orjson.dumps(members.to_state()))
    del state["active"]
    restored = JobMembers.from_state(state, running=RunningConfig(max_jobs=3))
    assert list(restored.active) == ["j3", "j1", "j4", "j0", "j2"]
    assert all(math.isnan(t) for t in restored.active.values())
    restored.admit([_job("new", ["n9"], T0 + 5)])
    assert [(j.job, j.unseen_for_s) for j in restored.forgotten] == [("j3", 0.0), ("j1", 0.0), ("j4", 0.0)]


@pytest.mark.parametrize("bad", ["nan", "inf", float("inf"), [1], "1e12"])
def test_a_snapshot_whose_job_times_are_not_times_is_refused(bad: object) -> None:
    members = JobMembers()
    members.admit([_job("j", ["n"], T0)])
    state = members.to_state()
    state["active"] = [["j", bad]]
    raw = (
        orjson.loads(orjson.dumps(state, option=orjson.OPT_SERIALIZE_NUMPY)) if bad != float("inf") else state
    )
    with pytest.raises(ValueError, match="is not a time"):
        JobMembers.from_state(raw)


def test_a_republished_job_1_of_an_earlier_run_stays_stale_after_the_job_was_forgotten() -> None:
    """Slurm reuses job ids: a job/1 whose start_ts is older than the run the stage knows changes
    nothing (contract), also once the bounds have forgotten the run and the table brought it back."""
    table = JobTable()
    current = {**_job("J", ["a", "b"], T0 + 100), "start_ts": T0 + 100}
    table.apply(current)
    task = JobTask(JobTaskConfig(running=RunningConfig(max_jobs=1)), jobs=table)
    task.process(topics.JOBS, [current])
    task.process(topics.JOBS, [_job("other", ["z"], T0 + 110)])  # J is forgotten
    assert [j.job for j in task.members.forgotten] == ["J"]
    step = {**steps(1, 1, job="J")[0], "node": "a", "ts": T0 + 120}
    task.process(topics.STEPS, [step])  # back from the table
    assert set(task.members.nodes) == {"J"} and task.refused == []
    earlier_run = {**_job("J", ["x", "y"], T0 + 130), "start_ts": T0}
    task.process(topics.JOBS, [earlier_run])
    task.process(topics.STEPS, [{**step, "ts": T0 + 140}])
    assert task.members.nodes["J"] == frozenset({"a", "b"}) and task.refused == []
    task.close()


def test_records_taken_before_a_job_was_forgotten_and_sent_again_are_late_not_new() -> None:
    """At-least-once delivery sends a batch again (a worker restarted before committing): records of
    a job the bounds forgot in between, no newer than what was taken of it, must not be judged
    again. They were: the table brought the job back, the detector replayed them and opened the
    incident it had just resolved as forgotten, with an earlier time."""
    table = JobTable()
    table.apply(job_start(4))
    metrics = FleetStateCollector()
    task = JobTask(JobTaskConfig(running=RunningConfig(max_jobs=1)), jobs=table, metrics=metrics)
    task.process(topics.JOBS, [job_start(4)])
    recs = steps(4, 400, slow={1: 0.3}, slow_from=10)
    out: list[Output] = []
    for i in range(0, len(recs), 40):
        out += task.process(topics.STEPS, recs[i : i + 40])
    out += task.process(topics.JOBS, [_job("other", ["z"], recs[-1]["ts"] + 1)])
    again: list[Output] = []
    for i in range(0, len(recs), 40):
        again += task.process(topics.STEPS, recs[i : i + 40])
    assert _findings(again) == [] and "job-1" not in task.members.nodes
    text = generate_latest(_registry(metrics)).decode()
    assert "fleetwatch_detect_stale_job_records_total 1600.0" in text
    # what is newer is judged: the job comes back from the table
    newer = steps(4, 1, job="job-1")[0]
    task.process(topics.STEPS, [{**newer, "ts": recs[-1]["ts"] + 2}])
    assert "job-1" in task.members.nodes and task.refused == []
    task.close()


def _snapshot() -> dict[str, Any]:
    members = JobMembers()
    members.admit([_job("j", ["n"], T0), {**steps(1, 1, job="h")[0], "node": "m", "ts": T0}])
    state = orjson.loads(orjson.dumps(members.to_state()))
    assert state["held"] and state["nodes"] and state["active"]
    return state


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda d: d.update(nodes={"j": [7]}), "where a name belongs"),
        (lambda d: d.update(newest="inf"), "is not a time"),
        (lambda d: d.update(active=[["j", True]]), "is not a time"),
        (lambda d: d.update(start={"nobody": 1.0}), "not running"),
        (lambda d: d.update(ended=[["j", None]]), "running and as ended"),
        (lambda d: d.update(held=d["held"] * 2), "twice"),
        (lambda d: d["held"][0].__setitem__(0, "other"), "another job's records"),
        (lambda d: d.update(gone=[["g", None, "nan"]]), "is not a time"),
    ],
)
def test_a_snapshot_the_state_topic_made_up_is_refused_at_restore(change: Any, match: str) -> None:
    """Refused at restore (the partition starts cold), not restored to break an invariant or raise
    at every record later (a review's finds: a held record judged under another job's nodes, a
    snapshot never written again, the hold expiring everything at once)."""
    state = _snapshot()
    JobMembers.from_state(state)  # as written, it restores
    change(state)
    with pytest.raises(ValueError, match=match):
        JobMembers.from_state(state)


@pytest.mark.parametrize("last_ts", [[], {"job-1": []}, {"job-1": {"step/1 node-00": "1"}}])
def test_a_task_snapshot_whose_stale_record_marks_are_made_up_is_refused_at_restore(last_ts: Any) -> None:
    """Restored, such a snapshot raised at every step record (each dead-lettered internal_error)."""
    task = JobTask()
    task.process(topics.JOBS, [job_start(2)])
    task.process(topics.STEPS, steps(2, 3))
    state = orjson.loads(task.to_bytes())
    JobTask.from_bytes(orjson.dumps(state)).close()
    state["last_ts"] = last_ts
    with pytest.raises(ValueError, match="last_ts"):
        JobTask.from_bytes(orjson.dumps(state))
    task.close()


def test_a_forgotten_jobs_job_1_or_held_records_sent_again_bring_nothing_back() -> None:
    """A review's finds: the same job/1 delivered again revived a job the bounds had forgotten
    (forgetting another in its place), and records released from the hold did not count among the
    newest taken, so sent again they were judged anew."""
    task = JobTask(JobTaskConfig(running=RunningConfig(max_jobs=1)))
    early = steps(4, 5, job="job-1")  # before the job/1: held, then released by it
    task.process(topics.STEPS, early)
    start = job_start(4, ts=T0)
    task.process(topics.JOBS, [start])
    assert task.members.n_held == 0 and "job-1" in task.members.nodes
    task.process(topics.JOBS, [_job("other", ["z"], early[-1]["ts"] + 1)])  # job-1 forgotten
    assert [j.job for j in task.members.forgotten] == ["job-1"]
    task.process(topics.JOBS, [start])  # sent again
    assert set(task.members.nodes) == {"other"} and task.members.forgotten == []
    task.process(topics.STEPS, early)  # sent again: taken before the forget, through the hold
    assert set(task.members.nodes) == {"other"} and task.refused == []
    task.close()
