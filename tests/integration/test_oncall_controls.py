"""Issue 26's "done means", end to end: the real `fleetwatch act` and `fleetwatch slurm-drainer`
processes, the real broker, the real Alertmanager and the real Slurm (tests/integration/act_rig.py).

- a node drained for an XID whose findings clear is validated on the node (the fake dcgmi, as a
  Slurm job) before it returns: pass, resumed and confirmed; fail, drained again with the failing
  test and GPU named, in Slurm and in a page;
- `fleetwatch pause` during a fault storm: nothing drained, every alert says drains are paused, and
  drains go on once the pause expires; a drain asked just before a pause is deferred by the
  adapter and asked again after it;
- `act --dry-run`: would-be requests on their own topic, nothing reaches Slurm, alerts labelled;
- a node in a maintenance reservation is neither paged for silence nor drained, and an operator's
  drain is never undone."""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Callable
from typing import Any

from fleetwatch.bus.admin import ensure_topics
from tests.helpers.findings import finding, resolve
from tests.integration.act_rig import ActRig, free_port, metric, wait_for_metric
from tests.integration.services import SLURM_NODES, USES_SLURM, Slurm, TopicTail

# USES_SLURM on each test that uses Slurm: the others run in the rest of the tier (scripts/test.sh)


def names(alerts: list[dict[str, Any]]) -> set[tuple[str, str]]:
    return {(a["labels"]["alertname"], a["labels"].get("node", "")) for a in alerts}


@USES_SLURM
def test_a_drained_node_returns_only_after_it_passes_its_validation(
    rig: ActRig, slurm: Slurm, topic_tail: Callable[[str], TopicTail]
) -> None:
    slurm.reset(*SLURM_NODES)
    drains = topic_tail(rig.drains)
    good, bad = "gpu-node-01", "gpu-node-02"
    rig.census(*SLURM_NODES)
    rig.plan_validation({bad: {"fixture": "dcgm4_fail_memory_gpu3.json"}})  # exits 205, as dcgmi does
    now = time.time()
    xids = [finding(good, ts=now - 30), finding(bad, ts=now - 29)]
    rig.send(*xids)
    port = free_port()
    act = rig.act("--budget-min-nodes", "2", "--resume-after", "2", "--metrics-port", str(port))
    try:
        got = drains.collect(lambda rs: len(rs) >= 2, timeout_s=60)
        assert {r.key for r in got} == {good.encode(), bad.encode()}, rig.logs()
        rig.drainer(slurm.conf)  # drains both
        assert wait_for_metric(port, "fleetwatch_act_drain_budget_used", 2), rig.logs()
        assert slurm.state(good)[0].startswith("drain") and slurm.state(bad)[0].startswith("drain")
        rig.send(*(resolve(f, time.time()) for f in xids))  # the findings clear
        got = drains.collect(lambda rs: len(rs) >= 2, timeout_s=60)
        assert {(m["node"], m["action"]) for m in drains.messages(got)} == {(good, "resume"), (bad, "resume")}
        rig.drainer(slurm.conf)  # validates each on the node, as a Slurm job, before any resume
        assert wait_for_metric(port, 'fleetwatch_act_validations_total{outcome="failed"}', 1), rig.logs()
        assert wait_for_metric(port, 'fleetwatch_act_validations_total{outcome="passed"}', 1), rig.logs()
        assert slurm.state(good) == ("idle", "none")
        state, reason = slurm.state(bad)
        assert state.startswith("drain") and "validation failed" in reason and "GPU 3" in reason
        # the good node's slot is free once its resume was executed; the failed node still counts
        assert wait_for_metric(port, "fleetwatch_act_drain_budget_used", 1), rig.logs()
        paged = rig.am.wait_for(
            lambda a: ("FleetwatchValidationFailed", bad) in names(a), cluster=rig.cluster, timeout_s=30
        )
        (page,) = [a for a in paged if a["labels"]["alertname"] == "FleetwatchValidationFailed"]
        assert page["labels"]["severity"] == "critical" and "GPU 3" in page["annotations"]["summary"]
        assert page["annotations"]["runbook_url"].endswith("/runbooks/validation.md")
        assert drains.collect(lambda rs: False, timeout_s=1.5) == []  # it is not asked again
    finally:
        act.terminate()
        act.wait(30)
        slurm.reset(*SLURM_NODES)


