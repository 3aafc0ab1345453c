"""A job detector judges only the nodes the scheduler put in the job, through the real broker into
a real detect worker (issue 23, item 3).

Job 1's job/1 lists nodes a, b, c; its training code also reports a node d, 30% slow, for 450 s of
event time. Before the fix d became a critical (drain-worthy) straggler; now each of d's steps is
dead-lettered as not_in_job and counted, and c, slow and in the job, is still found. Job 2's first
steps come before its job/1: they are held, then judged when it comes. Nodes and jobs are named per
run, so the shared topics carry nothing else that matches."""

from __future__ import annotations

import time
import uuid
from typing import Any

import orjson
import pytest
from prometheus_client import REGISTRY

from fleetwatch import schemas, topics
from fleetwatch.pipeline.job_members import RunningConfig
from fleetwatch.pipeline.job_stage import JobTask, JobTaskConfig
from tests.integration.services import TopicTail, send
from tests.integration.workers import Detect, produce


def _steps(
    job: str, nodes: list[str], t0: float, n: int, slow: dict[str, float], start: int = 0
) -> list[Any]:
    """(key, value) of step/1 records: every node one step a second, the slow ones slower."""
    return [
        (
            job,
            orjson.dumps(
                {
                    "schema": "step/1",
                    "job": job,
                    "node": node,
                    "rank": r,
                    "step": s,
                    "step_time_s": 1.0 * (1 + slow.get(node, 0.0)) + 0.001 * ((s * 7 + r * 3) % 5),
                    "ts": t0 + s,
                }
            ),
        )
        for s in range(start, start + n)
        for r, node in enumerate(nodes)
    ]


def _job(job: str, nodes: list[str], ts: float) -> list[tuple[str, bytes]]:
    return [
        (job, orjson.dumps({"schema": "job/1", "job": job, "nodes": nodes, "state": "running", "ts": ts}))
    ]


def _held(d: Detect, job: str) -> int:
    tasks = [t for t in list(d.worker.tasks.values()) if isinstance(t, JobTask)]
    return sum(len(t.members.held.get(job, ())) for t in tasks)


def _rejected(d: Detect, reason: str) -> float:
    labels = {"group": d.worker.group, "topic": topics.STEPS, "reason": reason}
    return REGISTRY.get_sample_value("fleetwatch_worker_rejected_total", labels) or 0.0


def test_steps_for_a_node_outside_the_job_are_dead_lettered_and_never_judged(
    kafka_bootstrap: str, detect: tuple[Detect, str]
) -> None:
    d, p = detect
    a, b, c, x = (f"{p}{n}" for n in "abcd")
    e, f, g = (f"{p}{n}" for n in "efg")
    j1, j2 = f"{p}job-1", f"{p}job-2"
    now = time.time()
    findings, dlq = TopicTail(kafka_bootstrap, topics.FINDINGS), TopicTail(kafka_bootstrap, topics.DEADLETTER)
    before = _rejected(d, "not_in_job")

    # job 1: its job/1 first (the worker's job table has it), then 450 s of steps for a, b, c and d
    produce(kafka_bootstrap, topics.JOBS, _job(j1, [a, b, c], now - 600))
    deadline = time.monotonic() + 90
    while not d.jobs.nodes_of(j1) and time.monotonic() < deadline:
        time.sleep(0.1)
    produce(kafka_bootstrap, topics.STEPS, _steps(j1, [a, b, c, x], now - 560, 450, {c: 0.3, x: 0.3}))

    def mine(recs: list[Any]) -> list[dict[str, Any]]:
        return [schemas.decode(r.value) for r in recs if r.key and r.key.startswith(p.encode())]

    def opened(recs: list[Any]) -> list[dict[str, Any]]:
        return [m for m in mine(recs) if not m["resolved"]]

    got = opened(findings.collect(lambda rs: any(m["severity"] == "critical" for m in opened(rs)), 120))
    letters = dlq.collect(lambda rs: len([r for r in rs if x.encode() in r.value]) >= 450, 90)
    assert d.thread.is_alive(), "the worker died"
    assert {(m["node"], m["job"]) for m in got} == {(c, j1)}, [m["summary"] for m in got]
    assert any(m["severity"] == "critical" for m in got)  # a, b, c are judged: c is found
    mine_letters = [(dict(r.headers), orjson.loads(r.value)) for r in letters if p.encode() in r.value]
    assert {(h["reason"], m["node"]) for h, m in mine_letters} == {(b"not_in_job", x)}
    assert len(mine_letters) == 450 and all(m["job"] == j1 for _h, m in mine_letters)
    assert _rejected(d, "not_in_job") - before == 450

    # job 2, later in event time (a job held is refused once its partition's records are 2 x 60 s
    # newer): 30 s of steps before its job/1 (held), then the job/1, then the rest
    produce(kafka_bootstrap, topics.STEPS, _steps(j2, [e, f, g], now - 100, 30, {g: 0.3}))
    deadline = time.monotonic() + 90
    while _held(d, j2) < 90 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _held(d, j2) == 90, "job 2's early steps were not held for its job/1"
    produce(kafka_bootstrap, topics.JOBS, _job(j2, [e, f, g], now - 110))
    produce(kafka_bootstrap, topics.STEPS, _steps(j2, [e, f, g], now - 100, 70, {g: 0.3}, start=30))
    got = opened(findings.collect(lambda rs: any(m["node"] == g for m in opened(rs)), 120))
    assert {(m["node"], m["job"]) for m in got} == {(g, j2)}, [m["summary"] for m in got]
    # the held steps were judged: the straggler was found before the first step after the job/1
    assert min(m["first_seen"] for m in got) < now - 100 + 30
    assert _held(d, j2) == 0
    assert not [r for r in dlq.collect(lambda _rs: False, 1) if j2.encode() in r.value]
    findings.close()
    dlq.close()


