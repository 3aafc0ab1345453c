"""`fleetwatch demo`: the whole pipeline on one machine, with a live view and a scorecard.

It starts a fresh local Kafka broker of its own (ports 19292/19293, emptied at every start, so
each demo begins with no history; `--bootstrap` reuses a broker instead), the local
Alertmanager (:19094) and Prometheus (:19090, scraping the workers below), then runs as
separate processes, exactly as they run in production:
`fleetwatch detect` (metrics on :9108), `fleetwatch act` (alerts + signed drain requests,
metrics on :9110) and `fleetwatch simulate` (the cluster with injected faults). The terminal
shows every injected fault, finding and drain request as it happens, all on the simulated
clock, and says so in one line when the storm guard holds every drain; at the end the
scorecard (per fault kind: recall, precision, detection delay) is printed and written to
`.fleetwatch/demo/scorecard.json`, and `.fleetwatch/demo/fleet.png` plots node health over
time with the injected faults marked.
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import os
import secrets
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import orjson
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.markup import escape

from fleetwatch import topics
from fleetwatch.bus import TopicPart
from fleetwatch.bus.kafka import KafkaBus
from fleetwatch.collectors.sim import load_scenario
from fleetwatch.collectors.sim.cli import live_epoch
from fleetwatch.demo_plot import plot_fleet
from fleetwatch.pipeline.scorecard import busy_spans, format_table, score
from fleetwatch.runtime import stop_processes

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parent.parent
DEMO_KAFKA_PORT = 19292
DETECT_METRICS = 9108
ACT_METRICS = 9110
ALERTMANAGER = "http://127.0.0.1:19094"
PROMETHEUS = "http://127.0.0.1:19090"
SEVERITY_STYLE = {"info": "cyan", "warning": "yellow", "critical": "bold red"}
DEMO_CLUSTER = "demo"
STORM_POLL_S = 1.0


def _sh(script: str, verb: str, env: dict[str, str]) -> None:
    r = subprocess.run(
        ["bash", str(REPO / script), verb], env=env, capture_output=True, text=True, timeout=300
    )
    if r.returncode != 0:
        tail = (r.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"{script} {verb} failed: {tail}")


def start_demo_broker(home: Path) -> str:
    env = {
        **os.environ,
        "FLEETWATCH_HOME": str(home),
        "KAFKA_PORT": str(DEMO_KAFKA_PORT),
        "KAFKA_CONTROLLER_PORT": str(DEMO_KAFKA_PORT + 1),
    }
    _sh("services/kafka/kafka.sh", "stop", env)
    shutil.rmtree(home / f"kafka-{DEMO_KAFKA_PORT}", ignore_errors=True)  # every demo starts empty
    _sh("services/kafka/kafka.sh", "start", env)
    bootstrap = f"127.0.0.1:{DEMO_KAFKA_PORT}"
    # A broker started for another checkout (its own FLEETWATCH_HOME) may still hold the port: this
    # stop cannot see it, and its old telemetry would be scored as this run's findings.
    bus = KafkaBus(bootstrap)
    bus.wait_for_broker()
    leftover = sorted(t for t in bus.list_topics() if t.startswith("fleet."))
    if leftover:
        raise SystemExit(
            f"fleetwatch demo: the broker on port {DEMO_KAFKA_PORT} is not a fresh one (it holds "
            f"{', '.join(leftover[:3])}, ...): another checkout's demo broker is still running; stop it "
            f"(FLEETWATCH_HOME=<its .fleetwatch> KAFKA_PORT={DEMO_KAFKA_PORT} services/kafka/kafka.sh stop)"
        )
    return bootstrap


def _spawn(args: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    out = log_path.open("wb")
    return subprocess.Popen(
        [sys.executable, "-m", "fleetwatch.cli", *args], env=env, stdout=out, stderr=out, cwd=REPO
    )


def _worker_ready(proc: subprocess.Popen[bytes], metrics_port: int, group: str, timeout_s: float) -> bool:
    """True once the worker itself reports input partitions (its fleetwatch_worker_partitions).

    The broker's view of the group is not enough: a member can be assigned there and still be
    restoring state, or stuck in its join, so the simulation would start before anyone reads."""
    deadline = time.monotonic() + timeout_s
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                text = resp.read().decode()
        except OSError:  # not serving yet
            text = ""
        for family in text_string_to_metric_families(text):
            if family.name == "fleetwatch_worker_partitions" and any(
                s.labels.get("group") == group and s.value > 0 for s in family.samples
            ):
                return True
        time.sleep(0.3)
    return False


class SimClock:
    """Wall time -> the simulated clock, for what act stamps on the wall clock (drain requests, the
    storm alert), so that the console shows one clock.

    The demo picks the simulation's epoch (simulated second 0) and passes it to the simulator, which
    stamps tick k `epoch + k*dt` and sends it at wall `wall0 + k*dt/speed` (collectors/sim/cli.py):
    simulated = wall * speed + offset. wall0 is when the simulator's loop starts, a second or two
    after it is spawned (`started`), which at 10x would misplace drains by 10-20 s; so the offset
    is learned from the simulator's records: each gives ts - CreateTime * speed, never above the
    true offset (a record is sent at or after its time), and the largest is the estimate. Before
    the first record, `started` stands in for wall0."""

    def __init__(self, epoch: float, started: float, speed: float) -> None:
        self.epoch = epoch
        self.started = started
        self.speed = speed
        self.offset: float | None = None

    def observe(self, ts: float, sent_wall: float) -> None:
        if sent_wall < self.started:  # a record of an earlier run on a reused broker
            return
        bound = ts - sent_wall * self.speed
        if self.offset is None or bound > self.offset:
            self.offset = bound

    def at(self, wall: float) -> float:
        if self.offset is None:
            return self.epoch + (wall - self.started) * self.speed
        return wall * self.speed + self.offset


class StormWatch:
    """Follows act's FleetwatchDrainStorm alert in Alertmanager: act writes no Kafka message when
    its storm guard holds drains, and the alert is what on-call sees, with the numbers (node_count,
    threshold, window_s, drains_held) in its annotations. Alerts last updated before `since` are an
    earlier run's, still waiting out their endsAt."""

    def __init__(self, url: str, cluster: str, since: float) -> None:
        query = urllib.parse.urlencode(
            [("filter", 'alertname="FleetwatchDrainStorm"'), ("filter", f'cluster="{cluster}"')]
        )
        self.url = f"{url}/api/v2/alerts?{query}"
        self.since = since

    def poll(self) -> tuple[dict[str, Any], float] | None:
        """(annotations, wall time it was declared) of this run's active storm alert, if any;
        OSError when Alertmanager does not answer."""
        with urllib.request.urlopen(self.url, timeout=2) as resp:
            alerts = orjson.loads(resp.read())
        for a in alerts:
            updated = _unix(a["updatedAt"])
            if updated >= self.since:
                # startsAt is the declaration unless Alertmanager merged this into an earlier run's
                # alert (it keeps the earliest start); then the first update of this run is.
                starts = _unix(a["startsAt"])
                return a["annotations"], starts if starts >= self.since else updated
        return None


