"""Every metric the dashboards and alert rules query is really exported: a real Prometheus
(Debian package, started with services/prometheus/prometheus.sh) scrapes a real `fleetwatch detect`,
`fleetwatch act` and `fleetwatch collect` while `fleetwatch simulate` feeds the detect worker a
small cluster with faults (and one malformed message, for the dead-letter and reject series);
then each name the dashboards' queries and the rules select must be in Prometheus'
/api/v1/label/__name__/values, each panel query must run, and each template variable must
resolve.

Isolation: the broker is this test process's own (scripts/test.sh gives the other process
another: a detect or act of its tests would otherwise read this test's records, and this one
theirs). On it, the workers run in consumer groups of their own whose offsets are committed at the
current end of their input topics before anything is produced, so they read only what the tests
of this process produce from then on, not the topics' history (and need no --start-at flag).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import orjson
import pytest
import yaml

from fleetwatch import topics
from fleetwatch.bus.admin import ensure_topics
from fleetwatch.detectors.findings import make_finding
from fleetwatch.signing import encode_signed
from tests.helpers.paths import REPO
from tests.helpers.promql import (
    PROMETHEUS_BUILTINS,
    dashboard_metric_names,
    dashboard_queries,
    load_dashboards,
    metric_names,
)
from tests.integration.services import USES_SLURM, Slurm, commit_offsets, end_offsets, send

pytestmark = USES_SLURM

PROMETHEUS_SH = REPO / "services" / "prometheus" / "prometheus.sh"
RULES = REPO / "services" / "prometheus" / "rules" / "fleetwatch-pipeline.yml"
CLUSTER = "scrape-test"
DETECT_INPUTS = (topics.TELEMETRY, topics.NODE_FEATURES, topics.STEPS, topics.JOBS)
# the loop ends as soon as every series is there; on a loaded CI machine (two pytest processes,
# a test's detect workers beside this one) 75 s was not enough for the first drain request
SCRAPE_DEADLINE_S = 180.0
# Series that exist only after an event the scrape test cannot cause without more services: a
# spool overflow needs a long broker outage. Their unlabelled counters are exported from the
# start (value 0), so they are seen; nothing is excused here today. Keep this empty unless a
# metric truly cannot appear, and say why next to it.
NOT_PROVABLE_HERE: dict[str, str] = {}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_json(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def commit_at_end(bootstrap: str, group: str, topic_names: tuple[str, ...]) -> None:
    """Give a new consumer group committed offsets at the current end of its input topics."""
    ends = end_offsets(bootstrap, topic_names)
    assert ends, f"no partitions for {topic_names}"
    commit_offsets(bootstrap, group, ends)


def wait_for_log(path: Path, text: str, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text(errors="replace"):
            return True
        time.sleep(0.2)
    return False


def scenario(path: Path, prefix: str) -> Path:
    # 8 nodes for 120 simulated seconds: long enough for the statistical detector's warm-up (anomaly
    # scores appear after ~50 samples), with faults that make hardware, straggler, drain and
    # resolved-finding series.
    doc = {
        "name": "scrape",
        "seed": 11,
        "nodes": 8,
        "node_prefix": prefix,
        "duration_s": 120,
        "jobs": {"sizes": [4], "duration_s": [600, 900], "step_time_s": [0.8, 1.0], "startup_s": [2, 3]},
        "faults": [
            {"kind": "xid79", "node": 2, "gpu": 3, "onset_s": 20},
            {"kind": "ib_link_down", "node": 5, "onset_s": 30},
            {"kind": "straggler", "node": 7, "onset_s": 5, "slowdown": 0.25},
            # Silences that end: the resolved-findings series exists only once a finding resolved
            # (two nodes, in case one is alone on its partition, where event time would not move).
            {"kind": "node_down", "node": 4, "onset_s": 40, "duration_s": 30},
            {"kind": "node_down", "node": 6, "onset_s": 50, "duration_s": 30},
        ],
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def accounting_history(
    prefix: str, census_key: str, findings_topic: str, bootstrap: str
) -> list[tuple[bytes, bytes]]:
    """job/1 records for the accounting stage (the finding goes to its own topic here)."""
    now = time.time()
    start = now - 7200
    f = make_finding(node=f"{prefix}acc1", kind="ecc", rule="dbe", severity="critical", score=1.0,
                     summary="double-bit ECC", evidence={}, first_seen=now - 100, ts=now - 100)  # fmt: skip
    send(bootstrap, findings_topic, [(f["node"].encode(), encode_signed(f, census_key.encode()))])
    out = []
    for job, node, state, end_state in (
        ("acc-a", "acc1", "failed", "FAILED"),
        ("acc-b", "acc2", "finished", "COMPLETED"),
    ):
        base = {"schema": "job/1", "job": job, "nodes": [f"{prefix}{node}"], "gpus": [8], "start_ts": start}
        out.append((job.encode(), orjson.dumps({**base, "state": "started", "ts": start})))
        out.append((job.encode(), orjson.dumps({**base, "state": state, "ts": now, "end_state": end_state})))
    out.append((b"acc-c", b"{not json"))  # a data-quality line
    return out


@dataclass
class Stack:
    prom_url: str
    env: dict[str, str]
    seen: set[str]
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    logs: dict[str, Path] = field(default_factory=dict)

    def query(self, expr: str) -> dict[str, Any]:
        url = f"{self.prom_url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        try:
            return http_json(url)
        except urllib.error.HTTPError as e:  # 400 = PromQL error: the body says which
            return json.loads(e.read())

    def log_tail(self) -> str:
        return "\n".join(f"--- {n}\n{p.read_text(errors='replace')[-1500:]}" for n, p in self.logs.items())


def names_needed() -> dict[str, set[str]]:
    """metric name -> where it is used (dashboards and the rules file)."""
    needed = dashboard_metric_names(load_dashboards())
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            for n in metric_names(rule["expr"]):
                needed.setdefault(n, set()).add(f"rule {rule['alert']}")
    return needed


def prometheus_sh(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(PROMETHEUS_SH), *args], env=env, capture_output=True, text=True, timeout=60
    )


@pytest.fixture(scope="module")
def stack(kafka_bootstrap: str, slurm: Slurm, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    if shutil.which("prometheus") is None:
        pytest.fail("prometheus not found: apt-get install prometheus (scripts/install.sh installs it)")
    tmp = tmp_path_factory.mktemp("scrape")
    run = uuid.uuid4().hex[:6]
    prefix = f"scr{run}-"
    ports = {name: free_port() for name in ("prometheus", "detect", "act", "agent", "slurm-jobs", "account")}
    env = {
        **os.environ,
        "FLEETWATCH_HOME": str(tmp / "home"),  # Prometheus data and target files: private to this test
        "PROMETHEUS_PORT": str(ports["prometheus"]),
        "PROMETHEUS_SCRAPE_INTERVAL": "1s",
        "FLEETWATCH_CLUSTER": CLUSTER,
        # A key of its own: act adopts the drains on scheduler.drain.v1 signed with its key as its
        # own, so a shared key would inherit earlier runs' drains and their budget.
        "FLEETWATCH_DRAIN_KEY": uuid.uuid4().hex,
    }
    r = prometheus_sh(env, "start")
    if r.returncode != 0:
        pytest.fail(f"prometheus.sh start failed: {r.stderr}")
    prom_url = f"http://127.0.0.1:{ports['prometheus']}"
    st = Stack(prom_url=prom_url, env=env, seen=set())
    opened: list[IO[bytes]] = []

    def spawn(name: str, *args: str) -> None:
        st.logs[name] = tmp / f"{name}.log"
        out = st.logs[name].open("wb")
        opened.append(out)
        st.procs[name] = subprocess.Popen(
            [sys.executable, "-m", "fleetwatch.cli", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=REPO,
        )

    try:
        detect_group, act_group = f"scrape-detect-{run}", f"scrape-act-{run}"
        # act's operator switches and Slurm's view of the nodes on private topics: another test's pause
        # or maintenance on the shared ones must not hold this act's drains
        control, slurm_nodes = f"scrape.control.{run}", f"scrape.slurmnodes.{run}"
        commit_at_end(kafka_bootstrap, detect_group, DETECT_INPUTS)
        commit_at_end(kafka_bootstrap, act_group, (topics.FINDINGS,))
        for job, port in (
            ("fleetwatch-detect", "detect"),
            ("fleetwatch-act", "act"),
            ("fleetwatch-agent", "agent"),
            ("fleetwatch-slurm-jobs", "slurm-jobs"),
            ("fleetwatch-account", "account"),
        ):
            r = prometheus_sh(env, "target", job, f"127.0.0.1:{ports[port]}")
            assert r.returncode == 0, r.stderr
        b = kafka_bootstrap
        spawn("detect", "detect", "--bootstrap", b, "--metrics-port", str(ports["detect"]),
              "--group", detect_group, "--snapshot-every", "2")  # fmt: skip
        # Nothing listens on the Alertmanager port: act buffers its alerts and counts failed posts.
        spawn("act", "act", "--bootstrap", b, "--metrics-port", str(ports["act"]), "--group", act_group,
              "--alertmanager", f"http://127.0.0.1:{free_port()}", "--cluster", CLUSTER, "--fleet-size", "8",
              "--budget-min-nodes", "1", "--resend-interval", "1", "--instance-id", f"scrape-{run}",
              "--snapshot-every", "2", "--control-topic", control,
              "--slurm-nodes-topic", slurm_nodes)  # fmt: skip
        # The agent on this (GPU-less) machine: host and net sources work, NVML does not.
        spawn("agent", "collect", "--bootstrap", b, "--metrics-port", str(ports["agent"]),
              "--source", "nvml,host,net", "--interval", "0.5", "--node", f"{prefix}agent",
              "--spool-dir", str(tmp / "spool"))  # fmt: skip
        # The job publisher beside the local slurmctld, on a topic of its own.
        spawn("slurm-jobs", "slurm-jobs", "--bootstrap", b, "--metrics-port", str(ports["slurm-jobs"]),
              "--slurm-conf", slurm.conf, "--topic", f"scrape.jobs.{run}", "--interval", "1")  # fmt: skip
        # The accounting stage, on topics of its own with a history that makes every figure (a
        # hardware failure with its finding, a completed job, one refused record), so that the
        # Reliability dashboard's series exist: every job counts for r_f and ETTR here.
        acc = {
            name: f"scrape.acc.{run}.{name}"
            for name in ("jobs", "steps", "findings", "results", "nodes", "slurm_nodes")
        }
        ensure_topics(b, list(acc.values()))
        send(b, acc["jobs"], accounting_history(prefix, env["FLEETWATCH_CENSUS_KEY"], acc["findings"], b))
        spawn("account", "account", "--bootstrap", b, "--metrics-port", str(ports["account"]),
              "--db", str(tmp / "accounting.sqlite"), "--refresh-every", "1s", "--large-gpus", "0",
              "--ettr-min", "1s", "--jobs-topic", acc["jobs"], "--steps-topic", acc["steps"],
              "--findings-topic", acc["findings"], "--results-topic", acc["results"],
              "--nodes-topic", acc["nodes"], "--slurm-nodes-topic", acc["slurm_nodes"])  # fmt: skip
        # Both groups hold their partitions before anything is produced: a worker that is still
        # joining when the findings arrive would make this test slow, not wrong, but one that never
        # gets partitions is a bug to report, not to wait out.
        # 60 s: a join took up to ~25 s on a broker loaded by a long session, before consumers
        # loaded their metadata ahead of joining (kafka-python's clients, replaced since).
        for name, topic in (("detect", topics.TELEMETRY), ("act", topics.FINDINGS)):
            if not wait_for_log(st.logs[name], f"'{topic}:", 60.0):
                pytest.fail(f"fleetwatch {name} got no {topic} partitions in 60 s:\n{st.log_tail()}")
        sim = subprocess.run(
            [sys.executable, "-m", "fleetwatch.cli", "simulate", "--bootstrap", b,
             "--scenario", str(scenario(tmp / "scenario.yaml", prefix)), "--speed", "0"],
            capture_output=True, text=True, timeout=120, env=env, cwd=REPO,
        )  # fmt: skip
        assert sim.returncode == 0, sim.stderr[-2000:]
        # One malformed telemetry message: the dead-letter and reject series exist only once one happened.
        send(b, topics.TELEMETRY, [(f"{prefix}0001".encode(), b'{"schema": "telemetry/1"}')], timeout_s=10)
        # ... and one on each of act's control and Slurm-node topics (act made them at start): the
        # refused-records series of the dashboard exist only once act refused one.
        send(b, control, [(b"drain_pause", b'{"schema": "control/1"}')], timeout_s=10)
        send(b, slurm_nodes, [(f"{prefix}0001".encode(), b'{"schema": "slurm_node/1"}')], timeout_s=10)

        needed = set(names_needed()) - set(NOT_PROVABLE_HERE)
        deadline = time.monotonic() + SCRAPE_DEADLINE_S
        while time.monotonic() < deadline:
            st.seen = set(http_json(f"{prom_url}/api/v1/label/__name__/values")["data"])
            if needed <= st.seen:
                break
            for name, proc in st.procs.items():
                if proc.poll() is not None:
                    pytest.fail(f"fleetwatch {name} exited with {proc.returncode}:\n{st.log_tail()}")
            time.sleep(1.0)
        yield st
    finally:
        for proc in st.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in st.procs.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        for f in opened:
            f.close()
        r = prometheus_sh(env, "stop")
        assert r.returncode == 0, r.stderr


def test_every_queried_metric_is_exported(stack: Stack) -> None:
    needed = names_needed()
    missing = {
        n: sorted(where) for n, where in needed.items() if n not in stack.seen and n not in NOT_PROVABLE_HERE
    }
    assert not missing, (
        f"queried but not in Prometheus after {SCRAPE_DEADLINE_S:.0f} s of scraping: {missing}\n"
        f"{stack.log_tail()}"
    )
    fleetwatch = {n for n in needed if n not in PROMETHEUS_BUILTINS}
    assert len(fleetwatch) >= 30, sorted(fleetwatch)  # the dashboards really cover the exporters


def _concrete(expr: str) -> str:
    # Grafana's variables and macros as Grafana would send them with "All" selected.
    for var, value in (("$__rate_interval", "15s"), ("$__interval", "5s"), ("$__range", "5m")):
        expr = expr.replace(var, value)
    for var in ("cluster", "node", "job", "gpu", "signal"):
        expr = expr.replace(f"${var}", ".*")
    assert "$" not in expr, expr
    return expr


def test_every_panel_query_runs(stack: Stack) -> None:
    failed = []
    for dash_name, dash in load_dashboards().items():
        for where, expr in dashboard_queries(dash):
            if where.startswith("variable"):
                continue
            res = stack.query(_concrete(expr))
            if res.get("status") != "success":
                failed.append(f"{dash_name} {where}: {res.get('error')}")
    assert not failed, "\n".join(failed)
    # Series that must have data after this run, queried without rate(): the test stops as soon as
    # every name was scraped once, before a rate window holds two samples.
    for expr in (
        f'min by (node) (fleetwatch_node_health_score{{cluster="{CLUSTER}"}})',
        f'sum by (topic) (fleetwatch_worker_messages_total{{cluster="{CLUSTER}"}})',
        f'max by (gpu) (fleetwatch_gpu_anomaly_score{{cluster="{CLUSTER}"}})',
        f'max by (exported_job, node) (fleetwatch_job_node_slowdown{{cluster="{CLUSTER}"}})',
        f'sum by (reason, source_topic) (fleetwatch_deadletter_total{{cluster="{CLUSTER}"}})',
    ):
        res = stack.query(expr)
        assert res["status"] == "success" and res["data"]["result"], f"no data for {expr}"


def test_the_reliability_figures_are_the_account_historys(stack: Stack) -> None:
    # The accounting stage's history (accounting_history): one failed job blamed on its node's
    # double-bit ECC finding, one completed job, one record that is not JSON. The Reliability
    # dashboard's series carry exactly these, as Prometheus scraped them from `fleetwatch account`.
    c = f'cluster="{CLUSTER}"'
    want = {
        f"sum by (category) (fleetwatch_reliability_job_ends{{{c}}})": {"hardware": 1.0, "completed": 1.0},
        f"sum by (component) (fleetwatch_reliability_infra_failures{{{c}}})": {"gpu_memory": 1.0},
    }
    got: dict[str, dict[str, float]] = {}
    deadline = time.monotonic() + 30.0  # the stage refreshes its figures every second
    while time.monotonic() < deadline:
        got = {expr: _by_label(stack.query(expr)) for expr in want}
        if got == want:
            break
        time.sleep(1.0)
    assert got == want
    # the line is refused:TOPIC:REASON, the topic being this run's own jobs topic
    lines = _by_label(stack.query(f"sum by (what) (fleetwatch_reliability_data_quality{{{c}}})"))
    assert [(what.split(":")[0], n) for what, n in lines.items()] == [("refused", 1.0)], lines


def _by_label(res: dict[str, Any]) -> dict[str, float]:
    """An instant vector summed by one label, as {label value: value}."""
    assert res.get("status") == "success", res
    return {next(iter(r["metric"].values()), ""): float(r["value"][1]) for r in res["data"]["result"]}


def test_oncall_controls_read_as_this_act_runs(stack: Stack) -> None:
    # The fleet overview's on-call stats read a live, unpaused act with nobody holding a node as
    # LIVE / ACTIVE / 0 (value mappings 0 -> LIVE, ACTIVE), and the records this test forged show
    # as refused `malformed` on the control and Slurm-node panel.
    c = f'cluster="{CLUSTER}"'
    for expr, want in (
        (f"max(fleetwatch_act_dry_run{{{c}}})", 0.0),
        (f"max(fleetwatch_act_drains_paused{{{c}}})", 0.0),
        (f"max(fleetwatch_act_drains_paused_until_seconds{{{c}}})", 0.0),
        (f"sum(fleetwatch_act_nodes_held{{{c}}})", 0.0),
        (f"sum(fleetwatch_act_resumed_by_hand_total{{{c}}})", 0.0),
        (f'sum(fleetwatch_act_validations_total{{{c}, outcome=~"passed|failed"}})', 0.0),
        (f'sum(fleetwatch_act_control_refused_total{{{c}, reason="malformed"}})', 1.0),
        (f'sum(fleetwatch_act_slurm_nodes_refused_total{{{c}, reason="malformed"}})', 1.0),
    ):
        # act refuses the fixture's malformed records a moment after they are sent, and Prometheus
        # scrapes every second: wait for it (the series themselves exist from the start)
        deadline = time.monotonic() + 20
        while True:
            res = stack.query(expr)
            assert res["status"] == "success" and res["data"]["result"], f"no data for {expr}"
            got = float(res["data"]["result"][0]["value"][1])
            if got == want or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert got == want, (expr, res["data"]["result"])
    # both outcomes are exported from the start, so increase() sees the first validation
    res = stack.query(f"fleetwatch_act_validations_total{{{c}}}")
    assert {s["metric"]["outcome"] for s in res["data"]["result"]} == {"passed", "failed"}


def test_template_variables_resolve(stack: Stack) -> None:
    # label_values(SELECTOR, LABEL) as Grafana runs it: /api/v1/label/LABEL/values?match[]=SELECTOR.
    for dash_name, dash in load_dashboards().items():
        for var in dash["templating"]["list"]:
            if var["type"] != "query":
                continue
            inner = var["query"]["query"].removeprefix("label_values(").removesuffix(")")
            selector, label = (s.strip() for s in inner.rsplit(",", 1))
            selector = _concrete(selector)
            url = f"{stack.prom_url}/api/v1/label/{label}/values?" + urllib.parse.urlencode(
                {"match[]": selector}
            )
            values = http_json(url)["data"]
            assert values, f"{dash_name}: variable {var['name']} ({var['query']['query']}) has no values"
            if var["name"] == "cluster":
                assert CLUSTER in values


def test_training_job_label_is_exported_job(stack: Stack) -> None:
    # fleetwatch labels per-job series `job`; Prometheus keeps `job` for the scrape job and renames
    # the exported one, which is why the dashboards filter on exported_job.
    res = stack.query(f'fleetwatch_job_node_slowdown{{cluster="{CLUSTER}"}}')
    assert res["data"]["result"], "no per-job series"
    for s in res["data"]["result"]:
        assert s["metric"]["job"] == "fleetwatch-detect" and s["metric"]["exported_job"], s["metric"]


def test_alert_rules_load_and_evaluate(stack: Stack) -> None:
    expected = {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}
    deadline = time.monotonic() + 10
    while True:
        groups = http_json(f"{stack.prom_url}/api/v1/rules")["data"]["groups"]
        rules = [r for g in groups if g["name"] == "fleetwatch-pipeline" for r in g["rules"]]
        # Go's zero time until a rule's first evaluation
        evaluated = [r for r in rules if not r.get("lastEvaluation", "0001").startswith("0001")]
        if len(evaluated) == len(expected) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert {r["name"] for r in rules} == expected
    bad = {r["name"]: r.get("lastError") for r in rules if r["health"] != "ok"}
    assert not bad, bad
    # The dead letter this test produced becomes a real alert for this cluster (no `for`: firing at
    # the first evaluation after the series was scraped).
    deadline = time.monotonic() + 10
    while True:
        alerts = http_json(f"{stack.prom_url}/api/v1/alerts")["data"]["alerts"]
        mine = [
            a
            for a in alerts
            if a["labels"]["alertname"] == "FleetwatchDeadLetters"
            and a["labels"]["cluster"] == CLUSTER
            and a["labels"]["source_topic"] == topics.TELEMETRY  # the accounting stage's too
        ]
        if mine or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert mine and mine[0]["state"] == "firing", alerts


def test_prometheus_sh_is_idempotent(stack: Stack) -> None:
    r = prometheus_sh(stack.env, "start")
    assert r.returncode == 0 and "already running" in r.stderr, r.stderr
    assert prometheus_sh(stack.env, "status").returncode == 0
    r = prometheus_sh(stack.env, "target", "no-such-job", "127.0.0.1:1")
    assert r.returncode == 2 and "no scrape job" in r.stderr
    r = prometheus_sh(stack.env, "url")
    assert r.stdout.strip() == stack.prom_url
