"""`fleetwatch act` as a process, on the real Kafka, Alertmanager and Slurm: killed mid-stream and
restarted it loses no alert and executes no drain twice; a flood stays within the drain budget; a
storm drains nothing and raises one alert."""

from __future__ import annotations

import signal
import time
import urllib.request
import uuid
from collections.abc import Callable
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from fleetwatch import schemas, topics
from fleetwatch.alerts.journal import Journal
from fleetwatch.bus.partitioner import partition_for
from fleetwatch.signing import signed as sign
from tests.helpers.findings import finding, resolve, signed
from tests.integration.act_rig import CENSUS_KEY, ActRig, free_port, metric, wait_for_metric
from tests.integration.services import SLURM_NODES, USES_SLURM, Slurm, TopicTail

# USES_SLURM on each test that uses Slurm: the others run in the rest of the tier (scripts/test.sh)


def labels_of(alerts: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {
        (a["labels"]["alertname"], a["labels"].get("node", ""), a["labels"].get("gpu", "")) for a in alerts
    }


def warn(node: str, ts: float) -> dict[str, Any]:
    return finding(node, "thermal", "warning", "thermal_throttle", ts=ts, gpu=1)


@USES_SLURM
def test_kill_mid_stream_and_restart_loses_no_alert_and_drains_once(
    rig: ActRig,
    slurm: Slurm,
    topic_tail: Callable[[str], TopicTail],
) -> None:
    slurm.reset(*SLURM_NODES)
    drains = topic_tail(rig.drains)
    now = time.time()
    xid = finding("gpu-node-01", ts=now - 30)
    warns_a = [warn(f"rel-a{i}", now - 30 + i) for i in range(10)]
    # The critical that the budget refuses is sent after gpu-node-02's, in its partition: act reads a
    # partition in order but two in either order, and decides per polled batch, so a node keyed to
    # another partition could come first on replay and take the last slot (gpu-node-03 is in another)
    parts = rig.bus.partition_count(rig.findings)
    late = next(
        n for n in (f"rel-ib{i}" for i in range(1000))
        if partition_for(n.encode(), parts) == partition_for(b"gpu-node-02", parts)
    )  # fmt: skip
    rig.census("gpu-node-01", "gpu-node-02", late)
    rig.send(xid, *warns_a, *(resolve(w, now - 10) for w in warns_a[:3]))
    # Snapshots only at the start: the restart has to replay everything, duplicates included.
    act = rig.act("--fleet-size", "100", "--snapshot-every", "600", "--resume-after", "3600")
    got = drains.collect(lambda rs: len(rs) >= 1, timeout_s=60)
    assert [r.key for r in got] == [b"gpu-node-01"], rig.logs()
    rig.drainer(slurm.conf)  # executes it now, so a replayed duplicate must be recognised later
    assert slurm.state("gpu-node-01")[0].startswith("drain")
    act.send_signal(signal.SIGKILL)
    act.wait(10)

    dbe = finding("gpu-node-02", "ecc", "critical", "ecc_dbe", ts=now - 5)
    ib = finding(late, "ib_link", "critical", "ib_port_state:mlx5_0/1", ts=now - 1, gpu=None)
    warns_b = [warn(f"rel-b{i}", now - 5 + i * 0.1) for i in range(10)]
    rig.send(dbe, ib, *warns_b, *(resolve(w, now - 2) for w in warns_a[3:6]))  # arrives while act is dead
    act = rig.act("--fleet-size", "100", "--snapshot-every", "1", "--resume-after", "3600")

    open_warns = warns_a[6:] + warns_b
    expected = {("FleetwatchThermal", w["node"], "1") for w in open_warns} | {
        ("FleetwatchXid", "gpu-node-01", "0"),
        ("FleetwatchEcc", "gpu-node-02", "0"),
        ("FleetwatchIbLink", late, ""),
        ("FleetwatchNodeDrained", "gpu-node-01", ""),
        ("FleetwatchNodeDrained", "gpu-node-02", ""),
        ("FleetwatchDrainRefused", late, ""),  # 2% of 100 nodes: two drains at most
    }
    # Generous: the restarted process imports, rejoins, restores and replays before it re-sends,
    # and on a cold, slow 2-core machine that once took longer than 30 s (returns on success).
    alerts = rig.am.wait_for(lambda a: labels_of(a) == expected, timeout_s=90, cluster=rig.cluster)
    assert labels_of(alerts) == expected, rig.logs()
    refused = next(a for a in alerts if a["labels"]["alertname"] == "FleetwatchDrainRefused")
    assert refused["labels"]["reason"] == "budget" and refused["labels"]["severity"] == "critical"

    got += drains.collect(lambda rs: {r.key for r in rs} >= {b"gpu-node-02"}, timeout_s=20)
    reqs = drains.messages(got)
    assert {m["node"] for m in reqs} == {"gpu-node-01", "gpu-node-02"}
    # The replay saw gpu-node-01's finding again, but adopted the request already on the drain
    # topic instead of deciding afresh (which could drain another node in its place).
    assert sum(m["node"] == "gpu-node-01" for m in reqs) == 1
    assert "adopted 1 drain/resume requests" in rig.logs()

    act.send_signal(signal.SIGTERM)
    assert act.wait(30) == 0
    rig.drainer(slurm.conf)
    try:
        assert slurm.state("gpu-node-01")[0].startswith("drain")
        assert slurm.state("gpu-node-02")[0].startswith("drain")
        j = Journal(rig.tmp / "journal.sqlite")
        entries = j.entries()
        j.close()
        assert sorted((e.node, e.action, e.status) for e in entries) == [
            ("gpu-node-01", "drain", "executed"),
            ("gpu-node-02", "drain", "executed"),
        ]

        # A clean restart resumes from the closing snapshot: nothing is re-issued, alerts stay.
        before = len(got)
        act = rig.act("--fleet-size", "100", "--snapshot-every", "1", "--resume-after", "3600")
        rig.wait_for_log(len(rig.procs) - 1, "assigned")  # up, its snapshot restored
        # the closing snapshot's alerts are sent again (those the stopped process sent expire 8 s on)
        alerts = rig.am.wait_for(lambda a: labels_of(a) == expected, timeout_s=30, cluster=rig.cluster)
        assert labels_of(alerts) == expected, rig.logs()
        assert drains.collect(lambda rs: False, timeout_s=0.5) == [] and len(got) == before
        act.send_signal(signal.SIGTERM)
        assert act.wait(30) == 0
    finally:
        slurm.reset(*SLURM_NODES)


def drained_series(port: int) -> set[str]:
    """The nodes with a fleetwatch_act_node_drained series."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        lines = [x for x in r.read().decode().splitlines() if x.startswith("fleetwatch_act_node_drained{")]
    return {x.split('"')[1] for x in lines}


def test_flood_stays_within_budget_and_a_storm_drains_nothing(
    rig: ActRig, topic_tail: Callable[[str], TopicTail]
) -> None:
    drains = topic_tail(rig.drains)
    now = time.time()
    # 200 broken nodes, onsets 20 s apart in event time (three per storm window: no storm), all
    # delivered at once: only the budget stands between them and 200 drains.
    flood = [finding(f"flood-{i:03d}", ts=now - 4300 + 20 * i, gpu=i % 8) for i in range(200)]
    flood.append({"schema": "finding/1", "id": "x", "node": "bad node!"})  # malformed: dead-lettered
    rig.census(*(f"flood-{i:03d}" for i in range(200)), *(f"storm-{i}" for i in range(8)))
    rig.send(*flood)
    port = free_port()
    act = rig.act("--fleet-size", "1000", "--metrics-port", str(port), "--storm-nodes", "5")
    alerts = rig.am.wait_for(
        lambda a: sum(x["labels"]["alertname"] == "FleetwatchDrainRefused" for x in a) == 180,
        timeout_s=30,
        cluster=rig.cluster,
    )
    names = [a["labels"]["alertname"] for a in alerts]
    assert names.count("FleetwatchDrainRefused") == 180, rig.logs()
    assert names.count("FleetwatchNodeDrained") == 20 and names.count("FleetwatchXid") == 200
    got = drains.collect(lambda rs: len(rs) >= 20, timeout_s=10)
    got += drains.collect(lambda rs: False, timeout_s=1)  # and nothing more
    assert len({r.key for r in got}) == len(got) == 20  # 2% of 1000
    # No adapter has answered: all 20 are pending, hold the whole budget, and none is reported drained.
    assert metric(port, "fleetwatch_act_drains_pending") == 20
    assert metric(port, "fleetwatch_act_drain_budget_used") == 0 and drained_series(port) == set()
    for m in drains.messages(got):  # the adapter executes them
        rig.result(m, "executed")
    assert wait_for_metric(port, "fleetwatch_act_drain_budget_used", 20), rig.logs()
    assert metric(port, "fleetwatch_act_drains_pending") == 0
    assert drained_series(port) == {r.key.decode() for r in got}  # one series per drained node
    assert metric(port, "fleetwatch_act_drain_budget_nodes") == 20
    assert metric(port, 'fleetwatch_act_drains_refused_total{reason="budget"}') == 180
    assert metric(port, "fleetwatch_worker_rejected_total") == 1

    storm = [
        finding(f"storm-{i}", "ib_link", "critical", "ib_link_downed:mlx5_0/1", ts=time.time(), gpu=None)
        for i in range(8)
    ]
    rig.send(*storm)
    # the 8 findings may reach act in more than one batch: the storm opens at the threshold (5)
    # and its alert is updated as the rest arrive
    alerts = rig.am.wait_for(
        lambda a: any(
            x["labels"]["alertname"] == "FleetwatchDrainStorm" and "8 nodes" in x["annotations"]["summary"]
            for x in a
        ),
        cluster=rig.cluster,
    )
    storms = [a for a in alerts if a["labels"]["alertname"] == "FleetwatchDrainStorm"]
    assert len(storms) == 1 and "8 nodes" in storms[0]["annotations"]["summary"], rig.logs()
    ann = storms[0]["annotations"]  # the numbers apart, for the demo's console and scorecard
    assert (ann["node_count"], ann["threshold"], ann["window_s"]) == ("8", "5", "60")
    assert int(ann["drains_held"]) >= 8  # every storm node's drain is held (and any refused before)
    assert metric(port, "fleetwatch_act_storm_active") == 1
    assert drains.collect(lambda rs: False, timeout_s=1) == []  # the storm drained nothing
    act.send_signal(signal.SIGTERM)
    assert act.wait(30) == 0


@USES_SLURM
def test_only_census_nodes_drain_and_only_what_slurm_confirms_counts(
    rig: ActRig,
    slurm: Slurm,
    topic_tail: Callable[[str], TopicTail],
) -> None:
    """Issue 15 end to end with the real slurm-drainer and Slurm: the fleet is the census (a job/1
    naming 10,000 nodes that never reported changes nothing), a finding for a node outside it only
    alerts, a drain Slurm refuses frees its slot for the next node and is not asked again, a node
    with 257 findings gets one request of 256 ids, and only confirmed drains count as drained."""
    slurm.reset(*SLURM_NODES)
    drains = topic_tail(rig.drains)
    tag = uuid.uuid4().hex[:6]
    stray, phantom = f"stray-{tag}", f"phantom-{tag}"  # stray reports but Slurm has no such node
    rig.census(*SLURM_NODES, stray, f"spare-{tag}")  # six nodes report
    ghosts = [f"ghost-{tag}-{i:05d}" for i in range(10_000)]
    job = {"schema": "job/1", "job": f"ghosts-{tag}", "nodes": ghosts, "state": "finished", "ts": time.time()}
    rig.producer.send(topics.JOBS, key=job["job"].encode(), value=schemas.encode(job))
    now = time.time()
    ports = [
        finding("gpu-node-02", "ib_link", "critical", f"ib_port_state:mlx5_{i}/1", ts=now - 200, gpu=None)
        for i in range(256)
    ]
    rig.send(
        finding("gpu-node-01", ts=now - 300), finding(stray, ts=now - 250), finding(phantom, ts=now - 100)
    )
    port = free_port()
    # 2% of six nodes, floored at two: gpu-node-01 and the stray take the budget at first. (act
    # decides on each batch it reads, in the order its partitions deliver them: gpu-node-02's
    # findings come once the budget is taken, so that they wait for a slot whatever that order.)
    act = rig.act("--budget-min-nodes", "2", "--metrics-port", str(port))
    try:
        got = drains.collect(lambda rs: len(rs) >= 2, timeout_s=60)
        assert {r.key for r in got} == {b"gpu-node-01", stray.encode()}, rig.logs()
        rig.send(*ports, finding("gpu-node-02", ts=now - 200))  # 257 findings on one node
        assert metric(port, "fleetwatch_act_fleet_size") == 6
        assert wait_for_metric(port, "fleetwatch_act_drains_pending", 2)
        assert metric(port, "fleetwatch_act_drain_budget_used") == 0
        assert metric(port, 'fleetwatch_act_drains_refused_total{reason="unknown_node"}') == 1

        rig.drainer(slurm.conf)  # drains gpu-node-01, refuses the stray: Slurm does not know it
        got += drains.collect(lambda rs: len(rs) >= 1, timeout_s=30)
        assert [r.key for r in got[2:]] == [b"gpu-node-02"], rig.logs()  # the stray's slot, freed
        big = drains.messages(got[2:])[0]
        assert len(big["findings"]) == 256 and big["reason"].endswith("(256 of 257 findings listed)")
        rig.drainer(slurm.conf)
        assert wait_for_metric(port, "fleetwatch_act_drain_budget_used", 2), rig.logs()
        assert metric(port, "fleetwatch_act_drains_pending") == 0
        assert drained_series(port) == {"gpu-node-01", "gpu-node-02"}
        assert (
            metric(port, 'fleetwatch_act_drains_refused_total{reason="adapter:rejected_unknown_node"}') == 1
        )
        assert drains.collect(lambda rs: False, timeout_s=3) == []  # the stray is not asked again
        refused = rig.am.wait_for(
            lambda a: len([x for x in a if x["labels"]["alertname"] == "FleetwatchDrainRefused"]) == 2,
            cluster=rig.cluster,
        )
        reasons = {
            a["labels"]["node"]: a["labels"]["reason"]
            for a in refused
            if a["labels"]["alertname"] == "FleetwatchDrainRefused"
        }
        assert reasons == {phantom: "unknown_node", stray: "adapter:rejected_unknown_node"}, rig.logs()
        assert slurm.state("gpu-node-01")[0].startswith("drain")
        assert slurm.state("gpu-node-02")[0].startswith("drain")
        act.send_signal(signal.SIGTERM)
        assert act.wait(30) == 0
    finally:
        slurm.reset(*SLURM_NODES)


def test_findings_that_do_not_verify_drain_page_and_end_nothing(
    rig: ActRig, topic_tail: Callable[[str], TopicTail]
) -> None:
    """Issue 23: findings steer drains and pages, so act takes only those detect signed. An
    unsigned XID 79 and one signed with another key, for census nodes and within the budget, drain
    nothing and page nothing; forged `resolved` findings (unsigned, or carrying the real finding's
    signature) end no real alert. Each is dead-lettered with its reason and counted, while a signed
    finding for another node drains."""
    drains, dlq = topic_tail(rig.drains), topic_tail(topics.DEADLETTER)
    tag = uuid.uuid4().hex[:6]
    unsigned_node, forged_node, real, paged = (f"{x}-{tag}" for x in ("unsigned", "forged", "real", "paged"))
    rig.census(unsigned_node, forged_node, real, paged)
    now = time.time()
    xid, page = finding(real, ts=now - 20), warn(paged, now - 20)
    rig.send_raw(
        (unsigned_node, schemas.encode(finding(unsigned_node, ts=now - 30))),
        (forged_node, signed(finding(forged_node, ts=now - 30), "not-detects-key-0123456789abcdef")),
    )
    rig.send(xid, page)
    port = free_port()
    # a budget of five nodes: only the signatures stand between the forged findings and a drain
    act = rig.act("--fleet-size", "100", "--budget-min-nodes", "5", "--metrics-port", str(port))

    def letters(records: list[Any]) -> list[tuple[str, str]]:
        """(reason, node) of this rig's dead letters."""
        out = []
        for r in records:
            h = dict(r.headers)
            if h["source"].startswith(rig.findings.encode()):
                out.append((h["reason"].decode(), schemas.decode(r.value)["node"]))
        return out

    def rejected(reason: str) -> float:
        """fleetwatch_worker_rejected_total of this rig's findings topic for `reason`."""
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            families = text_string_to_metric_families(r.read().decode())
        return sum(
            s.value
            for fam in families
            for s in fam.samples
            if s.name == "fleetwatch_worker_rejected_total"
            and s.labels.get("topic") == rig.findings
            and s.labels.get("reason") == reason
        )

    expected = {
        ("FleetwatchXid", real, "0"),
        ("FleetwatchNodeDrained", real, ""),
        ("FleetwatchThermal", paged, "1"),
    }
    alerts = rig.am.wait_for(lambda a: labels_of(a) == expected, timeout_s=60, cluster=rig.cluster)
    assert labels_of(alerts) == expected, rig.logs()  # the forged ones paged nothing
    got = drains.collect(lambda rs: len(rs) >= 1, timeout_s=10)
    got += drains.collect(lambda rs: False, timeout_s=1)
    assert [r.key for r in got] == [real.encode()], rig.logs()  # and drained nothing
    dead = dlq.collect(lambda rs: len(letters(rs)) >= 2, timeout_s=10)
    assert sorted(letters(dead)) == [("bad_signature", forged_node), ("unsigned", unsigned_node)]
    assert rejected("unsigned") == 1 and rejected("bad_signature") == 1

    # forged ends of both real alerts: unsigned, and altered under the real finding's signature
    rig.send_raw(
        (paged, schemas.encode(resolve(page, time.time()))),
        (real, schemas.encode(resolve(sign(xid, CENSUS_KEY.encode()), time.time()))),
    )
    dead = dlq.collect(lambda rs: len(letters(rs)) >= 2, timeout_s=30)
    assert sorted(letters(dead)) == [("bad_signature", real), ("unsigned", paged)]
    assert rejected("unsigned") == 2 and rejected("bad_signature") == 2
    # the real end of the page, after the forged ones: once it is gone, act has seen them all
    rig.send(resolve(page, time.time()))
    alerts = rig.am.wait_for(
        lambda a: ("FleetwatchThermal", paged, "1") not in labels_of(a), cluster=rig.cluster
    )
    assert labels_of(alerts) == expected - {("FleetwatchThermal", paged, "1")}, rig.logs()
    assert drains.collect(lambda rs: False, timeout_s=0.5) == []
    act.send_signal(signal.SIGTERM)
    assert act.wait(30) == 0
