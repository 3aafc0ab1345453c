"""act runs through Worker.run, so the poll watchdog guards it as it guards detect: a Kafka client
whose poll() never returns makes the process exit with status 75 (EX_TEMPFAIL) for its supervisor
to restart it, which resumes from the snapshots. On the in-memory bus, in a child process (the
exit is the process's), with act's own worker, actor and a real AlertSender."""

from __future__ import annotations

import subprocess
import sys
import time

from tests.helpers.paths import REPO

SCRIPT = """
import sys, threading, time
from fleetwatch import topics
from fleetwatch.alerts.act import Ownership, act_worker, serve
from fleetwatch.alerts.actor import Actor
from fleetwatch.alerts.alert_model import AlertBuilder
from fleetwatch.alerts.alertmanager import AlertmanagerClient, AlertSender
from fleetwatch.alerts.drain_log import ResultBook
from fleetwatch.alerts.policy import Policy, PolicyConfig
from fleetwatch.bus.memory import MemoryBus, MemoryGroupConsumer
from fleetwatch.pipeline.job_table import JobTable
from fleetwatch.runtime import StopFlag, setup_logging
from tests.helpers.act import KEY
from tests.helpers.findings import finding, signed

DETECT_KEY, DRAINS = b"test-detect-key-0123456789abcdef", "drains.v1"
wedged = threading.Event()


class Wedged(MemoryGroupConsumer):
    def poll(self, max_records, timeout_s):
        if wedged.is_set():
            threading.Event().wait(60)  # as a client's poll() waiting on a join that never completes
        return super().poll(max_records, timeout_s)


class WedgedBus(MemoryBus):
    def group_consumer(self, group, *, client_id, start_at="earliest", **_kw):
        return Wedged(self, group, start_at)


setup_logging()
bus = WedgedBus(partitions=4, log_append_time=())
bus.append(topics.FINDINGS, b"gpu-node-01", signed(finding("gpu-node-01", ts=time.time()), DETECT_KEY))
owner = Ownership()
sender = AlertSender(AlertmanagerClient("http://127.0.0.1:9", timeout_s=0.2, retries=0))
actor = Actor(
    policy=Policy(PolicyConfig(budget_min_nodes=1)), builder=AlertBuilder("test"), dispatcher=sender,
    jobs=JobTable(), key=KEY, drain_topic=DRAINS, tasks=owner.tasks, share=owner.share,
    task_for_node=owner.task_for_node, fleet_size=100, clock=time.time, census={"gpu-node-01"},
    results=ResultBook(KEY).answers, finding_key=DETECT_KEY,
)
worker = act_worker(bus, actor, owner, group="act", findings_topic=topics.FINDINGS, snapshot_every_s=3600,
                    instance_id="act-0", session_timeout_s=10, poll_stall_s=1.0)


def wedge_after_the_drain():
    while not bus.records(DRAINS):
        time.sleep(0.01)
    print("drain requested; wedging poll()", file=sys.stderr, flush=True)
    wedged.set()


threading.Thread(target=wedge_after_the_drain, daemon=True).start()
serve(worker, actor, sender, StopFlag(install=False), idle_exit_s=None, alert_flush_timeout_s=1.0)
print("serve returned", file=sys.stderr, flush=True)
"""


def test_a_poll_that_never_returns_makes_act_exit_for_its_supervisor() -> None:
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 75, r.stderr[-3000:]
    assert "drain requested; wedging poll()" in r.stderr  # act ran through the worker's loop first
    assert "poll() has not returned" in r.stderr and "supervisor restarts" in r.stderr
    assert "serve returned" not in r.stderr
    assert time.monotonic() - t0 < 30
