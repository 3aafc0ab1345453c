"""What users control and Slurm says oddly, through the slurm-jobs publisher (an adversarial probe's
finds): a job's name past UTF-8, a working directory that writes lines into the jobcomp log, a
record too large to publish, runs older than the consumers' window, states 22.05 names by a flag,
a start that moves when nodes power up, host lists that expand past any bound, a log that cannot be
read or is rotated mid-line. Each case states what must hold; each failed before its fix."""

from __future__ import annotations

import json
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from fleetwatch import schemas
from fleetwatch.bus import Delivery, RecordTooLarge, SendError
from fleetwatch.bus.memory import MemoryBus, MemoryProducer
from fleetwatch.collectors.slurm_jobs import squeue
from fleetwatch.collectors.slurm_jobs.jobcomp import JobcompLog
from fleetwatch.collectors.slurm_jobs.ledger import Ledger
from fleetwatch.collectors.slurm_jobs.model import SlurmJob, SlurmParseError, expand_nodes
from fleetwatch.collectors.slurm_jobs.publisher import DROPPED, Publisher
from tests.helpers import paths

FIXTURES = paths.FIXTURES / "slurm"
REAL_LINE = (FIXTURES / "jobcomp-22.05.log").read_text().splitlines()[1]  # job 4, FAILED, gpu-node-03


def _sj(job: str, state: str, start: float, end: float | None = None, **kw: Any) -> SlurmJob:
    return SlurmJob(
        job=job,
        state=state,
        nodes=kw.pop("nodes", ("gpu-node-01", "gpu-node-02")),
        gpus=None,
        start_ts=start,
        end_ts=end,
        exit_code=None,
        signal=None,
        **kw,
    )


