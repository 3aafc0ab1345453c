"""Consumer groups of detect workers on the real broker, for the scale-out and fault-tolerance
tests (test_scale_out.py, test_fault_tolerance.py): a simulated scenario, the finding ids the
clock-free in-process path finds in it, an in-process detect member, committed start offsets and
"drained" checks."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

from fleetwatch import schemas, topics
from fleetwatch.bus import Record, TopicPart
from fleetwatch.bus.admin import Admin
from fleetwatch.bus.kafka import KafkaBus
from fleetwatch.collectors.sim import Simulation
from fleetwatch.collectors.sim.scenario import Scenario, parse_scenario
from fleetwatch.detectors.batch import TelemetryBatch
from fleetwatch.pipeline.detect import stages
from fleetwatch.pipeline.job_stage import JobTask
from fleetwatch.pipeline.job_table import JobTable, JobTableFollower
from fleetwatch.pipeline.node_stage import NodeTask, NodeTaskConfig
from fleetwatch.pipeline.worker import Worker
from fleetwatch.runtime import StopFlag
from tests.integration.services import TopicTail, commit_offsets, end_offsets, read_quiet

INPUTS = (topics.TELEMETRY, topics.STEPS, topics.JOBS, topics.NODE_FEATURES)


def scenario(
    prefix: str, nodes: int, duration_s: float, faults: list[dict[str, Any]], seed: int = 11
) -> Scenario:
    return parse_scenario(
        {
            "name": f"test-{prefix}",
            "seed": seed,
            "nodes": nodes,
            "node_prefix": prefix,
            "duration_s": duration_s,
            "jobs": {
                "sizes": [4, 8],
                "duration_s": [600, 900],
                "step_time_s": [0.8, 1.0],
                "startup_s": [2, 3],
            },
            "faults": faults,
        }
    )


def sim_ticks(sc: Scenario, epoch: float) -> list[list[tuple[str, str, dict[str, Any]]]]:
    return list(Simulation(sc, epoch=epoch).ticks())


def expected_ids(sc: Scenario, epoch: float) -> dict[str, dict[str, Any]]:
    """Finding id -> first emission, from the clock-free in-process path (pipeline/evaluate.py)."""
    jobs = JobTable()
    node_task = NodeTask(jobs, NodeTaskConfig())
    job_task = JobTask()
    out: list[Any] = []
    try:
        for tick in Simulation(sc, epoch=epoch).ticks():
            for topic, _k, m in tick:
                if topic == topics.JOBS:
                    jobs.apply(m)
                    out += job_task.process(topic, [m])
            node_out = node_task.process(
                topics.TELEMETRY,
                TelemetryBatch.from_messages([m for t, _k, m in tick if t == topics.TELEMETRY]),
            )
            out += node_out
            out += job_task.process(
                topics.NODE_FEATURES, [m for t, _k, m in node_out if t == topics.NODE_FEATURES]
            )
            out += job_task.process(topics.STEPS, [m for t, _k, m in tick if t == topics.STEPS])
    finally:
        node_task.close()
        job_task.close()
    return first_by_id(m for t, _k, m in out if t == topics.FINDINGS)


def first_by_id(findings: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    first: dict[str, dict[str, Any]] = {}
    for f in findings:
        first.setdefault(f["id"], f)
    return first


def describe(findings: dict[str, dict[str, Any]]) -> list[tuple[Any, ...]]:
    return sorted(
        (f["node"], f["kind"], f.get("gpu"), f["evidence"].get("rule"), f["first_seen"], i[:8])
        for i, f in findings.items()
    )


def commit_start(bootstrap: str, group: str) -> None:
    """Commit the current end of every detect input for `group`: its workers (whenever they join)
    start exactly there, so nothing produced afterwards is skipped and nothing older is read."""
    commit_offsets(bootstrap, group, end_offsets(bootstrap, INPUTS))


def wait_committed(bootstrap: str, group: str, targets: dict[TopicPart, int], timeout_s: float) -> None:
    admin = Admin(bootstrap)
    try:
        deadline = time.monotonic() + timeout_s
        behind: dict[TopicPart, tuple[int, int]] = {}
        while time.monotonic() < deadline:
            got = admin.group_offsets(group, list(targets))  # -1: nothing committed
            behind = {tp: (got.get(tp, -1), end) for tp, end in targets.items() if got.get(tp, -1) < end}
            if not behind:
                return
            time.sleep(0.3)
        raise AssertionError(f"group {group} did not reach the end of its input in {timeout_s} s: {behind}")
    finally:
        admin.close()


def wait_drained(bootstrap: str, group: str, timeout_s: float) -> None:
    """Everything produced so far on the inputs is processed and committed by `group` (outputs are
    flushed before each commit, so its findings are on the topic). Node features are produced by
    the group itself, so their end is taken once the other inputs are done."""
    deadline = time.monotonic() + timeout_s
    wait_committed(bootstrap, group, end_offsets(bootstrap, INPUTS[:3]), timeout_s)
    wait_committed(
        bootstrap, group, end_offsets(bootstrap, [topics.NODE_FEATURES]), deadline - time.monotonic()
    )


def produce(
    bootstrap: str, ticks: Sequence[list[tuple[str, str, dict[str, Any]]]], pace_s: float = 0.0
) -> None:
    p = KafkaBus(bootstrap).producer(linger_ms=20, max_message_bytes=8 << 20)
    try:
        for tick in ticks:
            for topic, key, m in tick:
                p.send(topic, key=key.encode(), value=schemas.encode(m))
            if pace_s:
                assert not p.flush(30), "records not acknowledged"
                time.sleep(pace_s)
        assert not p.flush(60), "records not acknowledged"
    finally:
        p.close(10)


def mine(records: Iterable[Record], prefix: str) -> list[dict[str, Any]]:
    return [schemas.decode(r.value) for r in records if r.key and r.key.startswith(prefix.encode())]


def drain_tail(tail: TopicTail, quiet_s: float = 1.5, timeout_s: float = 15.0) -> list[Record]:
    """What the tail holds until nothing new arrives for quiet_s."""
    return read_quiet(tail.reader, quiet_s, timeout_s)


def drain_to_end(tail: TopicTail, timeout_s: float = 60.0) -> list[Record]:
    """Everything the topic holds now, read up to its end offsets taken at the call: for a
    writer that has flushed and left, where a quiet spell can end a read early on a loaded
    machine (a fetch slower than the quiet window)."""
    ends = tail.reader.end_offsets(tail.tps)
    records: list[Record] = []
    deadline = time.monotonic() + timeout_s
    while any(tail.reader.position(tp) < end for tp, end in ends.items()):
        if time.monotonic() > deadline:
            behind = {
                f"{tp.topic}:{tp.partition}": end - tail.reader.position(tp) for tp, end in ends.items()
            }
            raise AssertionError(f"{tail.topic} not read to its end in {timeout_s:.0f} s: {behind}")
        records += tail.reader.poll(0.2)
    return records


class Member:
    """One in-process detect worker (the stages `fleetwatch detect` runs, with its own job table
    follower), stepping in its own thread."""

    def __init__(self, bootstrap: str, group: str, name: str, snapshot_every_s: float = 3600.0) -> None:
        self.name = name
        self.jobs = JobTable()
        self.follower = JobTableFollower(self.jobs, KafkaBus(bootstrap))
        self.follower.start()
        assert self.follower.caught_up.wait(30), "the job table follower never caught up"
        self.worker = Worker(
            bootstrap,
            group,
            stages(self.jobs),
            snapshot_every_s=snapshot_every_s,
            client_id=f"{group}-{name}",
            start_at="latest",
        )
        self.stop = StopFlag(install=False)
        self.assigned: frozenset[TopicPart] = frozenset()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name=f"member-{name}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            while not self.stop:
                self.worker.step(timeout_ms=200)
                self.assigned = frozenset(self.worker.consumer.assignment())
        except BaseException as e:  # reported by check(): a worker must not die
            self.error = e

    def check(self) -> None:
        assert self.error is None, f"worker {self.name} died: {self.error!r}"
        assert self.thread.is_alive(), f"worker {self.name} stopped"

    def close(self) -> None:
        self.stop.set()
        self.thread.join(30)
        try:
            self.worker.close()
        finally:
            self.follower.stop()


def wait_balanced(bootstrap: str, members: Sequence[Member], timeout_s: float = 45.0) -> None:
    """Every member owns partitions, none twice, and together all of the detect inputs."""
    want = set(end_offsets(bootstrap, INPUTS[:3]) | end_offsets(bootstrap, [topics.NODE_FEATURES]))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for m in members:
            m.check()
        sets = [m.assigned for m in members]
        if all(sets) and sum(map(len, sets)) == len(want) and set().union(*sets) == want:
            return
        time.sleep(0.2)
    raise AssertionError(f"group never balanced: {[sorted(map(tuple, m.assigned)) for m in members]}")
