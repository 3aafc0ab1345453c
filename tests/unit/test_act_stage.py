"""act as a worker stage (alerts/act.py) on the in-memory bus: the worker runs the actor's tasks,
tells it each batch's partitions and calls its tick, whose drain requests it produces; the actor
sees the partitions it owns through the worker's public view, and finds a node's task by the
bus's partitioner. The same Worker runs it on the real broker (tests/integration/test_act_*.py)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import orjson
from prometheus_client import REGISTRY

from fleetwatch import topics
from fleetwatch.alerts.act import Ownership, act_stage, act_worker
from fleetwatch.alerts.actor import Actor
from fleetwatch.alerts.alert_model import AlertBuilder
from fleetwatch.alerts.drain_log import ResultBook
from fleetwatch.alerts.policy import Policy, PolicyConfig
from fleetwatch.bus.memory import MemoryBus
from fleetwatch.bus.partitioner import partition_for
from fleetwatch.pipeline.job_table import JobTable
from fleetwatch.pipeline.worker import Worker
from fleetwatch.runtime import StopFlag
from tests.helpers.act import KEY, NoAlertmanager
from tests.helpers.findings import T0, finding, signed

FINDINGS, DRAINS, GROUP = topics.FINDINGS, "drains.v1", "act-test"
DETECT_KEY = b"test-detect-key-0123456789abcdef"
NODES = [f"gpu-node-{i:02d}" for i in range(1, 9)]


def _bus() -> MemoryBus:
    bus = MemoryBus(partitions=4, log_append_time=())
    for t in (FINDINGS, DRAINS, topics.STATE, topics.DEADLETTER):
        bus.create_topic(t)
    return bus


def _actor(clock: list[float], **cfg: Any) -> tuple[Actor, Ownership]:
    owner = Ownership()
    actor = Actor(
        policy=Policy(PolicyConfig(**cfg)),
        builder=AlertBuilder("test"),
        dispatcher=NoAlertmanager(),
        jobs=JobTable(),
        key=KEY,
        drain_topic=DRAINS,
        tasks=owner.tasks,
        share=owner.share,
        task_for_node=owner.task_for_node,
        fleet_size=100,
        clock=lambda: clock[0],
        census=set(NODES),
        results=ResultBook(KEY).answers,
        finding_key=DETECT_KEY,
    )
    return actor, owner


def _member(bus: MemoryBus, clock: list[float], **cfg: Any) -> tuple[Worker, Ownership]:
    actor, owner = _actor(clock, **cfg)
    worker = act_worker(
        bus,
        actor,
        owner,
        group=GROUP,
        findings_topic=FINDINGS,
        snapshot_every_s=3600,
        instance_id=None,
        session_timeout_s=10,
    )
    return worker, owner


def _drains(bus: MemoryBus) -> list[tuple[str, str]]:
    return [(m["action"], m["node"]) for m in (orjson.loads(r.value) for r in bus.records(DRAINS))]


def test_a_nodes_task_is_the_one_the_bus_partitioner_names_and_each_member_sees_its_share() -> None:
    bus = _bus()
    clock = [T0]
    for n in NODES:
        bus.append(FINDINGS, n.encode(), signed(finding(n, severity="warning"), DETECT_KEY))
    a, own_a = _member(bus, clock)
    b, own_b = _member(bus, clock)  # two members: two partitions each (range assignment)
    for w in (a, b, a):  # a polls again to take its share of the rebalance b's join started
        w.run(StopFlag(install=False), idle_exit_s=0)
    assert set(own_a.tasks()) == {0, 1} and set(own_b.tasks()) == {2, 3}
    assert own_a.share() == own_b.share() == 0.5
    for n in NODES:
        p = partition_for(n.encode(), 4)
        assert p == bus.partition_of(FINDINGS, n.encode())  # where the producer put its findings
        mine, other = (own_a, own_b) if p < 2 else (own_b, own_a)
        task = mine.task_for_node(n)
        assert task is not None and task.partition == p and n in task.nodes, n
        assert other.task_for_node(n) is None
    a.close()
    b.close()


def test_the_tick_decides_without_input_and_the_worker_produces_its_drain_requests() -> None:
    """A drain held for settle_s is requested by a tick once that time has passed, with no new
    finding: the worker's loop calls the tick and produces what it returns."""
    bus = _bus()
    clock = [T0]
    actor, owner = _actor(clock, settle_s=60.0, budget_min_nodes=1)
    # act's own stage, ticking on every pass of the loop (TICK_S in the command)
    worker = Worker(
        bus, GROUP, [replace(act_stage(actor, FINDINGS), tick_every_s=0.0)], snapshot_every_s=3600
    )
    owner.worker = worker
    bus.append(FINDINGS, NODES[0].encode(), signed(finding(NODES[0]), DETECT_KEY))
    worker.run(StopFlag(install=False), idle_exit_s=0)
    assert _drains(bus) == []  # settling
    produced = REGISTRY.get_sample_value("fleetwatch_worker_outputs_total", {"group": GROUP, "topic": DRAINS})
    clock[0] = T0 + 61
    worker.run(StopFlag(install=False), idle_exit_s=0)
    assert _drains(bus) == [("drain", NODES[0])]
    counted = REGISTRY.get_sample_value("fleetwatch_worker_outputs_total", {"group": GROUP, "topic": DRAINS})
    assert counted == (produced or 0.0) + 1
    worker.close()


