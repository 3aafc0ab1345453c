"""The job stage judges only the nodes a job's job/1 lists (issue 23, item 3).

A step for another node is refused (not_in_job) and never becomes a straggler; steps that come
before their job's job/1 are held, then judged against its nodes, or refused (unknown_job) when the
hold runs out (records of a job that ended are late: dropped and counted); the hold is bounded and
survives a snapshot."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson
import pytest

from fleetwatch import topics
from fleetwatch.pipeline.job_members import NOT_IN_JOB, UNKNOWN_JOB, HoldConfig, JobMembers
from fleetwatch.pipeline.job_stage import JobTask, JobTaskConfig
from fleetwatch.pipeline.job_table import JobTable
from fleetwatch.pipeline.tasks import Output
from tests.helpers.detector_inputs import T0, job_start, steps


def _job(nodes: list[str], job: str = "job-1", state: str = "running", ts: float = T0) -> dict[str, Any]:
    return {"schema": "job/1", "job": job, "nodes": nodes, "state": state, "ts": ts}


def _stragglers(outputs: Iterable[Output], resolved: bool = False) -> list[dict[str, Any]]:
    return [m for t, _k, m in outputs if t == topics.FINDINGS and m and m["resolved"] == resolved]


def _run(task: JobTask, msgs: list[dict[str, Any]], size: int = 40) -> tuple[list[Output], list[Any]]:
    """Steps in batches of `size` through the task: (outputs, refusals)."""
    out: list[Output] = []
    refused: list[Any] = []
    for i in range(0, len(msgs), size):
        out += task.process(topics.STEPS, msgs[i : i + size])
        refused += task.refused
    return out, refused


def test_a_slow_node_outside_the_job_is_refused_and_never_a_straggler() -> None:
    """The job runs on node-00..02; training code also reports node-03, 30% slow, for 500 s of
    event time. Before the check node-03 became a critical (drain-worthy) straggler; now each of
    its steps is refused as not_in_job, and a slow node inside the job is still found."""
    recs = steps(4, 500, slow={3: 0.3, 1: 0.2}, slow_from=20)
    task = JobTask()
    try:
        task.process(topics.JOBS, [_job(["node-00", "node-01", "node-02"])])
        out, refused = _run(task, recs)
    finally:
        task.close()
    found = {(f["node"], f["severity"]) for f in _stragglers(out)}
    assert ("node-01", "critical") in found
    assert not any(node == "node-03" for node, _s in found)
    assert len(refused) == 500 and {(r.reason, r.msg["node"], r.topic) for r in refused} == {
        (NOT_IN_JOB, "node-03", topics.STEPS)
    }
    # each refusal names its record's place in the call that refused it (the worker sends its bytes)
    assert all(r.index is not None and r.index % 4 == 3 for r in refused[:10])
    assert (
        "node-03" not in orjson.dumps(task.straggler.to_state(), option=orjson.OPT_SERIALIZE_NUMPY).decode()
    )


def test_steps_before_their_job_are_held_then_judged_as_if_the_job_had_come_first() -> None:
    recs = steps(4, 200, slow={2: 0.25}, slow_from=10)
    first = JobTask()
    first.process(topics.JOBS, [job_start(4)])
    want, _ = _run(first, recs)
    late = JobTask()
    early, held = recs[:120], recs[120:]  # 30 steps, ~30 s of event time, before the job/1
    out, refused = _run(late, early)
    assert out == [] and refused == [] and late.members.n_held == len(early)
    out += late.process(topics.JOBS, [job_start(4)])
    more, refused = _run(late, held)
    assert refused == [] and late.members.n_held == 0
    assert _stragglers(out + more) == _stragglers(want) and _stragglers(want)
    first.close()
    late.close()


def test_a_held_step_of_a_node_the_job_does_not_list_is_refused_when_the_job_comes() -> None:
    task = JobTask()
    recs = steps(4, 10)
    task.process(topics.STEPS, recs)
    task.process(topics.JOBS, [_job(["node-00", "node-01", "node-02"])])
    assert [(r.reason, r.msg["node"], r.index) for r in task.refused] == [(NOT_IN_JOB, "node-03", None)] * 10
    task.close()


def test_steps_of_a_job_no_job_1_names_are_refused_when_the_hold_runs_out() -> None:
    """Held for hold_s of the job's own event time, then refused as unknown_job, never judged;
    a job that goes quiet is refused once the partition's records are 2 x hold_s newer."""
    task = JobTask(JobTaskConfig(hold=HoldConfig(hold_s=60.0)))
    ghost = steps(4, 200, slow={1: 0.3}, job="ghost")
    out, refused = _run(task, ghost)
    assert _stragglers(out) == [] and refused
    assert {r.reason for r in refused} == {UNKNOWN_JOB}
    newest = ghost[-1]["ts"]
    assert all(r.msg["ts"] < newest - 60.0 for r in refused)
    assert task.members.n_held == len([m for m in ghost if m["ts"] >= newest - 60.0])
    # the ghost job goes quiet; another job's records move the partition's clock on
    other = steps(2, 1, job="other")
    task.process(topics.STEPS, [{**other[0], "ts": newest + 1.0}])
    assert task.members.n_held == 1 + len([m for m in ghost if m["ts"] >= newest - 60.0])
    task.process(topics.STEPS, [{**other[1], "ts": newest + 121.0}])
    assert set(task.members.held) == {"other"}
    task.close()