@USES_SLURM
def test_a_pause_during_a_fault_storm_drains_nothing_says_so_and_drains_go_on_after_it(
    rig: ActRig, slurm: Slurm, topic_tail: Callable[[str], TopicTail]
) -> None:
    slurm.reset(*SLURM_NODES)
    drains = topic_tail(rig.drains)
    rig.census(*SLURM_NODES)
    # long enough to outlast act's group join (about 10 s on this broker), short enough to expire here
    r = rig.control_command("pause", "--reason", "switch firmware rollout", "--for", "20s")
    assert r.returncode == 0 and "paused until" in r.stdout, r.stderr
    port = free_port()
    # the storm guard is set above these three nodes: the pause alone must hold them
    act = rig.act(
        "--budget-min-nodes",
        "3",
        "--storm-nodes",
        "50",
        "--storm-min-nodes",
        "50",
        "--metrics-port",
        str(port),
    )
    try:
        now = time.time()
        rig.send(*(finding(n, ts=now - 5 + i) for i, n in enumerate(SLURM_NODES[:3])))
        assert wait_for_metric(port, "fleetwatch_act_drains_paused", 1), rig.logs()
        assert wait_for_metric(port, 'fleetwatch_act_drains_refused_total{reason="paused"}', 3), rig.logs()
        alerts = rig.am.wait_for(
            lambda a: (
                len([x for x in a if x["labels"]["alertname"] == "FleetwatchXid"]) == 3
                and ("FleetwatchDrainsPaused", "") in names(a)
            ),
            cluster=rig.cluster,
            timeout_s=30,
        )
        for a in alerts:
            if a["labels"]["alertname"] == "FleetwatchXid":
                assert "switch firmware rollout" in a["annotations"]["drains_paused"], a
                assert a["annotations"]["action"].endswith("held, drains are paused")
        assert not any(n == "FleetwatchDrainRefused" for n, _ in names(alerts))
        assert drains.collect(lambda rs: False, timeout_s=2) == []  # nothing asked of Slurm
        # the pause expires by itself: the held drains go out, and the adapter carries them out
        got = drains.collect(lambda rs: len(rs) >= 3, timeout_s=60)
        assert {r.key.decode() for r in got} == set(SLURM_NODES[:3]), rig.logs()
        assert metric(port, "fleetwatch_act_drains_paused") == 0
        rig.drainer(slurm.conf)
        assert all(slurm.state(n)[0].startswith("drain") for n in SLURM_NODES[:3])
    finally:
        act.terminate()
        act.wait(30)
        slurm.reset(*SLURM_NODES)