def _publish(ledger: Ledger, msgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for m in msgs:
        schemas.validate_job(m)
        ledger.apply(m)
    return msgs


def _on_topic(bus: MemoryBus, job: str) -> list[dict[str, Any]]:
    """The job's records on the jobs topic, in order (one key: one partition)."""
    return [json.loads(r.value) for r in bus.records("fleet.jobs.v1") if r.key == job.encode() and r.value]


def _states(msgs: list[dict[str, Any]], job: str) -> list[tuple[str, str | None]]:
    return [(m["state"], m.get("end_state")) for m in msgs if m["job"] == job]


def _job_json(name: str, job_id: int = 12) -> bytes:
    job = {
        "job_id": job_id,
        "job_state": "RUNNING",
        "nodes": "gpu-node-01",
        "start_time": 1_796_390_745,
        "name": "NAME",
    }
    return (
        json.dumps({"jobs": [job, {**job, "job_id": job_id + 1, "name": "ok"}]})
        .encode()
        .replace(b"NAME", name.encode("latin-1"))
    )


def test_a_job_name_past_utf8_spoils_only_its_own_string() -> None:
    # json-c passes a name's bytes through: the whole answer had been refused at every poll
    jobs, errors = squeue.parse(_job_json("\xff\xfe"))
    assert [j.job for j in jobs] == ["12", "13"] and errors == []


def _forged_log(tmp_path: Path, forged: str) -> JobcompLog:
    """A real line whose working directory holds a line break and `forged` text, as slurmctld
    writes it (unescaped)."""
    line = REAL_LINE.replace("WorkDir=/tmp", "WorkDir=/tmp/a\n" + forged + "\nx")
    path = tmp_path / "jobcomp.log"
    path.write_text(line + "\n")
    log = JobcompLog(str(path))
    log.refresh()
    return log


FORGED_777 = REAL_LINE.replace("JobId=4 ", "JobId=777 ").replace("JobState=FAILED", "JobState=NODE_FAIL")
FORGED_777 = FORGED_777.replace("NodeList=gpu-node-03", "NodeList=victim-[01-16]")


def test_lines_a_user_writes_into_the_jobcomp_log_fail_no_job(tmp_path: Path) -> None:
    log = _forged_log(tmp_path, FORGED_777)
    assert "777" in log.ends  # the forged line parses: nothing in the text tells it apart
    msgs = Ledger().catch_up(log, pending=set())
    # a job only the log knows is published with its nodes and times, never as failed
    assert _states(msgs, "777") == [("started", None), ("finished", "UNKNOWN")]
    assert all(m["state"] != "failed" for m in msgs)


def test_a_second_line_for_a_run_the_publisher_saw_makes_its_logged_end_unknown(tmp_path: Path) -> None:
    start = time.mktime(time.strptime("2026-12-04T13:28:51", "%Y-%m-%dT%H:%M:%S"))
    ledger = Ledger()
    _publish(ledger, ledger.observe([_sj("4", "RUNNING", start, nodes=("gpu-node-03",))]))
    # the job's own directory writes a second line for itself, NODE_FAIL: its real line says FAILED
    log = _forged_log(tmp_path, REAL_LINE.replace("JobState=FAILED", "JobState=NODE_FAIL"))
    ends = ledger.vanished(seen=set(), jobcomp=log, now=start + 600)
    assert _states(ends, "4") == [("finished", "UNKNOWN")]
    # alone, the line names the run as squeue showed it: taken; on other nodes: not
    clean = tmp_path / "clean.log"
    clean.write_text(REAL_LINE + "\n")
    log = JobcompLog(str(clean))
    log.refresh()
    assert log.end_of("4", start, ("gpu-node-03",)) is not None
    assert log.end_of("4", start, ("gpu-node-04",)) is None


class _SizeLimitedProducer(MemoryProducer):
    """The real client's refusal of a record past message.max.bytes (RecordTooLarge, raised by
    send()), on the in-memory bus."""

    def __init__(self, bus: MemoryBus, limit: int) -> None:
        super().__init__(bus)
        self.limit = limit

    def send(self, topic: str, key: bytes | None = None, value: bytes | None = None, **kw: Any) -> Delivery:
        if value is not None and len(value) > self.limit:
            raise RecordTooLarge(f"{len(value)} bytes")
        return super().send(topic, key, value, **kw)


def test_a_record_too_large_to_publish_holds_back_none_behind_it() -> None:
    bus = MemoryBus()
    ledger = Ledger()
    publisher = Publisher(_SizeLimitedProducer(bus, limit=2_000), ledger, None)
    big = tuple(f"gpu-a100-sxm4-80gb-rack{i:05d}" for i in range(200))
    now = 1_796_390_800.0
    before = DROPPED.labels("too_large")._value.get()
    jobs = [
        _sj("1", "RUNNING", now - 60),
        _sj("2", "RUNNING", now - 60, nodes=big),
        _sj("3", "RUNNING", now - 60),
    ]
    answer = json.dumps({"jobs": []}).encode()
    publisher.parse = lambda _answer: (jobs, [])  # type: ignore[method-assign]
    assert publisher.once(answer, now) == 2
    assert {r.key for r in bus.records("fleet.jobs.v1")} == {b"1", b"3"}
    assert DROPPED.labels("too_large")._value.get() == before + 1
    # settled: not produced again at the next poll (it had been, for ever, with job 3 never sent)
    assert publisher.once(answer, now + 2) == 0 and set(ledger.running()) == {"1", "2", "3"}


def test_runs_older_than_the_consumers_window_are_published_inside_it() -> None:
    bus = MemoryBus()
    ledger = Ledger()
    publisher = Publisher(bus.producer(), ledger, None, max_behind_s=86_400.0)
    now = 1_796_390_800.0
    two_days = now - 2 * 86_400
    publisher.parse = lambda _a: ([_sj("5", "RUNNING", two_days)], [])  # type: ignore[method-assign]
    assert publisher.once(b"", now) == 1  # a job running for days when the publisher started
    (start,) = _on_topic(bus, "5")
    assert start["state"] == "started" and start["start_ts"] == two_days and start["ts"] >= now - 86_400
    # Slurm then forgets it (no jobcomp): its end, UNKNOWN, is dated when it was found gone
    publisher.parse = lambda _a: ([], [])  # type: ignore[method-assign]
    assert publisher.once(b"", now + 30) == 1
    end = _on_topic(bus, "5")[-1]
    assert (end["state"], end["end_state"], end["ts"]) == ("finished", "UNKNOWN", now + 30)
    assert ledger.running() == []


def test_an_end_slurm_dates_in_the_future_is_dated_now() -> None:
    assert squeue._time(0xFFFFFFFF, "") is None and squeue._time(0xFFFFFFFE, "") is None
    bus = MemoryBus()
    publisher = Publisher(bus.producer(), Ledger(), None)
    now = 1_796_390_800.0
    publisher.parse = lambda _a: ([_sj("6", "COMPLETED", now - 10, end=now + 10**6)], [])  # type: ignore[method-assign]
    publisher.once(b"", now)
    assert [m["ts"] for m in _on_topic(bus, "6")] == [now - 10, now]


def test_a_job_22_05_names_by_a_flag_still_holds_its_nodes() -> None:
    ledger = Ledger()
    _publish(ledger, ledger.observe([_sj("7", "RUNNING", 1000.0)]))
    for state in ("STOPPED", "RESIZING", "POWER_UP_NODE", "UPDATE_DB"):  # scancel --signal=STOP: STOPPED
        assert ledger.observe([_sj("7", state, 1000.0)]) == [], state
    assert ledger.observe([_sj("7", "RUNNING", 1000.0)]) == [] and ledger.running() == ["7"]


def test_a_start_that_moves_when_nodes_power_up_is_the_same_run() -> None:
    ledger = Ledger()
    first = _publish(ledger, ledger.observe([_sj("8", "CONFIGURING", 1000.0)]))
    assert _states(first, "8") == [("started", None)]
    assert ledger.observe([_sj("8", "RUNNING", 1090.0)]) == []  # restart_cnt unchanged
    end = ledger.observe([_sj("8", "COMPLETED", 1090.0, end=2000.0)])
    assert _states(end, "8") == [("finished", "COMPLETED")] and end[0]["start_ts"] == 1000.0
    # a requeue counts in restart_cnt: that is a new run
    _publish(ledger, ledger.observe([_sj("9", "RUNNING", 1000.0)]))
    again = ledger.observe([_sj("9", "RUNNING", 1100.0, restarts=1)])
    assert _states(again, "9") == [("finished", "UNKNOWN"), ("started", None)]


def test_a_topic_record_of_state_running_is_a_running_job() -> None:
    ledger = Ledger()
    msg = {"schema": "job/1", "job": "10", "nodes": ["n1"], "state": "running", "ts": 5.0, "source": "slurm"}
    ledger.load("10", msg)
    assert ledger.running() == ["10"]
    assert _states(ledger.vanished(seen=set(), jobcomp=None, now=50.0), "10") == [("finished", "UNKNOWN")]


@pytest.mark.parametrize(
    "text",
    [
        "n[" + "9" * 5000 + "-" + "9" * 5000 + "]",  # past int()'s digit limit: a ValueError
        ",".join(f"g{i}x[0-99999]" for i in range(40)),  # 549 characters, 4 million names
    ],
)
def test_a_host_list_is_refused_before_it_expands_past_the_bound(text: str) -> None:
    tracemalloc.start()
    try:
        with pytest.raises(SlurmParseError):
            expand_nodes(text, text)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20, peak  # one group at most (it was 530 MiB for the 40 groups)


def test_a_host_list_listing_a_name_twice_counts_it_once_in_its_first_place() -> None:
    assert expand_nodes("b2,a[1-2],a1", "") == ("b2", "a1", "a2")


def test_a_jobcomp_log_that_cannot_be_read_is_reported_and_read_once_it_can(tmp_path: Path) -> None:
    path = tmp_path / "jobcomp.log"
    path.mkdir()  # (a rotation that left something unreadable in its place)
    log = JobcompLog(str(path))
    errors = log.refresh()
    assert len(errors) == 1 and "cannot read" in str(errors[0])
    path.rmdir()
    path.write_text(REAL_LINE + "\n")
    assert log.refresh() == [] and "4" in log.ends


def test_lines_appended_to_a_rotated_log_before_it_moved_are_read(tmp_path: Path) -> None:
    lines = (FIXTURES / "jobcomp-22.05.log").read_text().splitlines(keepends=True)
    path = tmp_path / "jobcomp.log"
    path.write_text(lines[0])
    log = JobcompLog(str(path))
    log.refresh()
    with path.open("a") as f:
        f.write(lines[1])  # job 4's end, appended just before the rotation
    path.rename(tmp_path / "jobcomp.log.1")
    path.write_text(lines[2])
    assert log.refresh() == []
    assert {"2", "4", "3"} <= set(log.ends)


def test_a_line_that_never_ends_is_refused_not_kept_growing(tmp_path: Path) -> None:
    path = tmp_path / "jobcomp.log"
    path.write_bytes(b"x" * (5 << 20))  # more than a read and more than a line may be
    log = JobcompLog(str(path))
    errors = log.refresh()
    assert errors and all(e.what == "jobcomp" for e in errors) and len(log._partial) <= 1 << 16


# -- a review's finds in the fixes above ---------------------------------------------------------


def test_a_requeue_seen_completing_with_its_new_restart_count_is_a_new_run() -> None:
    # Slurm counts the requeue while the first run's epilog still runs (COMPLETING, old start): the
    # count a run started with decides, not the last one seen
    ledger = Ledger()
    _publish(ledger, ledger.observe([_sj("7", "RUNNING", 1000.0, nodes=("n1",))]))
    assert ledger.observe([_sj("7", "COMPLETING", 1000.0, nodes=("n1",), restarts=1)]) == []
    again = ledger.observe([_sj("7", "RUNNING", 1500.0, nodes=("n9",), restarts=1)])
    assert _states(again, "7") == [("finished", "UNKNOWN"), ("started", None)]
    assert again[1]["nodes"] == ["n9"] and again[1]["start_ts"] == 1500.0


def _log_of(tmp_path: Path, *lines: str) -> JobcompLog:
    path = tmp_path / "jobcomp.log"
    path.write_text("".join(line + "\n" for line in lines))
    log = JobcompLog(str(path))
    log.refresh()
    return log


def test_a_whole_jobcomp_line_of_a_state_that_is_no_end_cuts_nothing(tmp_path: Path) -> None:
    start = time.mktime(time.strptime("2026-12-04T13:28:51", "%Y-%m-%dT%H:%M:%S"))
    resizing = REAL_LINE.replace("JobState=FAILED", "JobState=RESIZING")
    log = _log_of(tmp_path, resizing, REAL_LINE)
    assert log.end_of("4", start, ("gpu-node-03",)) is not None


def test_the_logged_end_of_a_run_whose_start_slurm_moved_is_found(tmp_path: Path) -> None:
    first = time.mktime(time.strptime("2026-12-04T13:27:21", "%Y-%m-%dT%H:%M:%S"))
    moved = time.mktime(time.strptime("2026-12-04T13:28:51", "%Y-%m-%dT%H:%M:%S"))  # REAL_LINE's start
    ledger = Ledger()
    _publish(ledger, ledger.observe([_sj("4", "CONFIGURING", first, nodes=("gpu-node-03",))]))
    assert ledger.observe([_sj("4", "RUNNING", moved, nodes=("gpu-node-03",))]) == []
    ends = ledger.vanished(seen=set(), jobcomp=_log_of(tmp_path, REAL_LINE), now=moved + 600)
    assert _states(ends, "4") == [("failed", "FAILED")] and ends[0]["start_ts"] == first


def test_a_runs_own_line_too_old_to_publish_still_makes_a_second_one_ambiguous(tmp_path: Path) -> None:
    start = time.mktime(time.strptime("2026-12-04T13:28:51", "%Y-%m-%dT%H:%M:%S"))
    forged = REAL_LINE.replace("JobState=FAILED", "JobState=NODE_FAIL").replace(
        "EndTime=2026-12-04T13:28:56", "EndTime=2026-12-05T13:28:56"
    )
    path = tmp_path / "jobcomp.log"
    path.write_text(REAL_LINE + "\n" + forged + "\n")
    log = JobcompLog(str(path), since=start + 3600)  # the real end is older than what is kept
    log.refresh()
    assert log.end_of("4", start, ("gpu-node-03",)) is None


class _RefusingProducer(MemoryProducer):
    """Refuses the first record of one job (a client error other than its size)."""

    def __init__(self, bus: MemoryBus, job: bytes) -> None:
        super().__init__(bus)
        self.job = job

    def send(self, topic: str, key: bytes | None = None, value: bytes | None = None, **kw: Any) -> Delivery:
        if key == self.job:
            self.job = b""
            raise SendError("queue full")
        return super().send(topic, key, value, **kw)


def test_a_refused_start_holds_back_its_jobs_end_in_the_same_round() -> None:
    bus = MemoryBus()
    ledger = Ledger()
    publisher = Publisher(_RefusingProducer(bus, b"9"), ledger, None)
    now = 1_796_390_800.0
    publisher.parse = lambda _a: ([_sj("9", "COMPLETED", now - 60, end=now - 5)], [])  # type: ignore[method-assign]
    assert publisher.once(b"", now) == 0  # its start refused: its end not sent alone
    assert publisher.once(b"", now + 2) == 2
    assert [m["state"] for m in _on_topic(bus, "9")] == ["started", "finished"]


def test_many_lines_for_one_job_id_are_read_in_linear_time_and_each_run_found(tmp_path: Path) -> None:
    """20,000 whole lines for one job id, each a run of its own (starts 2 s apart): a user's text can
    write such lines, and each one read was compared with every run kept for the id (24 s for these;
    a hung test here is that regression). Each run's end is found by its start, within Slurm's
    second; a second, different line for one run still makes it ambiguous; forgetting keeps the rest
    findable."""
    stamp = "%Y-%m-%dT%H:%M:%S"
    first = time.mktime(time.strptime("2026-12-04T13:28:51", stamp))

    def line(k: int, state: str = "FAILED") -> str:
        start, end = (time.strftime(stamp, time.localtime(first + 2 * k + d)) for d in (0, 5))
        return (
            REAL_LINE.replace("StartTime=2026-12-04T13:28:51", "StartTime=" + start)
            .replace("EndTime=2026-12-04T13:28:56", "EndTime=" + end)
            .replace("JobState=FAILED", "JobState=" + state)
        )  # fmt: skip

    n = 20_000
    log = _log_of(tmp_path, *(line(k) for k in range(n)), line(100, "NODE_FAIL"))
    assert len(log.ends["4"]) == n and log.bad_lines == 0
    for k in (0, 1, 99, 101, n - 1):
        found = log.end_of("4", first + 2 * k + 0.5, ("gpu-node-03",))  # squeue's start, within the second
        assert found is not None and found.start_ts == first + 2 * k
    assert log.end_of("4", first + 200, ("gpu-node-03",)) is None  # run 100: two different lines
    assert (
        log.end_of("4", first + 1, ("gpu-node-03",)) is None
    )  # between runs 0 and 1: within a second of both
    log.forget_before(first + 2 * (n - 10) + 5)  # the last ten ends stay
    assert len(log.ends["4"]) == 10
    assert log.end_of("4", first + 2 * (n - 1), ("gpu-node-03",)) is not None
    assert log.end_of("4", first + 2 * (n - 11), ("gpu-node-03",)) is None
