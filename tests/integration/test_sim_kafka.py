"""`fleetwatch simulate` against the real local Kafka broker."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import uuid
from collections import defaultdict

from fleetwatch import schemas, topics

NODES, SAMPLES = 64, 10


def test_simulate_produces_to_kafka(kafka_bootstrap: str, topic_tail, tmp_path) -> None:
    # Faults early enough that truth and a failed job arrive within a 10-second run.
    scenario = tmp_path / "kafka.yaml"
    # A node prefix of its own: other runs may produce gpu-node-* telemetry to the same broker.
    prefix = f"simk{uuid.uuid4().hex[:6]}-"
    scenario.write_text(
        f"seed: 5\nnodes: 8\nduration_s: 30\nnode_prefix: {prefix}\n"
        "jobs: {sizes: [2, 4], startup_s: [1, 2], step_time_s: [0.8, 1.2]}\n"
        "faults:\n  - {kind: xid48, node: 2, gpu: 1, onset_s: 3}\n"
        "  - {kind: straggler, node: 5, onset_s: 0}\n"
    )
    tails = {t: topic_tail(t) for t in (topics.TELEMETRY, topics.JOBS, topics.STEPS, topics.TRUTH)}
    cmd = [sys.executable, "-m", "fleetwatch.cli", "simulate", "--bootstrap", kafka_bootstrap, "--scenario",
           str(scenario), "--nodes", str(NODES), "--duration", str(SAMPLES), "--speed", "0"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "done after 10/10 ticks" in proc.stderr

    tel = tails[topics.TELEMETRY]
    mine = prefix.encode()
    records = tel.collect(lambda rs: sum(r.key.startswith(mine) for r in rs) >= NODES * SAMPLES, timeout_s=30)
    records = [r for r in records if r.key.startswith(mine)]
    msgs = tel.messages(records)  # decode() validates every one
    assert len(msgs) == NODES * SAMPLES
    seqs: dict[str, list[int]] = defaultdict(list)
    for r, m in zip(records, msgs, strict=True):
        assert r.key.decode() == m["node"] and m["schema"] == schemas.TELEMETRY
        seqs[m["node"]].append(m["seq"])
    assert len(seqs) == NODES
    assert all(s == list(range(SAMPLES)) for s in seqs.values())  # in order per node (key -> partition)

    got = {}
    for topic, key_field in ((topics.JOBS, "job"), (topics.STEPS, "job"), (topics.TRUTH, "node")):
        recs = tails[topic].collect(lambda rs: len(rs) > 0, timeout_s=10)
        recs += tails[topic].collect(lambda rs: False, timeout_s=1)  # drain the rest
        recs = [r for r in recs if prefix in r.value.decode()]
        ms = tails[topic].messages(recs)
        assert ms, topic
        assert all(r.key.decode() == m[key_field] for r, m in zip(recs, ms, strict=True))
        got[topic] = ms
    assert {m["state"] for m in got[topics.JOBS]} >= {"started", "failed"}
    assert {(m["node"], m["fault"]) for m in got[topics.TRUTH]} == {
        (f"{prefix}0002", "xid48"),
        (f"{prefix}0005", "straggler"),
    }
    assert any(m["wait_time_s"] > 0 for m in got[topics.STEPS])


def test_simulate_serves_metrics(kafka_bootstrap: str, tmp_path) -> None:
    import socket
    import time
    import urllib.request

    with socket.socket() as s:  # a free port
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    scenario = tmp_path / "m.yaml"
    scenario.write_text(f"nodes: 4\nduration_s: 20\nnode_prefix: simm{uuid.uuid4().hex[:6]}-\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "fleetwatch.cli", "simulate", "--bootstrap", kafka_bootstrap, "--scenario",
         str(scenario), "--speed", "4", "--metrics-port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    seen = ""
    deadline = time.monotonic() + 30
    try:
        while (
            time.monotonic() < deadline
            and 'fleetwatch_sim_messages_total{topic="fleet.telemetry.v1"}' not in seen
        ):
            with contextlib.suppress(OSError):
                seen = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
            time.sleep(0.3)
    finally:
        proc.wait(60)
    assert proc.returncode == 0
    assert (
        'fleetwatch_sim_messages_total{topic="fleet.telemetry.v1"}' in seen and "fleetwatch_sim_tick" in seen
    )