@USES_SLURM
def test_a_drain_asked_just_before_a_pause_is_deferred_by_the_adapter_and_asked_again_after_it(
    rig: ActRig, slurm: Slurm, topic_tail: Callable[[str], TopicTail]
) -> None:
    """act drains a node; before the adapter reads the request an operator pauses drains. The adapter
    follows the pause: it answers `deferred` and Slurm is left alone; act pages nobody for it and
    asks nothing during the pause; once it is lifted act asks again (the same request, signed anew)
    and the adapter drains the node."""
    slurm.reset(*SLURM_NODES)
    drains = topic_tail(rig.drains)
    node = SLURM_NODES[1]
    rig.census(*SLURM_NODES)
    port = free_port()
    act = rig.act("--budget-min-nodes", "2", "--retry-deferred", "2", "--metrics-port", str(port))
    try:
        rig.send(finding(node, ts=time.time() - 5))
        got = drains.collect(lambda rs: len(rs) >= 1, timeout_s=60)
        (first,) = drains.messages(got)
        assert first["node"] == node, rig.logs()
        r = rig.control_command("pause", "--reason", "switch firmware rollout", "--for", "10m")
        assert r.returncode == 0, r.stderr
        assert wait_for_metric(port, "fleetwatch_act_drains_paused", 1), rig.logs()
        rig.drainer(slurm.conf)  # reads the request during the pause
        assert slurm.state(node)[0].rstrip("*").startswith("idle")
        deferred = 'fleetwatch_act_drains_refused_total{reason="adapter:deferred"}'
        assert wait_for_metric(port, deferred, 1), rig.logs()
        assert wait_for_metric(port, "fleetwatch_act_drain_budget_used", 0)
        assert metric(port, "fleetwatch_act_drains_pending") == 0  # nothing done: no slot held
        assert drains.collect(lambda rs: False, timeout_s=5) == []  # past the retry, but paused
        alerts = rig.am.wait_for(lambda a: ("FleetwatchXid", node) in names(a), cluster=rig.cluster)
        assert not any(n == "FleetwatchDrainRefused" for n, _ in names(alerts))
        assert rig.control_command("resume-drains", "--reason", "rollout done").returncode == 0
        (again,) = drains.messages(drains.collect(lambda rs: len(rs) >= 1, timeout_s=30))
        assert again["request_id"] == first["request_id"] and again["signature"] != first["signature"]
        rig.drainer(slurm.conf)
        assert slurm.state(node)[0].startswith("drain")
        assert wait_for_metric(port, "fleetwatch_act_drain_budget_used", 1), rig.logs()
    finally:
        act.terminate()
        act.wait(30)
        slurm.reset(*SLURM_NODES)


def test_resume_drains_lifts_a_pause_and_a_forged_pause_holds_nothing(
    rig: ActRig, topic_tail: Callable[[str], TopicTail]
) -> None:
    drains = topic_tail(rig.drains)
    node = f"node-{uuid.uuid4().hex[:6]}"
    rig.census(node)
    forged = rig.control_command("pause", "--reason", "x", "--for", "1h")
    assert forged.returncode == 0
    # a second pause signed with another key (whoever can write the topic but holds no key)
    env = {**rig.env, "FLEETWATCH_DRAIN_KEY": "someone-elses-key-0123456789abcdef"}
    argv = [
        "pause",
        "--reason",
        "forged",
        "--for",
        "1h",
        "--bootstrap",
        rig.bootstrap,
        "--control-topic",
        rig.control,
    ]
    assert subprocess.run(["fleetwatch", *argv], env=env, capture_output=True, timeout=60).returncode == 0
    port = free_port()
    act = rig.act("--budget-min-nodes", "1", "--metrics-port", str(port))
    try:
        assert wait_for_metric(port, 'fleetwatch_act_control_refused_total{reason="bad_signature"}', 1), (
            rig.logs()
        )
        assert wait_for_metric(port, "fleetwatch_act_drains_paused", 1)  # the real one holds
        assert rig.control_command("resume-drains", "--reason", "done").returncode == 0
        assert wait_for_metric(port, "fleetwatch_act_drains_paused", 0), rig.logs()
        rig.send(finding(node, ts=time.time()))
        got = drains.collect(lambda rs: len(rs) >= 1, timeout_s=30)
        assert [r.key.decode() for r in got] == [node]
    finally:
        act.terminate()
        act.wait(30)


