"""`fleetwatch slurm-jobs` against the real Slurm (services/slurm/slurm.sh: slurmctld and four slurmd,
4 CPUs and 8 GPUs a node, jobs sharing nodes) and the real broker: real sbatch jobs' starts and ends
reach the topic with their nodes, GPUs and Slurm's end state, in seconds; a killed slurmd ends its
job NODE_FAIL and the lemon history counts it; a killed publisher or a restarted slurmctld loses no
start or end and invents none; a broker outage is waited out; an answer that does not parse is
logged with its text and counted while the loop goes on.

Each test has a topic of its own; the Slurm cluster is shared, so each looks only at its own jobs.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetwatch import schemas
from fleetwatch.bus.admin import ensure_topics
from fleetwatch.detectors.batch import TelemetryBatch
from fleetwatch.pipeline.job_table import JobTable
from fleetwatch.pipeline.node_stage import NodeTask
from tests.helpers.messages import gpu
from tests.helpers.paths import REPO
from tests.integration.act_rig import free_port
from tests.integration.services import SLURM_SH, USES_SLURM, Jobs, PrivateBroker, Slurm, TopicTail, send

pytestmark = USES_SLURM

START_WITHIN_S = 10.0  # issue 16: a job start is on the topic within 10 s of Slurm starting it


@pytest.fixture
def jobs(slurm: Slurm, kafka_bootstrap: str, tmp_path: Path) -> Iterator[Jobs]:
    j = Jobs(slurm, kafka_bootstrap, tmp_path)
    yield j
    j.stop()
    j.tail.close()


def _end(msgs: list[dict[str, Any]]) -> dict[str, Any]:
    ends = [m for m in msgs if m["state"] in ("finished", "failed")]
    assert ends, msgs
    assert all(e == ends[0] for e in ends), f"duplicates must be the same message: {ends}"
    return ends[0]


def test_real_jobs_start_and_end_with_their_nodes_gpus_and_slurms_end_state(jobs: Jobs) -> None:
    jobs.start()
    pair = jobs.sbatch("-N", "2", "-w", "gpu-node-[01-02]", "--gres=gpu:4", "-c", "1", script="sleep 6")
    sharing = jobs.sbatch("-N", "1", "-w", "gpu-node-01", "--gres=gpu:2", "-c", "1", script="sleep 6")
    four = jobs.sbatch("-N", "4", "-c", "1", script="sleep 2")
    failing = jobs.sbatch("-N", "1", "-c", "1", script="sleep 1; exit 3")
    cancelled = jobs.sbatch("-N", "1", "-c", "1", script="sleep 300")
    jobs.wait(jobs.started(pair, sharing, cancelled))
    # while the first two run, the job table maps their shared node to both
    table = JobTable()
    for r in list(jobs.records):
        if r.value is not None and r.key in (pair.encode(), sharing.encode()):
            table.apply(schemas.decode(r.value, schemas.JOB, key=r.key))
    assert set(table.jobs_of(["gpu-node-01"])[0]) == {pair, sharing}
    subprocess.run(["scancel", cancelled], env=jobs.slurm.env, check=True)
    jobs.wait(jobs.ended(pair, sharing, four, failing, cancelled))

    start = {j: next(m for m in jobs.messages(j) if m["state"] == "started") for j in (pair, sharing, four)}
    assert start[pair]["nodes"] == ["gpu-node-01", "gpu-node-02"] and start[pair]["gpus"] == [4, 4]
    assert start[sharing]["nodes"] == ["gpu-node-01"] and start[sharing]["gpus"] == [2]
    assert sorted(start[four]["nodes"]) == [f"gpu-node-0{i}" for i in range(1, 5)]
    assert "gpus" not in start[four]  # it asked for none: Slurm does not say
    for job, (state, end_state, code) in {
        pair: ("finished", "COMPLETED", 0),
        sharing: ("finished", "COMPLETED", 0),
        four: ("finished", "COMPLETED", 0),
        failing: ("failed", "FAILED", 3),
        cancelled: ("finished", "CANCELLED", None),
    }.items():
        end = _end(jobs.messages(job))
        info = jobs.scontrol_job(job)
        if job == cancelled:
            # scancel's SIGTERM ends the script by the signal (Slurm: ExitCode=0:15, no exit code)
            # or, when its shell outlives the signalled sleep, with 128 + 15 (ExitCode=143:0):
            # Slurm's own record says which
            status, sig = (int(x) for x in info["ExitCode"].split(":"))
            assert (status, sig) in ((0, 15), (143, 0)), info["ExitCode"]
            code = None if sig else status
        assert (end["state"], end["end_state"], end.get("exit_code")) == (state, end_state, code), end
        assert end["ts"] == time.mktime(time.strptime(info["EndTime"], "%Y-%m-%dT%H:%M:%S"))
        assert end["start_ts"] == time.mktime(time.strptime(info["StartTime"], "%Y-%m-%dT%H:%M:%S"))
    assert _end(jobs.messages(pair))["gpus"] == [4, 4]  # the start's GPUs: Slurm forgets them at the end

    # the accounting stage on what slurm-jobs published: each real end in its category
    r = account_report(jobs, pair, sharing, four, failing, cancelled)
    runs = {f["job"]: f for f in r["failures"]}
    assert r["taxonomy"]["by_end_state"] == {"COMPLETED": 3, "FAILED": 1, "CANCELLED": 1}
    assert r["taxonomy"]["by_category"] == {"completed": 3, "user": 1, "other": 1}
    assert runs == {}  # the application's own failure is no infrastructure failure
    sizes = {row["gpus"]: row["jobs"] for row in r["mttf_by_gpus"]}
    # pair: 4 + 4 GPUs; sharing: 2; four (no GPUs asked): its 4 nodes' 8 each; failing, cancelled: 8
    assert sizes == {8: 3, 2: 1, 32: 1}, sizes

    # how long a start took to reach the broker (the producer's timestamp; Slurm's are whole seconds)
    lags = [
        r.timestamp_ms / 1000 - start[j]["ts"]
        for j in start
        for r in jobs.records
        if r.key == j.encode() and schemas.decode(r.value)["state"] == "started"
    ]
    assert max(lags) < START_WITHIN_S, lags
    print(f"start -> topic: max {max(lags):.2f} s over {len(lags)} records")


def _telemetry(node: str, ts: float, seq: int) -> dict[str, Any]:
    return {"schema": "telemetry/1", "node": node, "ts": ts, "seq": seq, "gpus": [gpu(0)]}


def test_a_killed_slurmd_ends_its_job_node_fail_and_the_lemon_history_counts_it(
    jobs: Jobs,
    slurm: Slurm,
) -> None:
    jobs.start()
    job = jobs.sbatch("-N", "2", "-w", "gpu-node-[03-04]", "--no-requeue", "-c", "1", script="sleep 300")
    jobs.wait(jobs.started(job))
    pid = int((Path(slurm.conf).parent / "slurmd-gpu-node-04.pid").read_text())
    os.kill(pid, signal.SIGKILL)
    try:
        jobs.wait(jobs.ended(job), timeout_s=90)  # SlurmdTimeout=15 in the local slurm.conf
    finally:
        subprocess.run(["bash", str(SLURM_SH), "start"], capture_output=True, check=True, timeout=60)
        slurm.reset("gpu-node-04")
    end = _end(jobs.messages(job))
    assert (end["state"], end["end_state"]) == ("failed", "NODE_FAIL")
    assert end["nodes"] == ["gpu-node-03", "gpu-node-04"]

    # the job stage's table and a node task: the failure enters both nodes' lemon history
    table = JobTable()
    for m in jobs.messages(job):
        table.apply(m)
    task = NodeTask(jobs=table)
    t0 = end["ts"]
    samples = [_telemetry(n, t0 + 1, 1) for n in ("gpu-node-03", "gpu-node-04")]
    task.process("fleet.telemetry.v1", TelemetryBatch.from_messages(samples))
    nodes, _score, events, _fleet = task.lemon.scores()
    counted = dict(zip(nodes, events.tolist(), strict=True))
    assert counted["gpu-node-04"] > 0 and counted["gpu-node-03"] > 0
    assert job in task.failed_jobs_seen

    # the accounting stage: a real NODE_FAIL is the hardware's, never the user's
    (failure,) = account_report(jobs, job)["failures"]
    assert (failure["job"], failure["end_state"], failure["category"], failure["component"]) == (
        job, "NODE_FAIL", "hardware", "node",
    )  # fmt: skip


def account_report(jobs: Jobs, *job_ids: str) -> dict[str, Any]:
    """`fleetwatch account` on the records slurm-jobs published for these jobs (copied as they
    are to a topic of their own: the publisher's topic is the shared one, with other tests' jobs),
    until idle; then `fleetwatch report --json` over the last day."""
    db = jobs.tmp / f"acc-{uuid.uuid4().hex[:6]}.sqlite"
    run = uuid.uuid4().hex[:8]
    topic = f"test.acc.{run}.jobs"
    ensure_topics(jobs.bootstrap, [topic])
    ours = [(r.key, r.value) for r in jobs.records if r.key is not None and r.key.decode() in job_ids]
    send(jobs.bootstrap, topic, ours)
    argv = [sys.executable, "-m", "fleetwatch.cli", "account", "--bootstrap", jobs.bootstrap, "--db", str(db),
            "--jobs-topic", topic, "--idle-exit", "2", "--steps-topic", f"test.acc.{run}.steps",
            "--findings-topic", f"test.acc.{run}.findings", "--results-topic", f"test.acc.{run}.results",
            "--nodes-topic", f"test.acc.{run}.nodes",
            "--slurm-nodes-topic", f"test.acc.{run}.slurm_nodes"]  # fmt: skip
    subprocess.run(argv, check=True, capture_output=True, timeout=60, cwd=REPO)
    out = subprocess.run(
        [sys.executable, "-m", "fleetwatch.cli", "report", "--db", str(db), "--since", "1d", "--json"],
        check=True, capture_output=True, timeout=60, cwd=REPO,
    )  # fmt: skip
    return json.loads(out.stdout)


def test_a_killed_publisher_loses_no_start_or_end_and_invents_none(jobs: Jobs) -> None:
    jobs.start()
    before = jobs.sbatch("-N", "1", "-c", "1", script="sleep 6")
    jobs.wait(jobs.started(before))
    jobs.kill()
    # while it is down: the running job ends, a short one runs and ends, a long one starts
    short = jobs.sbatch("-N", "1", "-c", "1", script="sleep 1")
    long = jobs.sbatch("-N", "1", "-c", "1", script="sleep 300")
    jobs.wait_state(before, {"COMPLETED"})
    jobs.wait_state(short, {"COMPLETED"})
    jobs.wait_state(long, {"RUNNING"})
    jobs.start()
    jobs.wait(lambda: jobs.ended(before, short)() and jobs.started(long)())
    subprocess.run(["scancel", long], env=jobs.slurm.env, check=True)
    jobs.wait(jobs.ended(long))
    for job, end_state in ((before, "COMPLETED"), (short, "COMPLETED"), (long, "CANCELLED")):
        states = jobs.states(job)
        assert states[0] == "started" and set(states) == {"started", "finished"}, (job, states)
        assert _end(jobs.messages(job))["end_state"] == end_state
    assert jobs.states(before).count("started") == 1  # read back from the topic, not sent again


def test_a_restarted_slurmctld_ends_nothing_that_still_runs(jobs: Jobs, slurm: Slurm) -> None:
    jobs.start()
    job = jobs.sbatch("-N", "1", "-c", "1", script="sleep 300")
    jobs.wait(jobs.started(job))
    pid = int((Path(slurm.conf).parent / "slurmctld.pid").read_text())
    os.kill(pid, signal.SIGTERM)
    time.sleep(4)  # several polls fail while it is down
    subprocess.run(["bash", str(SLURM_SH), "start"], capture_output=True, check=True, timeout=60)
    jobs.wait_state(job, {"RUNNING"})
    time.sleep(3)  # polls of the restarted controller
    jobs.records += jobs.tail.collect(lambda rs: False, timeout_s=1)
    assert jobs.states(job) == ["started"]
    subprocess.run(["scancel", job], env=jobs.slurm.env, check=True)
    jobs.wait(jobs.ended(job))
    assert _end(jobs.messages(job))["end_state"] == "CANCELLED"


def test_a_broker_outage_is_waited_out_and_nothing_is_lost(
    slurm: Slurm,
    private_broker: PrivateBroker,
    tmp_path: Path,
) -> None:
    jobs = Jobs(slurm, private_broker.bootstrap, tmp_path)
    try:
        jobs.start()
        job = jobs.sbatch("-N", "1", "-c", "1", script="sleep 4")
        jobs.wait(jobs.started(job))
        private_broker.stop()
        try:
            jobs.wait_state(job, {"COMPLETED"})
            time.sleep(2)  # polls that cannot deliver
        finally:
            private_broker.start()
        jobs.tail.close()
        jobs.tail = TopicTail(private_broker.bootstrap, jobs.topic)
        jobs.tail.rewind()
        jobs.records = []
        jobs.wait(jobs.ended(job), timeout_s=90)
        assert _end(jobs.messages(job))["end_state"] == "COMPLETED"
    finally:
        jobs.stop()
        jobs.tail.close()


def test_an_answer_that_does_not_parse_is_logged_counted_and_the_loop_goes_on(jobs: Jobs) -> None:
    # a squeue in front of the real one that answers garbage while a flag file exists
    fake_bin = jobs.tmp / "bin"
    fake_bin.mkdir()
    flag = jobs.tmp / "garbage"
    flag.write_text("")
    real = subprocess.run(["which", "squeue"], capture_output=True, text=True, check=True).stdout.strip()
    (fake_bin / "squeue").write_text(
        f"#!/bin/sh\nif [ -e {flag} ]; then\n"
        f'  echo \'{{"jobs": [{{"job_id": 1, "nodes": "n[1-"}}], "meta": 7\'; echo truncated; exit 0\n'
        f'fi\nexec {real} "$@"\n'
    )
    (fake_bin / "squeue").chmod(0o755)
    port = free_port()
    env = {**jobs.env, "PATH": f"{fake_bin}:{os.environ['PATH']}"}
    jobs.start("--metrics-port", str(port), env=env)
    deadline = time.monotonic() + 30
    while "truncated" not in jobs.log.read_text() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "unparsable Slurm squeue" in jobs.log.read_text()
    assert "truncated" in jobs.log.read_text()  # the raw text is in the log
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    bad = re.search(r'fleetwatch_slurm_jobs_bad_answers_total\{what="squeue"\} (\S+)', metrics)
    assert bad and float(bad.group(1)) >= 1
    flag.unlink()
    job = jobs.sbatch("-N", "1", "-c", "1", script="sleep 1")
    jobs.wait(jobs.ended(job))
    assert jobs.proc is not None and jobs.proc.poll() is None
    assert json.dumps(jobs.states(job)) == json.dumps(["started", "finished"])