def _unix(rfc3339: str) -> float:
    return dt.datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()


def storm_from_annotations(ann: dict[str, str], declared_t: float) -> dict[str, Any]:
    """The scorecard's drain_storm from the storm alert's annotations."""
    shown = ann.get("nodes", "").split(" and ")[0]
    return {
        "node_count": int(ann["node_count"]),
        "threshold": int(ann["threshold"]),
        "window_s": float(ann["window_s"]),
        "drains_held": int(ann["drains_held"]),
        "nodes": [n for n in shown.split(", ") if n],
        "declared_t": round(declared_t, 1),
        "over_t": None,
    }


class LiveView:
    """Follows truth, findings and drain requests and prints them; keeps them for the scorecard.
    Everything is printed on the simulated clock (SimClock for what act stamps on the wall clock)."""

    TOPICS = (topics.TRUTH, topics.FINDINGS, topics.DRAIN, topics.JOBS, topics.DEADLETTER)

    def __init__(
        self, bootstrap: str, console: Console, clock: SimClock, storms: StormWatch | None = None
    ) -> None:
        self.console = console
        self.epoch = clock.epoch
        self.clock = clock
        self.storms = storms
        self.storm: dict[str, Any] | None = None  # this run's storm, for the scorecard
        self._storm_active = False
        self._next_storm_poll = 0.0
        self.reader = KafkaBus(bootstrap).reader()
        tps = []
        for t in self.TOPICS:
            parts = self.reader.partitions(t, wait_s=30)  # metadata of a just-created topic lags
            if not parts:
                raise RuntimeError(f"topic {t} has no partitions on the broker")
            tps += [TopicPart(t, p) for p in parts]
        self.reader.assign(tps, "beginning")
        self.truths: list[dict[str, Any]] = []
        self.findings: list[dict[str, Any]] = []
        self.drains: list[dict[str, Any]] = []
        self.jobs: list[dict[str, Any]] = []
        self.deadletters = 0
        self._seen: set[str] = set()
        self.last_event = time.monotonic()

    def t(self, ts: float) -> str:
        return f"t={ts - self.epoch:6.1f}s"

    def poll(self) -> None:
        for r in self.reader.poll(0.3):
            self.last_event = time.monotonic()
            if r.topic == topics.DEADLETTER:
                self.deadletters += 1
                continue
            if r.value is None:  # a tombstone (an old job the job publisher forgot): nothing to show
                continue
            m = orjson.loads(r.value)
            if r.topic in (topics.TRUTH, topics.JOBS) and r.timestamp_ms >= 0:
                self.clock.observe(m["onset_ts" if r.topic == topics.TRUTH else "ts"], r.timestamp_ms / 1000)
            if r.topic == topics.TRUTH:
                self.truths.append(m)
                if "end_ts" not in m or m.get("end_ts") == m.get("onset_ts"):
                    where = m["node"] + (f" GPU{m['gpu']}" if m.get("gpu") is not None else "")
                    self.console.print(
                        f"[dim]{self.t(m['onset_ts'])}[/]  [magenta]INJECT[/]   {escape(m['fault']):<18} "
                        f"{escape(where)}"
                    )
            elif r.topic == topics.FINDINGS:
                self.findings.append(m)
                key = f"{m['id']}:{m['severity']}:{m['resolved']}"
                if key in self._seen:
                    continue
                self._seen.add(key)
                style = "green" if m["resolved"] else SEVERITY_STYLE.get(m["severity"], "white")
                label = "RESOLVED" if m["resolved"] else m["severity"].upper()
                # the summary names what the node's agent sent: text, never Rich markup
                self.console.print(
                    f"[dim]{self.t(m['ts'])}[/]  [{style}]{label:<8}[/] {escape(m['summary'])}"
                )
            elif r.topic == topics.DRAIN:
                self.drains.append(m)
                self.console.print(
                    f"[dim]{self.t(self.clock.at(m['issued_at']))}[/]  "
                    f"[bold blue]{m['action'].upper():<8}[/] {m['node']}: {escape(m['reason'])}"
                )
            elif r.topic == topics.JOBS:
                self.jobs.append(m)
        self._poll_storm()

    def _poll_storm(self) -> None:
        """Once a second: print the storm guard holding drains, and its end, one line each."""
        if self.storms is None or time.monotonic() < self._next_storm_poll:
            return
        self._next_storm_poll = time.monotonic() + STORM_POLL_S
        try:
            seen = self.storms.poll()
        except (OSError, ValueError, KeyError):  # Alertmanager away or an unexpected answer
            return
        if seen is not None:
            self._storm_seen(*seen)
        elif self._storm_active:
            self._storm_over()

    def _storm_seen(self, ann: dict[str, str], declared: float) -> None:
        try:
            storm = storm_from_annotations(ann, self.clock.at(declared) - self.epoch)
        except (KeyError, ValueError):  # an act without the storm numbers: nothing to report
            return
        if self._storm_active and self.storm is not None:  # it grew: keep its start, new numbers
            self.storm.update({k: v for k, v in storm.items() if k not in ("declared_t", "over_t")})
            return
        self._storm_active, self.storm = True, storm
        self.console.print(
            f"[dim]{self.t(self.clock.at(declared))}[/]  [bold magenta]STORM[/]    drains held: "
            f"{storm['node_count']} nodes became drain-worthy within {storm['window_s']:g} s "
            f"(storm threshold {storm['threshold']}), a likely shared cause; no node is drained "
            "while it lasts"
        )

    def _storm_over(self) -> None:
        self._storm_active = False
        now = self.clock.at(time.time())
        if self.storm is not None:
            self.storm["over_t"] = round(now - self.epoch, 1)
        self.console.print(f"[dim]{self.t(now)}[/]  [bold magenta]STORM[/]    over: drains are allowed again")

    def close(self) -> None:
        self.reader.close()