def _forgotten(reason: str) -> float:
    return REGISTRY.get_sample_value("fleetwatch_detect_jobs_forgotten_total", {"reason": reason}) or 0.0


def test_running_jobs_past_the_bound_are_forgotten_the_least_recently_active_first(
    kafka_bootstrap: str,
) -> None:
    """job/1 records are unsigned: a flood of running jobs must not grow the stage without bound.
    Through the real broker and worker, with [detect.job.running] max_jobs = 2: a job with an open
    straggler finding, then two other jobs' job/1 on its partition.
    The second pushes it out: its finding resolves as forgotten at that job/1's time, the worker
    counts it, and the job's next steps start it afresh from the worker's job table."""
    run = uuid.uuid4().hex[:6]
    p = f"f{run}-"
    d = Detect(kafka_bootstrap, run, job_config=JobTaskConfig(running=RunningConfig(max_jobs=2)))
    findings = TopicTail(kafka_bootstrap, topics.FINDINGS)
    try:
        a, b, c = (f"{p}{n}" for n in "abc")
        job = f"{p}job"
        now = time.time()
        before = _forgotten("max_jobs")
        produce(kafka_bootstrap, topics.JOBS, _job(job, [a, b, c], now - 600))
        deadline = time.monotonic() + 90
        while not d.jobs.nodes_of(job) and time.monotonic() < deadline:
            time.sleep(0.1)
        produce(kafka_bootstrap, topics.STEPS, _steps(job, [a, b, c], now - 560, 200, {c: 0.3}))

        def mine(recs: list[Any]) -> list[dict[str, Any]]:
            return [schemas.decode(r.value) for r in recs if r.key and r.key.startswith(p.encode())]

        got = mine(findings.collect(lambda rs: any(not m["resolved"] for m in mine(rs)), 120))
        assert {(m["node"], m["job"]) for m in got if not m["resolved"]} == {(c, job)}
        others = [
            {
                "schema": "job/1",
                "job": f"{p}other{i}",
                "nodes": [f"{p}z{i}"],
                "state": "running",
                "ts": now - 300 + i,
            }
            for i in range(2)
        ]
        # on the job's partition (a record's key must name its job: the partition is given)
        [part] = [
            k[1] for k, t in list(d.worker.tasks.items()) if isinstance(t, JobTask) and job in t.members.nodes
        ]
        send(
            kafka_bootstrap,
            topics.JOBS,
            [(o["job"].encode(), orjson.dumps(o)) for o in others],
            partition=part,
        )
        got = mine(findings.collect(lambda rs: any(m["resolved"] for m in mine(rs)), 60))
        assert d.thread.is_alive(), "the worker died"
        [resolved] = [m for m in got if m["resolved"]]
        assert (resolved["node"], resolved["job"]) == (c, job)
        assert resolved["evidence"]["resolution"] == "forgotten"
        assert resolved["ts"] == pytest.approx(now - 299, abs=1e-3)
        assert "passed max_jobs running jobs" in resolved["summary"]
        assert _forgotten("max_jobs") == before + 1
        # its next steps: the job table knows the job, so they are judged, not held or refused
        produce(kafka_bootstrap, topics.STEPS, _steps(job, [a, b, c], now - 290, 60, {c: 0.3}, start=300))
        got = mine(findings.collect(lambda rs: len([m for m in mine(rs) if not m["resolved"]]) >= 1, 120))
        assert {(m["node"], m["job"]) for m in got if not m["resolved"]} == {(c, job)}
    finally:
        findings.close()
        d.close()
