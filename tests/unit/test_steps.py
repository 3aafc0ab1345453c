"""fleetwatch.steps: the StepReporter that training code calls once per step (issue 16, part 2).

These tests run against an unreachable broker (nothing listens on port 1), so the sender thread
never takes a record out of the buffer; tests against the real broker, which read every message
back and decode it with the readers' own validation, are in tests/integration/test_steps.py.
"""

from __future__ import annotations

import fractions
import json
import logging
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Iterator
from typing import Any

import numpy as np
import orjson
import pytest

from fleetwatch import schemas, steps
from fleetwatch.steps import StepReporter, resolve_identity
from tests.helpers.paths import REPO
from tests.helpers.steps import EXIT_SCRIPT, new_job

DEAD = "127.0.0.1:1"  # connection refused at once: a broker that is down


@pytest.fixture
def dead_reporter() -> Iterator[Any]:
    made: list[StepReporter] = []

    def make(**kw: Any) -> StepReporter:
        kw.setdefault("job", new_job())
        kw.setdefault("rank", 0)
        kw.setdefault("node", "n1")
        # One short bootstrap attempt: the tests that wait for the thread to finish wait less.
        r = StepReporter(DEAD, connect_timeout_s=0.2, **kw)
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
    got = [(s, t, w) for s, t, _, w, _ in _buffered(r)]
    assert got == [(1, 0.25, None), (2, 0.5, None), (3, 9.5, None), (4, 2.0, None), (6, 0.5, 0.125)]
    assert r.accepted == 5 and r.rejected == 0
    ts = [ts for _, _, ts, _, _ in _buffered(r)]  # wall-clock time of each call, for the message
    assert ts == sorted(ts) and time.time() - 5 < ts[0] and ts[-1] <= time.time()


def test_a_checkpoint_mark_travels_with_every_later_step_report(dead_reporter: Any) -> None:
    r = dead_reporter()
    r.step(1, 0.5)
    r.checkpoint(write_time_s=2.5)  # of the last step reported
    r.step(2, 0.5)
    r.step(3, 0.5)
    r.checkpoint(3)
    r.checkpoint("bad")  # counted as a rejection, never raised; the mark before it stands
    r.step(4, 0.5)
    msgs = [orjson.loads(r._encode(rec)) for rec in _buffered(r)]
    for m in msgs:
        schemas.validate_step(m)
    marks = [(m["step"], m.get("checkpoint_step"), m.get("checkpoint_write_s")) for m in msgs]
    # every report after a save carries it (one lost to an outage loses no mark)
    assert marks == [(1, None, None), (2, 1, 2.5), (3, 1, 2.5), (4, 3, None)]
    assert msgs[1]["checkpoint_ts"] <= msgs[1]["ts"]
    assert r.rejected == 1


def test_hostile_checkpoint_marks_are_refused_and_the_last_good_one_stands(dead_reporter: Any) -> None:
    r = dead_reporter()
    r.step(1, 0.5)
    r.checkpoint(1, write_time_s=2.0)
    hostile = [
        ((-1,), {}), ((2**63,), {}), ((True,), {}), ((1.5,), {}), ((b"3",), {}), (("3",), {}),
        ((2,), {"write_time_s": float("nan")}), ((2,), {"write_time_s": float("inf")}),
        ((2,), {"write_time_s": -1.0}), ((2,), {"write_time_s": "2.5"}), ((2,), {"write_time_s": object()}),
    ]  # fmt: skip
    for args, kw in hostile:
        r.checkpoint(*args, **kw)  # never raises
    r.step(2, 0.5)
    assert r.rejected == len(hostile)
    last = orjson.loads(r._encode(_buffered(r)[-1]))
    schemas.validate_step(last)
    assert (last["checkpoint_step"], last["checkpoint_write_s"]) == (1, 2.0)


def test_numbers_of_other_types_are_converted(dead_reporter: Any) -> None:
    r = dead_reporter()
    r.step(np.int64(3), np.float32(0.5))
    r.step(4, 2)  # an int time
    r.step(5, fractions.Fraction(1, 4), wait_time_s=np.float64(0.0))
    got = [(s, t, w) for s, t, _, w, _ in _buffered(r)]
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


# ---------------------------------------------------------------- after os.fork()


def _in_child(body: Any) -> dict[str, Any]:
    """Run body() in a forked child (which never returns into pytest) and return what it returns."""
    import os
    import select
    import signal

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(read)
            os.write(write, json.dumps(body()).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as f:
        # a child stuck (in close(), say) fails the test instead of hanging it
        if not select.select([f], [], [], 60)[0]:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise AssertionError("the forked child did not finish within 60 s")
        out = json.loads(f.read() or "{}")
    _pid, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, out
    return out


def test_a_forked_child_that_never_reports_starts_nothing_and_closes_at_once(dead_reporter: Any) -> None:
    """A DataLoader worker forked from a rank that reports: no sender thread, no connection, and
    close() (or exit) has nothing to wait for; the parent's buffered steps are not the child's."""
    r = dead_reporter(close_timeout_s=600)
    r.step(0, 0.1)
    r.step(1, 0.1)

    def child() -> dict[str, Any]:
        import threading

        senders = [t.name for t in threading.enumerate() if t.name.startswith("fleetwatch-steps")]
        return {"senders": senders, "closed": r.close(), "is_closed": r.closed, **r.stats()}

    out = _in_child(child)
    assert out["senders"] == [] and out["closed"] is True and out["is_closed"] is True
    assert (out["accepted"], out["sent"], out["dropped"], out["pending"]) == (0, 0, 0, 0)
    assert r.accepted == 2 and r.pending == 2 and not r.closed  # the parent's, untouched


def test_a_forked_childs_steps_go_to_a_sender_of_its_own_and_are_counted(dead_reporter: Any) -> None:
    """With the broker down the child's steps wait in its own sender's buffer, and closing counts
    them as dropped: never accepted into a queue nobody reads (dropped 0, nothing logged)."""
    r = dead_reporter(close_timeout_s=600)
    r.step(0, 0.1)

    def child() -> dict[str, Any]:
        import threading

        for i in range(10, 15):
            r.step(i, 0.1)
        senders = [t.name for t in threading.enumerate() if t.name.startswith("fleetwatch-steps")]
        before = r.stats()
        closed = r.close(0.2)
        deadline = time.monotonic() + 30  # the sender may still be in a connection attempt
        while not r.closed and time.monotonic() < deadline:
            time.sleep(0.01)
        return {"senders": senders, "before": before, "closed": closed, "after": r.stats()}

    out = _in_child(child)
    assert len(out["senders"]) == 1
    assert out["before"]["accepted"] == 5 and out["before"]["pending"] == 5
    assert out["closed"] is False
    assert (out["after"]["accepted"], out["after"]["dropped"], out["after"]["pending"]) == (5, 5, 0)
    assert r.accepted == 1 and not r.closed


def test_a_reporter_closed_before_the_fork_stays_closed_in_the_child(dead_reporter: Any) -> None:
    r = dead_reporter()
    r.close(0)

    def child() -> dict[str, Any]:
        r.step(1, 0.1)
        return {"closed": r.closed, **r.stats()}

    out = _in_child(child)
    assert out["closed"] is True and (out["accepted"], out["dropped"], out["pending"]) == (1, 1, 0)
