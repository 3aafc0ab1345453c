"""The one protocol every per-node detector follows, and what it is given with each batch.

A detector sees a columnar batch of telemetry (detectors/batch.py) and returns finding/1 dicts
(detectors/findings.py). The task that runs it (pipeline/node_stage.py) guarantees, once for all
of them, that each (node, ts) arrives at most once and that a node's samples arrive in increasing
ts: duplicates and late samples are dropped before any detector sees them. State is held by the
detector and snapshotted with to_state(); from_state() takes the configuration from the
deployment, never from the snapshot (tests/unit/test_snapshot_config.py). The generic checks every
registered detector passes are in tests/unit/test_detector_checks.py; the registry is
detectors/registry.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from fleetwatch.detectors.batch import TelemetryBatch
from fleetwatch.detectors.findings import Forgotten, IncidentBook

Finding = dict[str, Any]


@dataclass(frozen=True, slots=True)
class NodeContext:
    """What the task knows around one batch, beyond the batch itself."""

    nodes: list[str]  # each message's node (batch.nodes())
    seen: set[str]  # the nodes that reported in this batch
    last_ts: Mapping[str, float]  # every node the task holds: its latest sample's ts, this batch's included
    prev_ts: Mapping[str, float]  # the batch's nodes: their latest ts before it (absent for a new node)
    # what the detectors before this one found in this batch (the registry's order)
    findings: list[Finding] = field(default_factory=list)
    # (ts, node, weight): failed jobs newly known that these nodes were in (the lemon's history)
    job_failures: list[tuple[float, str, float]] = field(default_factory=list)


class NodeDetector(Protocol):
    book: IncidentBook  # its open incidents (health, metrics and forgetting read them)

    def observe(self, batch: TelemetryBatch, ctx: NodeContext) -> list[Finding]:
        """Learn from the batch; the findings it opens, updates or resolves."""
        ...

    def forget(self, gone: Forgotten) -> list[Finding]:
        """Drop these nodes' state; resolve their open incidents, saying why."""
        ...

    def to_state(self) -> Any:
        """The learned state only (JSON-able): never the configuration."""
        ...

    @classmethod
    def from_state(cls, state: Any, config: Any) -> NodeDetector:
        """State from a snapshot, configuration from the deployment."""
        ...


class JobDetector(Protocol):
    """A detector of the job stage (pipeline/job_stage.py): it compares the nodes of a job with
    each other, from the job's own records (step/1, nodefeatures/1, job/1), not from a node's
    telemetry. Same state contract as NodeDetector."""

    book: IncidentBook

    def observe(self, msgs: Sequence[Mapping[str, Any]]) -> list[Finding]:
        """Learn from records of one job-keyed partition, in offset order (any of the three schemas)."""
        ...

    def to_state(self) -> Any: ...

    @classmethod
    def from_state(cls, state: Any, config: Any) -> JobDetector: ...
