"""The job table (pipeline/job_table.py) on nodes that several jobs share, and jobs forgotten at
their tombstone (issue 16): features go to every job of a node and peers are compared within each
job; a failure a task counted stays in its lemon history after the job is tombstoned and after the
task is restored from its snapshot."""

from __future__ import annotations

import time
from typing import Any

import orjson
import pytest

from fleetwatch import topics
from fleetwatch.bus.memory import MemoryBus
from fleetwatch.detectors.batch import TelemetryBatch
from fleetwatch.pipeline import job_table
from fleetwatch.pipeline.job_stage import JobTask
from fleetwatch.pipeline.job_table import JobTable, JobTableFollower
from fleetwatch.pipeline.node_stage import NodeTask, NodeTaskConfig
from tests.helpers.followers import following
from tests.helpers.messages import telemetry

T0 = 1_800_000_000.0


def job(name: str, nodes: list[str], state: str = "running", ts: float = T0) -> dict[str, Any]:
    return {"schema": "job/1", "job": name, "nodes": nodes, "state": state, "ts": ts}


def test_a_node_maps_to_all_its_running_jobs() -> None:
    t = JobTable()
    t.apply(job("a", ["n1", "n2"]))
    t.apply(job("b", ["n2", "n3"]))
    t.apply(job("c", ["n2", "n2"], "started"))  # a node listed twice is one membership
    assert t.jobs_of(["n1", "n2", "n3", "n4"]) == [("a",), ("a", "b", "c"), ("b",), ()]
    assert t.jobs_on("n2") == ("a", "b", "c") and t.nodes_of("b") == ("n2", "n3")
    t.apply(job("a", ["n1", "n2"], "finished", T0 + 1))  # an end removes the job from its own nodes only
    assert t.jobs_of(["n1", "n2", "n3"]) == [(), ("b", "c"), ("b",)]
    t.apply(job("b", ["n3", "n4"], "running", T0 + 2))  # a job that moved: its old nodes lose it
    assert t.jobs_of(["n2", "n3", "n4"]) == [("c",), ("b",), ("b",)]
    t.apply(job("b", ["n3", "n4"], "failed", T0 + 3))
    t.apply(job("c", ["n2"], "finished", T0 + 3))
    assert t.jobs_of(["n1", "n2", "n3", "n4"]) == [(), (), (), ()]
    assert list(t.failed_jobs) == ["b"] and t.nodes_of("b") == ()


def test_running_jobs_are_bounded_in_all_and_per_node() -> None:
    """job/1 is unsigned (the topic's ACL guards it) and a publisher can miss ends: the table holds
    at most max_running jobs (the least recently announced leaves first) and max_jobs_per_node jobs
    on one node (the node's job announced first leaves that node, still on its other nodes)."""
    t = JobTable(max_running=4, max_jobs_per_node=3)
    for name in ("a", "b", "c"):
        t.apply(job(name, ["n1", "n2"]))
    t.apply(job("d", ["n1"]))  # n1 is full: a, announced first, leaves n1 and stays on n2
    assert t.jobs_on("n1") == ("b", "c", "d") and t.jobs_on("n2") == ("a", "b", "c")
    assert t.nodes_of("a") == ("n2",)
    t.apply(job("a", ["n2"], ts=T0 + 1))  # announced again: now the most recent
    t.apply(job("e", ["n3"]))  # five running: b, the least recently announced, leaves
    assert t.nodes_of("b") == () and t.jobs_on("n1") == ("c", "d") and t.jobs_on("n2") == ("a", "c")
    assert t.dropped == 2
    t.apply(job("c", ["n1", "n2"], "finished", T0 + 2))  # ends go on as before
    assert t.jobs_of(["n1", "n2", "n3"]) == [("d",), ("a",), ("e",)]


