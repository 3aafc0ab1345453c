"""fleetwatch.steps against the real broker (issue 16, part 2): the StepReporter's messages read
back and decoded with the readers' own validation (schemas.decode with the key and the clock),
through a broker outage, a bad producer setting and close. Without a broker:
tests/unit/test_steps.py."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import subprocess
import sys
import threading
import time
from typing import Any

from fleetwatch import schemas, topics
from fleetwatch.bus import TopicPart, reference_time
from fleetwatch.steps import StepReporter
from tests.helpers.paths import REPO
from tests.helpers.steps import EXIT_SCRIPT, new_job
from tests.integration.services import PrivateBroker, end_offsets, reader_at, topic_parts


def _steps_parts(bootstrap: str) -> list[TopicPart]:
    parts = topic_parts(bootstrap, [topics.STEPS], wait_s=10)
    assert parts, f"no partitions for {topics.STEPS}"
    return parts


def _end_offsets(bootstrap: str) -> dict[TopicPart, int]:
    """Where the steps topic ends now: a test reads only what it produced after this."""
    ends = end_offsets(bootstrap, [topics.STEPS])
    assert ends, f"no partitions for {topics.STEPS}"
    return ends


def _read_steps(
    bootstrap: str, since: dict[TopicPart, int], job: str, last_step: int, timeout_s: float = 30.0
) -> list[dict[str, Any]]:
    return _read_steps_until(bootstrap, since, job, {last_step}, timeout_s, any_of=True)


def _read_steps_until(
    bootstrap: str,
    since: dict[TopicPart, int],
    job: str,
    steps: set[int],
    timeout_s: float = 30.0,
    any_of: bool = False,
) -> list[dict[str, Any]]:
    """The step/1 messages of `job` from the offsets `since` on, until the one of `last_step`,
    each decoded as the detect workers decode it: schema, key and clock checked (or, with
    _read_steps_until, until all of `steps` are there). A fresh reader,
    so that one connected before a broker restart does not sit out its reconnect backoff."""
    reader = reader_at(bootstrap, {tp: since.get(tp, 0) for tp in _steps_parts(bootstrap)})
    key = job.encode()
    out: list[dict[str, Any]] = []
    try:
        deadline = time.monotonic() + timeout_s

        def done() -> bool:
            seen = {m["step"] for m in out}
            return bool(seen & steps) if any_of else steps <= seen

        while time.monotonic() < deadline and not done():
            for rec in reader.poll(0.2):
                if rec.key != key:
                    continue  # another test's or simulation's job
                ref = reference_time(rec, time.time())
                m = schemas.decode(
                    rec.value, schemas.STEP, key=rec.key, ref_ts=ref, clock=schemas.DEFAULT_CLOCK
                )
                out.append(m)
        return out
    finally:
        reader.close()


def test_steps_reach_the_topic_as_valid_step_messages(kafka_bootstrap: str) -> None:
    job = new_job()
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
    job = new_job()
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
    bad = {"message.timeout.ms": 10, "linger.ms": 1000}  # librdkafka refuses this pair
    with caplog.at_level(logging.ERROR, logger="fleetwatch.steps"):
        r = StepReporter(kafka_bootstrap, job=new_job(), rank=0, node="n1", producer_config=bad)
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
    with StepReporter(kafka_bootstrap, job=new_job(), rank=0, node="n1") as r:
        for i in range(10):
            r.step(i, 0.1)
        _wait_for(lambda: r.sent == 10, 15, "steps were not acknowledged")
    _wait_for(lambda: {t.ident for t in threading.enumerate() if t.is_alive()} <= before, 5, "threads left")


# A reporter made before a fork, used in the child: os.fork() (a child that must never return into
# pytest) and a multiprocessing worker started by "fork", as PyTorch DataLoader workers are.
_FORKED: StepReporter | None = None
_CLOSE_TIMEOUT_S = 60.0  # the child's close() must return long before this
_PROMPT_S = 15.0  # a generous bound for connecting and delivering, far below the timeout


def _child_reports(first: int, close: bool) -> dict[str, Any]:
    r = _FORKED
    assert r is not None
    for i in range(first, first + 10):
        r.step(i, 0.25)
    out: dict[str, Any] = {}
    if close:
        t0 = time.monotonic()
        out["closed_ok"] = r.close()
        out["close_s"] = time.monotonic() - t0
    out.update(r.stats())
    return out


def _mp_worker(first: int, close: bool, results: Any) -> None:
    results.put(_child_reports(first, close))


def test_a_reporter_made_before_a_fork_reports_from_the_child(kafka_bootstrap: str) -> None:
    """The child's steps go out through a sender of its own and arrive; its close() returns as soon
    as they are delivered; the parent's reporter and counters are untouched by the child."""
    global _FORKED
    job = new_job()
    since = _end_offsets(kafka_bootstrap)
    _FORKED = r = StepReporter(kafka_bootstrap, job=job, rank=0, node="n1", close_timeout_s=_CLOSE_TIMEOUT_S)
    try:
        r.step(0, 0.5)
        _wait_for(lambda: r.sent == 1, 15, "the parent's step was not acknowledged")  # it has a producer
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report, close, tell the parent, and never return into pytest
            code = 1
            try:
                os.close(read)
                os.write(write, json.dumps(_child_reports(100, close=True)).encode())
                code = 0
            finally:
                os._exit(code)
        os.close(write)
        with os.fdopen(read) as f:
            child = json.loads(f.read() or "{}")
        _pid, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, child
        assert child["closed_ok"] is True and child["close_s"] < _PROMPT_S, child
        assert (child["accepted"], child["sent"], child["dropped"]) == (10, 10, 0), child

        ctx = multiprocessing.get_context("fork")
        results = ctx.Queue()
        workers = [
            ctx.Process(target=_mp_worker, args=(first, close, results))
            for first, close in ((200, True), (300, False))
        ]
        for w in workers:
            w.start()
        got = [results.get(timeout=_CLOSE_TIMEOUT_S) for _ in workers]
        for w in workers:
            w.join(_CLOSE_TIMEOUT_S)
            assert w.exitcode == 0
        closed = next(g for g in got if "closed_ok" in g)
        assert closed["closed_ok"] is True and closed["close_s"] < _PROMPT_S, got
        assert (closed["accepted"], closed["sent"], closed["dropped"]) == (10, 10, 0), got
        r.step(1, 0.5)  # the parent goes on
    finally:
        assert r.close(15)
        _FORKED = None
    assert (r.accepted, r.sent, r.dropped) == (2, 2, 0)  # the children's steps are theirs
    # Every step arrives: the parent's, the forked child's, both workers' (the one that did not
    # close delivered as its process exited).
    want = {0, 1, *range(100, 110), *range(200, 210), *range(300, 310)}
    msgs = _read_steps_until(kafka_bootstrap, since, job, want)
    assert {m["step"] for m in msgs} == want
    assert {(m["job"], m["rank"], m["node"]) for m in msgs} == {(job, 0, "n1")}
