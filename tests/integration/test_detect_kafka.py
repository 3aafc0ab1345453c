"""The detector pipeline through the real broker: `fleetwatch simulate` produces a small
cluster with faults; a detect Worker (the same stages `fleetwatch detect` runs) in its own
consumer group finds them and publishes finding/1 on fleet.findings.v1, keyed by node."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import yaml

from fleetwatch import schemas, topics
from fleetwatch.bus.kafka import KafkaBus
from fleetwatch.pipeline.detect import stages
from fleetwatch.pipeline.job_table import JobTable, JobTableFollower
from fleetwatch.pipeline.worker import Worker
from fleetwatch.runtime import StopFlag
from tests.helpers.paths import REPO


def _scenario(tmp_path: Path, prefix: str) -> Path:
    doc = {
        "name": "e2e",
        "seed": 3,
        "nodes": 12,
        "node_prefix": prefix,
        "duration_s": 90,
        "jobs": {"sizes": [4], "duration_s": [600, 900], "step_time_s": [0.8, 1.0], "startup_s": [2, 3]},
        "faults": [
            {"kind": "xid79", "node": 2, "gpu": 3, "onset_s": 20},
            {"kind": "ib_link_down", "node": 10, "onset_s": 30},
            {"kind": "straggler", "node": 7, "onset_s": 5, "slowdown": 0.25},
        ],
    }
    p = tmp_path / "e2e.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


def test_simulated_faults_come_out_as_findings(kafka_bootstrap: str, topic_tail: Any, tmp_path: Path) -> None:
    run = uuid.uuid4().hex[:6]
    prefix = f"e2e{run}-"
    findings_tail = topic_tail(topics.FINDINGS)
    jobs = JobTable()
    follower = JobTableFollower(jobs, KafkaBus(kafka_bootstrap))
    follower.start()
    worker = Worker(
        kafka_bootstrap, f"test-detect-{run}", stages(jobs), snapshot_every_s=3600, start_at="latest"
    )
    stop = StopFlag(install=False)
    thread = threading.Thread(target=worker.run, args=(stop,))
    # Join the group and take positions at the end of every input partition before anything is
    # produced ("latest" would skip what arrives before a partition is assigned).
    expected = sum(worker.consumer.partition_count(t) for s in stages(jobs) for t in s.inputs)
    deadline = time.monotonic() + 60
    while len(worker.consumer.assignment()) < expected and time.monotonic() < deadline:
        worker.step(timeout_ms=200)
    assert len(worker.consumer.assignment()) == expected, "the worker never got all its partitions"
    thread.start()
    try:
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "fleetwatch.cli",
                "simulate",
                "--bootstrap",
                kafka_bootstrap,
                "--scenario",
                str(_scenario(tmp_path, prefix)),
                "--speed",
                "0",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=REPO,
        )
        assert r.returncode == 0, r.stderr

        def found(recs: list[Any]) -> bool:
            kinds = {(x.key, schemas.decode(x.value)["kind"]) for x in recs}
            return {
                (f"{prefix}0002".encode(), "xid"),
                (f"{prefix}0010".encode(), "ib_link"),
                (f"{prefix}0007".encode(), "straggler"),
            } <= kinds

        recs = findings_tail.collect(found, 60)
    finally:
        stop.set()
        thread.join(30)
        worker.close()
        follower.stop()
    mine = [schemas.decode(x.value) for x in recs if x.key and x.key.startswith(prefix.encode())]
    by = {(f["node"], f["kind"]) for f in mine}
    assert (f"{prefix}0002", "xid") in by and (f"{prefix}0002", "pcie") in by  # XID 79 and the lost GPU
    assert (f"{prefix}0010", "ib_link") in by
    assert (f"{prefix}0007", "straggler") in by
    xid = next(f for f in mine if f["kind"] == "xid" and f["node"] == f"{prefix}0002")
    assert xid["gpu"] == 3 and xid["severity"] == "critical" and "79" in xid["summary"]
    healthy = {f"{prefix}{i:04d}" for i in range(1, 13)} - {f"{prefix}0002", f"{prefix}0010", f"{prefix}0007"}
    straggler_peers = [f for f in mine if f["kind"] == "straggler" and f["node"] in healthy]
    assert straggler_peers == [], [(f["node"], f["summary"], f["evidence"]) for f in straggler_peers]