def run(args: argparse.Namespace) -> int:
    console = Console(stderr=False, highlight=False)
    out_dir = REPO / ".fleetwatch" / "demo"
    out_dir.mkdir(parents=True, exist_ok=True)
    overrides = {"nodes": args.nodes, "duration": args.duration, "seed": args.seed}
    sc = load_scenario(args.scenario, overrides)  # fail fast on a bad scenario

    console.rule("[bold]fleetwatch demo")
    if args.bootstrap:
        bootstrap = args.bootstrap
        console.print(f"using the Kafka broker at {bootstrap}")
    else:
        console.print("starting a fresh local Kafka broker (KRaft) ...")
        bootstrap = start_demo_broker(REPO / ".fleetwatch")
    bus = KafkaBus(bootstrap)
    bus.wait_for_broker()
    bus.ensure_topics()
    _sh("services/alertmanager/alertmanager.sh", "start", dict(os.environ))
    prom_env = {**os.environ, "FLEETWATCH_CLUSTER": "demo"}
    _sh("services/prometheus/prometheus.sh", "start", prom_env)
    for job, port in (("fleetwatch-detect", DETECT_METRICS), ("fleetwatch-act", ACT_METRICS)):
        subprocess.run(
            ["bash", str(REPO / "services/prometheus/prometheus.sh"), "target", job, f"127.0.0.1:{port}"],
            env=prom_env,
            check=True,
            capture_output=True,
            timeout=30,
        )
    console.print(f"Kafka {bootstrap}, Alertmanager {ALERTMANAGER}, Prometheus {PROMETHEUS}")

    run_id = secrets.token_hex(3)
    env = {
        **os.environ,
        "FLEETWATCH_DRAIN_KEY": secrets.token_hex(32),
        "FLEETWATCH_CENSUS_KEY": secrets.token_hex(32),  # detect's: census and findings
        "PYTHONUNBUFFERED": "1",
    }
    procs: dict[str, subprocess.Popen[bytes]] = {}
    detect_group, act_group = f"demo-detect-{run_id}", f"demo-act-{run_id}"
    # the deployment file (--config, or $FLEETWATCH_CONFIG, which the workers inherit anyway):
    # its settings are the workers'; the flags below, the demo's own, override it
    conf = ["--config", args.config] if getattr(args, "config", None) else []
    procs["detect"] = _spawn(
        [
            "detect",
            "--bootstrap",
            bootstrap,
            "--metrics-port",
            str(DETECT_METRICS),
            "--group",
            detect_group,
            "--start-at",
            "latest" if args.bootstrap else "earliest",
            "--time-scale",
            str(sc.detector_time_scale),
            # the simulator sends at --speed: silences are judged on the broker's clock
            "--arrival-speed",
            str(args.speed),
            *conf,
        ],
        env,
        out_dir / "detect.log",
    )
    # Demo-sized safety limits: at 2% a 32-node fleet could drain nothing, and the default scenario
    # injects several drain-worthy faults within a minute, which the default storm guard would read
    # as a shared cause (see alerts/README.md).
    budget = max(args.drain_budget, 4 / sc.nodes)
    act_started = time.time()
    procs["act"] = _spawn(
        [
            "act",
            "--bootstrap",
            bootstrap,
            "--alertmanager",
            ALERTMANAGER,
            "--metrics-port",
            str(ACT_METRICS),
            "--group",
            act_group,
            "--fleet-size",
            str(sc.nodes),
            "--drain-budget",
            f"{budget:.4f}",
            "--storm-min-nodes",
            "6",
            "--cluster",
            DEMO_CLUSTER,
            *conf,
        ],
        env,
        out_dir / "act.log",
    )
    try:
        for name, group, port in (
            ("detect", detect_group, DETECT_METRICS),
            ("act", act_group, ACT_METRICS),
        ):
            if not _worker_ready(procs[name], port, group, 60):
                raise RuntimeError(f"fleetwatch {name} did not get its partitions; see {out_dir}/{name}.log")
        # The demo chooses simulated second 0 (as the simulator would: early enough that no sample
        # is stamped after it is sent) and gives it to the simulator, so that it knows the clock
        # that the simulator's samples, and so the findings, are stamped on.
        started = time.time()
        epoch = live_epoch(started, sc.duration_s, args.speed)
        wall = sc.duration_s / args.speed if args.speed else 0
        console.print(
            f"simulating {sc.nodes} nodes x {sc.gpus_per_node} GPUs for {sc.duration_s:.0f} s "
            f"at {args.speed:g}x (~{wall:.0f} s), {len(sc.faults)} injected faults"
        )
        console.print(
            f"metrics: http://127.0.0.1:{DETECT_METRICS}/metrics (detect), "
            f"http://127.0.0.1:{ACT_METRICS}/metrics (act); alerts: {ALERTMANAGER}/#/alerts"
        )
        console.rule()
        sim_args = [
            "simulate",
            "--bootstrap",
            bootstrap,
            "--speed",
            str(args.speed),
            "--epoch",
            f"{epoch:.6f}",
        ]
        if args.scenario:
            sim_args += ["--scenario", args.scenario]
        for flag, value in (("--nodes", args.nodes), ("--duration", args.duration), ("--seed", args.seed)):
            if value is not None:
                sim_args += [flag, str(value)]
        storms = StormWatch(ALERTMANAGER, DEMO_CLUSTER, act_started)
        view = LiveView(bootstrap, console, SimClock(epoch, started, args.speed), storms)
        procs["simulate"] = _spawn(sim_args, env, out_dir / "simulate.log")
        while procs["simulate"].poll() is None:
            view.poll()
            for name in ("detect", "act"):
                if procs[name].poll() is not None:
                    raise RuntimeError(f"fleetwatch {name} exited; see {out_dir}/{name}.log")
        if procs["simulate"].returncode != 0:
            raise RuntimeError(f"the simulator failed; see {out_dir}/simulate.log")
        # Let the detectors and the action layer finish what is in flight.
        while time.monotonic() - view.last_event < args.settle:
            view.poll()
        view.close()
    finally:
        stop_processes(procs.values())

    end = epoch + sc.duration_s
    card = score(
        view.findings,
        view.truths,
        [sc.node_name(i) for i in range(sc.nodes)],
        epoch,
        end,
        sc.interval_s,
        busy=busy_spans(view.jobs),
    )
    card.drain_storm = view.storm
    console.rule("[bold]scorecard")
    console.print(format_table(card))
    drains = [d for d in view.drains if d["action"] == "drain"]
    console.print(
        f"drain requests: {len(drains)} ({', '.join(sorted({d['node'] for d in drains})) or 'none'}); "
        f"dead letters: {view.deadletters}"
    )
    (out_dir / "scorecard.json").write_bytes(orjson.dumps(card.to_json(), option=orjson.OPT_INDENT_2))
    png = out_dir / "fleet.png"
    plot_fleet(view.findings, view.truths, [sc.node_name(i) for i in range(sc.nodes)], epoch, end, png)
    console.print(f"written: {out_dir / 'scorecard.json'}, {png}; logs in {out_dir}/")
    console.print(
        f"Prometheus {PROMETHEUS} keeps scraping (try fleetwatch_node_health_score); dashboards: import "
        "dashboards/json/*.json into Grafana with that Prometheus as its data source, or run "
        "`docker compose up` for the whole stack with Grafana provisioned"
    )
    return 0
