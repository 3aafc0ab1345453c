"""fleetwatch.steps: the StepReporter that training code calls once per step (issue 16, part 2).

Unit tests run against an unreachable broker (nothing listens on port 1), so the sender thread
never takes a record out of the buffer; tests against the real broker read every message back
and decode it with the readers' own validation (schemas.decode with the key and the clock).
"""

from __future__ import annotations

import fractions
import json
import logging
import subprocess
import sys
import textwrap
import threading
import time
import tracemalloc
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from kafka import KafkaConsumer, TopicPartition

from fleetwatch import kafka_io, schemas, steps, topics
from fleetwatch.steps import StepReporter, resolve_identity
from tests.conftest import REPO, PrivateBroker

DEAD = "127.0.0.1:1"  # connection refused at once: a broker that is down


def _job() -> str:
    return f"steps-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def dead_reporter() -> Iterator[Any]:
    made: list[StepReporter] = []

    def make(**kw: Any) -> StepReporter:
        kw.setdefault("job", _job())
        kw.setdefault("rank", 0)
        kw.setdefault("node", "n1")
        # One short bootstrap attempt: the tests that wait for the thread to finish wait less.
        r = StepReporter(DEAD, producer_config={"bootstrap_timeout_ms": 200}, **kw)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close(0)


def _buffered(r: StepReporter) -> list[tuple[Any, ...]]:
    # The records still in the buffer: with the broker down nothing takes them out.
    return list(r._buf)


# ---------------------------------------------------------------- identity from the environment


def test_identity_from_slurm_wins_over_torchrun() -> None:
    env = {"SLURM_JOB_ID": "4242", "SLURM_PROCID": "3", "RANK": "5", "LOCAL_RANK": "1"}
    env["SLURMD_NODENAME"] = "gpu-node-02"
    assert resolve_identity(env=env) == ("4242", 3, "gpu-node-02")


def test_identity_rank_falls_back_to_torchrun_then_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(steps.socket, "gethostname", lambda: "trainer-7.cluster.example.org")
    assert resolve_identity(env={"SLURM_JOB_ID": "1", "RANK": "5", "LOCAL_RANK": "1"}) == (
        "1",
        5,
        "trainer-7",
    )
    assert resolve_identity(env={"SLURM_JOB_ID": "1", "LOCAL_RANK": "2"})[1] == 2
    assert resolve_identity(env={"SLURM_JOB_ID": "1", "RANK": " "})[1] == 0  # blank: not set
    assert resolve_identity(env={"SLURM_JOB_ID": "1"}) == ("1", 0, "trainer-7")


def test_identity_torchrun_under_slurm_takes_the_workers_rank() -> None:
    # `srun torchrun --nproc-per-node 8 ...`: SLURM_PROCID is the node's task, RANK the worker's.
    env = {"SLURM_JOB_ID": "9", "SLURM_PROCID": "1", "RANK": "13", "LOCAL_RANK": "5"}
    env |= {"TORCHELASTIC_RUN_ID": "9", "SLURMD_NODENAME": "gpu-node-02"}
    assert resolve_identity(env=env) == ("9", 13, "gpu-node-02")
    del env["RANK"]  # not torchrun's doing after all: Slurm's rank again
    assert resolve_identity(env=env)[1] == 1


def test_identity_arguments_override_the_environment() -> None:
    env = {"SLURM_JOB_ID": "1", "SLURM_PROCID": "3", "SLURMD_NODENAME": "gpu-node-01"}
    assert resolve_identity("run-9", 7, "gpu-node-04", env=env) == ("run-9", 7, "gpu-node-04")
    assert resolve_identity(rank=np.int64(6), env=env)[1] == 6