def test_a_finding_of_a_kind_this_release_does_not_know_is_alerted_not_dead_lettered_nor_drained() -> None:
    """A rolling upgrade: detect already writes a kind act does not know. act decodes it, alerts it
    under the generic alertname with its own kind, severity and summary, and never drains for it."""
    bus = _bus()
    clock = [T0]
    sent: list[Any] = []

    class Capture:
        def flush(self, books: Any, force: bool = False) -> bool:
            sent.extend(r for b in books for r in b.records.values())
            return True

    actor, owner = _actor(clock, budget_min_nodes=1)
    actor.dispatcher = Capture()  # type: ignore[assignment]
    worker = Worker(
        bus, GROUP, [replace(act_stage(actor, FINDINGS), tick_every_s=0.0)], snapshot_every_s=3600
    )
    owner.worker = worker
    newer = {
        **finding(NODES[0]),
        "kind": "fabric_manager",
        "summary": "gpu-node-01 fabric manager: SXid 20034 (fatal)",
    }
    bus.append(FINDINGS, NODES[0].encode(), signed(newer, DETECT_KEY))
    worker.run(StopFlag(install=False), idle_exit_s=0)
    clock[0] = T0 + 120
    worker.run(StopFlag(install=False), idle_exit_s=0)
    assert bus.records(topics.DEADLETTER) == [] and _drains(bus) == []
    alerts = [r for r in sent if r.labels.get("kind") == "fabric_manager"]
    assert alerts and alerts[0].labels["alertname"] == "FleetwatchFinding"
    assert alerts[0].labels["severity"] == "critical" and "SXid 20034" in alerts[0].annotations["summary"]
    worker.close()


def test_the_budget_share_keeps_the_last_partition_count_through_a_broker_outage() -> None:
    """act's decision asks for the findings topic's partitions every second; during a broker outage
    the client raised out of it and act died (the full suite's outage-in-a-flood test, through the
    real broker). The count is then unknown (0): the share stays what the last count made it."""

    class Worker:
        partitions = 8

        def owned(self, stage: str) -> dict[int, object]:
            return {0: object(), 1: object()}

        def partition_count(self, stage: str) -> int:
            return self.partitions

    owner = Ownership()
    worker = Worker()
    owner.worker = worker  # type: ignore[assignment]
    assert owner.share() == 0.25
    worker.partitions = 0  # no broker answers
    assert owner.share() == 0.25
