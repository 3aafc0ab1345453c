"""Which jobs each node is running, read by every worker from the whole fleet.jobs.v1 topic.

Telemetry is partitioned by node and jobs by job, so a worker holding node X's partition
does not hold X's jobs' partitions. Job events are few, so every worker reads all of them
(a broadcast table) instead of repartitioning them.

A node may run several jobs at once (Slurm shares a node between jobs that each take some of its
CPUs or GPUs), so the table maps a node to all of them. The topic is compacted by job, and the
job publisher tombstones a job (value null) once its end is older than topics.JOB_HISTORY_S: a
tombstone makes the table forget the job, which compaction has dropped or soon will.
"""

from __future__ import annotations

import logging
import math
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from fleetwatch import schemas, topics
from fleetwatch.bus import Bus, Record, reference_time
from fleetwatch.follow import TopicFollower
from fleetwatch.refusal_log import RefusalLog

log = logging.getLogger(__name__)

ACTIVE_STATES = frozenset({"started", "running"})


FAILED_KEEP_S = topics.JOB_HISTORY_S  # failed jobs kept this long (event time) for the lemon detector
MAX_FAILED = 100_000  # and never more than this many, the oldest dropped first
# Running jobs leave at their end record or tombstone; a publisher that missed ends, or a flood of
# job/1 records (unsigned: the topic's ACL is what guards it), must not grow every worker's table,
# nor one node's list (each job of a node gets its features per sample) without bound
MAX_RUNNING = 100_000  # running jobs in all: the least recently announced leaves first
MAX_JOBS_PER_NODE = 256  # running jobs of one node: its job announced first leaves that node


