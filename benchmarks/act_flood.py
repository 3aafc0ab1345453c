"""act's throughput on a flood of findings: how fast `fleetwatch act` works through 3,000 signed
findings that are already on its topic (a fleet-wide event: detect published them faster than act
decides), through the real broker and the real Alertmanager.

Each run gets private topics, a signed census of --nodes nodes, and the flood: per node in turn a
thermal warning, a drain-worthy XID 79, and, for a third of the warnings, its resolve, so the run
exercises the alert book, the drain budget (2% of the fleet) and the storm guard as a real flood
does. Then `fleetwatch act` starts on them as a process (the command a site runs, so two releases
can be compared: --python runs it with another interpreter, e.g. one whose `fleetwatch` is the
commit before), and its /metrics (fleetwatch_act_findings_total) are read every 20 ms:

- ready_s: from the process start to its partitions' assignment (its log's first "assigned" line:
  imports, followers' catch-up, the group join);
- rate: findings per second from that assignment to the last finding acted on (the metric is
  read every 20 ms; act's batches are hundreds of findings, so the first count seen is no start).

Runs alternate between the interpreters (A B A B ...) because this machine's speed drifts; the
ratio is per pair.

    python -m benchmarks.act_flood --alertmanager URL [--python OTHER --cwd OTHER_REPO] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from fleetwatch.bus import admin
from fleetwatch.bus.kafka import KafkaBus
from fleetwatch.census import node_message
from fleetwatch.detectors.findings import make_finding
from fleetwatch.signing import encode_signed

REPO = Path(__file__).resolve().parents[1]
DRAIN_KEY = "bench-drain-key-0123456789abcdef"
CENSUS_KEY = "bench-census-key-0123456789abcdef"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def flood(nodes: list[str], count: int, now: float) -> list[dict[str, Any]]:
    """`count` findings over `nodes`, in the order detect would publish them."""
    out: list[dict[str, Any]] = []
    i = 0
    while len(out) < count:
        node = nodes[i % len(nodes)]
        ts = now - 60 + i * 0.01
        common = {"node": node, "score": 0.9, "first_seen": ts, "ts": ts, "job": None}
        if i % 3 == 1:
            f = make_finding(
                kind="xid", rule="xid_burst", severity="critical", summary=f"{node} xid", gpu=0,
                evidence={"xids": {"79": 1}, "worst_xid": 79, "action": "drain_node"}, **common,
            )  # fmt: skip
        else:
            f = make_finding(
                kind="thermal", rule="thermal_throttle", severity="warning", summary=f"{node} hot",
                gpu=1, evidence={}, resolved=False, **common,
            )  # fmt: skip
        out.append(f)
        if i % 9 == 0 and len(out) < count:  # a third of the warnings end
            out.append({**f, "ts": ts + 5, "resolved": True, "summary": "resolved: " + f["summary"]})
        i += 1
    return out[:count]


def acted(port: int) -> float:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1) as r:
            text = r.read().decode()
    except OSError:
        return -1.0  # not serving yet
    return sum(
        s.value
        for fam in text_string_to_metric_families(text)
        if fam.name == "fleetwatch_act_findings"
        for s in fam.samples
        if s.name == "fleetwatch_act_findings_total"
    )


def one_run(args: argparse.Namespace, python: str, cwd: str, logs: Path) -> dict[str, float]:
    tag = uuid.uuid4().hex[:8]
    t = {k: f"bench.actflood.{tag}.{k}" for k in ("findings", "drains", "nodes", "results")}
    admin.ensure_topics(args.bootstrap, list(t.values()))
    bus = KafkaBus(args.bootstrap)
    producer = bus.producer()
    now = time.time()
    nodes = [f"flood{tag}-n{i:04d}" for i in range(args.nodes)]
    for n in nodes:
        m = node_message(n, now - 3600, now, steady_since=now - 3600, seen_at=now)
        producer.send(t["nodes"], key=n.encode(), value=encode_signed(m, CENSUS_KEY.encode()))
    findings = flood(nodes, args.findings, now)
    for f in findings:
        producer.send(t["findings"], key=f["node"].encode(), value=encode_signed(f, CENSUS_KEY.encode()))
    assert not producer.flush(60), "the flood was not all acknowledged"
    producer.close(5)

    port = free_port()
    argv = [python, "-m", "fleetwatch.cli", "act", "--bootstrap", args.bootstrap]
    argv += ["--alertmanager", args.alertmanager, "--cluster", f"flood-{tag}", "--group", f"flood-{tag}"]
    argv += ["--findings-topic", t["findings"], "--drain-topic", t["drains"]]
    argv += ["--nodes-topic", t["nodes"], "--results-topic", t["results"]]
    # long enough for any join (a release before 9760866 gave up on a slow first join): the run
    # ends when the counter reaches the flood, not at the idle exit
    argv += ["--metrics-port", str(port), "--idle-exit", "60"]
    env = {**os.environ, "FLEETWATCH_DRAIN_KEY": DRAIN_KEY, "FLEETWATCH_CENSUS_KEY": CENSUS_KEY}
    log = logs / f"act-{tag}.log"
    with open(log, "wb") as out:
        start = time.monotonic()
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
        first_at = done_at = None
        deadline = start + args.timeout
        try:
            while time.monotonic() < deadline:
                n = acted(port)
                if n > 0 and first_at is None:
                    first_at, first_n = time.monotonic(), n
                if n >= len(findings):
                    done_at, done_wall = time.monotonic(), time.time()
                    break
                if proc.poll() is not None:
                    break
                time.sleep(0.02)
        finally:
            proc.terminate()
            proc.wait(30)
    if first_at is None or done_at is None:
        raise SystemExit(f"act did not work through the flood; its log: {log}\n{log.read_text()[-2000:]}")
    assigned = assigned_at(log)
    span = max(done_wall - assigned, 1e-3)
    ready = done_at - start - span
    return {"ready_s": ready, "rate": len(findings) / span, "total_s": done_at - start, "first_n": first_n}


def assigned_at(log: Path) -> float:
    """Wall time of the log's first 'assigned' line (the worker's, in every release)."""
    for line in log.read_text(errors="replace").splitlines():
        if "fleetwatch.pipeline.worker: assigned" in line:
            stamp = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
            return stamp.timestamp()
    raise SystemExit(f"act never logged its assignment: {log}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bootstrap", default="localhost:9092")
    ap.add_argument("--alertmanager", required=True, help="a running Alertmanager's URL")
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--findings", type=int, default=3000)
    ap.add_argument("--runs", type=int, default=3, help="runs per interpreter")
    ap.add_argument("--timeout", type=float, default=180.0, help="seconds one run may take")
    ap.add_argument("--python", default=None, help="a second interpreter to compare (B)")
    ap.add_argument("--cwd", default=None, help="the repository B runs in")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    sides = {"A": (sys.executable, str(REPO))}
    if args.python:
        sides["B"] = (args.python, args.cwd or str(REPO))
    results: dict[str, list[dict[str, float]]] = {k: [] for k in sides}
    logs = Path(tempfile.mkdtemp(prefix="act-flood-"))  # act's logs stay for a look after a run
    for _ in range(args.runs):
        for name, (python, cwd) in sides.items():
            results[name].append(one_run(args, python, cwd, logs))
    if args.json:
        print(json.dumps(results, indent=1))
        return 0
    for name, runs in results.items():
        rates = ", ".join(f"{r['rate']:,.0f}" for r in runs)
        ready = ", ".join(f"{r['ready_s']:.1f}" for r in runs)
        print(f"{name} ({sides[name][0]}): findings/s {rates}; ready after {ready} s")
    if "B" in results:
        ratios = [a["rate"] / b["rate"] for a, b in zip(results["A"], results["B"], strict=True)]
        print("A/B rate per pair: " + ", ".join(f"{r:.2f}x" for r in ratios))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