def test_a_flood_of_running_jobs_on_one_node_stays_bounded_and_quick() -> None:
    """10,000 running jobs naming one node (the probe took 14 s to load them, re-sorting the node's
    growing list at each): the node keeps MAX_JOBS_PER_NODE, the most recent, so each insert sorts
    at most that many, and its features go to that many jobs."""
    t = JobTable()
    for i in range(10_000):
        t.apply(job(f"flood-{i:05d}", ["n1", f"other-{i}"]))
    assert t.jobs_on("n1") == tuple(
        f"flood-{i:05d}" for i in range(10_000 - job_table.MAX_JOBS_PER_NODE, 10_000)
    )
    assert t.jobs_on("other-0") == ("flood-00000",) and t.dropped == 10_000 - job_table.MAX_JOBS_PER_NODE


def test_a_tombstone_forgets_a_job_running_or_failed() -> None:
    t = JobTable()
    t.apply(job("run", ["n1", "n2"]))
    t.apply(job("other", ["n2"]))
    t.apply(job("dead", ["n3"], "failed"))
    version = t.failed_version
    t.forget("run")
    t.forget("dead")
    t.forget("never-seen")  # a tombstone of a job the table does not hold changes nothing
    assert t.jobs_of(["n1", "n2", "n3"]) == [(), ("other",), ()] and t.nodes_of("run") == ()
    assert t.failed_jobs == {} and t.failed_ids() == set()
    assert t.failed_version == version  # nothing new to count: tasks do not rescan
    t.apply(job("dead2", ["n3"], "failed", T0 + 1))  # the failed-job bookkeeping still works
    assert list(t.failed_jobs) == ["dead2"] and t.failed_version == version + 1


def test_the_follower_applies_records_and_tombstones_in_order() -> None:
    """A job's records and then its tombstone; a tombstone before a job's record (the publisher
    reusing an id); a record keyed as another job: applied in offset order, the last one not.
    Read from the bus (in memory, one partition so that one order holds), as from the broker."""
    t = JobTable()
    bus = MemoryBus(partitions=1, clock_ms=lambda: int(time.time() * 1000))
    follower = JobTableFollower(t, bus)
    now = time.time()
    rec = [
        (b"dead", job("dead", ["n1"], "failed", now)),
        (b"run", job("run", ["n1", "n2"], "running", now)),
        (b"dead", None),
        (b"again", None),
        (b"again", job("again", ["n2"], "started", now)),
        (b"bad", job("other", ["n3"], "running", now)),
        (None, None),  # a tombstone without a key names no job
    ]
    for key, msg in rec:
        bus.append(topics.JOBS, key, None if msg is None else orjson.dumps(msg))
    with following(follower):
        assert follower.caught_up.wait(30)
    assert t.failed_jobs == {} and t.jobs_of(["n1", "n2", "n3"]) == [("run",), ("again", "run"), ()]


def test_the_failure_window_is_the_topics_job_history() -> None:
    # the publisher (collectors/) tombstones ended jobs after topics.JOB_HISTORY_S; the table keeps
    # failures for the same window, so a tombstone never removes one the lemon detector still wants
    assert job_table.FAILED_KEEP_S == topics.JOB_HISTORY_S == 7 * 86400.0


def _features(out: list[Any]) -> list[tuple[str | None, dict[str, Any]]]:
    return [(k, m) for t, k, m in out if t == topics.NODE_FEATURES]


def _sample(node: str, ts: float, seq: int, clock: float) -> dict[str, Any]:
    m = telemetry(node=node, ts=ts, seq=seq)
    m["gpus"] = [{**g, "sm_clock_mhz": clock} for g in m["gpus"]]
    return m


