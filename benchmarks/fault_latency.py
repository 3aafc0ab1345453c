"""End-to-end latency on the local stack from a sudden fault's sample to its finding, its alert
accepted by Alertmanager and its drain request (issue 6, item 4; target p99 <= 2 s).

Runs `fleetwatch detect` and `fleetwatch act` as separate processes against the local broker and
Alertmanager, exactly as in production (fleetwatch/demo.py), then plays the producer role of the
node agents itself: healthy telemetry of --nodes nodes (the simulator core, healthy.yaml) at 1 Hz of
wall clock, every sample stamped with the wall time it is produced, with --faults sudden faults
injected into the telemetry/1 dicts, one every --spacing seconds on distinct nodes, cycling:

- xid79: XID 79 (GPU fallen off the bus) on one GPU, in that sample only;
- dbe: the GPU's uncorrectable ECC counters (ecc_dbe_volatile/aggregate) +1 from then on, no XID,
  so the counter rule (ecc_dbe) is measured rather than the XID path again;
- ib_down: one IB port's state DOWN and link_downed +1 from then on.

For each fault, the delay from the sample's timestamp (= the wall time it was handed to the
producer) to:

  (a) finding: the first open finding for that node read back from fleet.findings.v1;
  (b) alert:   the node's finding alert first seen in Alertmanager (GET /api/v2/alerts polled every
               --am-poll s, so (b) is an upper bound by up to one poll period);
  (c) drain:   the first drain request for the node read back from scheduler.drain.v1.

Faults are spaced out and act runs with --storm-min-nodes above the fleet size, so no storm guard
holds a drain back, and with --drain-budget 1 and no jobs on the fleet, so neither the budget nor
the one-node-per-job rule does: what is measured is the pipeline's delay, not a policy's.

By default the run gets a fresh private broker (port --broker-port, emptied at start, stopped at
the end; see private_broker) so that no other traffic mixes in; --bootstrap reuses a broker. Node
names carry a run id (lat<id>-n0001, ...) and act its own --cluster label, as Alertmanager is
shared. act's new consumer group is committed at the end of fleet.findings.v1 before it starts,
otherwise on a reused broker it would replay every finding in the topic's history.

    python benchmarks/fault_latency.py [--nodes 32] [--faults 15] [--spacing 6] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from fleetwatch import schemas, topics
from fleetwatch.bus import TopicPart
from fleetwatch.bus.admin import Admin, ensure_topics, wait_for_broker
from fleetwatch.bus.kafka import KafkaBus
from fleetwatch.collectors.sim import Simulation, load_scenario, packaged_path
from fleetwatch.runtime import stop_processes

REPO = Path(__file__).resolve().parent.parent
KINDS = ("xid79", "dbe", "ib_down")
STAGES = ("finding", "alert", "drain")
# A new group starts at the end (no history replayed); no metrics port, so demo runs do not clash.
DETECT_FLAGS = ("--start-at", "latest", "--metrics-port", "0")


@dataclass
class Fault:
    kind: str
    node: str
    tick: int
    gpu: int = 0
    port: int = 0
    ts: float | None = None  # the faulty sample's timestamp = wall time it was produced
    seen: dict[str, float] = field(default_factory=dict)  # stage -> wall time first observed

    def delays(self) -> dict[str, float | None]:
        return {s: (self.seen[s] - self.ts if s in self.seen and self.ts else None) for s in STAGES}


# ------------------------------------------------------------------ telemetry


def healthy_ticks(nodes: int, ticks: int, seed: int, prefix: str) -> list[list[dict[str, Any]]]:
    """Healthy telemetry/1 of `nodes` nodes, one list per tick, node names prefixed with the run id."""
    overrides = {"nodes": nodes, "duration_s": ticks, "seed": seed}
    sim = Simulation(load_scenario(str(packaged_path("healthy.yaml")), overrides))
    out = []
    for msgs in sim.ticks():
        tick = [m for t, _k, m in msgs if t == topics.TELEMETRY]
        for m in tick:
            m["node"] = f"{prefix}-n{m['node'].rsplit('-', 1)[-1]}"
        out.append(tick)
    return out


def inject(msg: dict[str, Any], faults: list[Fault], tick: int) -> dict[str, Any]:
    """The node's sample with the faults that began at or before this tick applied (a copy).

    Counters stay raised after the fault (a counter that went back down would read as a reset)
    and a downed port stays down; the XID is reported once, in the faulty sample only.
    """
    mine = [f for f in faults if f.node == msg["node"] and f.tick <= tick]
    if not mine:
        return msg
    msg = copy.deepcopy(msg)
    for f in mine:
        gpu = next((g for g in msg["gpus"] if g["index"] == f.gpu), None)
        if f.kind == "xid79" and f.tick == tick and gpu is not None:
            gpu["xids"] = [*gpu.get("xids", []), 79]
        elif f.kind == "dbe" and gpu is not None:
            for k in ("ecc_dbe_volatile", "ecc_dbe_aggregate"):
                gpu[k] = gpu.get(k, 0) + 1
        elif f.kind == "ib_down":
            port = msg["net"]["ib"][f.port]
            port["state"] = "DOWN"
            port["link_downed"] = port.get("link_downed", 0) + 1
    return msg


# ------------------------------------------------------------------ observers


class KafkaWatch(threading.Thread):
    """Reads findings and drain requests from the end of both topics; records first sightings."""

    def __init__(self, bootstrap: str, faults: dict[str, Fault], prefix: str) -> None:
        super().__init__(daemon=True)
        self.faults, self.prefix = faults, prefix
        self.false_findings: list[dict[str, Any]] = []  # open findings on our nodes without a fault
        self.stop = threading.Event()
        self.reader = KafkaBus(bootstrap).reader()
        tps = [TopicPart(t, p) for t in (topics.FINDINGS, topics.DRAIN) for p in self.reader.partitions(t)]
        self.reader.assign(tps, "end")  # the end now, before any fault is produced

    def run(self) -> None:
        while not self.stop.is_set():
            polled = self.reader.poll(0.05)
            now = time.time()  # one wall time per poll: the records of a poll arrive together
            for r in polled:
                m = orjson.loads(r.value)
                node = m.get("node") or ""
                if not node.startswith(self.prefix):
                    continue
                f = self.faults.get(node)
                if r.topic == topics.FINDINGS and not m.get("resolved"):
                    if f is not None and f.ts is not None and m["ts"] >= f.ts - 0.5:
                        f.seen.setdefault("finding", now)
                    elif f is None or f.ts is None:
                        self.false_findings.append(m)
                elif r.topic == topics.DRAIN and m.get("action") == "drain" and f is not None:
                    f.seen.setdefault("drain", now)
        self.reader.close()


class AlertmanagerWatch(threading.Thread):
    """Polls GET /api/v2/alerts for this run's cluster label; records each node's first alert."""

    def __init__(self, url: str, cluster: str, faults: dict[str, Fault], every_s: float) -> None:
        super().__init__(daemon=True)
        q = urllib.parse.urlencode(
            {"filter": f'cluster="{cluster}"', "silenced": "true", "inhibited": "true"}
        )
        self.url = f"{url.rstrip('/')}/api/v2/alerts?{q}"
        self.faults, self.every_s = faults, every_s
        self.stop = threading.Event()
        self.errors = 0

    def run(self) -> None:
        while not self.stop.is_set():
            t0 = time.time()
            try:
                with urllib.request.urlopen(self.url, timeout=2) as resp:
                    alerts = json.loads(resp.read())
            except OSError:
                self.errors += 1
                alerts = []
            for a in alerts:
                labels = a.get("labels", {})
                f = self.faults.get(labels.get("node", ""))
                # A finding's alert, not a policy alert (FleetwatchDrainRefused, ...) about the node.
                if (
                    f is not None
                    and f.ts is not None
                    and labels.get("kind")
                    and "Drain" not in labels.get("alertname", "")
                ):
                    f.seen.setdefault("alert", t0)  # request time: the alert was in by then
            self.stop.wait(max(0.0, self.every_s - (time.time() - t0)))


# ------------------------------------------------------------------ processes


def _spawn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    out = log.open("wb")
    return subprocess.Popen([sys.executable, "-m", "fleetwatch.cli", *args], env=env, stdout=out, stderr=out)


@contextlib.contextmanager
def running(procs: dict[str, subprocess.Popen[bytes]]) -> Iterator[None]:
    """Stop every started process on the way out: SIGTERM (they stop cleanly), then SIGKILL."""
    try:
        yield
    finally:
        stop_processes(procs.values())


def group_ready(bootstrap: str, group: str, timeout_s: float) -> bool:
    """True once the group is Stable with partitions assigned (so no sample or finding is missed)."""
    deadline = time.monotonic() + timeout_s
    with Admin(bootstrap) as admin:
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):  # the group does not exist yet
                state, _members, assigned = admin.describe_group(group)
                if state == "STABLE" and assigned:
                    return True
            time.sleep(0.3)
    return False


def commit_at_end(bootstrap: str, group: str, topic: str) -> None:
    """Give a new consumer group committed offsets at the topic's end (it then starts there)."""
    bus = KafkaBus(bootstrap)
    reader = bus.reader()
    try:
        ends = reader.end_offsets([TopicPart(topic, p) for p in reader.partitions(topic)])
    finally:
        reader.close()
    member = bus.group_consumer(group, client_id=f"{group}-start")  # commits only, never joins
    try:
        member.commit(ends, asynchronous=False)
    finally:
        member.close()