@pytest.mark.parametrize(
    ("kwargs", "env", "match"),
    [
        ({}, {}, "SLURM_JOB_ID is not set"),
        ({"job": "my job"}, {}, "job 'my job' is not a valid"),
        ({"job": "-x"}, {}, "not a valid"),
        ({"job": "j\n"}, {}, "not a valid"),
        ({"job": "j" * 254}, {}, "not a valid"),
        ({}, {"SLURM_JOB_ID": "1", "SLURMD_NODENAME": "gpu/01"}, "SLURMD_NODENAME 'gpu/01'"),
        ({"job": "j", "node": ""}, {}, "node '' is not a valid"),
        ({"job": "j"}, {"SLURM_PROCID": "zero"}, "SLURM_PROCID 'zero' is not an integer"),
        ({"job": "j"}, {"RANK": "-1"}, r"RANK -1 is out of range"),
        ({"job": "j", "rank": True}, {}, "not an integer rank"),
        ({"job": "j", "rank": 1.0}, {}, "not an integer rank"),
        ({"job": "j", "rank": 2**31}, {}, "out of range"),
    ],
)
def test_bad_configuration_is_refused_at_construction(
    kwargs: dict[str, Any], env: dict[str, str], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        StepReporter(DEAD, env={"SLURMD_NODENAME": "n1", **env}, **kwargs)


def test_bootstrap_from_the_environment_or_refused() -> None:
    r = StepReporter(env={"FLEETWATCH_BOOTSTRAP": DEAD, "SLURM_JOB_ID": "77", "SLURMD_NODENAME": "n1"})
    try:
        assert (r.bootstrap, r.job, r.rank, r.node) == (DEAD, "77", 0, "n1")
    finally:
        r.close(0)
    with pytest.raises(ValueError, match="FLEETWATCH_BOOTSTRAP"):
        StepReporter(env={"SLURM_JOB_ID": "77"})


# ---------------------------------------------------------------- step(): times, bounds, bad input


def test_measured_step_time_between_calls(dead_reporter: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter([100.0, 100.25, 100.75, 101.0, 103.0, 104.0, 104.5, 105.0])
    monkeypatch.setattr(steps, "_perf", lambda: next(clock))
    r = dead_reporter()
    r.step(0)  # 100.0: only starts the clock
    assert r.accepted == 0 and _buffered(r) == []
    r.step(1)  # 100.25
    r.step(2)  # 100.75
    r.step(3, 9.5)  # 101.0: a given time wins, and the clock still moves to this call
    r.step(4)  # 103.0
    r.reset_clock()  # a pause (evaluation, checkpoint) that is not a step
    r.step(5)  # 104.0: starts the clock again
    r.step(6, wait_time_s=0.125)  # 104.5
    got = [(s, t, w) for s, t, _, w in _buffered(r)]
    assert got == [(1, 0.25, None), (2, 0.5, None), (3, 9.5, None), (4, 2.0, None), (6, 0.5, 0.125)]
    assert r.accepted == 5 and r.rejected == 0
    ts = [ts for _, _, ts, _ in _buffered(r)]  # wall-clock time of each call, for the message
    assert ts == sorted(ts) and time.time() - 5 < ts[0] and ts[-1] <= time.time()


def test_numbers_of_other_types_are_converted(dead_reporter: Any) -> None:
    r = dead_reporter()
    r.step(np.int64(3), np.float32(0.5))
    r.step(4, 2)  # an int time
    r.step(5, fractions.Fraction(1, 4), wait_time_s=np.float64(0.0))
    got = [(s, t, w) for s, t, _, w in _buffered(r)]
    assert got == [(3, 0.5, None), (4, 2.0, None), (5, 0.25, 0.0)]
    assert all(type(s) is int and type(t) is float for s, t, _ in got)
    assert r.rejected == 0


class _Hostile:
    def __index__(self) -> int:
        raise RuntimeError("no index for you")

    def __float__(self) -> float:
        raise RuntimeError("no float either")

    def __repr__(self) -> str:
        raise RuntimeError("and no repr")


def test_bad_arguments_are_counted_and_logged_once(dead_reporter: Any, caplog: Any) -> None:
    r = dead_reporter()
    bad: list[tuple[Any, ...]] = [
        (-1, 0.1),
        (2**63, 0.1),
        (1.5, 0.1),
        ("3", 0.1),
        (True, 0.1),
        (None, 0.1),
        (_Hostile(), 0.1),
        (1, float("nan")),
        (1, float("inf")),
        (1, -0.5),
        (1, "0.1"),
        (1, b"0.1"),
        (1, False),
        (1, _Hostile()),
        (1, object()),
        (1, 0.1, -1.0),
        (1, 0.1, float("nan")),
    ]
    with caplog.at_level(logging.WARNING, logger="fleetwatch.steps"):
        for args in bad:
            r.step(*args)  # must not raise
    assert r.rejected == len(bad)
    assert r.accepted == 0 and _buffered(r) == []
    warnings = [rec for rec in caplog.records if rec.name == "fleetwatch.steps" and "refused" in rec.message]
    assert len(warnings) == 1 and "StepReporter.rejected" in warnings[0].message
    r.step(8, 0.5)  # good calls keep working after bad ones
    assert r.accepted == 1 and _buffered(r)[0][:2] == (8, 0.5)


def test_buffer_is_bounded_and_drops_the_oldest(dead_reporter: Any) -> None:
    r = dead_reporter(max_buffered=100)
    for i in range(1000):
        r.step(i, 0.01)
    assert [rec[0] for rec in _buffered(r)] == list(range(900, 1000))
    assert (r.accepted, r.sent, r.dropped, r.pending) == (1000, 0, 900, 100)
    assert r.close(0.2) is False  # nothing was delivered: close says so, without raising
    deadline = time.monotonic() + 5
    while not r.closed and time.monotonic() < deadline:  # the thread may still be bootstrapping
        time.sleep(0.05)
    assert r.closed and (r.dropped, r.pending) == (1000, 0)
    r.step(1000, 0.01)  # after close: counted as dropped, never raises
    assert (r.accepted, r.dropped, r.pending) == (1001, 1001, 0)
    assert r.close() is False  # a second close is harmless


def test_memory_stays_bounded_while_the_broker_is_down(dead_reporter: Any) -> None:
    r = dead_reporter(max_buffered=1000)
    for i in range(2000):  # fill the buffer first: what follows must not grow anything
        r.step(i, 0.01)
    tracemalloc.start()
    try:
        # Only what steps.py allocates: the sender thread's connection attempts and the test's log
        # capture allocate meanwhile too, and are not the reporter's buffer.
        base = _traced_in_steps()
        for i in range(2000, 102_000):
            r.step(i, 0.01)
        now = _traced_in_steps()
    finally:
        tracemalloc.stop()
    assert len(_buffered(r)) == 1000 and r.dropped == 101_000
    assert now - base < 64 * 1024, f"memory grew by {now - base} bytes over 100,000 steps"


def _traced_in_steps() -> int:
    snap = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(True, steps.__file__)])
    return sum(stat.size for stat in snap.statistics("filename"))


