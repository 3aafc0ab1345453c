"""State snapshots on the real broker's compacted state topic: several stages and partitions read
back in one pass, chunked state reassembled, and a half-written snapshot never half-loaded."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from prometheus_client import REGISTRY

from fleetwatch import topics
from fleetwatch.bus.kafka import KafkaBus
from fleetwatch.bus.partitioner import partition_for
from fleetwatch.pipeline import state_store
from fleetwatch.pipeline.state_store import read_snapshots, write_snapshot
from tests.helpers.messages import gpu, sample
from tests.integration.services import TopicTail, partition_count
from tests.integration.workers import Detect, produce


def test_snapshots_of_several_stages_and_partitions_come_back_from_one_read(
    kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(state_store, "CHUNK_BYTES", 1000)  # several chunks per snapshot
    run = uuid.uuid4().hex[:8]
    node, job = f"g-{run}/node", f"g-{run}/job"
    states = {(node, 0): os.urandom(3500), (job, 0): os.urandom(10), (node, 1): os.urandom(2000)}
    producer = KafkaBus(kafka_bootstrap).producer()
    for (stage, p), state in states.items():
        write_snapshot(producer, stage, p, {"in.topic": 100 + p}, b"old" + state)
        write_snapshot(producer, stage, p, {"in.topic": 200 + p}, state)  # the newer one wins
    # A newer snapshot of (job, 1) interrupted after its first chunk, over a complete older one:
    # its chunk replaced the old chunk 0, so neither generation is whole and the state is cold.
    write_snapshot(producer, job, 1, {"in.topic": 7}, os.urandom(2500))
    producer.send(
        topics.STATE, key=f"{job}/1/chunk-00000".encode(), value=b"0123456789abcdef:partial", partition=1
    )
    assert not producer.flush(30), "records not acknowledged"
    producer.close()

    made: list[tuple[str, list[int]]] = []

    class CountingBus(KafkaBus):
        def read_to_end(self, topic, partitions, on_record, timeout_s):  # type: ignore[no-untyped-def]
            made.append((topic, sorted(partitions)))
            return super().read_to_end(topic, partitions, on_record, timeout_s)

    factory = CountingBus(kafka_bootstrap)

    missing = (f"g-{run}/none", 0)
    lost: list[tuple[tuple[str, int], str]] = []
    got = read_snapshots(factory, [*states, (job, 1), missing], on_lost=lambda k, why: lost.append((k, why)))
    assert made == [(topics.STATE, [0, 1])]  # one pass over the partitions involved
    for (stage, p), state in states.items():
        snap = got[(stage, p)]
        assert snap is not None
        assert snap.state == state and snap.offsets == {"in.topic": 200 + p}
    assert got[(job, 1)] is None
    assert got[missing] is None
    assert lost == [((job, 1), "incomplete")]  # a missing snapshot is not a lost one
    assert read_snapshots(factory, []) == {} and len(made) == 1  # nothing wanted, nothing read

    # A state partition not read to its end in time starts cold, and says so.
    lost.clear()
    late = read_snapshots(factory, list(states), timeout_s=0, on_lost=lambda k, why: lost.append((k, why)))
    assert late == dict.fromkeys(states)
    assert sorted(lost) == sorted((k, "timeout") for k in states)


def _lost(group: str, stage: str) -> float:
    labels = {"group": group, "stage": stage, "reason": "unreadable"}
    return REGISTRY.get_sample_value("fleetwatch_worker_state_lost_total", labels) or 0.0


def _plant(bootstrap: str, state: str, partition: int, manifest: bytes, chunk: bytes | None = None) -> None:
    """A manifest (and chunk 0) for one partition of a stage on the state topic, as a hostile or
    buggy client could write it."""
    producer = KafkaBus(bootstrap).producer()
    if chunk is not None:
        producer.send(
            topics.STATE, key=f"{state}/{partition}/chunk-00000".encode(), value=chunk, partition=partition
        )
    producer.send(
        topics.STATE, key=f"{state}/{partition}/manifest".encode(), value=manifest, partition=partition
    )
    assert not producer.flush(30), "records not acknowledged"
    producer.close()


def test_unreadable_state_starts_its_partition_cold_and_detect_goes_on_across_a_restart(
    kafka_bootstrap: str, topic_tail: Callable[[str], TopicTail]
) -> None:
    """Issue 23, item 4: a manifest on fleet.state.v1 that is not one ([1,2,3], garbage bytes, a
    chunk count of 10**12, offsets of another topic) once made the restore in the assign
    callback raise; the worker exited with SystemError, and again on every restart (the record
    is compacted, not gone). Now each such partition starts cold, counted as unreadable, and a
    real detect worker goes on finding faults in its telemetry, after a restart too."""
    run = uuid.uuid4().hex[:6]
    group = f"test-hostile-{run}"  # Detect's group for this run
    node_state, job_state = f"{group}/detect-node", f"{group}/detect-job"
    n_parts = partition_count(kafka_bootstrap, topics.TELEMETRY)
    nodes = [f"su{run}-{i}" for i in range(40)]
    by_part: dict[int, str] = {}
    for n in nodes:  # a node of each telemetry partition
        by_part.setdefault(partition_for(n.encode(), n_parts), n)
    assert len(by_part) == n_parts >= 2
    _plant(kafka_bootstrap, node_state, 0, b"[1,2,3]")
    _plant(kafka_bootstrap, node_state, 1, b"\x00\xff not json")
    _plant(kafka_bootstrap, job_state, 0, b'{"generation": "a", "chunks": 1000000000000, "offsets": {}}')
    findings = topic_tail(topics.FINDINGS)

    def xid_on_every_partition(seq: int) -> None:
        now = time.time()
        produce(
            kafka_bootstrap,
            topics.TELEMETRY,
            [(n, sample(n, now, seq, [gpu(0, xids=[79])])) for n in by_part.values()],
        )

    def found(since: float, want: set[str]) -> set[str]:
        """The nodes with an XID finding first seen after `since`, once `want` are among them."""

        def mine(recs: list[Any]) -> set[str]:
            return {
                m["node"]
                for r in recs
                if r.key and r.key.decode() in by_part.values()
                and (m := orjson.loads(r.value))["kind"] == "xid" and m["first_seen"] >= since
            }  # fmt: skip

        return mine(findings.collect(lambda rs: mine(rs) >= want, 120))  # a first batch may compile kernels

    d = Detect(kafka_bootstrap, run)  # today: SystemError out of the assign callback
    try:
        assert _lost(group, "detect-node") == 2 and _lost(group, "detect-job") == 1
        since = time.time() - 1
        xid_on_every_partition(1)
        assert found(since, set(by_part.values())) == set(by_part.values())  # the cold partitions included
        assert d.thread.is_alive()
    finally:
        d.close()

    # A restart: the cold partitions were snapshotted afresh and restore; a new hostile snapshot
    # (whole, but its offsets are another topic's) starts its partition cold again.
    from fleetwatch.pipeline.job_table import JobTable
    from fleetwatch.pipeline.node_stage import NodeTask

    task = NodeTask(JobTable())
    _plant(
        kafka_bootstrap,
        node_state,
        1,
        b'{"generation": "g", "chunks": 1, "offsets": {"fleet.other.v1": 5}, "written_at": 1}',
        b"g:" + task.to_bytes(),
    )
    task.close()
    d = Detect(kafka_bootstrap, run)
    try:
        assert _lost(group, "detect-node") == 3 and _lost(group, "detect-job") == 1
        since = time.time() - 1
        xid_on_every_partition(2)
        # partition 1 is cold: its node's XID is a new incident; the others' continue theirs
        assert by_part[1] in found(since, {by_part[1]})
        assert d.thread.is_alive()
    finally:
        d.close()
