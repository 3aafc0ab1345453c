"""`fleetwatch act` and `fleetwatch slurm-drainer` as processes on private topics of the real broker,
for the act tests (test_act_*.py): ActRig makes the topics and group of one test, produces findings,
census records and drain results onto them as detect and the Slurm adapter do, and starts the
processes; metric() reads a process's /metrics."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from fleetwatch import schemas
from fleetwatch.alerts import drain_result
from fleetwatch.bus.admin import Admin, ensure_topics
from fleetwatch.bus.kafka import KafkaBus
from fleetwatch.census import node_message
from fleetwatch.signing import encode_signed
from tests.helpers.findings import signed
from tests.helpers.paths import REPO
from tests.integration.services import Alertmanager

KEY = "test-drain-key-0123456789abcdef"
CENSUS_KEY = "test-census-key-0123456789abcdef"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ActRig:
    """Private topics and group for one test, and the act / slurm-drainer processes on them."""

    def __init__(self, bootstrap: str, am: Alertmanager, cluster: str, tmp: Path) -> None:
        tag = uuid.uuid4().hex[:8]
        self.bootstrap, self.am, self.cluster, self.tmp = bootstrap, am, cluster, tmp
        self.findings, self.drains = f"test.act.{tag}.findings", f"test.act.{tag}.drain"
        self.nodes, self.results = f"test.act.{tag}.nodes", f"test.act.{tag}.results"
        # the operators' switches and Slurm's view of the nodes: private too, or one test's pause
        # or maintenance would hold another's drains
        self.control, self.slurm_nodes = f"test.act.{tag}.control", f"test.act.{tag}.slurmnodes"
        self.group = f"act-{tag}"
        # made LogAppendTime, as fleet.control.v1, scheduler.nodes.v1 and scheduler.drain.results.v1
        # are (topics.BROKER_TIMED): act checks a pause's and a node view's clock against the time
        # the broker took the record, and orders views and answers by it, the path a deployment
        # takes (the rig's topic names are its own, which ensure_topics makes with no settings)
        timed = (self.control, self.slurm_nodes, self.results)
        with Admin(bootstrap) as admin:
            admin.create_topics(
                timed, configs={t: {"message.timestamp.type": "LogAppendTime"} for t in timed}
            )
        ensure_topics(bootstrap, [self.findings, self.drains, self.nodes])
        self.bus = KafkaBus(bootstrap)
        self.producer = self.bus.producer()
        # the fake dcgmi's plan (tests/fakes/dcgmi): the adapter's validation passes unless a test
        # plans otherwise (plan_validation)
        self.plan = tmp / "dcgmi-plan.json"
        self.plan_validation({})
        self.env = {
            **os.environ,
            "FLEETWATCH_DRAIN_KEY": KEY,
            "FLEETWATCH_CENSUS_KEY": CENSUS_KEY,
            "FLEETWATCH_FAKE_DCGMI_PLAN": str(self.plan),
        }
        self.procs: list[subprocess.Popen[bytes]] = []

    def send(self, *fs: dict[str, Any]) -> None:
        """Findings as detect writes them: signed with its key (the census key), or act refuses them."""
        self.send_raw(*((f["node"], signed(f, CENSUS_KEY)) for f in fs))

    def send_raw(self, *records: tuple[str, bytes]) -> None:
        """(node, value) records on the findings topic as they are, e.g. forged ones."""
        for node, value in records:
            self.producer.send(self.findings, key=node.encode(), value=value)
        self.flush()

    def flush(self, timeout_s: float = 10.0) -> None:
        """Wait until the broker has every record sent so far."""
        assert not self.producer.flush(timeout_s), "records not acknowledged"

    def result(self, request: dict[str, Any], outcome: str) -> None:
        """What the Slurm adapter says it did with a request (signed, as slurm-drainer sends it)."""
        r = drain_result.make_result(
            request_id=request["request_id"],
            node=request["node"],
            action=request["action"],
            outcome=outcome,
            detail="",
            ts=time.time(),
            request_signature=request["signature"],
            key=KEY.encode(),
        )
        self.producer.send(self.results, key=r["node"].encode(), value=schemas.encode(r))
        self.flush()

    def plan_validation(self, per_node: dict[str, dict[str, Any]]) -> None:
        """What the fake dcgmi answers on each node (an entry of tests/fakes/dcgmi's plan); a
        passing run on every other node."""
        default = {"fixture": "dcgm4_pass_r2_8gpu.json"}
        self.plan.write_text(json.dumps({"nodes": per_node, "default": default}))

    def census(self, *nodes: str, steady_for: float = 3600.0) -> None:
        """These nodes report telemetry (what the detect workers publish on fleet.nodes.v1, signed),
        steadily for `steady_for` seconds (default: long past act's warm-up)."""
        now = time.time()
        for n in nodes:
            m = node_message(n, now - steady_for, now, steady_since=now - steady_for, seen_at=now)
            self.producer.send(self.nodes, key=n.encode(), value=encode_signed(m, CENSUS_KEY.encode()))
        self.flush()

    def act(self, *extra: str) -> subprocess.Popen[bytes]:
        argv = [sys.executable, "-m", "fleetwatch.cli", "act", "--bootstrap", self.bootstrap]
        argv += ["--alertmanager", self.am.url, "--cluster", self.cluster, "--group", self.group]
        argv += ["--findings-topic", self.findings, "--drain-topic", self.drains, "--resend-interval", "2"]
        argv += ["--nodes-topic", self.nodes, "--results-topic", self.results]
        argv += ["--control-topic", self.control, "--slurm-nodes-topic", self.slurm_nodes]
        argv += ["--instance-id", f"{self.group}-0"]  # static membership: a restart rejoins at once
        log = open(self.tmp / f"act-{len(self.procs)}.log", "wb")  # noqa: SIM115 (closed with the process)
        p = subprocess.Popen([*argv, *extra], env=self.env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(p)
        return p

    def drainer(self, slurm_conf: str) -> None:
        argv = [sys.executable, "-m", "fleetwatch.cli", "slurm-drainer", "--bootstrap", self.bootstrap]
        argv += ["--drain-topic", self.drains, "--group", f"slurm-{self.group}", "--state-dir", str(self.tmp)]
        argv += ["--results-topic", self.results, "--slurm-nodes-topic", self.slurm_nodes]
        argv += ["--control-topic", self.control]  # the rig's pause defers the adapter's requests too
        argv += ["--dcgmi", str(REPO / "tests" / "fakes" / "dcgmi"), "--validate-timeout", "60"]
        r = subprocess.run(
            [*argv, "--slurm-conf", slurm_conf, "--idle-exit", "1.5"],
            env=self.env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 0, r.stderr[-2000:]

    def control_command(self, *args: str) -> subprocess.CompletedProcess[str]:
        """`fleetwatch pause ...` / `fleetwatch resume-drains ...` on this rig's control topic."""
        argv = [sys.executable, "-m", "fleetwatch.cli", *args, "--bootstrap", self.bootstrap]
        argv += ["--control-topic", self.control]
        return subprocess.run(argv, env=self.env, cwd=REPO, capture_output=True, text=True, timeout=60)

    def wait_for_log(self, proc: int, text: str, timeout_s: float = 60) -> None:
        """Until the log of the proc-th act started contains `text`."""
        path = self.tmp / f"act-{proc}.log"
        deadline = time.monotonic() + timeout_s
        while text not in path.read_text(errors="replace"):
            assert time.monotonic() < deadline, f"act {proc} never logged {text!r}: {self.logs()}"
            time.sleep(0.1)

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-3000:] for p in sorted(self.tmp.glob("act-*.log")))

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
        self.producer.close(5)


def wait_for_metric(port: int, name: str, value: float, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if metric(port, name) == value:
                return True
        except (OSError, AssertionError):  # not serving yet (act starting), or the series not made yet
            pass
        time.sleep(0.2)
    return False


def metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not exported")
