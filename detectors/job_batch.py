"""Columnar view of a batch of job-keyed records: step/1, nodefeatures/1 and job/1, in offset order.

The job stage's counterpart of detectors/batch.TelemetryBatch: the stage builds it once per polled
batch and every job detector reads the same arrays (detectors/protocol.JobDetector). Records keep
their order: a job's end resolves what the records before it found, and records after it start the
job afresh, so a detector walks the batch in runs of one kind (`runs`).

Layout (R records): `kind` (R,) STEP, FEATURES or JOB; `job`, `node` (R,) names (node "" for a
job record); `ts` (R,); `step_time_s` (R,) a step's time, NaN on other records; `sm_clock_mhz`,
`util` (R,) a feature record's, NaN where absent or on other records; `ended` (R,) a job record
whose state ends the job; `listed` (R,) a job record's nodes, the only ones its detectors may judge
(() on other records).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import groupby
from typing import Any

import numpy as np

from fleetwatch.schemas import JOB, NODE_FEATURES, STEP

ENDED_STATES = frozenset({"finished", "failed"})  # job/1 states that end a job
STEP_RECORD, FEATURES_RECORD, JOB_RECORD = 0, 1, 2
_KIND = {STEP: STEP_RECORD, NODE_FEATURES: FEATURES_RECORD, JOB: JOB_RECORD}


@dataclass(frozen=True, slots=True)
class JobBatch:
    kind: np.ndarray
    job: list[str]
    node: list[str]
    ts: np.ndarray
    step_time_s: np.ndarray
    sm_clock_mhz: np.ndarray
    util: np.ndarray
    ended: np.ndarray
    listed: list[tuple[str, ...]]

    @classmethod
    def from_records(cls, msgs: Sequence[Mapping[str, Any]]) -> JobBatch:
        """Decoded records of the three schemas (schemas.decode has checked each)."""
        nan = float("nan")
        kind = [_KIND[m["schema"]] for m in msgs]
        return cls(
            kind=np.array(kind, dtype=np.int8),
            job=[m["job"] for m in msgs],
            node=[m.get("node", "") for m in msgs],
            ts=np.array([m["ts"] for m in msgs], dtype=np.float64),
            step_time_s=np.array([m.get("step_time_s", nan) for m in msgs], dtype=np.float64),
            sm_clock_mhz=np.array(
                [nan if m.get("sm_clock_mhz") is None else m["sm_clock_mhz"] for m in msgs], dtype=np.float64
            ),
            util=np.array([nan if m.get("util") is None else m["util"] for m in msgs], dtype=np.float64),
            ended=np.array(
                [k == JOB_RECORD and m["state"] in ENDED_STATES for k, m in zip(kind, msgs, strict=True)],
                dtype=bool,
            ),
            listed=[tuple(m["nodes"]) if k == JOB_RECORD else () for k, m in zip(kind, msgs, strict=True)],
        )

    def runs(self) -> Iterator[tuple[int, np.ndarray]]:
        """(kind, record indices) of each run of records of one kind, in order."""
        start = 0
        for k, run in groupby(self.kind.tolist()):
            n = len(list(run))
            yield k, np.arange(start, start + n)
            start += n