class JobTable:
    """Running jobs (node -> its jobs, job -> nodes) and recently failed ones.

    Running jobs leave the table when they end, so it holds what runs now; a job's end removes it
    from its own nodes only, which keep their other jobs. Failed jobs are what the node stage adds
    to each node's lemon history (pipeline/node_stage.py): a task counts each failed job once, when
    it first sees it, and keeps what it counted in its own (snapshotted) state, so the table only
    needs those a task may not have seen yet (one that restarts from a snapshot, after an outage).
    It keeps those that failed within `failed_keep_s` of the newest job message's time, at most
    `max_failed` of them, dropping the first added first (a failure reported late, out of time
    order, leaves by the cap or when those added before it have left), and forgets a job at its
    tombstone (`forget`)."""

    def __init__(
        self,
        failed_keep_s: float = FAILED_KEEP_S,
        max_failed: int = MAX_FAILED,
        max_running: int = MAX_RUNNING,
        max_jobs_per_node: int = MAX_JOBS_PER_NODE,
    ) -> None:
        self._lock = threading.Lock()
        # node -> its running jobs, sorted (tuples: readers get them without a copy)
        self._node_jobs: dict[str, tuple[str, ...]] = {}
        # job -> its nodes, in the order the jobs were last announced (the least recent first)
        self._job_nodes: dict[str, tuple[str, ...]] = {}
        self._announced: dict[str, int] = {}  # job -> when it was last announced (a count)
        self._announcements = 0
        self.max_running = max_running
        self.max_jobs_per_node = max_jobs_per_node
        self.dropped = 0  # running jobs (or a job's place on one node) dropped by the two bounds
        self._refusals = RefusalLog(log)  # a flood logs its first drop and every 1000th
        self.failed_keep_s = failed_keep_s
        self.max_failed = max_failed
        self.failed_jobs: OrderedDict[str, tuple[str, ...]] = OrderedDict()  # job -> its nodes
        self._failed_at: dict[str, float] = {}  # job -> its failure's event time
        self.failed_version = 0  # counts failed jobs added: a reader skips its scan when unchanged
        self.newest = -math.inf  # the newest job message's event time

    def apply(self, msg: dict[str, Any]) -> None:
        job, nodes, ts = msg["job"], tuple(msg["nodes"]), float(msg["ts"])
        with self._lock:
            self._stop(job)
            if msg["state"] in ACTIVE_STATES:
                self._start(job, nodes)
            elif msg["state"] == "failed" and job not in self.failed_jobs and self._recent(ts):
                self.failed_jobs[job] = nodes
                self._failed_at[job] = ts
                self.failed_version += 1
            self.newest = max(self.newest, ts)
            self._prune_failed()

    def forget(self, job: str) -> None:
        """The job's tombstone: it leaves the running and the failed jobs. Tasks that counted its
        failure keep it in their lemon history; failed_version is not bumped (nothing to count)."""
        with self._lock:
            self._stop(job)
            if self.failed_jobs.pop(job, None) is not None:
                del self._failed_at[job]

    def _start(self, job: str, nodes: tuple[str, ...]) -> None:
        while len(self._job_nodes) >= self.max_running:
            oldest = next(iter(self._job_nodes))
            self._stop(oldest)
            self.dropped += 1
            self._refusals("running", f"{self.max_running} running jobs: {oldest[:64]} leaves the table")
        self._job_nodes[job] = nodes
        self._announcements += 1
        self._announced[job] = self._announcements
        node_jobs = self._node_jobs
        for n in dict.fromkeys(nodes):
            jobs = node_jobs.get(n, ())
            if len(jobs) >= self.max_jobs_per_node:
                first = min(jobs, key=self._announced.__getitem__)
                jobs = tuple(j for j in jobs if j != first)
                self._job_nodes[first] = tuple(x for x in self._job_nodes[first] if x != n)
                self.dropped += 1
                self._refusals("per_node", f"node {n[:64]} runs {len(jobs) + 1} jobs: {first[:64]} leaves it")
            node_jobs[n] = tuple(sorted({*jobs, job}))

    def _stop(self, job: str) -> None:
        node_jobs = self._node_jobs
        self._announced.pop(job, None)
        for n in self._job_nodes.pop(job, ()):
            rest = tuple(j for j in node_jobs.get(n, ()) if j != job)
            if rest:
                node_jobs[n] = rest
            else:
                node_jobs.pop(n, None)

    def _recent(self, ts: float) -> bool:
        """Within the window: a failure already past it (a replayed old record) is not taken back."""
        return ts >= self.newest - self.failed_keep_s

    def _prune_failed(self) -> None:
        horizon = self.newest - self.failed_keep_s
        failed = self.failed_jobs
        while failed and (len(failed) > self.max_failed or self._failed_at[next(iter(failed))] < horizon):
            job, _nodes = failed.popitem(last=False)
            del self._failed_at[job]

    def failed(self) -> tuple[int, list[tuple[str, tuple[str, ...]]]]:
        """(failed_version, the failed jobs and their nodes), read together."""
        with self._lock:
            return self.failed_version, list(self.failed_jobs.items())

    def failed_ids(self) -> set[str]:
        with self._lock:
            return set(self.failed_jobs)

    def jobs_on(self, node: str) -> tuple[str, ...]:
        """The node's running jobs, sorted; () for none."""
        return self._node_jobs.get(node, ())

    def jobs_of(self, nodes: Sequence[str]) -> list[tuple[str, ...]]:
        """jobs_on() of each node, read together."""
        with self._lock:
            get = self._node_jobs.get
            return [get(n, ()) for n in nodes]

    def nodes_of(self, job: str) -> tuple[str, ...]:
        return self._job_nodes.get(job, ())


class JobTableFollower(TopicFollower):
    """Keeps a JobTable current from fleet.jobs.v1 (all partitions, from the beginning; a tombstone
    makes it forget the job).

    It applies exactly the records the worker's job stage accepts: one decode (schemas.decode) with
    the record's key and clock reference, so a job the worker dead-letters (clock skew, a key that
    is not the job) never enters the table either. Every worker reads every job record, so none
    is dead-lettered here: the worker's job stage, which owns each jobs partition once in the
    consumer group, dead-letters and counts it."""

    def __init__(
        self,
        table: JobTable,
        bus: Bus,
        clock: schemas.ClockLimits | None = schemas.DEFAULT_CLOCK,
    ) -> None:
        super().__init__(topics.JOBS, None, bus)
        self.table = table
        self._clock = clock

    def apply_record(self, record: Record, now: float) -> None:
        if record.value is None:  # a tombstone: the publisher is done with this job
            if record.key is not None:
                self.table.forget(record.key.decode("utf-8", "replace"))
            return
        ref = reference_time(record, now)
        try:
            msg = schemas.decode(record.value, schemas.JOB, key=record.key, ref_ts=ref, clock=self._clock)
        except schemas.MessageError as e:
            log.debug("ignoring bad job record at %s: %s", record.offset, e)
            return
        self.table.apply(msg)
