"""Which job each node is running, read by every worker from the whole fleet.jobs.v1 topic.

Telemetry is partitioned by node and jobs by job, so a worker holding node X's partition
does not hold X's job's partition. Job events are few, so every worker reads all of them
(a broadcast table) instead of repartitioning them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from kafka import TopicPartition

from fleetwatch import schemas, topics

log = logging.getLogger(__name__)

ACTIVE_STATES = frozenset({"started", "running"})


class JobTable:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._node_job: dict[str, str] = {}
        self._job_nodes: dict[str, tuple[str, ...]] = {}
        self.failed_jobs: dict[str, tuple[str, ...]] = {}  # job -> its nodes, for lemon history

    def apply(self, msg: dict[str, Any]) -> None:
        job, nodes = msg["job"], tuple(msg["nodes"])
        with self._lock:
            old = self._job_nodes.pop(job, ())
            for n in old:
                if self._node_job.get(n) == job:
                    del self._node_job[n]
            if msg["state"] in ACTIVE_STATES:
                self._job_nodes[job] = nodes
                for n in nodes:
                    self._node_job[n] = job
            elif msg["state"] == "failed":
                self.failed_jobs[job] = nodes

    def job_of(self, node: str) -> str | None:
        return self._node_job.get(node)

    def jobs_of(self, nodes: Sequence[str]) -> list[str | None]:
        with self._lock:
            get = self._node_job.get
            return [get(n) for n in nodes]

    def nodes_of(self, job: str) -> tuple[str, ...]:
        return self._job_nodes.get(job, ())


class JobTableFollower(threading.Thread):
    """Keeps a JobTable current from fleet.jobs.v1 (all partitions, from the beginning)."""

    def __init__(self, table: JobTable, consumer_factory: Callable[[], Any]) -> None:
        super().__init__(name="job-table", daemon=True)
        self.table = table
        self._factory = consumer_factory
        self._stop = threading.Event()
        self.caught_up = threading.Event()

    def run(self) -> None:
        consumer = self._factory()
        try:
            parts = consumer.partitions_for_topic(topics.JOBS) or set()
            tps = [TopicPartition(topics.JOBS, p) for p in sorted(parts)]
            consumer.assign(tps)
            consumer.seek_to_beginning(*tps)
            end = consumer.end_offsets(tps)
            while not self._stop.is_set():
                for batch in consumer.poll(timeout_ms=200).values():
                    for r in batch:
                        try:
                            self.table.apply(schemas.decode(r.value, schemas.JOB))
                        except schemas.MessageError as e:
                            # Every worker reads every job record, so none dead-letters here; the
                            # worker's "jobs" stage, which owns each jobs partition once in the
                            # consumer group, dead-letters and counts it.
                            log.debug("ignoring bad job record at %s: %s", r.offset, e)
                if not self.caught_up.is_set() and all(consumer.position(tp) >= end[tp] for tp in tps):
                    self.caught_up.set()
        finally:
            consumer.close()

    def stop(self) -> None:
        self._stop.set()