EXIT_SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    from fleetwatch.steps import StepReporter
    r = StepReporter(sys.argv[1], job="exit-test", rank=0, node="n1")
    for i in range(5000):
        r.step(i)
    if sys.argv[2] == "wait":
        deadline = time.monotonic() + 20
        while r.sent < 4999 and time.monotonic() < deadline:  # connected, all delivered
            time.sleep(0.01)
    print(json.dumps(r.stats()), flush=True)
    if sys.argv[2] == "wait":
        sys.stdin.readline()  # the test stops the broker, then lets us go on
        for i in range(5000, 5100):
            r.step(i, 0.01)
    print(json.dumps(r.stats()), flush=True)
    """
)


def test_exit_does_not_hang_when_the_broker_is_unreachable() -> None:
    t0 = time.monotonic()
    p = subprocess.run(
        [sys.executable, "-c", EXIT_SCRIPT, DEAD, "now"], cwd=REPO, capture_output=True, text=True, timeout=30
    )
    took = time.monotonic() - t0
    assert p.returncode == 0, p.stderr[-2000:]
    stats = [json.loads(line) for line in p.stdout.splitlines()]
    assert len(stats) == 2 and stats[-1]["accepted"] == 4999 and stats[-1]["sent"] == 0
    assert "Traceback" not in p.stderr
    assert took < 6.0, f"interpreter exit took {took:.1f} s"


# ---------------------------------------------------------------- against the real broker


def _steps_consumer(bootstrap: str) -> tuple[KafkaConsumer, list[TopicPartition]]:
    consumer = KafkaConsumer(**kafka_io.client_config(bootstrap), enable_auto_commit=False)
    parts = consumer.partitions_for_topic(topics.STEPS)
    deadline = time.monotonic() + 10
    while not parts and time.monotonic() < deadline:
        time.sleep(0.2)
        parts = consumer.partitions_for_topic(topics.STEPS)
    assert parts, f"no partitions for {topics.STEPS}"
    return consumer, [TopicPartition(topics.STEPS, p) for p in sorted(parts)]


def _end_offsets(bootstrap: str) -> dict[TopicPartition, int]:
    """Where the steps topic ends now: a test reads only what it produced after this."""
    consumer, tps = _steps_consumer(bootstrap)
    try:
        return dict(consumer.end_offsets(tps))
    finally:
        consumer.close()


def _read_steps(
    bootstrap: str, since: dict[TopicPartition, int], job: str, last_step: int, timeout_s: float = 30.0
) -> list[dict[str, Any]]:
    """The step/1 messages of `job` from the offsets `since` on, until the one of `last_step`,
    each decoded as the detect workers decode it: schema, key and clock checked. A fresh consumer,
    so that one connected before a broker restart does not sit out its reconnect backoff."""
    consumer, tps = _steps_consumer(bootstrap)
    key = job.encode()
    out: list[dict[str, Any]] = []
    try:
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, since.get(tp, 0))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not any(m["step"] == last_step for m in out):
            for batch in consumer.poll(timeout_ms=200).values():
                for rec in batch:
                    if rec.key != key:
                        continue  # another test's or simulation's job
                    ref = kafka_io.reference_time(rec, time.time())
                    m = schemas.decode(
                        rec.value, schemas.STEP, key=rec.key, ref_ts=ref, clock=schemas.DEFAULT_CLOCK
                    )
                    out.append(m)
        return out
    finally:
        consumer.close()


def test_steps_reach_the_topic_as_valid_step_messages(kafka_bootstrap: str) -> None:
    job = _job()
    env = {"SLURM_JOB_ID": job, "SLURM_PROCID": "3", "SLURMD_NODENAME": "gpu-node-02"}
    since = _end_offsets(kafka_bootstrap)
    t0 = time.time()
    with StepReporter(kafka_bootstrap, env=env) as r:
        r.step(0)  # starts the clock
        for i in range(1, 21):
            time.sleep(0.002)
            r.step(i)  # measured
        for i in range(21, 41):
            r.step(i, 0.5 + i / 1000, wait_time_s=0.01)
    assert r.closed
    assert (r.accepted, r.sent, r.dropped, r.pending, r.rejected) == (40, 40, 0, 0, 0)
    msgs = _read_steps(kafka_bootstrap, since, job, 40)
    assert [m["step"] for m in msgs] == list(range(1, 41))  # one partition per job: in order
    assert {(m["job"], m["node"], m["rank"], m["schema"]) for m in msgs} == {
        (job, "gpu-node-02", 3, schemas.STEP)
    }
    measured = [m["step_time_s"] for m in msgs[:20]]
    assert all(0.002 <= t < 1.0 for t in measured)
    assert [m["step_time_s"] for m in msgs[20:]] == [0.5 + i / 1000 for i in range(21, 41)]
    assert all("wait_time_s" not in m for m in msgs[:20])
    assert all(m["wait_time_s"] == 0.01 for m in msgs[20:])
    ts = [m["ts"] for m in msgs]
    assert ts == sorted(ts) and t0 <= ts[0] and ts[-1] <= time.time()


def test_an_outage_drops_within_the_bound_and_later_steps_arrive(private_broker: PrivateBroker) -> None:
    bootstrap = private_broker.bootstrap
    job = _job()
    since = _end_offsets(bootstrap)
    r = StepReporter(
        bootstrap,
        job=job,
        rank=1,
        node="gpu-node-03",
        max_buffered=200,
        max_in_flight=20,
        delivery_timeout_s=1.0,  # the outage is noticed when steps handed over expire
        retry_backoff_s=(0.1, 0.5),
    )
    # A second process with a connected reporter, to exit during the outage (see below).
    child = subprocess.Popen(
        [sys.executable, "-c", EXIT_SCRIPT, bootstrap, "wait"],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for i in range(20):
            r.step(i, 0.1)
        _wait_for(lambda: r.sent == 20, 15, "steps before the outage were not acknowledged")
        assert child.stdout is not None
        assert json.loads(child.stdout.readline())["sent"] == 4999, "the child is connected"

        private_broker.stop()
        # The child leaves with steps unacknowledged and its broker gone: exit must not hang.
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()
        t0 = time.monotonic()
        t_outage = time.monotonic()
        for i in range(20, 1020):
            r.step(i, 0.1)
        held = r.pending
        assert held <= 200 + 20, "memory is bounded: at most max_buffered + max_in_flight held"
        assert r.dropped >= 1000 - held
        _wait_for(lambda: not r.broker_up, 10, "the outage was not noticed")
        out, err = child.communicate(timeout=30)
        child_exit_s = time.monotonic() - t0  # an upper bound: the outage was noticed meanwhile
        private_broker.start()
        outage_s = time.monotonic() - t_outage

        _wait_for(lambda: r.broker_up and r.pending == 0, 30, "the reporter did not recover")
        for i in range(1020, 1040):
            r.step(i, 0.1)
        assert r.close(10) is False  # True only when every step was delivered
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        private_broker.start()  # a no-op when it is up; other tests need it
    assert child.returncode == 0, err[-2000:]
    assert json.loads(out)["pending"] == 100, "the child left with steps it could not deliver"
    assert "Traceback" not in err
    assert child_exit_s < 6.0, f"exit during the outage took {child_exit_s:.1f} s"
    assert r.closed and r.pending == 0
    assert r.accepted == r.sent + r.dropped == 1040
    assert 1000 - 220 <= r.dropped <= 1000, "only steps of the outage may be lost"

    msgs = _read_steps(bootstrap, since, job, 1039)
    got = {m["step"] for m in msgs}
    assert set(range(20)) <= got, "steps before the outage arrived"
    assert set(range(1020, 1040)) <= got, "steps after the broker returned arrived"
    assert set(range(1000, 1020)) <= got, "the newest steps of the outage were kept and arrived"
    assert len(got & set(range(20, 1020))) <= 220, "the outage's steps beyond the bound were dropped"
    assert len(got) >= r.sent, "every acknowledged step is on the topic (repeats are allowed)"
    assert all(m["node"] == "gpu-node-03" and m["rank"] == 1 for m in msgs)
    assert outage_s > 1.0


def _wait_for(cond: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(what)
        time.sleep(0.02)


def test_a_bad_producer_setting_is_logged_not_raised(kafka_bootstrap: str, caplog: Any) -> None:
    bad = {"delivery_timeout_ms": 10, "request_timeout_ms": 30000}  # kafka-python refuses this
    with caplog.at_level(logging.ERROR, logger="fleetwatch.steps"):
        r = StepReporter(kafka_bootstrap, job=_job(), rank=0, node="n1", producer_config=bad)
        try:
            for i in range(10):
                r.step(i, 0.1)
            _wait_for(
                lambda: any("cannot create the Kafka producer" in m for m in caplog.messages), 15, "no log"
            )
            assert r.sent == 0 and r.pending == 10 and not r.broker_up
        finally:
            assert r.close(0.5) is False
    assert r.dropped == 10
    assert sum("cannot create the Kafka producer" in m for m in caplog.messages) == 1


def test_no_thread_is_left_behind_after_close(kafka_bootstrap: str) -> None:
    before = {t.ident for t in threading.enumerate()}
    with StepReporter(kafka_bootstrap, job=_job(), rank=0, node="n1") as r:
        for i in range(10):
            r.step(i, 0.1)
        _wait_for(lambda: r.sent == 10, 15, "steps were not acknowledged")
    _wait_for(lambda: {t.ident for t in threading.enumerate() if t.is_alive()} <= before, 5, "threads left")
