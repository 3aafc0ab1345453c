"""`fleetwatch account` on the real broker: a real training job's StepReporter, job ends, signed
findings, drain results and census, hostile records between them; the stage killed with SIGKILL
half-way and restarted; then `fleetwatch report --json` and the live figures on /metrics.
Nothing is counted twice, nothing hostile is applied, every hostile record is dead-lettered."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest

from fleetwatch import schemas, signing, topics
from fleetwatch.alerts.slurm import NodeInfo
from fleetwatch.alerts.slurm_nodes import make_record
from fleetwatch.bus.admin import ensure_topics
from fleetwatch.census import node_message
from fleetwatch.steps import StepReporter
from tests.helpers.paths import REPO
from tests.helpers.reliability import finding, result
from tests.integration.act_rig import free_port
from tests.integration.services import TopicTail, send

CENSUS = "account-test-census-key-0123456789"
DRAIN = "account-test-drain-key-0123456789ab"


class Rig:
    def __init__(self, bootstrap: str, tmp: Path) -> None:
        run = uuid.uuid4().hex[:8]
        self.bootstrap, self.tmp = bootstrap, tmp
        self.t = {
            name: f"test.account.{run}.{name}"
            for name in ("jobs", "steps", "findings", "results", "nodes", "slurm_nodes")
        }
        ensure_topics(bootstrap, list(self.t.values()))
        self.db = tmp / "acc.sqlite"
        self.port = free_port()
        self.env = {**os.environ, "FLEETWATCH_CENSUS_KEY": CENSUS, "FLEETWATCH_DRAIN_KEY": DRAIN}
        self.proc: subprocess.Popen[bytes] | None = None

    def send(self, topic: str, key: str, value: bytes) -> None:
        send(self.bootstrap, self.t[topic], [(key.encode(), value)])

    def job(
        self, job: str, nodes: list[str], state: str, ts: float, start: float, end_state: str | None = None
    ) -> None:
        m = {
            "schema": schemas.JOB,
            "job": job,
            "nodes": nodes,
            "state": state,
            "ts": ts,
            "start_ts": start,
            "gpus": [8] * len(nodes),
        }
        if end_state:
            m["end_state"] = end_state
        self.send("jobs", job, orjson.dumps(m))

    def finding(self, node: str, kind: str, ts: float) -> str:
        f = finding(node, kind, ts, rule="t", key=CENSUS.encode())  # signed as detect signs it
        self.send("findings", node, orjson.dumps(f))
        return f["id"]

    def start(self) -> None:
        argv = [sys.executable, "-m", "fleetwatch.cli", "account", "--bootstrap", self.bootstrap,
                "--db", str(self.db), "--metrics-port", str(self.port), "--refresh-every", "1s",
                "--jobs-topic", self.t["jobs"],
                "--steps-topic", self.t["steps"], "--findings-topic", self.t["findings"],
                "--results-topic", self.t["results"], "--nodes-topic", self.t["nodes"],
                "--slurm-nodes-topic", self.t["slurm_nodes"]]  # fmt: skip
        log = open(self.tmp / "account.log", "ab")  # noqa: SIM115 (closed with the process)
        self.proc = subprocess.Popen(argv, env=self.env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
            return r.read().decode()

    def report(self) -> dict:
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "fleetwatch.cli",
                "report",
                "--db",
                str(self.db),
                "--since",
                "1d",
                "--json",
            ],
            env=self.env,
            cwd=REPO,
            capture_output=True,
            timeout=60,
            check=True,
        )
        return json.loads(out.stdout)

    def wait_report(self, done, timeout_s: float = 60.0) -> dict:
        deadline = time.monotonic() + timeout_s
        while True:
            assert self.proc is not None and self.proc.poll() is None, (self.tmp / "account.log").read_text()[
                -3000:
            ]
            if self.db.exists():
                r = self.report()
                if done(r):
                    return r
            if time.monotonic() > deadline:
                pytest.fail(f"the store never showed what was sent: {r if self.db.exists() else 'no store'}")
            time.sleep(0.5)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(30)


@pytest.fixture
def rig(kafka_bootstrap: str, tmp_path: Path):
    r = Rig(kafka_bootstrap, tmp_path)
    yield r
    r.stop(signal.SIGKILL)


HOSTILE = [
    ("jobs", "x", b"{not json"),
    (
        "jobs",
        "wrong-key",
        orjson.dumps({"schema": "job/1", "job": "x", "nodes": ["n"], "state": "started", "ts": 1.0}),
    ),
    ("findings", "n1", orjson.dumps({"schema": "finding/1", "id": "f", "node": "n1"})),
    ("steps", "j", b"\xff\xfe" * 100),
    # forged: a critical finding on b1 in b's window, signed with another key, must blame nothing
    ("findings", "b1", orjson.dumps(finding("b1", "nvlink", time.time() - 4 * 3600 + 7100, key=b"f" * 32))),
    ("jobs", "big", b"[" * 64 + b"1" * 900_000),  # as large as the broker takes, nested, not JSON
]


def hostile_views(start: float) -> list[tuple[str, str, bytes]]:
    """Slurm's node view of b1 in service between its drain (start + 7300) and its resume by hand
    (start + 7500), as nothing but the adapter may send it: garbage, a genuine record cut short, one
    under another node's key, one as large as the broker takes. Each is dead-lettered, and none
    ends the drain early."""
    genuine = schemas.encode(make_record(NodeInfo("b1", "idle", ""), (), False, start + 7320, DRAIN.encode()))
    return [
        ("slurm_nodes", "b1", b"{not json"),
        ("slurm_nodes", "b1", genuine[: len(genuine) // 2]),
        ("slurm_nodes", "a1", genuine),  # keyed by a node the record does not name
        ("slurm_nodes", "b1", b"[" * 64 + b"1" * 900_000),
    ]


def test_the_stage_survives_a_kill_counts_nothing_twice_and_reports(rig: Rig, kafka_bootstrap: str) -> None:
    now = time.time()
    start = now - 4 * 3600
    tail = TopicTail(kafka_bootstrap, topics.DEADLETTER)
    for node in ("a1", "a2", "b1", "c1", "c2"):
        m = node_message(node, start - 86400, now, seen_at=now)
        rig.send("nodes", node, orjson.dumps(signing.signed(m, CENSUS.encode())))
    # a: the node stopped answering; b: the application's failure, with an ECC error beside it
    rig.job("a", ["a1", "a2"], "started", start, start)
    rig.job("b", ["b1"], "started", start, start)
    rig.job("c", ["c1", "c2"], "started", start, start)
    for topic, key, value in [*HOSTILE, *hostile_views(start)]:
        rig.send(topic, key, value)
    rig.job("a", ["a1", "a2"], "failed", start + 3600, start, "NODE_FAIL")
    ecc = rig.finding("b1", "ecc", start + 7000)
    rig.job("b", ["b1"], "failed", start + 7200, start, "FAILED")
    rig.start()
    rig.wait_report(lambda r: r["taxonomy"]["runs"] == 2)
    rig.stop(signal.SIGKILL)  # mid-stream: whatever it had not committed it reads again

    # c trains with the real reporter (the real Kafka client): steps, a checkpoint, then dies
    with StepReporter(kafka_bootstrap, job="c", rank=0, node="c1", topic=rig.t["steps"]) as steps:
        steps.step(1, 0.5)
        steps.checkpoint(1, write_time_s=12.0)
        steps.step(2, 0.5)
    assert steps.sent == 2
    end_c = time.time() + 1
    rig.job("c", ["c1", "c2"], "failed", end_c, start, "FAILED")
    rig.finding("c2", "ib_link", end_c - 60)
    rig.send(
        "results", "b1", schemas.encode(result("b1", "drain", start + 7300, "e" * 32, key=DRAIN.encode()))
    )
    # an operator resumed b1 by hand 200 s later (scontrol, not act): Slurm's view, as the adapter
    # publishes it, ends the drain there; a forged view of it in service earlier ends nothing
    forged = make_record(NodeInfo("b1", "idle", ""), (), False, start + 7310, b"f" * 32)
    rig.send("slurm_nodes", "b1", schemas.encode(forged))
    for state, at in (("drained", start + 7301), ("idle", start + 7500)):
        view = make_record(NodeInfo("b1", state, ""), (), False, at, DRAIN.encode())
        rig.send("slurm_nodes", "b1", schemas.encode(view))
    for topic, key, value in [*HOSTILE, *hostile_views(start)]:
        rig.send(topic, key, value)
    hostile = len(HOSTILE) + len(hostile_views(start))

    def refused_in(r: dict[str, Any]) -> dict[str, int]:
        return {q["what"]: q["count"] for q in r["data_quality"] if q["what"].startswith("refused:")}

    def settled(r: dict[str, Any]) -> bool:
        """Everything sent has been read: the stage reads six topics, each polled batch on its own, so
        a report may fall between the drain's answer and the view that ends it (the drain then counts
        until now), or before the hostile records are refused."""
        c = next((f for f in r["failures"] if f["job"] == "c"), {})
        return (
            r["taxonomy"]["runs"] == 3
            and abs(r["lost_gpu_hours_by_cause"]["drained"] - 200 * 8 / 3600) < 1e-3
            and c.get("component") == "ib_link"
            and sum(refused_in(r).values()) == 2 * hostile + 1
        )

    rig.start()
    r = rig.wait_report(settled)
    assert r["lost_gpu_hours_by_cause"]["drained"] == pytest.approx(200 * 8 / 3600, abs=1e-3)

    assert r["taxonomy"]["by_category"] == {"hardware": 3}
    by_job = {f["job"]: f for f in r["failures"]}
    assert by_job["a"]["component"] == "node" and by_job["a"]["evidence"] == []
    assert by_job["b"]["component"] == "gpu_memory"
    assert [e["finding"] for e in by_job["b"]["evidence"]] == [ecc]
    assert by_job["c"]["component"] == "ib_link"
    lost = r["lost_gpu_hours_by_cause"]["lost_progress"]
    # c lost what it did since its checkpoint (the reporter's), on 16 GPUs; not the assumed half hour
    assert 0 < lost["hardware:ib_link"] < 16 * 5 / 3600
    assert r["lost_gpu_hours_by_cause"]["assumed_lost_progress_runs"] == 2  # a and b reported no steps
    refused = refused_in(r)
    assert sum(refused.values()) == 2 * hostile + 1, refused  # the forged view too

    def ours(recs: list[Any]) -> list[Any]:  # the topic is shared: other writers' dead letters too
        return [
            rec
            for rec in recs
            if dict(rec.headers or []).get("source", b"").startswith(b"account:test.account.")
            and any(t.encode() in dict(rec.headers or [])["source"] for t in rig.t.values())
        ]

    # (waiting for ours: it stopped at as many dead letters of any writer, and found half its own)
    dead = ours(tail.collect(lambda recs: len(ours(recs)) >= 2 * hostile + 1, timeout_s=20))
    assert len(dead) == 2 * hostile + 1

    # the live figures: the same history, on /metrics
    deadline = time.monotonic() + 20
    while 'fleetwatch_reliability_job_ends{category="hardware"} 3.0' not in (text := rig.metrics()):
        assert time.monotonic() < deadline, text[-3000:]
        time.sleep(0.5)
    assert 'fleetwatch_reliability_infra_failures{component="ib_link"} 1.0' in text
    rig.stop()
    assert rig.proc is not None and rig.proc.returncode == 0
