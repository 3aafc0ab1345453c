"""The per-job stage: step times and node features (both keyed by job) -> straggler findings.

It also owns fleet.jobs.v1 in the consumer group (same key, same partition count): a job's
end resolves its straggler findings, and a malformed job record is dead-lettered once, by
the one worker that owns its partition. A job's job/1 also says which nodes its detectors may
judge: a step or feature record for another node is refused, one that comes before its job's
job/1 is held for it (pipeline/job_members.py).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import groupby
from typing import Any, cast

import orjson

from fleetwatch import topics
from fleetwatch.config import why
from fleetwatch.detectors.findings import ForgottenJob
from fleetwatch.detectors.job_batch import ENDED_STATES, JobBatch
from fleetwatch.detectors.protocol import JobDetector
from fleetwatch.detectors.registry import JOB_DETECTORS
from fleetwatch.detectors.straggler import StragglerConfig, StragglerDetector
from fleetwatch.pipeline import fleet_metrics
from fleetwatch.pipeline.job_members import HoldConfig, JobMembers, NodesOf, RunningConfig
from fleetwatch.pipeline.tasks import Output, Refused
from fleetwatch.schemas import JOB


@dataclass(frozen=True)
class JobTaskConfig:
    """Each registered job detector's configuration, under its registry name; and how long the
    stage holds a job's records for its job/1 (`hold`)."""

    straggler: StragglerConfig = field(
        default_factory=StragglerConfig, metadata=why("stragglers: nodes slower than the rest of their job")
    )
    hold: HoldConfig = field(
        default_factory=HoldConfig, metadata=why("records of a job waiting for its job/1")
    )
    running: RunningConfig = field(
        default_factory=RunningConfig, metadata=why("running jobs the stage keeps at most (a flood of job/1)")
    )


@dataclass(eq=False)  # identity: tasks are registered with the metrics collector
class JobTask:
    config: JobTaskConfig = field(default_factory=JobTaskConfig)
    straggler: StragglerDetector | None = None
    # job -> "schema node" -> the ts of the latest record taken: a redelivered or late step or
    # feature record is dropped here, once for every job detector, as the node stage drops stale
    # telemetry (at-least-once delivery upstream makes them normal). A job's entries go with its end.
    last_ts: dict[str, dict[str, float]] = field(default_factory=dict)
    # the worker's JobTable: the nodes of a job whose job/1 this task has not read (configuration)
    jobs: NodesOf | None = None
    members: JobMembers | None = None  # each job's nodes, and the records held for a job/1
    refused: list[Refused] = field(default_factory=list)  # by the latest process() call
    # where the task exports its jobs and counts (fleetwatch detect: fleet_metrics.exported());
    # None, as eval and tests build it: nothing exported, the global registry untouched
    metrics: fleet_metrics.FleetStateCollector | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        for reg in JOB_DETECTORS:  # each one the task was not given starts empty
            if getattr(self, reg.name) is None:
                setattr(self, reg.name, reg.detector(getattr(self.config, reg.name)))
        if self.members is None:
            self.members = JobMembers(self.config.hold, self.jobs, self.config.running)
        if self.metrics is not None:
            self.metrics.add_jobs(self)

    @property
    def detectors(self) -> list[JobDetector]:
        """The registered job detectors (detectors/registry.py), in the order they run."""
        return [getattr(self, reg.name) for reg in JOB_DETECTORS]

    def job_step_times(self) -> Iterator[tuple[str, str | None, float, float]]:
        """Per running job: each node's median step time and slowdown, and the job median."""
        yield from self.straggler.step_times()

    def open_incidents(self) -> Iterator[tuple[str, str]]:
        for book in (d.book for d in self.detectors):
            for inc in list(book.open.values()):
                yield inc.kind, inc.severity

    def close(self) -> None:
        if self.metrics is not None:
            self.metrics.remove(self)

    def process(self, topic: str, msgs: Sequence[dict[str, Any]]) -> list[Output]:
        # steps, node features or jobs: each message says which by its schema. Only records of
        # the nodes a job's job/1 lists reach the detectors; the worker dead-letters the refused.
        taken, self.refused = self.members.admit(msgs)
        if self.members.late and self.metrics is not None:
            self.metrics.stale_job_records.inc(self.members.late)
        found: list[dict[str, Any]] = []
        # the records in order, and a job the bounds forgot in its place among them
        for forgets, run in groupby(taken, key=lambda r: isinstance(r, ForgottenJob)):
            if forgets:
                gone = cast(list[ForgottenJob], list(run))
                for job in gone:
                    self.last_ts.pop(job.job, None)
                    if self.metrics is not None:
                        self.metrics.jobs_forgotten.labels(job.reason).inc()
                found += [f for d in self.detectors for f in d.forget(gone)]
            elif fresh := self._fresh(cast(list[dict[str, Any]], list(run))):
                batch = JobBatch.from_records(fresh)
                found += [f for d in self.detectors for f in d.observe(batch)]
        return [(topics.FINDINGS, f["node"], f) for f in found]

    def _fresh(self, msgs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for m in msgs:
            if m["schema"] == JOB:
                if m["state"] in ENDED_STATES:
                    self.last_ts.pop(m["job"], None)
                out.append(m)
                continue
            seen = self.last_ts.setdefault(m["job"], {})
            key = f"{m['schema']} {m['node']}"
            if m["ts"] <= seen.get(key, float("-inf")):
                if self.metrics is not None:
                    self.metrics.stale_job_records.inc()
                continue
            seen[key] = m["ts"]
            out.append(m)
        return out

    def to_bytes(self) -> bytes:
        state: dict[str, Any] = {reg.name: getattr(self, reg.name).to_state() for reg in JOB_DETECTORS}
        state["last_ts"] = self.last_ts
        state["members"] = self.members.to_state()
        return orjson.dumps(state, option=orjson.OPT_SERIALIZE_NUMPY)

    @classmethod
    def from_bytes(
        cls,
        raw: bytes,
        config: JobTaskConfig | None = None,
        jobs: NodesOf | None = None,
        metrics: fleet_metrics.FleetStateCollector | None = None,
    ) -> JobTask:
        """State from the snapshot, configuration from `config`: the deployment's, as new tasks get;
        `jobs`: the worker's JobTable."""
        d = orjson.loads(raw)
        config = config or JobTaskConfig()
        if "straggler" not in d:  # snapshots before the job stage kept what it had taken
            d = {"straggler": d, "last_ts": {}}
        detectors = {
            reg.name: reg.detector.from_state(d[reg.name], getattr(config, reg.name)) for reg in JOB_DETECTORS
        }
        # snapshots before the membership check have no "members": the JobTable tells the nodes
        members = JobMembers.from_state(d.get("members"), config.hold, jobs, config.running)
        last_ts = d["last_ts"]  # checked: a made-up one would raise at every step record, not here
        if not isinstance(last_ts, dict) or not all(
            isinstance(marks, dict) and all(type(t) in (int, float) for t in marks.values())
            for marks in last_ts.values()
        ):
            raise ValueError("the snapshot's last_ts is not job -> record -> time")
        return cls(config, **detectors, last_ts=last_ts, jobs=jobs, members=members, metrics=metrics)