@contextlib.contextmanager
def private_broker(port: int) -> Iterator[str]:
    """A fresh broker of our own on `port` (emptied first), stopped on the way out.

    The shared broker carries other runs' telemetry: a detect worker reading fleet.telemetry.v1
    scores every node on it, so their drain-worthy faults would reach our act (and spend its
    budget, and be drained with our key), and their clocks (simulations run faster than real time)
    would make our nodes look silent. A private broker measures the pipeline alone.
    """
    env = {**os.environ, "KAFKA_PORT": str(port), "KAFKA_CONTROLLER_PORT": str(port + 1)}
    home = Path(os.environ.get("FLEETWATCH_HOME", REPO / ".fleetwatch"))
    script = str(REPO / "services/kafka/kafka.sh")
    subprocess.run(["bash", script, "stop"], env=env, capture_output=True, timeout=120)
    shutil.rmtree(home / f"kafka-{port}", ignore_errors=True)
    r = subprocess.run(["bash", script, "start"], env=env, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise SystemExit(f"kafka.sh start on port {port} failed: {r.stderr.strip()[-500:]}")
    try:
        yield f"127.0.0.1:{port}"
    finally:
        subprocess.run(["bash", script, "stop"], env=env, capture_output=True, timeout=120)
        shutil.rmtree(home / f"kafka-{port}", ignore_errors=True)


# ------------------------------------------------------------------ run


def _what(finding: dict[str, Any]) -> str:
    return f"{finding.get('kind')}/{finding.get('rule')}/{finding.get('severity')}"


def percentiles(xs: list[float]) -> dict[str, float]:
    a = np.asarray(xs)
    return {
        "n": len(xs),
        "p50": float(np.percentile(a, 50)),
        "p95": float(np.percentile(a, 95)),
        "p99": float(np.percentile(a, 99)),
        "max": float(a.max()),
    }


def measure(args: argparse.Namespace, logs: Path) -> dict[str, Any]:
    run_id = secrets.token_hex(3)
    prefix, cluster = f"lat{run_id}", f"latency-{run_id}"
    fault_ticks = [args.warmup + i * args.spacing for i in range(args.faults)]
    n_ticks = fault_ticks[-1] + 1 + args.after
    ticks = healthy_ticks(args.nodes, n_ticks, args.seed, prefix)
    names = sorted(m["node"] for m in ticks[0])
    if args.faults > len(names):
        raise SystemExit(f"--faults {args.faults}: at most one fault per node ({len(names)} nodes)")
    # Distinct nodes spread over the fleet; GPU and port vary so several code paths are exercised.
    step = len(names) // args.faults
    faults = [
        Fault(KINDS[i % len(KINDS)], names[i * step], k, gpu=i % 8, port=i % 8)
        for i, k in enumerate(fault_ticks)
    ]
    by_node = {f.node: f for f in faults}

    env = {
        **os.environ,
        "FLEETWATCH_DRAIN_KEY": secrets.token_hex(32),
        "FLEETWATCH_CENSUS_KEY": secrets.token_hex(32),  # detect's: census and findings
        "PYTHONUNBUFFERED": "1",
    }
    detect_group, act_group = f"latency-detect-{run_id}", f"latency-act-{run_id}"
    wait_for_broker(args.bootstrap, timeout_s=30)
    ensure_topics(args.bootstrap)
    commit_at_end(args.bootstrap, act_group, topics.FINDINGS)
    procs: dict[str, subprocess.Popen[bytes]] = {}
    with running(procs):
        procs["detect"] = _spawn(
            ["detect", "--bootstrap", args.bootstrap, "--group", detect_group, *DETECT_FLAGS],
            env,
            logs / "detect.log",
        )
        procs["act"] = _spawn(
            [
                *("act", "--bootstrap", args.bootstrap, "--group", act_group),
                *("--alertmanager", args.alertmanager, "--cluster", cluster),
                *("--fleet-size", str(args.nodes), "--drain-budget", "1"),
                *("--storm-min-nodes", str(args.nodes + 1), "--no-auto-resume"),
            ],
            env,
            logs / "act.log",
        )
        t_join = time.monotonic()
        for name, group in (("detect", detect_group), ("act", act_group)):
            if not group_ready(args.bootstrap, group, 90):
                raise SystemExit(f"fleetwatch {name} did not join its group; see {logs / name}.log")
        join_s = time.monotonic() - t_join

        kw = KafkaWatch(args.bootstrap, by_node, prefix)
        am = AlertmanagerWatch(args.alertmanager, cluster, by_node, args.am_poll)
        kw.start()
        am.start()
        producer = KafkaBus(args.bootstrap).producer(linger_ms=5)
        start = time.time() + 0.2
        try:
            for k, tick in enumerate(ticks):
                time.sleep(max(0.0, start + k - time.time()))  # 1 Hz of wall clock, no drift
                ts = time.time()
                for f in faults:  # before sending: the finding can be back before flush() returns
                    if f.tick == k:
                        f.ts = ts
                for m in tick:
                    m = inject(m, faults, k)
                    m["ts"] = ts
                    producer.send(topics.TELEMETRY, key=m["node"].encode(), value=schemas.encode(m))
                producer.flush(30)  # an agent sends each sample as it is taken
                for name, p in procs.items():
                    if p.poll() is not None:
                        raise SystemExit(f"fleetwatch {name} exited; see {logs / name}.log")
            deadline = time.time() + args.tail
            while time.time() < deadline and any(len(f.seen) < len(STAGES) for f in faults):
                time.sleep(0.2)
        finally:
            producer.close()
            kw.stop.set()
            am.stop.set()
            kw.join(5)
            am.join(5)

    per_stage = {s: [d[s] for f in faults if (d := f.delays())[s] is not None] for s in STAGES}
    return {
        "nodes": args.nodes,
        "faults": len(faults),
        "telemetry_s": len(ticks),
        "join_s": round(join_s, 1),
        "stats": {s: percentiles(v) if v else None for s, v in per_stage.items()},
        "missed": {s: [f.node for f in faults if s not in f.seen] for s in STAGES},
        "false_findings": len(kw.false_findings),
        "false_by_rule": dict(Counter(_what(m) for m in kw.false_findings)),
        "am_poll_errors": am.errors,
        "per_fault": [{"kind": f.kind, "node": f.node, **f.delays()} for f in faults],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--bootstrap",
        help="use this broker instead of a private one (other traffic on it skews the figures; see above)",
    )
    ap.add_argument("--broker-port", type=int, default=19392, help="port of the private broker (and +1)")
    ap.add_argument("--alertmanager", default="http://127.0.0.1:19094")
    ap.add_argument("--nodes", type=int, default=32)
    ap.add_argument("--faults", type=int, default=15)
    ap.add_argument("--spacing", type=int, default=6, help="seconds between faults")
    ap.add_argument("--warmup", type=int, default=10, help="healthy seconds before the first fault")
    ap.add_argument("--after", type=int, default=5, help="healthy seconds after the last fault")
    ap.add_argument("--tail", type=float, default=15.0, help="max seconds to wait for late observations")
    ap.add_argument("--am-poll", type=float, default=0.1, help="Alertmanager poll period, s")
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="fault-latency-") as tmp, contextlib.ExitStack() as stack:
        if not args.bootstrap:
            args.bootstrap = stack.enter_context(private_broker(args.broker_port))
        try:
            r = measure(args, Path(tmp))
        except SystemExit:
            for log in sorted(Path(tmp).glob("*.log")):  # the logs go with the temp dir: show them
                print(f"--- {log.name} (tail)\n{log.read_text(errors='replace')[-2000:]}", file=sys.stderr)
            raise
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    print(
        f"{r['nodes']} nodes x 8 GPUs at 1 Hz for {r['telemetry_s']} s, {r['faults']} sudden faults "
        f"({', '.join(KINDS)}), detect + act as processes (joined in {r['join_s']} s)"
    )
    cols = " ".join(f"{c:>7}" for c in ("p50 s", "p95 s", "p99 s", "max s"))
    print(f"{'delay from the faulty sample to':<42} {'n':>3} {cols}")
    label = {
        "finding": "(a) finding on fleet.findings.v1",
        "alert": "(b) alert accepted by Alertmanager",
        "drain": "(c) drain request on scheduler.drain.v1",
    }
    for s in STAGES:
        st = r["stats"][s]
        if st is None:
            print(f"{label[s]:<42} {0:>3}       -       -       -       -")
            continue
        vals = " ".join(f"{st[k]:>7.2f}" for k in ("p50", "p95", "p99", "max"))
        print(f"{label[s]:<42} {st['n']:>3} {vals}")
    missed = {s: v for s, v in r["missed"].items() if v}
    print(
        f"target p99 <= 2 s; alert delays are upper bounds by one {args.am_poll:g} s poll; "
        f"missed: {missed or 'none'}; open findings on nodes without a fault (or before it): "
        f"{r['false_findings']} {r['false_by_rule'] or ''}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