def test_a_shared_node_sends_its_features_to_each_job_and_is_judged_within_each() -> None:
    """Job a = n1, n2, n3 and job b = n3, n4, n5 share n3. n3 and all of b run at 1500 MHz, a's
    other nodes at 1980: n3 is a straggler in a (its peers there are faster), not in b (its peers
    there are as slow), and no other node is blamed."""
    jobs = JobTable()
    jobs.apply(job("a", ["n1", "n2", "n3"]))
    jobs.apply(job("b", ["n3", "n4", "n5"]))
    clocks = {"n1": 1980.0, "n2": 1980.0, "n3": 1500.0, "n4": 1500.0, "n5": 1500.0}
    node, straggler = NodeTask(jobs), JobTask(jobs=jobs)  # as `fleetwatch detect` wires them
    findings: list[dict[str, Any]] = []
    try:
        for s in range(60):
            out = node.process(
                topics.TELEMETRY,
                TelemetryBatch.from_messages([_sample(n, T0 + s, s, c) for n, c in clocks.items()]),
            )
            feats = _features(out)
            if s == 0:
                assert sorted((k, m["job"], m["node"]) for k, m in feats) == [
                    ("a", "a", "n1"),
                    ("a", "a", "n2"),
                    ("a", "a", "n3"),
                    ("b", "b", "n3"),
                    ("b", "b", "n4"),
                    ("b", "b", "n5"),
                ]
                one, two = (m for _k, m in feats if m["node"] == "n3")
                assert {**one, "job": ""} == {**two, "job": ""}  # the same sample, once per job
            findings += [m for _t, _k, m in straggler.process(topics.NODE_FEATURES, [m for _k, m in feats])]
    finally:
        node.close()
        straggler.close()
    found = {(f["node"], f["job"]) for f in findings if f["kind"] == "straggler" and not f["resolved"]}
    assert found == {("n3", "a")}


def _lemon_events(task: NodeTask) -> dict[str, float]:
    state = task.lemon.to_state()
    return dict(zip(state["nodes"], state["events"], strict=True))


def _run(task: NodeTask, start: int, stop: int) -> list[dict[str, Any]]:
    """Telemetry of n1..n6 every 10 s from T0 + start to T0 + stop; the task's findings."""
    out = []
    for t in range(start, stop, 10):
        batch = TelemetryBatch.from_messages([telemetry(node=f"n{i}", ts=T0 + t, seq=t) for i in range(1, 7)])
        out += [m for topic, _k, m in task.process(topics.TELEMETRY, batch) if topic == topics.FINDINGS]
    return out


@pytest.mark.parametrize("restore", [False, True])
def test_a_counted_failure_outlives_its_tombstone_and_a_restore(restore: bool) -> None:
    """Three failed single-node jobs on n1, an episode apart, make it a lemon. The publisher then
    tombstones them: the table forgets them, the task drops them from failed_jobs_seen at its next
    sweep, and its lemon history (its own, snapshotted state) keeps them, also in a task restored
    from its snapshot into a table rebuilt from the compacted topic (which no longer has them).
    A twin task whose table never saw the tombstones ends in the same lemon state."""
    cfg = NodeTaskConfig(forget_every_s=10.0)
    table, twin_table = JobTable(), JobTable()
    task, twin = NodeTask(table, cfg), NodeTask(twin_table, cfg)
    tasks = [task, twin]
    try:
        for i, t in enumerate((0, 700, 1400)):
            for tbl in (table, twin_table):
                tbl.apply(job(f"j{i}", ["n1"], "failed", T0 + t))
            for x in (task, twin):
                _run(x, t, t + 700)
        assert task.failed_jobs_seen == {"j0", "j1", "j2"}
        counted = _lemon_events(task)
        assert counted["n1"] > 2.5 and counted["n2"] == 0.0
        for i in range(3):
            table.forget(f"j{i}")  # the tombstones reach the worker's table
        assert table.failed_jobs == {}
        if restore:
            rebuilt = JobTable()  # from the compacted topic: records and tombstones are gone
            task.close()
            task = NodeTask.from_bytes(task.to_bytes(), rebuilt, cfg)
            tasks.append(task)
            assert task.failed_jobs_seen == {"j0", "j1", "j2"}  # until its next sweep
        found = _run(task, 2100, 2400)
        twin_found = _run(twin, 2100, 2400)
        assert task.failed_jobs_seen == set()  # the table no longer offers them: not remembered
        assert twin.failed_jobs_seen == {"j0", "j1", "j2"}
        assert _lemon_events(task) == _lemon_events(twin)  # nothing lost, nothing counted twice
        assert _lemon_events(task)["n1"] > 2.5
        lemons = [(f["node"], f["resolved"]) for f in found if f["kind"] == "lemon"]
        assert lemons == [(f["node"], f["resolved"]) for f in twin_found if f["kind"] == "lemon"]
        assert task.lemon.book.open and {k[0] for k in task.lemon.book.open} == {"n1"}
    finally:
        for x in tasks:
            x.close()
