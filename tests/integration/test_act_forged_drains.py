"""Issue 23, item 6, end to end on the real broker and Slurm, with the real act and slurm-drainer:
a forged drain/1 that copies (or predicts) a real request's id must not free that request's budget
slot, whether the adapter sees the forgery after the request (Slurm slow and retrying the real
one) or before it: with a budget of one, exactly one node is drained."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from fleetwatch import schemas, topics
from fleetwatch.alerts import drain_request, drain_result
from tests.helpers.findings import finding
from tests.helpers.paths import REPO
from tests.integration.act_rig import KEY, ActRig, free_port, metric, wait_for_metric
from tests.integration.services import SLURM_NODES, USES_SLURM, Slurm, TopicTail

pytestmark = USES_SLURM

ATTACKER_KEY = b"attacker-key-attacker-key-123456"


# ------------------------------------------------------------------ item 6: forged drain requests


class SlowSlurm:
    """`scontrol` as a slow, then unreachable, controller: a wrapper first on the drainer's PATH
    that takes a second per call and fails while `down` exists (the drainer retries with backoff),
    then runs the real scontrol."""

    def __init__(self, tmp: Path) -> None:
        self.bin = tmp / "slow-bin"
        self.bin.mkdir()
        self.down = tmp / "slurmctld-down"
        self.down.touch()
        real = subprocess.run(
            ["which", "scontrol"], capture_output=True, text=True, check=True
        ).stdout.strip()
        wrapper = self.bin / "scontrol"
        wrapper.write_text(
            "#!/bin/bash\n"
            "sleep 1\n"
            f"if [ -e '{self.down}' ]; then\n"
            "  echo 'slurm_update error: Unable to contact slurm controller (connect failure)' >&2\n"
            "  exit 1\n"
            "fi\n"
            f'exec {real} "$@"\n'
        )
        wrapper.chmod(0o755)

    def env(self, base: dict[str, str]) -> dict[str, str]:
        return {**base, "PATH": f"{self.bin}:{base.get('PATH', '')}"}

    def up(self) -> None:
        self.down.unlink()


def start_drainer(rig: ActRig, slurm: Slurm, slow: SlowSlurm) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "fleetwatch.cli", "slurm-drainer", "--bootstrap", rig.bootstrap]
    argv += ["--drain-topic", rig.drains, "--group", f"slurm-{rig.group}", "--state-dir", str(rig.tmp)]
    argv += ["--results-topic", rig.results, "--slurm-conf", slurm.conf]
    log = open(rig.tmp / "drainer.log", "wb")  # noqa: SIM115 (closed with the process)
    p = subprocess.Popen(argv, env=slow.env(rig.env), cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    rig.procs.append(p)  # killed by rig.close()
    return p


def forge(request: dict[str, Any]) -> dict[str, Any]:
    """`request` as someone without the key sends it: same id, node and content, wrong signature."""
    m = {k: v for k, v in request.items() if k != "signature"}
    m["signature"] = drain_request.sign(m, ATTACKER_KEY)
    return m


def send_forged(rig: ActRig, forged: dict[str, Any], avoid_partition: int | None) -> bytes:
    """Produce the forgery onto the drain topic; on a partition other than the real request's, so
    the adapter reaches it while it is still retrying the real one."""
    raw = orjson.dumps(forged)
    parts = range(rig.bus.partition_count(rig.drains))
    p = next(p for p in parts if p != avoid_partition)
    rig.producer.send(rig.drains, key=forged["node"].encode(), value=raw, partition=p)
    rig.flush()
    return raw


@pytest.mark.parametrize("order", ["forgery_after_request", "forgery_before_request"])
def test_a_forged_request_with_a_real_requests_id_frees_no_budget_slot(
    rig: ActRig, slurm: Slurm, topic_tail: Callable[[str], TopicTail], order: str
) -> None:
    slurm.reset(*SLURM_NODES)
    slow = SlowSlurm(rig.tmp)
    drains, dead = topic_tail(rig.drains), topic_tail(topics.DEADLETTER)
    results = topic_tail(rig.results)
    rig.census("gpu-node-01", "gpu-node-02")
    now = time.time()
    first, second = finding("gpu-node-01", ts=now - 20), finding("gpu-node-02", ts=now - 10)
    start_drainer(rig, slurm, slow)
    port = free_port()
    # Budget: max(2% of 10, 1) = one node.
    rig.act("--fleet-size", "10", "--budget-min-nodes", "1", "--metrics-port", str(port))
    try:
        if order == "forgery_before_request":
            # Request ids are predictable from finding ids: the forgery is planted first.
            predicted = drain_request.make_request(
                node="gpu-node-01",
                action="drain",
                reason="fleetwatch: XID 79",
                severity="critical",
                findings=[first["id"]],
                issued_at=time.time(),
                key=ATTACKER_KEY,
            )
            raw = send_forged(rig, predicted, None)
            assert dead.collect(lambda rs: any(r.value == raw for r in rs), timeout_s=30), "never handled"
        # gpu-node-01 first and alone: the two nodes' findings sit in different partitions, which act
        # may read in either order, and the budget is one node
        rig.send(first)
        got = drains.collect(lambda rs: len(issued(rs)) >= 1, timeout_s=60)
        assert [r.key for r in issued(got)] == [b"gpu-node-01"], rig.logs()
        rig.send(second)
        real = drains.messages(issued(got))[0]
        if order == "forgery_before_request":
            assert real["request_id"] == predicted["request_id"]
        else:
            # Slurm is retrying the real request; a forgery with its id reaches the adapter meanwhile.
            raw = send_forged(rig, forge(real), got[0].partition)
            assert dead.collect(lambda rs: any(r.value == raw for r in rs), timeout_s=30), "never handled"
        # act read gpu-node-02's finding and refused it for the budget while gpu-node-01's drain is
        # pending (Slurm held); then time for act to apply any result and decide again (every second)
        assert wait_for_metric(port, 'fleetwatch_act_drains_refused_total{reason="budget"}', 1), rig.logs()
        got += drains.collect(lambda rs: bool(issued(rs)), timeout_s=4)
        assert [r.key for r in issued(got)] == [b"gpu-node-01"], (
            "a second node was asked to drain while the first is pending: " + rig.logs()
        )
        slow.up()
        assert wait_for_metric(port, "fleetwatch_act_drain_budget_used", 1, timeout_s=60), rig.logs()
        got += drains.collect(lambda rs: False, timeout_s=2)
        assert [r.key for r in issued(got)] == [b"gpu-node-01"], rig.logs()
        assert slurm.state("gpu-node-01")[0].startswith("drain")
        assert slurm.state("gpu-node-02")[0].rstrip("*") == "idle"  # exactly one node drained
        # The adapter vouched for nothing it had not authenticated: its only result answers the
        # real request, bound to that request's signature.
        answered = drains_results(results.collect(lambda rs: False, timeout_s=1))
        assert [(m["request_id"], m["outcome"]) for m in answered] == [(real["request_id"], "executed")]
        assert answered[0]["request_signature"] == real["signature"]
        assert metric(port, 'fleetwatch_act_drains_refused_total{reason="budget"}') == 1, rig.logs()
    finally:
        slurm.reset(*SLURM_NODES)


def issued(records: list[Any]) -> list[Any]:
    """The drain topic's records act wrote (signed with the key), not the test's forgeries."""
    return [r for r in records if drain_request.verify(orjson.loads(r.value), KEY.encode())]


def drains_results(records: list[Any]) -> list[dict[str, Any]]:
    out = [schemas.decode(r.value, drain_result.DRAIN_RESULT) for r in records]
    assert all(drain_request.verify(m, KEY.encode()) for m in out)
    return out
