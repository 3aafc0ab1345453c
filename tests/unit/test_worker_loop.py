"""The worker loop on the in-memory bus (fleetwatch/bus/memory.py): the same Worker class that runs
on the real broker (tests/integration/test_worker.py, test_worker_guard.py), with its consumer and
producer injected. Commits follow acknowledged outputs, bad records are dead-lettered, a task that
raises is rebuilt from its snapshot, and partitions change hands with their state."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import orjson
import pytest
from prometheus_client import REGISTRY

from fleetwatch import schemas, topics
from fleetwatch.bus import TopicPart
from fleetwatch.bus.memory import MemoryBus
from fleetwatch.pipeline.state_store import write_snapshot
from fleetwatch.pipeline.tasks import Output, Refused
from fleetwatch.pipeline.worker import Worker
from fleetwatch.runtime import StopFlag
from tests.helpers.counting import CountingTask, counting_stage
from tests.helpers.messages import telemetry

IN, OUT = "in.v1", "out.v1"
NODES = [f"node-{i:02d}" for i in range(8)]


def _bus() -> MemoryBus:
    bus = MemoryBus(partitions=4, log_append_time=())
    for t in (IN, OUT, topics.STATE, topics.DEADLETTER):
        bus.create_topic(t)
    return bus


def _feed(bus: MemoryBus, seqs: range, nodes: Sequence[str] = NODES) -> None:
    for s in seqs:
        for n in nodes:
            bus.append(IN, n.encode(), schemas.encode(telemetry(node=n, seq=s)))


def _counts(bus: MemoryBus) -> dict[str, list[int]]:
    by_node: dict[str, list[int]] = {}
    for r in bus.records(OUT):
        m = orjson.loads(r.value)
        by_node.setdefault(m["node"], []).append(m["n"])
    return by_node


def _drain(worker: Worker) -> None:
    while worker.step(timeout_ms=0):
        pass


def test_outputs_are_produced_before_the_input_is_committed_and_bad_records_are_dead_lettered() -> None:
    bus = _bus()
    _feed(bus, range(5))
    bus.append(IN, b"node-00", b"{not json")
    worker = Worker(bus, "g", [counting_stage("count", IN, OUT)], snapshot_every_s=3600)
    _drain(worker)
    assert _counts(bus) == {n: [1, 2, 3, 4, 5] for n in NODES}
    [dead] = bus.records(topics.DEADLETTER)
    assert dict(dead.headers)["reason"] == b"not_json"
    ends = {TopicPart(IN, p): len(log) for p, log in enumerate(bus.partitions(IN))}
    assert bus.committed("g") == ends


def test_outputs_the_broker_never_acknowledges_stop_the_worker_before_it_commits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("fleetwatch.pipeline.worker.time.sleep", lambda _s: None)
    bus = _bus()
    worker = Worker(bus, "g", [counting_stage("count", IN, OUT)], snapshot_every_s=3600)
    worker.step(timeout_ms=0)  # joins (the anchoring snapshots go out)
    _feed(bus, range(1))
    bus.fail_next = 3  # the first three sends fail, then the broker is back: resent, all there
    _drain(worker)
    assert _counts(bus) == {n: [1] for n in NODES}
    committed = bus.committed("g")
    assert sum(committed.values()) == len(NODES)

    _feed(bus, range(1, 2))
    bus.fail_next = 10**9  # an outage that never ends: nothing committed past what was delivered
    with pytest.raises(RuntimeError, match="could not be produced"):
        worker.step(timeout_ms=0)
    assert bus.committed("g") == committed


def test_a_worker_that_gave_up_delivering_saves_and_commits_nothing_past_it_when_it_closes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """detect and act close their worker in `finally`: after a delivery that failed for good, that
    close must not snapshot or commit the batch whose outputs were never produced (the broker may
    take the snapshot and the commit while the output topic still fails), or its outputs are lost."""
    monkeypatch.setattr("fleetwatch.pipeline.worker.time.sleep", lambda _s: None)
    bus = _bus()
    worker = Worker(bus, "g", [counting_stage("count", IN, OUT)], snapshot_every_s=3600)
    _feed(bus, range(1))
    _drain(worker)
    committed = bus.committed("g")
    _feed(bus, range(1, 2))
    bus.fail_next = 6 * len(NODES)  # every attempt of this batch's delivery fails
    with pytest.raises(RuntimeError, match="could not be produced"):
        worker.step(timeout_ms=0)
    bus.fail_next = 0  # the broker takes the closing snapshot and commit again
    worker.close()
    assert bus.committed("g") == committed
    successor = Worker(bus, "g", [counting_stage("count", IN, OUT)], snapshot_every_s=3600)
    _drain(successor)
    # replayed from the last snapshot (at least once, same ids): the lost batch's outputs are there
    assert {n: sorted(set(c)) for n, c in _counts(bus).items()} == {n: [1, 2] for n in NODES}


def test_idle_exit_does_not_fire_while_the_first_join_is_still_under_way() -> None:
    """A join that outlasts --idle-exit (librdkafka's first rebalance waits seconds) is not
    idleness: the worker waits for its partitions and handles their records before it exits."""
    bus = _bus()
    _feed(bus, range(2))
    worker = Worker(bus, "g", [counting_stage("count", IN, OUT)], snapshot_every_s=3600)
    real_poll = worker.consumer.poll
    joined_at = time.monotonic() + 1.0

    def slow_join(max_records: int, timeout_s: float) -> Any:
        if time.monotonic() < joined_at:  # as a consumer whose join has not completed yet
            time.sleep(0.05)
            return {}
        return real_poll(max_records, timeout_s)

    worker.consumer.poll = slow_join  # type: ignore[method-assign]
    worker.run(StopFlag(install=False), idle_exit_s=0.3)
    worker.close()
    assert _counts(bus) == {n: [1, 2] for n in NODES}


class RaisingTask(CountingTask):
    """Counts, and raises part-way through a batch on node-02's sample seq 3."""

    def process(self, topic: str, msgs: Sequence[dict[str, Any]]) -> list[Output]:
        out: list[Output] = []
        for m in msgs:
            if m["node"] == "node-02" and m["seq"] == 3:
                raise ZeroDivisionError("a detector bug")
            out += super().process(topic, [m])
        return out


def test_a_record_that_raises_is_dead_lettered_and_every_other_is_counted_once() -> None:
    bus = _bus()
    _feed(bus, range(6))
    worker = Worker(bus, "g", [counting_stage("count", IN, OUT, task=RaisingTask)], snapshot_every_s=3600)
    for _ in range(20):
        worker.step(timeout_ms=0)
    counts = _counts(bus)
    # replayed outputs repeat with the same value: the last of each node is its count
    final = {n: max(v) for n, v in counts.items()}
    assert final == {**{n: 6 for n in NODES}, "node-02": 5}
    [dead] = [r for r in bus.records(topics.DEADLETTER) if dict(r.headers)["reason"] == b"internal_error"]
    assert orjson.loads(dead.value)["seq"] == 3 and b"ZeroDivisionError" in dict(dead.headers)["detail"]


def test_partitions_change_hands_with_their_state() -> None:
    """A second member joins: the first snapshots what it gives up, the second restores it and
    counts on; then the first leaves and the second takes everything, still counting on."""
    bus = _bus()
    _feed(bus, range(3))
    a = Worker(bus, "g", [counting_stage("count", IN, OUT)], snapshot_every_s=3600)
    _drain(a)
    b = Worker(bus, "g", [counting_stage("count", IN, OUT)], snapshot_every_s=3600)
    a.step(timeout_ms=0)
    b.step(timeout_ms=0)
    assert a.consumer.assignment() and b.consumer.assignment()
    assert not a.consumer.assignment() & b.consumer.assignment()
    _feed(bus, range(3, 5))
    _drain(a)
    _drain(b)
    a.close()
    _feed(bus, range(5, 6))
    _drain(b)
    assert len(b.consumer.assignment()) == 4
    assert {n: v[-1] for n, v in _counts(bus).items()} == {n: 6 for n in NODES}
    b.close()


def test_a_restarted_worker_resumes_from_its_snapshot_not_from_the_start() -> None:
    bus = _bus()
    _feed(bus, range(4))
    a = Worker(bus, "g", [counting_stage("count", IN, OUT)], snapshot_every_s=3600)
    a.run(StopFlag(install=False), idle_exit_s=0)
    a.close()
    produced = [len(log) for log in bus.partitions(OUT)]
    _feed(bus, range(4, 5))
    b = Worker(bus, "g", [counting_stage("count", IN, OUT)], snapshot_every_s=3600)
    _drain(b)
    new = [
        orjson.loads(r.value)["n"]
        for log, k in zip(bus.partitions(OUT), produced, strict=True)
        for r in log[k:]
    ]
    assert sorted(new) == [5] * len(NODES)


def test_each_output_topic_is_written_by_its_stages_serializer() -> None:
    """A stage owns how its outputs are written: a topic it names gets its serializer, the others
    compact JSON, and the snapshot of the task is not affected."""
    bus = _bus()
    bus.create_topic("other.v1")
    _feed(bus, range(2), nodes=NODES[:2])

    class TwoTopics(CountingTask):
        def process(self, topic: str, msgs: Sequence[dict[str, Any]]) -> list[Output]:
            out = super().process(topic, msgs)
            return out + [("other.v1", k, m) for _t, k, m in out]

    stage = counting_stage(
        "count", IN, OUT, task=TwoTopics, serializers={OUT: lambda m: f"{m['node']}={m['n']}".encode()}
    )
    worker = Worker(bus, "g", [stage], snapshot_every_s=3600)
    _drain(worker)
    assert sorted(r.value for r in bus.records(OUT)) == sorted(
        f"{n}={k}".encode() for n in NODES[:2] for k in (1, 2)
    )
    assert sorted((m["node"], m["n"]) for m in (orjson.loads(r.value) for r in bus.records("other.v1"))) == [
        (n, k) for n in NODES[:2] for k in (1, 2)
    ]
    worker.close()


def test_a_snapshot_its_stage_cannot_load_starts_that_partition_cold_and_the_worker_goes_on() -> None:
    """A snapshot a stage cannot load (a bug, or one written by a release this one does not read)
    must not stop the worker on every restart: that partition starts from the group's offsets
    with no state, counted as state lost ("unreadable"); the others restore as usual."""
    bus = _bus()
    _feed(bus, range(3))
    a = Worker(bus, "g", [counting_stage("count", IN, OUT)], snapshot_every_s=3600)
    a.run(StopFlag(install=False), idle_exit_s=0)
    a.close()
    producer = bus.producer()
    write_snapshot(producer, "g/count", 0, {IN: 0}, b"{not a state")
    producer.flush(timeout_s=1)

    def unreadable() -> float:
        labels = {"group": "g", "stage": "count", "reason": "unreadable"}
        return REGISTRY.get_sample_value("fleetwatch_worker_state_lost_total", labels) or 0.0

    lost = unreadable()
    produced = [len(log) for log in bus.partitions(OUT)]
    _feed(bus, range(3, 4))
    b = Worker(bus, "g", [counting_stage("count", IN, OUT)], snapshot_every_s=3600)
    _drain(b)
    assert unreadable() == lost + 1
    new = {
        (m := orjson.loads(r.value))["node"]: m["n"]
        for log, k in zip(bus.partitions(OUT), produced, strict=True)
        for r in log[k:]
    }
    cold = {n for n in NODES if bus.partition_of(IN, n.encode()) == 0}
    assert cold and new == {n: 1 if n in cold else 4 for n in NODES}  # partition 0 counts afresh


def _callback_errors(group: str, callback: str) -> float:
    labels = {"group": group, "callback": callback}
    return REGISTRY.get_sample_value("fleetwatch_bus_rebalance_errors_total", labels) or 0.0


def _latest(bus: MemoryBus) -> dict[str, int]:
    return {node: ns[-1] for node, ns in _counts(bus).items()}


def test_an_assignment_whose_restore_raises_is_held_unread_and_taken_on_retry() -> None:
    """No exception leaves a rebalance callback (issue 23, item 4: on the real broker one came out
    of poll() as SystemError and the worker exited, on every restart). Reading the state topic
    fails once: the partitions are held without being read (nothing skipped), counted, and the
    retry restores every one from its snapshot."""
    bus = _bus()
    _feed(bus, range(3))
    a = Worker(bus, "g-retry", [counting_stage("count", IN, OUT)], snapshot_every_s=3600)
    _drain(a)
    a.close()
    _feed(bus, range(3, 4))
    read = bus.read_to_end
    calls: list[int] = []

    def flaky(*args: Any, **kw: Any) -> set[int]:
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionError("the state topic is out of reach")
        return read(*args, **kw)

    bus.read_to_end = flaky  # type: ignore[method-assign]
    errors = _callback_errors("g-retry", "assign")
    b = Worker(bus, "g-retry", [counting_stage("count", IN, OUT)], snapshot_every_s=3600)
    produced = len(bus.records(OUT))
    assert b.step(timeout_ms=0) == 0  # the failed assignment: nothing read, nothing raised
    assert b.consumer.assignment() == set() and not b.tasks
    assert len(bus.records(OUT)) == produced
    assert _callback_errors("g-retry", "assign") == errors + 1
    _drain(b)
    assert len(calls) == 2 and len(b.consumer.assignment()) == 4
    assert _latest(bus) == dict.fromkeys(NODES, 4)  # restored, not cold: no count lost or doubled
    b.close()


class _Brittle(CountingTask):
    """A task whose state cannot be written once it has counted node-00 (a bug in to_bytes)."""

    def to_bytes(self) -> bytes:
        if "node-00" in self.counts:
            raise ValueError("cannot serialise")
        return super().to_bytes()


def test_a_revoke_whose_snapshot_raises_does_not_stop_the_worker_and_loses_nothing() -> None:
    """A snapshot that cannot be written when partitions are revoked: the worker goes on, and that
    partition's next owner replays its input from the previous snapshot."""
    bus = _bus()
    stage = counting_stage("count", IN, OUT, task=_Brittle)
    a = Worker(bus, "g-revoke", [stage], snapshot_every_s=3600)
    a.step(timeout_ms=0)  # joins: every task anchored, node-00's too (nothing counted yet)
    _feed(bus, range(3))
    _drain(a)
    b = Worker(bus, "g-revoke", [stage], snapshot_every_s=3600)  # a rebalance: a revokes everything
    _drain(a)
    _drain(b)
    assert a.tasks and b.tasks and len(a.consumer.assignment() | b.consumer.assignment()) == 4
    _feed(bus, range(3, 4))
    _drain(a)
    _drain(b)
    assert _latest(bus) == dict.fromkeys(NODES, 4)
    a.close()
    b.close()


def test_a_snapshot_whose_offsets_are_not_of_its_stages_inputs_is_not_used() -> None:
    """Offsets in a snapshot steer where the new owner reads: a snapshot whose offsets name another
    topic, or are not offsets, starts its partition cold (counted as unreadable)."""
    for bad in ({"other.v1": 3}, {IN: "3"}, {IN: -1}, {IN: True}):
        bus = _bus()
        _feed(bus, range(2))
        producer = bus.producer()
        write_snapshot(producer, "g-offsets/count", 0, bad, orjson.dumps({"node-xx": 9}))  # type: ignore[arg-type]
        labels = {"group": "g-offsets", "stage": "count", "reason": "unreadable"}
        lost = REGISTRY.get_sample_value("fleetwatch_worker_state_lost_total", labels) or 0.0
        w = Worker(bus, "g-offsets", [counting_stage("count", IN, OUT)], snapshot_every_s=3600)
        _drain(w)
        assert REGISTRY.get_sample_value("fleetwatch_worker_state_lost_total", labels) == lost + 1, bad
        assert "node-xx" not in w.tasks[("count", 0)].counts  # type: ignore[attr-defined]
        assert _latest(bus) == dict.fromkeys(NODES, 2)
        w.close()


class RefusingTask(CountingTask):
    """Counts, but refuses every sample of node-03 in the call that brings it, and keeps node-05's
    first sample back to refuse it in its partition's next call (as the job stage does with a step
    it held for its job/1)."""

    def __init__(self, out_topic: str, counts: dict[str, int] | None = None) -> None:
        super().__init__(out_topic, counts)
        self.kept: list[dict[str, Any]] = []
        self.refused: list[Refused] = []

    def process(self, topic: str, msgs: Sequence[dict[str, Any]]) -> list[Output]:
        self.refused = [Refused(topic, "unknown_job", "kept too long", m) for m in self.kept]
        self.kept, take = [], []
        for i, m in enumerate(msgs):
            if m["node"] == "node-03":
                self.refused.append(Refused(topic, "not_in_job", "not listed", m, i))
            elif m["node"] == "node-05" and m["seq"] == 0:
                self.kept.append(m)
            else:
                take.append(m)
        return super().process(topic, take)


def _rejected(reason: str) -> float:
    labels = {"group": "g-refuse", "topic": IN, "reason": reason}
    return REGISTRY.get_sample_value("fleetwatch_worker_rejected_total", labels) or 0.0


def test_records_a_task_refuses_are_dead_lettered_with_its_reason_and_counted() -> None:
    """The general way for a task to refuse a decoded record (pipeline/tasks.Refused): the worker
    dead-letters it with the task's reason, by its original bytes (or re-encoded, for one an
    earlier call kept), counts it by reason, and the rest goes on."""
    bus = _bus()
    bus.append(IN, b"node-03", b"{not json")  # a decode failure first: the indices skip it
    _feed(bus, range(3))
    before = {r: _rejected(r) for r in ("not_in_job", "unknown_job")}
    worker = Worker(
        bus, "g-refuse", [counting_stage("count", IN, OUT, task=RefusingTask)], snapshot_every_s=3600
    )
    _drain(worker)
    _feed(bus, range(3, 5))
    _drain(worker)
    counts = _counts(bus)
    assert "node-03" not in counts and counts["node-05"] == [1, 2, 3, 4]
    letters = [(dict(r.headers), r.value) for r in bus.records(topics.DEADLETTER)]
    refused = [
        (h["reason"], orjson.loads(v)["seq"], h["source"].count(b":"))
        for h, v in letters
        if h["reason"] != b"not_json"
    ]
    assert sorted(refused) == sorted([(b"not_in_job", s, 2) for s in range(5)] + [(b"unknown_job", 0, 1)])
    originals = {schemas.encode(telemetry(node="node-03", seq=s)) for s in range(5)}
    assert {v for h, v in letters if h["reason"] == b"not_in_job"} == originals
    assert _rejected("not_in_job") - before["not_in_job"] == 5
    assert _rejected("unknown_job") - before["unknown_job"] == 1


def test_a_snapshot_that_loads_but_fails_every_record_starts_its_partition_cold() -> None:
    """A state its stage loads but cannot run on ([1,2,3] where a dict of counts belongs): each
    record raised, was dead-lettered and the same state restored, for good. After
    FAILING_STATE_RECORDS records in a row the snapshot is not used: the partition starts cold
    (counted as unreadable), and its input, those records included, is counted from there."""
    from fleetwatch.pipeline.worker import FAILING_STATE_RECORDS

    bus = _bus()
    producer = bus.producer()
    write_snapshot(producer, "g-bad/count", 0, {IN: 0}, b"[1,2,3]")
    cold = [n for n in NODES if bus.partition_of(IN, n.encode()) == 0]
    _feed(bus, range(FAILING_STATE_RECORDS), cold[:1])
    labels = {"group": "g-bad", "stage": "count", "reason": "unreadable"}
    lost = REGISTRY.get_sample_value("fleetwatch_worker_state_lost_total", labels) or 0.0
    w = Worker(bus, "g-bad", [counting_stage("count", IN, OUT)], snapshot_every_s=3600)
    for _ in range(10 * FAILING_STATE_RECORDS):
        w.step(timeout_ms=0)
    _feed(bus, range(FAILING_STATE_RECORDS, FAILING_STATE_RECORDS + 1))
    _drain(w)
    assert REGISTRY.get_sample_value("fleetwatch_worker_state_lost_total", labels) == lost + 1
    latest = _latest(bus)
    assert latest[cold[0]] == FAILING_STATE_RECORDS + 1  # every record counted, from a cold state
    assert all(latest[n] == 1 for n in NODES if n != cold[0])
    w.close()


def test_a_stages_tick_runs_from_the_loop_while_it_owns_a_task_and_is_produced_as_a_batch_is() -> None:
    """Stage.tick: Worker.run calls it (here on every pass) once the member owns a task of the
    stage, never while it owns none; its outputs are written by the stage's serializers, counted
    and acknowledged like a batch's. Stage.begin_batch is told each batch's partitions before any
    task of the batch runs."""
    bus = MemoryBus(partitions=1, log_append_time=())
    for t in (IN, OUT, topics.STATE, topics.DEADLETTER):
        bus.create_topic(t)
    _feed(bus, range(2), NODES[:2])
    events: list[str] = []

    class Recording(CountingTask):
        def process(self, topic: str, msgs: Sequence[dict[str, Any]]) -> list[Output]:
            events.append(f"process {len(msgs)}")
            return super().process(topic, msgs)

    def stage(member: str) -> Any:
        def tick() -> list[Output]:
            events.append(f"tick {member}")
            return [(OUT, "tick", {"schema": "tick/1", "member": member})]

        return replace(
            counting_stage(
                "count", IN, OUT, task=Recording, serializers={OUT: lambda m: b"T" + schemas.encode(m)}
            ),
            begin_batch=lambda parts: events.append(f"begin {sorted(parts)}"),
            tick=tick,
            tick_every_s=0.0,
        )

    produced = (
        REGISTRY.get_sample_value("fleetwatch_worker_outputs_total", {"group": "g", "topic": OUT}) or 0.0
    )
    a = Worker(bus, "g", [stage("a")], snapshot_every_s=3600)
    b = Worker(bus, "g", [stage("b")], snapshot_every_s=3600)  # one partition: b joins second, owns none
    a.run(StopFlag(install=False), idle_exit_s=0)
    b.run(StopFlag(install=False), idle_exit_s=0)
    assert events[:2] == ["begin [0]", "process 4"] and events[2:] and set(events[2:]) == {"tick a"}, events
    ticks = [r for r in bus.records(OUT) if r.key == b"tick"]
    assert len(ticks) == len(events) - 2 and all(
        r.value == b'T{"schema":"tick/1","member":"a"}' for r in ticks
    )
    counted = REGISTRY.get_sample_value("fleetwatch_worker_outputs_total", {"group": "g", "topic": OUT})
    assert counted == produced + 4 + len(ticks)
    assert b.owned("count") == {} and set(a.owned("count")) == {0}
    a.close()
    b.close()


def test_lost_partitions_are_dropped_without_a_snapshot_or_a_commit() -> None:
    """A member whose partitions were lost (its session expired, it was fenced) may no longer own
    them: another member may have snapshotted past it. It writes nothing for them and keeps no
    task to resume: whoever takes them restores the group's snapshot and replays what follows."""
    bus = _bus()
    _feed(bus, range(3))
    a = Worker(bus, "g", [counting_stage("count", IN, OUT)], snapshot_every_s=3600)
    _drain(a)
    parts = sorted(a.consumer.assignment())
    snapshots, committed = len(bus.records(topics.STATE)), a.consumer.group_offsets(parts)
    a._on_lost(parts)  # as the bus calls it
    assert len(bus.records(topics.STATE)) == snapshots and a.consumer.group_offsets(parts) == committed
    assert not a.tasks and not a._parked and not a.offsets
    a.close()  # nothing of the lost tasks is written at close either
    assert len(bus.records(topics.STATE)) == snapshots and a.consumer.group_offsets(parts) == committed
    b = Worker(bus, "g", [counting_stage("count", IN, OUT)], snapshot_every_s=3600)
    _feed(bus, range(3, 4))
    _drain(b)  # from the group's snapshot, the input after it replayed: nothing lost
    assert _latest(bus) == {n: 4 for n in NODES}
    b.close()