def test_the_hold_is_bounded_and_the_job_held_longest_loses_its_oldest_first() -> None:
    task = JobTask(JobTaskConfig(hold=HoldConfig(hold_records=10)))
    a, b = steps(2, 4, job="a"), steps(2, 4, job="b")
    task.process(topics.STEPS, a)  # 8 held
    task.process(topics.STEPS, b[:4])  # 12: a's 4 oldest go
    assert [(r.reason, r.msg["job"], r.msg["step"]) for r in task.refused] == [(UNKNOWN_JOB, "a", 0)] * 2
    assert task.members.n_held == 10 and len(task.members.held["a"]) == 6
    task.close()


def test_held_steps_and_job_nodes_survive_a_snapshot() -> None:
    recs = steps(4, 200, slow={2: 0.25}, slow_from=10)
    whole, part = JobTask(), JobTask()
    for t in (whole, part):
        _run(t, recs[:100])
    restored = JobTask.from_bytes(part.to_bytes())
    part.close()
    assert restored.members.n_held == 100
    a = whole.process(topics.JOBS, [job_start(3)]) + _run(whole, recs[100:])[0]
    b = restored.process(topics.JOBS, [job_start(3)]) + _run(restored, recs[100:])[0]
    assert a == b and restored.to_bytes() == whole.to_bytes()
    whole.close()
    restored.close()


def test_the_job_table_names_the_nodes_of_a_job_whose_job_1_the_task_never_read() -> None:
    """A task that starts at the jobs topic's end, or restores a snapshot that knew no nodes:
    the worker's JobTable says which nodes the job has. A node outside them that the snapshot's
    windows held (the attack before the fix) is dropped, its open finding resolved."""
    recs = steps(4, 420, slow={3: 0.3}, slow_from=5)
    old = JobTask()
    old.process(topics.JOBS, [job_start(4)])  # the snapshot of a release that took node-03 as it came
    out, _ = _run(old, recs[:1200])
    assert any(f["node"] == "node-03" for f in _stragglers(out))
    state = orjson.loads(old.to_bytes())
    old.close()
    del state["members"]
    table = JobTable()
    table.apply(_job(["node-00", "node-01", "node-02"]))
    task = JobTask.from_bytes(orjson.dumps(state), jobs=table)
    out, refused = _run(task, recs[1200:])
    assert {r.msg["node"] for r in refused} == {"node-03"} and {r.reason for r in refused} == {NOT_IN_JOB}
    gone = [f for f in _stragglers(out, resolved=True) if f["node"] == "node-03"]
    assert gone and not any(f["node"] == "node-03" for f in _stragglers(out))
    assert (
        "node-03" not in orjson.dumps(task.straggler.to_state(), option=orjson.OPT_SERIALIZE_NUMPY).decode()
    )
    task.close()