@USES_SLURM
def test_dry_run_publishes_would_be_requests_that_nothing_executes(
    rig: ActRig, slurm: Slurm, topic_tail: Callable[[str], TopicTail]
) -> None:
    slurm.reset(*SLURM_NODES)
    dry = f"{rig.drains}.dryrun"
    ensure_topics(rig.bootstrap, [dry])
    drains, would = topic_tail(rig.drains), topic_tail(dry)
    node = SLURM_NODES[0]
    rig.census(*SLURM_NODES)
    rig.send(finding(node, ts=time.time()))
    port = free_port()
    act = rig.act("--dry-run", "--drain-topic", dry, "--budget-min-nodes", "1", "--metrics-port", str(port))
    try:
        (req,) = would.messages(would.collect(lambda rs: len(rs) >= 1, timeout_s=60))
        assert req["node"] == node and req["dry_run"] is True
        assert metric(port, "fleetwatch_act_dry_run") == 1
        rig.drainer(slurm.conf)  # the adapter reads the real topic: nothing there
        assert drains.collect(lambda rs: False, timeout_s=2) == []
        assert slurm.state(node) == ("idle", "none")
        alerts = rig.am.wait_for(
            lambda a: ("FleetwatchXid", node) in names(a) and ("FleetwatchNodeDrained", node) in names(a),
            cluster=rig.cluster,
            timeout_s=30,
        )
        for a in alerts:
            assert a["labels"]["dry_run"] == "true" and a["annotations"]["summary"].startswith("[dry-run]")
        assert metric(port, "fleetwatch_act_drains_unconfirmed") == 0
    finally:
        act.terminate()
        act.wait(30)
        slurm.reset(*SLURM_NODES)


@USES_SLURM
def test_a_node_in_maintenance_is_neither_paged_for_silence_nor_drained_and_an_operators_drain_stays(
    rig: ActRig, slurm: Slurm, topic_tail: Callable[[str], TopicTail]
) -> None:
    slurm.reset(*SLURM_NODES)
    drains = topic_tail(rig.drains)
    maint, operator, free = SLURM_NODES[2], SLURM_NODES[3], SLURM_NODES[0]
    resv = f"maint-{uuid.uuid4().hex[:6]}"
    subprocess.run(
        [
            "scontrol",
            "create",
            "reservation",
            f"ReservationName={resv}",
            f"Nodes={maint}",
            "StartTime=now",
            "Duration=30",
            "Users=root",
            "Flags=MAINT,IGNORE_JOBS",
        ],
        env=slurm.env,
        check=True,
        capture_output=True,
    )
    subprocess.run(
        ["scontrol", "update", f"NodeName={operator}", "State=DRAIN", "Reason=bad fan (alice)"],
        env=slurm.env,
        check=True,
    )
    try:
        rig.census(*SLURM_NODES)
        rig.drainer(slurm.conf)  # publishes the nodes as Slurm shows them
        port = free_port()
        act = rig.act("--budget-min-nodes", "4", "--metrics-port", str(port))
        assert wait_for_metric(port, "fleetwatch_act_nodes_held", 2), rig.logs()
        assert wait_for_metric(port, "fleetwatch_act_fleet_size", 2), rig.logs()  # 4, less 2 held
        now = time.time()
        silent = finding(maint, "host", "critical", "silent", ts=now - 3, gpu=None)
        rig.send(finding(maint, ts=now - 5), finding(operator, ts=now - 4), silent, finding(free, ts=now - 2))
        got = drains.collect(lambda rs: len(rs) >= 1, timeout_s=30)
        assert [r.key.decode() for r in got] == [free], rig.logs()  # only the node nobody holds
        alerts = rig.am.wait_for(
            lambda a: ("FleetwatchXid", maint) in names(a) and ("FleetwatchXid", operator) in names(a),
            cluster=rig.cluster,
            timeout_s=30,
        )
        held = {
            a["labels"]["node"]: a["labels"].get("node_state")
            for a in alerts
            if a["labels"]["alertname"] == "FleetwatchXid"
        }
        assert held == {maint: "maintenance", operator: "drained_by_other", free: None}
        assert ("FleetwatchHost", maint) not in names(alerts)  # its silence pages nobody
        assert not any(n == "FleetwatchDrainRefused" for n, _ in names(alerts))
        assert drains.collect(lambda rs: False, timeout_s=1.5) == []
        rig.drainer(slurm.conf)
        assert slurm.state(operator) == ("drained", "bad fan (alice)")  # the operator's, untouched
        act.terminate()
        act.wait(30)
    finally:
        subprocess.run(["scontrol", "delete", f"ReservationName={resv}"], env=slurm.env, capture_output=True)
        slurm.reset(*SLURM_NODES)
