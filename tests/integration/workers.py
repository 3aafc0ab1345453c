"""Workers on the real broker for the integration tests: Detect (the stages `fleetwatch detect`
runs, on a thread, positioned at the end of its inputs), and a small per-node counting stage for
the worker mechanism's own tests (CountingTask, counting_stage, produce)."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import orjson
from kafka import KafkaProducer

from fleetwatch import kafka_io, schemas
from fleetwatch.pipeline.detect import stages
from fleetwatch.pipeline.job_table import JobTable, JobTableFollower
from fleetwatch.pipeline.tasks import Output, Stage
from fleetwatch.pipeline.worker import Worker
from fleetwatch.runtime import StopFlag


class Detect:
    """A detect worker (the stages `fleetwatch detect` runs) in its own group, positioned at the end
    of every input partition before the test produces anything, running on a thread."""

    def __init__(self, bootstrap: str, run: str) -> None:
        self.jobs = JobTable()
        self.follower = JobTableFollower(self.jobs, lambda: kafka_io.make_consumer(bootstrap))
        self.follower.start()
        self.worker = Worker(
            bootstrap, f"test-hostile-{run}", stages(self.jobs), snapshot_every_s=3600, start_at="latest"
        )
        expected = sum(
            len(self.worker.consumer.partitions_for_topic(t) or ())
            for s in stages(self.jobs)
            for t in s.inputs
        )
        deadline = time.monotonic() + 60
        while len(self.worker.consumer.assignment()) < expected and time.monotonic() < deadline:
            self.worker.step(timeout_ms=200)
        assert len(self.worker.consumer.assignment()) == expected, "the worker never got all its partitions"
        for tp in self.worker.consumer.assignment():
            self.worker.consumer.position(tp)
        self.stop = StopFlag(install=False)
        self.thread = threading.Thread(target=self.worker.run, args=(self.stop,))
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(30)
        self.worker.close()
        self.follower.stop()


class CountingTask:
    """Counts samples per node; emits (node, count) for every sample it accepts."""

    def __init__(self, out_topic: str, counts: dict[str, int] | None = None) -> None:
        self.out_topic = out_topic
        self.counts = counts or {}

    def process(self, topic: str, msgs: Sequence[dict[str, Any]]) -> list[Output]:
        out: list[Output] = []
        for m in msgs:
            n = self.counts[m["node"]] = self.counts.get(m["node"], 0) + 1
            out.append(
                (self.out_topic, m["node"], {"schema": "count/1", "node": m["node"], "seq": m["seq"], "n": n})
            )
        return out

    def to_bytes(self) -> bytes:
        return orjson.dumps(self.counts)


def counting_stage(name: str, in_topic: str, out_topic: str, load_delay_s: float = 0.0) -> Stage:
    def load(_p: int, raw: bytes) -> CountingTask:
        time.sleep(load_delay_s)  # stands for a big state
        return CountingTask(out_topic, orjson.loads(raw))

    return Stage(
        name=name,
        inputs=(in_topic,),
        schemas={in_topic: schemas.TELEMETRY},
        new_task=lambda p: CountingTask(out_topic),
        load_task=load,
    )


def produce(bootstrap: str, topic: str, values: list[tuple[str, bytes]]) -> None:
    p = KafkaProducer(**kafka_io.client_config(bootstrap))
    for key, value in values:
        p.send(topic, key=key.encode(), value=value)
    p.flush()
    p.close()
