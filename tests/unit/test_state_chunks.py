"""The state topic's chunks (pipeline/state_store.py) on the in-memory bus, whose reader sees what a
compacted topic keeps (the newest record per key): a snapshot smaller than the one before deletes
the chunks past its own, so a flood's high-water state does not stay on the topic for good; a state
no reader would load is not written, and the previous snapshot stays the one to restore."""

from __future__ import annotations

import orjson
import pytest

from fleetwatch import schemas, topics
from fleetwatch.bus.memory import MemoryBus
from fleetwatch.pipeline import state_store
from fleetwatch.pipeline.state_store import TooLarge, read_snapshots, write_snapshot
from fleetwatch.pipeline.worker import Worker
from fleetwatch.runtime import StopFlag
from tests.helpers.counting import counting_stage
from tests.helpers.messages import telemetry

IN, OUT = "in.v1", "out.v1"


def _bus() -> MemoryBus:
    bus = MemoryBus(partitions=2, log_append_time=())
    for t in (IN, OUT, topics.STATE, topics.DEADLETTER):
        bus.create_topic(t)
    return bus


def live_chunks(bus: MemoryBus, prefix: str) -> set[int]:
    """The chunk numbers under `prefix` whose newest record is not a tombstone (what compaction keeps)."""
    newest: dict[bytes, bytes | None] = {}
    for r in bus.records(topics.STATE):
        if r.key is not None and r.key.startswith(f"{prefix}/chunk-".encode()):
            newest[r.key] = r.value
    numbers = (k.rsplit(b"-", 1)[1] for k, v in newest.items() if v is not None)
    return {int(x) if x.isdigit() else -1 for x in numbers}


def test_a_smaller_snapshot_deletes_the_chunks_past_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(state_store, "CHUNK_BYTES", 8)
    bus = _bus()
    producer = bus.producer()
    key = ("g/stage", 1)
    assert write_snapshot(producer, *key, {IN: 5}, b"x" * 40) == 5
    producer.send(topics.STATE, key=b"g/stage/1/chunk-99999", value=b"?", partition=1)  # no writer's
    producer.send(topics.STATE, key=b"g/stage/1/chunk-1x", value=b"?", partition=1)
    stored: dict[tuple[str, int], set[int]] = {}
    assert read_snapshots(bus, [key], stored=stored)[key].state == b"x" * 40  # type: ignore[union-attr]
    assert stored == {key: {0, 1, 2, 3, 4}}  # what no reader reads is not counted
    assert write_snapshot(producer, *key, {IN: 9}, b"y" * 16, stored[key]) == 2
    assert live_chunks(bus, "g/stage/1") == {0, 1, 99999, -1}  # (-1: chunk-1x)
    again: dict[tuple[str, int], set[int]] = {}
    snap = read_snapshots(bus, [key], stored=again)[key]
    assert snap is not None and snap.state == b"y" * 16 and snap.offsets == {IN: 9}
    assert again == {key: {0, 1}}


def test_a_state_no_reader_would_load_is_not_written(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(state_store, "CHUNK_BYTES", 8)
    monkeypatch.setattr(state_store, "MAX_CHUNKS", 3)
    bus = _bus()
    producer = bus.producer()
    write_snapshot(producer, "g/stage", 0, {IN: 1}, b"z" * 24)  # three chunks: the most a reader loads
    before = len(bus.records(topics.STATE))
    with pytest.raises(TooLarge, match="not written"):
        write_snapshot(producer, "g/stage", 0, {IN: 2}, b"z" * 25)
    assert len(bus.records(topics.STATE)) == before  # nothing of it queued
    snap = read_snapshots(bus, [("g/stage", 0)])[("g/stage", 0)]
    assert snap is not None and snap.offsets == {IN: 1}  # the previous one stays


def test_a_worker_deletes_the_chunks_a_larger_snapshot_left(monkeypatch: pytest.MonkeyPatch) -> None:
    """A snapshot of 12 chunks left on the topic (a state grown by a flood, written by an earlier
    process): the worker restores it, and its next snapshot, a small one, leaves only its own
    chunks live. The counts go on from the restored state."""
    monkeypatch.setattr(state_store, "CHUNK_BYTES", 16)
    bus = _bus()
    nodes = [n for n in (f"node-{i:02d}" for i in range(40)) if bus.partition_of(IN, n.encode()) == 0][:2]
    padded = orjson.dumps(dict.fromkeys(nodes, 3)) + b" " * 160  # JSON with trailing whitespace
    producer = bus.producer()
    assert write_snapshot(producer, "g/count", 0, {IN: 0}, padded) == 12
    producer.flush(timeout_s=1)
    for n in nodes:
        bus.append(IN, n.encode(), schemas.encode(telemetry(node=n, seq=1)))
    w = Worker(bus, "g", [counting_stage("count", IN, OUT)], snapshot_every_s=3600)
    w.run(StopFlag(install=False), idle_exit_s=0)
    w.close()  # snapshots every task
    small = len(orjson.dumps(dict.fromkeys(nodes, 4)))
    assert live_chunks(bus, "g/count/0") == set(range(-(-small // 16)))
    counts = sorted(orjson.loads(r.value)["n"] for r in bus.records(OUT))
    assert counts == [4, 4]  # restored at 3, one more each
