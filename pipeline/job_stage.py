"""The per-job stage: step times and node features (both keyed by job) -> straggler findings.

It also owns fleet.jobs.v1 in the consumer group (same key, same partition count): a job's
end resolves its straggler findings, and a malformed job record is dead-lettered once, by
the one worker that owns its partition.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from detectors.straggler import StragglerConfig, StragglerDetector
from fleetwatch import topics
from pipeline.tasks import Output

ENDED = frozenset({"finished", "failed"})


@dataclass
class JobTask:
    straggler: StragglerDetector = field(default_factory=StragglerDetector)

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
        return cls(StragglerDetector.from_bytes(raw, config))