def test_an_ended_job_is_not_revived_by_a_lagging_table_and_its_late_steps_are_not_judged() -> None:
    table = JobTable()
    table.apply(job_start(4))  # the table has not seen the end yet
    task = JobTask(jobs=table)
    task.process(topics.STEPS, steps(4, 10))
    task.process(topics.JOBS, [_job([], state="finished", ts=T0 + 20)])
    late = [{**m, "ts": m["ts"] + 30.0} for m in steps(4, 100)]
    out: list[Output] = []
    dropped = 0
    for i in range(0, len(late), 40):
        out += task.process(topics.STEPS, late[i : i + 40])
        assert task.refused == []  # late, not bad input: nothing is dead-lettered
        dropped += task.members.late
    assert _stragglers(out) == []
    assert "job-1" not in task.straggler.windows
    # held for a new run's job/1 until the hold ran out, then dropped and counted
    assert task.members.n_held > 0 and dropped + task.members.n_held == len(late)
    assert dropped >= len(late) - 4 * (HoldConfig().hold_s + 1)
    task.close()


def test_members_state_round_trips() -> None:
    m = JobMembers(HoldConfig())
    taken, refused = m.admit([job_start(2), *steps(3, 2), *steps(2, 2, job="later")])
    assert [r.msg["node"] for r in refused] == ["node-02", "node-02"]
    assert len(taken) == 1 + 4 and m.n_held == 4
    again = JobMembers.from_state(orjson.loads(orjson.dumps(m.to_state(), option=orjson.OPT_SERIALIZE_NUMPY)))
    assert again.to_state() == m.to_state() and again.n_held == 4


def test_a_previous_run_of_a_reused_job_id_does_not_end_the_running_one() -> None:
    """Slurm reuses job ids. The records of an earlier run (older start_ts), published again while
    the new run goes on, neither stop the new run's steps being judged nor reach the detectors."""
    recs = steps(4, 200, slow={2: 0.25}, slow_from=10)
    run = {**job_start(4), "start_ts": T0}
    old = [{**job_start(4), "start_ts": T0 - 9000}, {**_job([], state="finished"), "start_ts": T0 - 9000}]
    plain, reused = JobTask(), JobTask()
    plain.process(topics.JOBS, [run])
    reused.process(topics.JOBS, [run])
    want = _run(plain, recs[:400])[0] + _run(plain, recs[400:])[0]
    got = _run(reused, recs[:400])[0]
    assert reused.process(topics.JOBS, old) == []
    more, refused = _run(reused, recs[400:])
    assert refused == [] and got + more == want and _stragglers(want)
    # the run ends; its start published again afterwards does not make it run again
    end = {**_job([], state="finished", ts=recs[-1]["ts"] + 1), "start_ts": T0}
    reused.process(topics.JOBS, [end])
    assert reused.process(topics.JOBS, [run]) == [] and "job-1" not in reused.members.nodes
    plain.close()
    reused.close()


def test_a_snapshot_whose_held_records_or_memories_the_stage_would_not_take_is_refused() -> None:
    """The state topic is input too: a held record is judged later as if the decoder had passed
    it, so one that is not a valid step/1 or nodefeatures/1 (or too many of them, or too many
    ended jobs) makes the restore fail, and the worker starts the partition cold, instead of
    raising at every replay."""
    good = JobMembers.from_state(JobMembers().to_state())
    assert good.n_held == 0
    step = steps(2, 1, job="j1")[0]
    bad_states = [
        {"held": [["j1", [{k: v for k, v in step.items() if k != "node"}]]]},  # a step without a node
        {"held": [["j1", [5]]]},
        {"held": [["j1", [step] * 5]]},  # more than the hold takes (4 below)
        {"ended": [[f"j{i}", None] for i in range(5000)]},
    ]
    for bad in bad_states:
        state = {**JobMembers().to_state(), **bad}
        with pytest.raises((ValueError, TypeError)):
            JobMembers.from_state(orjson.loads(orjson.dumps(state)), HoldConfig(hold_records=4))
