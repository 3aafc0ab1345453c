"""`fleetwatch demo`, the README's first command, end to end (its own fresh broker, the real
Alertmanager, detect/act/simulate as processes), on a shortened run of the demo scenario; and
its console's storm line, from a real Alertmanager, on its own (its one clock:
tests/unit/test_demo.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from fleetwatch.alerts.alert_model import AlertBook, AlertBuilder
from fleetwatch.alerts.alertmanager import AlertmanagerClient, Dispatcher
from fleetwatch.collectors.sim.kinds import KINDS
from fleetwatch.demo import StormWatch, storm_from_annotations
from tests.helpers.paths import REPO
from tests.integration.services import APART, Alertmanager

pytestmark = APART


def test_demo_runs_and_writes_its_scorecard_and_picture(kafka_bootstrap: str) -> None:
    out = REPO / ".fleetwatch" / "demo"
    for f in ("scorecard.json", "fleet.png"):
        (out / f).unlink(missing_ok=True)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "fleetwatch.cli",
            "demo",
            "--duration",
            "260",  # past every sudden fault's onset (the last, an XID 119, at 240 s)
            "--speed",
            "25",
            "--settle",
            "4",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "INJECT" in r.stdout and "CRITICAL" in r.stdout and "scorecard" in r.stdout, r.stdout[-4000:]
    card = json.loads((out / "scorecard.json").read_text())
    sudden = {name: k for name, k in card["per_fault_kind"].items() if k["category"] == "sudden"}
    assert set(sudden) == {name for name, spec in KINDS.items() if spec.category == "sudden"}
    assert all(k["recall"] == 1.0 for k in sudden.values()), card["per_fault_kind"]
    assert card["false_findings_on_healthy_nodes"] == 0
    png = (out / "fleet.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    assert "DRAIN" in r.stdout  # the action layer asked for at least one drain
    # One clock: a drain is printed after the first critical finding that can have caused it (on
    # the wall clock it was printed at a few seconds, before every finding of the run).
    times = {
        kind: [float(t) for t in re.findall(rf"t=\s*([\d.]+)s\s+{kind}\b", r.stdout)]
        for kind in ("CRITICAL", "DRAIN")
    }
    assert times["DRAIN"] and min(times["DRAIN"]) >= min(times["CRITICAL"]), r.stdout[-4000:]
    if "drains held" in r.stdout:  # the storm guard tripped: the scorecard says so too
        assert card["drain_storm"]["drains_held"] >= 1


def test_the_console_learns_of_this_runs_storm_from_its_alert(
    alertmanager: Alertmanager,
    cluster: str,
) -> None:
    builder = AlertBuilder(cluster)
    disp = Dispatcher(AlertmanagerClient(alertmanager.url))

    def storm_alert(nodes: int, held: int) -> None:
        a = builder.storm(tuple(f"gpu-node-{i:02d}" for i in range(nodes)), 6, 60, held)
        book = AlertBook()
        book.fire("storm", a["labels"], a["annotations"], time.time())
        assert disp.flush([book])

    storm_alert(3, 3)  # an earlier run's storm, still active until its endsAt
    alertmanager.wait_for(lambda a: len(a) == 1, cluster=cluster)
    since = time.time()
    watch = StormWatch(alertmanager.url, cluster, since)
    assert watch.poll() is None  # not this run's
    time.sleep(0.01)  # Alertmanager shows times to the millisecond
    storm_alert(7, 7)
    alertmanager.wait_for(lambda a: a and a[0]["annotations"]["node_count"] == "7", cluster=cluster)
    seen = watch.poll()
    assert seen is not None
    ann, declared = seen
    assert since <= declared <= time.time()
    storm = storm_from_annotations(ann, 12.5)
    assert storm == {
        "node_count": 7,
        "threshold": 6,
        "window_s": 60.0,
        "drains_held": 7,
        "nodes": [f"gpu-node-{i:02d}" for i in range(7)],
        "declared_t": 12.5,
        "over_t": None,
    }


def test_the_demo_refuses_a_broker_left_on_its_port_by_another_checkout(tmp_path: Path) -> None:
    """Its own broker's stop cannot see one started from another FLEETWATCH_HOME; that broker's
    old telemetry would be scored as this run's findings (it was: 16 false ones)."""
    from fleetwatch.bus.admin import ensure_topics
    from fleetwatch.demo import DEMO_KAFKA_PORT

    env = {
        **os.environ,
        "FLEETWATCH_HOME": str(tmp_path / "other-checkout"),
        "KAFKA_PORT": str(DEMO_KAFKA_PORT),
        "KAFKA_CONTROLLER_PORT": str(DEMO_KAFKA_PORT + 1),
    }
    kafka_sh = ["bash", str(REPO / "services" / "kafka" / "kafka.sh")]
    ours = {**env, "FLEETWATCH_HOME": str(REPO / ".fleetwatch")}
    subprocess.run([*kafka_sh, "stop"], env=ours, capture_output=True, timeout=120)  # an earlier demo's
    subprocess.run([*kafka_sh, "start"], env=env, check=True, capture_output=True, timeout=300)
    try:
        ensure_topics(f"127.0.0.1:{DEMO_KAFKA_PORT}", ["fleet.telemetry.v1"])
        r = subprocess.run(
            [sys.executable, "-m", "fleetwatch.cli", "demo", "--duration", "10"],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=REPO,
        )
        assert r.returncode != 0
        assert "is not a fresh one" in r.stdout + r.stderr and "fleet.telemetry.v1" in r.stdout + r.stderr
    finally:
        subprocess.run([*kafka_sh, "stop"], env=env, capture_output=True, timeout=120)
