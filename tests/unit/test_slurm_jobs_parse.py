"""The slurm-jobs publisher's parsing and ledger, without services: squeue --json answers captured
from the local Slurm 22.05 (tests/fixtures/slurm), the newer data parser's field shapes, jobcomp
lines as 22.05 writes them, and hostile answers that must be refused whole or job by job, never
half-published. Host lists checked against Slurm's own `scontrol show hostnames`:
tests/integration/test_slurm_jobs_parse.py."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from fleetwatch import schemas
from fleetwatch.collectors.slurm_jobs import jobcomp, squeue
from fleetwatch.collectors.slurm_jobs.jobcomp import JobcompLog
from fleetwatch.collectors.slurm_jobs.ledger import Ledger
from fleetwatch.collectors.slurm_jobs.model import SlurmJob, SlurmParseError, expand_nodes
from tests.helpers import paths

FIXTURES = paths.FIXTURES / "slurm"


def _job(msgs: list[dict[str, Any]], job: str) -> list[tuple[str, str | None]]:
    return [(m["state"], m.get("end_state")) for m in msgs if m["job"] == job]


def _valid(msg: dict[str, Any]) -> dict[str, Any]:
    """Every message the ledger makes passes the one decoder every consumer uses."""
    return schemas.decode(json.dumps(msg).encode(), schemas.JOB, key=msg["job"].encode())


# -- squeue --json -----------------------------------------------------------------------------


def test_a_real_22_05_answer_gives_each_jobs_state_nodes_gpus_and_exit() -> None:
    jobs, errors = squeue.parse((FIXTURES / "squeue-22.05-mixed.json").read_bytes())
    assert errors == []
    by_id = {j.job: j for j in jobs}
    two_node = by_id["5"]  # sbatch -N 2 --gres=gpu:4, running
    assert (two_node.state, two_node.nodes, two_node.gpus) == (
        "RUNNING",
        ("gpu-node-01", "gpu-node-02"),
        (4, 4),
    )
    assert two_node.end_ts is None and two_node.exit_code is None
    assert by_id["6"].gpus == (2,)  # shares gpu-node-01 with job 5
    assert by_id["4"].state == "FAILED" and by_id["4"].exit_code == 3  # `exit 3`: wait status 768
    assert by_id["2"].state == "COMPLETED" and by_id["2"].exit_code == 0
    assert by_id["8"].state == "CANCELLED" and not by_id["8"].ran  # cancelled while pending
    assert by_id["10"].gpus is None  # asked for no GPU: Slurm does not say
    assert by_id["9"].gpus == (8,)


def _newer_job(**over: Any) -> dict[str, Any]:
    """A job as the data parser of Slurm 23.02+ (OpenAPI v0.0.39 on) writes it."""
    job = {
        "job_id": 481516,
        "job_state": ["NODE_FAIL"],
        "nodes": "gpu-node[014-015]",
        "start_time": {"set": True, "infinite": False, "number": 1796390745},
        "end_time": {"set": True, "infinite": False, "number": 1796394345},
        "exit_code": {
            "status": ["SIGNALED"],
            "return_code": {"set": True, "infinite": False, "number": 0},
            "signal": {"id": {"set": True, "infinite": False, "number": 9}, "name": "KILL"},
        },
        "restart_cnt": {"set": True, "infinite": False, "number": 1},
        "gres_detail": ["gpu:h100:8(IDX:0-7)", "gpu:h100:8(IDX:0-7)"],
        "job_resources": {
            "nodes": {
                "count": 2,
                "list": "gpu-node[014-015]",
                "allocation": [{"name": "gpu-node014"}, {"name": "gpu-node015"}],
            }
        },
    }
    job.update(over)
    return job


def test_newer_slurms_field_shapes_parse_to_the_same_job() -> None:
    job = squeue.parse_job(_newer_job())
    assert job == SlurmJob(
        job="481516",
        state="NODE_FAIL",
        nodes=("gpu-node014", "gpu-node015"),
        gpus=(8, 8),
        start_ts=1796390745.0,
        end_ts=1796394345.0,
        exit_code=0,
        signal=9,
        restarts=1,
    )
    # a running job with its completing flag is still on its nodes
    assert squeue.parse_job(_newer_job(job_state=["RUNNING", "COMPLETING"])).state == "COMPLETING"
    assert squeue.parse_job(_newer_job(job_state=["PENDING", "REQUEUED"])).state == "PENDING"
    unset_end = {"set": False, "infinite": False, "number": 0}
    assert squeue.parse_job(_newer_job(job_state=["RUNNING"], end_time=unset_end)).end_ts is None


def test_a_22_05_wait_status_gives_the_signal_that_killed_the_script() -> None:
    entry = json.loads((FIXTURES / "squeue-22.05-mixed.json").read_text())["jobs"][3]
    entry["exit_code"] = 9  # WIFSIGNALED, SIGKILL
    job = squeue.parse_job(entry)
    assert (job.exit_code, job.signal) == (None, 9)


def test_gpus_follow_their_nodes_where_slurm_conf_does_not_list_them_sorted() -> None:
    # job 5 with slurm.conf listing gpu-node-02 first: gres_detail and the allocated nodes come in
    # that order, the host list sorted; the counts were taken in the host list's order (swapped)
    entry = json.loads((FIXTURES / "squeue-22.05-mixed.json").read_text())["jobs"][4]
    alloc = entry["job_resources"]["allocated_nodes"]
    entry["job_resources"]["allocated_nodes"] = [alloc[1], alloc[0]]
    entry["gres_detail"] = ["gpu:8(IDX:0-7)", "gpu:4(IDX:0-3)"]  # gpu-node-02's, then gpu-node-01's
    job = squeue.parse_job(entry)
    assert job.nodes == ("gpu-node-01", "gpu-node-02") and job.gpus == (4, 8)
    entry["job_resources"]["allocated_nodes"] = [{"nodename": None}, alloc[0]]  # not its nodes
    with pytest.raises(SlurmParseError, match="allocation"):
        squeue.parse_job(entry)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("gpu-node-[01-", "unbalanced"),
        ("n[1-200000]", "too large"),
        ("gpu node 01", "not a valid name"),
        ("gpu/node[1-3]", "not a valid name"),
        ("x" * 70_000, "characters"),
    ],
)
def test_a_bad_host_list_is_refused_with_its_text(text: str, why: str) -> None:
    with pytest.raises(SlurmParseError, match=why) as e:
        expand_nodes(text, f"raw: {text}")
    assert e.value.what == "nodelist" and e.value.raw.startswith("raw: ")


def test_one_bad_job_is_reported_with_its_text_and_the_others_are_taken() -> None:
    doc = json.loads((FIXTURES / "squeue-22.05-mixed.json").read_text())
    doc["jobs"][4]["nodes"] = "gpu-node-[01-"  # job 5
    doc["jobs"][5]["job_state"] = {"oops": 1}  # job 6
    doc["jobs"][6]["gres_detail"] = ["gpu:999(IDX:0-998)"]  # job 7: more GPUs than a node has
    doc["jobs"].append("not a job")
    jobs, errors = squeue.parse(json.dumps(doc).encode())
    assert {j.job for j in jobs} == {"1", "2", "3", "4", "8", "9", "10"}
    assert [e.job for e in errors] == ["5", "6", "7", None]
    assert all(e.raw for e in errors)
    assert "gpu-node-[01-" in errors[0].raw


@pytest.mark.parametrize(
    "answer",
    [
        b"squeue: error: Unable to contact slurm controller",
        b'{"jobs": "no"}',
        b'{"errors": [{"error": "Invalid user"}], "jobs": []}',
        b"[" * 100_000,
        b'{"jobs": [' + b"{}," * 3 + b"{}",  # cut short
    ],
)
def test_an_answer_that_is_not_a_squeue_document_is_refused_whole(answer: bytes) -> None:
    with pytest.raises(SlurmParseError) as e:
        squeue.parse(answer)
    assert e.value.what == "squeue"


def test_hostile_job_fields_are_refused_not_published() -> None:
    base = _newer_job()
    for bad in (
        {"job_id": -1},
        {"job_id": True},
        {"job_id": "481516"},
        {"job_id": 2**40},
        {"job_state": ["running"]},
        {"job_state": "RUNNING; rm -rf"},
        {"start_time": "yesterday"},
        {"nodes": ["gpu-node014"]},
        {"job_resources": {"allocated_nodes": [{"nodename": "elsewhere"}]}},
    ):
        with pytest.raises(SlurmParseError):
            squeue.parse_job({**base, **bad})


# -- jobcomp/filetxt --------------------------------------------------------------------------


def test_real_jobcomp_lines_parse() -> None:
    lines = (FIXTURES / "jobcomp-22.05.log").read_text().splitlines()
    jobs = {j.job: j for j in map(jobcomp.parse_line, lines)}
    assert jobs["4"].state == "FAILED" and jobs["4"].exit_code == 3 and jobs["4"].nodes == ("gpu-node-03",)
    assert jobs["2"].nodes == ("gpu-node-01", "gpu-node-02") and jobs["2"].state == "COMPLETED"
    assert jobs["2"].end_ts - jobs["2"].start_ts == 5.0
    assert not jobs["8"].ran  # cancelled before it started: NodeList=(null)
    assert jobs["4"].end_ts == time.mktime(time.strptime("2026-12-04T13:28:56", "%Y-%m-%dT%H:%M:%S"))


def test_a_jobcomp_line_whose_name_or_workdir_imitates_fields_is_refused_or_read_right() -> None:
    line = (FIXTURES / "jobcomp-22.05.log").read_text().splitlines()[1]  # job 4, FAILED, exit 3
    forged = (
        " JobState=COMPLETED Partition=gpu TimeLimit=1 StartTime=x EndTime=y NodeList=n1 NodeCnt=1"
        " ProcCnt=1 WorkDir="
    )
    with pytest.raises(SlurmParseError, match="ambiguous"):
        jobcomp.parse_line(line.replace("Name=wrap", "Name=wrap" + forged))
    # a work directory with spaces and a fake exit code inside: the line's own end wins
    job = jobcomp.parse_line(line.replace("WorkDir=/tmp", "WorkDir=/tmp/a b ExitCode=0:0 c"))
    assert (job.state, job.exit_code) == ("FAILED", 3)
    for bad in (line[:80], line.replace("JobState=FAILED", "JobState=RUNNING"), "x" * 70_000):
        with pytest.raises(SlurmParseError):
            jobcomp.parse_line(bad)


def test_the_jobcomp_log_is_read_incrementally_and_again_after_rotation(tmp_path: Path) -> None:
    lines = (FIXTURES / "jobcomp-22.05.log").read_text().splitlines(keepends=True)
    path = tmp_path / "jobcomp.log"
    path.write_text(lines[0] + lines[1][:40])  # the second line is still being written
    log = JobcompLog(str(path))
    assert log.refresh() == [] and set(log.ends) == {"2"}
    with path.open("a") as f:
        f.write(lines[1][40:] + "garbage line\n")
    errors = log.refresh()
    assert set(log.ends) == {"2", "4"} and len(errors) == 1 and errors[0].raw == "garbage line"
    path.unlink()
    path.write_text(lines[2])  # rotated: a new file
    log.refresh()
    assert "3" in log.ends
    log.forget_before(log.ends["3"][0].end_ts + 1)
    assert "3" not in log.ends


# -- the ledger --------------------------------------------------------------------------------


def _sj(job: str, state: str, start: float = 1000.0, end: float | None = None, **kw: Any) -> SlurmJob:
    nodes = kw.pop("nodes", ("gpu-node-01", "gpu-node-02"))
    return SlurmJob(
        job=job,
        state=state,
        nodes=nodes,
        gpus=kw.pop("gpus", (4, 4) if state == "RUNNING" else None),
        start_ts=start,
        end_ts=end,
        exit_code=kw.pop("exit_code", None),
        signal=None,
        **kw,
    )


def _publish(ledger: Ledger, msgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for m in msgs:
        ledger.apply(_valid(m))
    return msgs


def test_each_start_and_end_is_published_once_with_the_start_s_gpus() -> None:
    ledger = Ledger()
    first = _publish(ledger, ledger.observe([_sj("7", "RUNNING"), _sj("8", "PENDING", start=0)]))
    assert _job(first, "7") == [("started", None)] and _job(first, "8") == []
    assert first[0]["gpus"] == [4, 4] and first[0]["ts"] == 1000.0
    assert ledger.observe([_sj("7", "RUNNING")]) == []
    end = _publish(ledger, ledger.observe([_sj("7", "NODE_FAIL", end=1500.0, exit_code=0)]))
    assert _job(end, "7") == [("failed", "NODE_FAIL")]
    assert end[0]["gpus"] == [4, 4] and end[0]["ts"] == 1500.0 and end[0]["start_ts"] == 1000.0
    assert ledger.observe([_sj("7", "NODE_FAIL", end=1500.0)]) == []


def test_user_ends_are_finished_and_only_hardware_like_ends_are_failed() -> None:
    ledger = Ledger()
    states = {
        "COMPLETED": "finished",
        "CANCELLED": "finished",
        "TIMEOUT": "finished",
        "OUT_OF_MEMORY": "finished",
    }
    states |= {"FAILED": "failed", "NODE_FAIL": "failed", "BOOT_FAIL": "failed", "PREEMPTED": "finished"}
    jobs = [_sj(str(i), s, end=2000.0) for i, s in enumerate(states)]
    msgs = ledger.observe(jobs)
    for i, (slurm_state, ours) in enumerate(states.items()):
        assert _job(msgs, str(i)) == [("started", None), (ours, slurm_state)]  # seen ended: both


def test_a_restarted_publisher_rebuilt_from_the_topic_publishes_nothing_twice() -> None:
    ledger = Ledger()
    topic = _publish(ledger, ledger.observe([_sj("7", "RUNNING"), _sj("9", "COMPLETED", end=1200.0)]))
    reborn = Ledger()
    for m in topic:
        reborn.load(m["job"], m)
    assert reborn.observe([_sj("7", "RUNNING"), _sj("9", "COMPLETED", end=1200.0)]) == []
    reborn.load("9", None)  # tombstoned since
    assert reborn.entries.keys() == {"7"}


def test_a_job_slurm_forgot_ends_from_the_jobcomp_log_or_as_unknown(tmp_path: Path) -> None:
    ledger = Ledger()
    _publish(
        ledger,
        ledger.observe(
            [
                _sj(
                    "2",
                    "RUNNING",
                    start=time.mktime(time.strptime("2026-12-04T13:28:51", "%Y-%m-%dT%H:%M:%S")),
                )
            ]
        ),
    )
    _publish(ledger, ledger.observe([_sj("77", "RUNNING")]))
    log = JobcompLog(str(FIXTURES / "jobcomp-22.05.log"))
    log.refresh()
    # job 5 is listed but did not parse: it must not be taken for vanished (the publisher
    # passes every listed id), while 2 and 77 are no longer listed at all
    ends = ledger.vanished(seen={"5"}, jobcomp=log)
    assert _job(ends, "2") == [("finished", "COMPLETED")] and _job(ends, "77") == [("finished", "UNKNOWN")]
    assert all(_valid(m) for m in ends)


def test_a_requeued_job_ends_its_first_run_before_its_second_starts() -> None:
    ledger = Ledger()
    _publish(ledger, ledger.observe([_sj("7", "RUNNING", start=1000.0)]))
    waiting = ledger.observe([_sj("7", "PENDING", start=1000.0, restarts=1)])
    assert _job(waiting, "7") == [("finished", "UNKNOWN")]
    _publish(ledger, waiting)
    again = _publish(ledger, ledger.observe([_sj("7", "RUNNING", start=1100.0, restarts=1)]))
    assert _job(again, "7") == [("started", None)] and again[0]["start_ts"] == 1100.0
    # and when the second start is the first thing seen after the first run (Slurm counts the
    # requeue in restart_cnt): end, dated no later than the second start, then start
    fresh = Ledger()
    _publish(fresh, fresh.observe([_sj("7", "RUNNING", start=1000.0)]))
    msgs = fresh.observe([_sj("7", "RUNNING", start=1100.0, restarts=1)])
    assert _job(msgs, "7") == [("finished", "UNKNOWN"), ("started", None)]
    assert msgs[0]["ts"] == 1100.0 and msgs[0]["start_ts"] == 1000.0


def test_jobs_only_the_jobcomp_log_knows_are_caught_up_once() -> None:
    ledger = Ledger()
    log = JobcompLog(str(FIXTURES / "jobcomp-22.05.log"))
    log.refresh()
    msgs = _publish(ledger, ledger.catch_up(log, pending={"3"}))
    ran = {job for job, runs in log.ends.items() if any(r.ran for r in runs)}
    assert "8" not in ran and {"2", "3", "4"} <= ran  # 8 was cancelled before it started
    assert {m["job"] for m in msgs} == ran - {"3"}  # 3 was already computed this round
    # its nodes and times from the log, its end state not: a line is not bound to its job
    assert _job(msgs, "4") == [("started", None), ("finished", "UNKNOWN")]
    four = [m for m in msgs if m["job"] == "4"]
    assert four[0]["nodes"] == ["gpu-node-03"] and four[1]["ts"] > four[0]["ts"]
    assert {m["job"] for m in ledger.catch_up(log, pending=set())} == {"3"}  # the rest are published


def test_ended_jobs_are_tombstoned_after_the_history_window_running_ones_never() -> None:
    ledger = Ledger(history_s=3600.0)
    _publish(ledger, ledger.observe([_sj("1", "COMPLETED", end=1000.0), _sj("2", "RUNNING", start=10.0)]))
    assert list(ledger.expired(now=4000.0)) == []
    assert list(ledger.expired(now=4601.0)) == ["1"]
