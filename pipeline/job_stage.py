"""The per-job stage: step times and node features (both keyed by job) -> straggler findings.

It also owns fleet.jobs.v1 in the consumer group (same key, same partition count): a job's
end resolves its straggler findings, and a malformed job record is dead-lettered once, by
the one worker that owns its partition.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
from prometheus_client import Counter

from fleetwatch import topics
from fleetwatch.detectors.straggler import (
    ENDED_STATES,
    STEP_TIME,
    StragglerConfig,
    StragglerDetector,
    loo_median,
)
from fleetwatch.pipeline import fleet_metrics
from fleetwatch.pipeline.tasks import Output
from fleetwatch.schemas import JOB

STALE = Counter(
    "fleetwatch_detect_stale_job_records_total",
    "step and node-feature records dropped as duplicate or out of order",
)


@dataclass(eq=False)  # identity: tasks are registered with the metrics collector
class JobTask:
    straggler: StragglerDetector = field(default_factory=StragglerDetector)
    # job -> "schema node" -> the ts of the latest record taken: a redelivered or late step or
    # feature record is dropped here, once for every job detector, as the node stage drops stale
    # telemetry (at-least-once delivery upstream makes them normal). A job's entries go with its end.
    last_ts: dict[str, dict[str, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        fleet_metrics.COLLECTOR.add_jobs(self)

    def job_step_times(self) -> Iterator[tuple[str, str | None, float, float]]:
        """Per running job: each node's median step time and slowdown, and the job median."""
        for (job, signal), w in list(self.straggler.windows.items()):
            if signal != STEP_TIME.name or len(w.count) < 2:
                continue
            ready = w.count >= self.straggler.cfg.min_samples
            if ready.sum() < 2:
                continue
            names = [n for n, i in sorted(w.nodes.items(), key=lambda kv: kv[1])]
            med = np.nanmedian(w.ring[ready], axis=1)
            peer = loo_median(med)
            for n, m, p in zip(
                [names[i] for i in np.flatnonzero(ready)], med.tolist(), peer.tolist(), strict=True
            ):
                yield job, n, m, m / p - 1.0
            yield job, None, float(np.median(med)), 0.0

    def open_incidents(self) -> Iterator[tuple[str, str]]:
        for inc in list(self.straggler.book.open.values()):
            yield inc.kind, inc.severity

    def close(self) -> None:
        fleet_metrics.COLLECTOR.remove(self)

    def process(self, topic: str, msgs: Sequence[dict[str, Any]]) -> list[Output]:
        # steps, node features or jobs: each message says which by its schema
        fresh = self._fresh(msgs)
        return [(topics.FINDINGS, f["node"], f) for f in self.straggler.observe(fresh)] if fresh else []

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
                STALE.inc()
                continue
            seen[key] = m["ts"]
            out.append(m)
        return out

    def to_bytes(self) -> bytes:
        state = {"straggler": self.straggler.to_state(), "last_ts": self.last_ts}
        return orjson.dumps(state, option=orjson.OPT_SERIALIZE_NUMPY)

    @classmethod
    def from_bytes(cls, raw: bytes, config: StragglerConfig | None = None) -> JobTask:
        """State from the snapshot, configuration from `config`: the deployment's, as new tasks get."""
        d = orjson.loads(raw)
        if "straggler" not in d:  # snapshots before the job stage kept what it had taken
            return cls(StragglerDetector.from_state(d, config))
        return cls(StragglerDetector.from_state(d["straggler"], config), d["last_ts"])
