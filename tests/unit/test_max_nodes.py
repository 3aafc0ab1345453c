"""The node stage holds at most max_nodes node names per partition (pipeline/node_stage.py): names
come from the agents, unsigned, and each one held costs state, snapshot and a census record. Past
it, the samples of a new name are refused (dead-lettered as too_many_nodes, counted) while the
nodes already held are judged as before; a forgotten node frees its place."""

from __future__ import annotations

from dataclasses import replace

import orjson
from prometheus_client import REGISTRY

from fleetwatch import schemas, topics
from fleetwatch.bus.memory import MemoryBus
from fleetwatch.detectors.batch import TelemetryBatch
from fleetwatch.detectors.findings import Forgotten
from fleetwatch.pipeline import detect
from fleetwatch.pipeline.job_table import JobTable
from fleetwatch.pipeline.node_stage import NodeTask, NodeTaskConfig
from fleetwatch.pipeline.worker import Worker
from tests.helpers.messages import telemetry

T0 = 1_764_000_000.0


def test_new_names_past_the_cap_are_refused_and_held_nodes_go_on() -> None:
    task = NodeTask(JobTable(), replace(NodeTaskConfig(), max_nodes=3))
    first = [telemetry(node=f"n{i}", ts=T0, seq=1) for i in range(2)]
    assert task.process(topics.TELEMETRY, TelemetryBatch.from_messages(first)) is not None
    assert task.refused == []
    # one place left: n2 takes it; n3 and n4 are refused, every sample of them; n0 goes on
    msgs = [telemetry(node=n, ts=T0 + 10, seq=2) for n in ("n3", "n2", "n0", "n4", "n3")]
    msgs[4]["seq"], msgs[4]["ts"] = 3, T0 + 11
    task.process(topics.TELEMETRY, TelemetryBatch.from_messages(msgs))
    assert task.index.names == ["n0", "n1", "n3"]  # the first new name of the batch took the place
    assert [(r.index, r.msg["node"], r.reason) for r in task.refused] == [
        (1, "n2", "too_many_nodes"),
        (3, "n4", "too_many_nodes"),
    ]
    assert all(r.reason in schemas.REASONS for r in task.refused)
    assert float(task.index.last_ts[0]) == T0 + 10  # n0's sample was judged
    task.forget(Forgotten({"n1": T0}, 3600.0))
    task.process(topics.TELEMETRY, TelemetryBatch.from_messages([telemetry(node="n4", ts=T0 + 20, seq=4)]))
    assert task.refused == [] and "n4" in task.index.rows
    # a task the snapshot restores keeps the cap (configuration comes from the deployment)
    back = NodeTask.from_bytes(task.to_bytes(), JobTable(), replace(NodeTaskConfig(), max_nodes=3))
    back.process(topics.TELEMETRY, TelemetryBatch.from_messages([telemetry(node="n9", ts=T0 + 30, seq=1)]))
    assert [r.msg["node"] for r in back.refused] == ["n9"]


def test_the_worker_dead_letters_them_and_counts_them() -> None:
    bus = MemoryBus(partitions=1, log_append_time=())
    for t in (topics.TELEMETRY, topics.FINDINGS, topics.NODES, topics.NODE_FEATURES):
        bus.create_topic(t)
    for t in (topics.STATE, topics.DEADLETTER):
        bus.create_topic(t)
    names = [f"flood-{i:03d}" for i in range(12)]
    for i, n in enumerate(names):
        bus.append(topics.TELEMETRY, n.encode(), schemas.encode(telemetry(node=n, ts=T0 + i, seq=1)))
    cfg = replace(NodeTaskConfig(), max_nodes=5)
    node_stage = detect.stages(JobTable(), None, node_config=cfg)[0]

    def rejected() -> float:
        labels = {"group": "g", "topic": topics.TELEMETRY, "reason": "too_many_nodes"}
        return REGISTRY.get_sample_value("fleetwatch_worker_rejected_total", labels) or 0.0

    before = rejected()
    w = Worker(bus, "g", [node_stage], snapshot_every_s=3600)
    while w.step(timeout_ms=0):
        pass
    w.close()
    dead = bus.records(topics.DEADLETTER)
    assert [dict(r.headers)["reason"] for r in dead] == [b"too_many_nodes"] * 7
    assert sorted(orjson.loads(r.value)["node"] for r in dead) == names[5:]  # the original records
    assert rejected() == before + 7
    census = {r.key.decode() for r in bus.records(topics.NODES) if r.value is not None}
    assert census == set(names[:5])  # no census record of a refused name
