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

from fleetwatch import topics
from fleetwatch.detectors.straggler import STEP_TIME, StragglerConfig, StragglerDetector, loo_median
from fleetwatch.pipeline import fleet_metrics
from fleetwatch.pipeline.tasks import Output

ENDED = frozenset({"finished", "failed"})


@dataclass(eq=False)  # identity: tasks are registered with the metrics collector
class JobTask:
    straggler: StragglerDetector = field(default_factory=StragglerDetector)

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
        if topic == topics.STEPS:
            findings = self.straggler.process_steps(msgs)
        elif topic == topics.NODE_FEATURES:
            findings = self.straggler.process_features(msgs)
        else:  # jobs
            findings = []
            for m in msgs:
                if m["state"] in ENDED:
                    findings += self.straggler.job_ended(m["job"], m["ts"])
        return [(topics.FINDINGS, f["node"], f) for f in findings]

    def to_bytes(self) -> bytes:
        return self.straggler.to_bytes()

    @classmethod
    def from_bytes(cls, raw: bytes, config: StragglerConfig | None = None) -> JobTask:
        """State from the snapshot, configuration from `config`: the deployment's, as new tasks get."""
        return cls(StragglerDetector.from_bytes(raw, config))
