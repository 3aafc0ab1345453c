"""The one protocol every per-node detector follows, and what it is given with each batch.

A detector sees a columnar batch of telemetry (detectors/batch.py) and returns finding/1 dicts
(detectors/findings.py). The task that runs it (pipeline/node_stage.py) guarantees, once for all
of them, that each sample arrives at most once, in its agent's order: duplicates and late samples
are dropped before any detector sees them (NodeIndex.admit_batch), and each sample's `ts` is its
event time, which never goes back within a node (two samples of a node may share one where its
clock went back: a rate over such a pair has no time to divide by, and counters skip it).

State is held the same way by every detector: per-node numpy arrays indexed by the rows of the
task's one NodeIndex (detectors/node_index.py), which the detector is given at construction and
the context carries with each message's row; open incidents in an IncidentBook. A detector grows
its arrays to len(index) as nodes arrive and compacts them with the Compaction that forget() is
given. It is snapshotted with to_state(); from_state() takes the configuration from the
deployment, never from the snapshot (tests/unit/test_snapshot_config.py). The generic checks every
registered detector passes are in tests/unit/test_detector_checks.py; the registry is
detectors/registry.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np

from fleetwatch.detectors.batch import TelemetryBatch
from fleetwatch.detectors.findings import Forgotten, ForgottenJob, IncidentBook
from fleetwatch.detectors.job_batch import JobBatch
from fleetwatch.detectors.node_index import CLOCK_LEAD_S, Admission, NodeIndex
from fleetwatch.detectors.rows import Compaction

Finding = dict[str, Any]


@dataclass(frozen=True, slots=True)
class NodeContext:
    """What the task knows around one batch, beyond the batch itself."""

    # the task's nodes (detectors/node_index.py): names, rows (every detector's per-node arrays are
    # indexed by them) and every node's latest sample ts, this batch's included
    index: NodeIndex
    rows: np.ndarray  # (M,) each message's node's row in the index
    nodes: list[str]  # (M,) each message's node (batch.nodes())
    seen: set[str]  # the nodes that reported in this batch
    prev_ts: np.ndarray  # (U,) each of batch.node_names: its latest ts before this batch (NaN: new)
    # what the detectors before this one found in this batch (the registry's order)
    findings: list[Finding] = field(default_factory=list)
    # (ts, node, weight): failed jobs newly known that these nodes were in (the lemon's history)
    job_failures: list[tuple[float, str, float]] = field(default_factory=list)
    # (M,) each sample's own time minus its event time, batch.ts (NodeIndex admission): > 0 its
    # clock was ahead of the broker's, < 0 behind its node's previous sample; None: not known
    clock_jump: np.ndarray | None = None

    @classmethod
    def of(
        cls,
        batch: TelemetryBatch,
        index: NodeIndex,
        rows: np.ndarray,
        before: np.ndarray,
        job_failures: list[tuple[float, str, float]] | None = None,
    ) -> NodeContext:
        """The context of an admitted batch; rows, before: (M,) each message's Admission.rows and
        Admission.before."""
        nodes = batch.nodes()
        prev = np.empty(len(batch.node_names))
        prev[batch.node_idx] = before  # the same for every message of a node
        return cls(
            index=index,
            rows=rows,
            nodes=nodes,
            seen=set(batch.node_names),
            prev_ts=prev,
            job_failures=job_failures or [],
        )


def admit(
    batch: TelemetryBatch, index: NodeIndex, lead_s: float = CLOCK_LEAD_S
) -> tuple[Admission, TelemetryBatch, NodeContext]:
    """The one admission (NodeIndex.admit_batch) as the node stage applies it before any detector:
    (what it decided for every message; the new samples, each at its event time; their context).
    The batch is empty where no sample is new. pipeline/node_stage.py and the generic detector
    checks both feed detectors through this."""
    admitted = index.admit_batch(batch, lead_s)
    keep = admitted.keep
    # the detectors see each sample at its event time (never ahead of the broker's time, never
    # before its node's previous sample), and how far its own clock was off
    new = replace(batch if keep.all() else batch.select(keep), ts=admitted.ts[keep])
    ctx = NodeContext.of(new, index, admitted.rows[keep], admitted.before[keep])
    return admitted, new, replace(ctx, clock_jump=admitted.jump[keep])


class NodeDetector(Protocol):
    book: IncidentBook  # its open incidents (health, metrics and forgetting read them)

    def __init__(self, config: Any = None, index: NodeIndex | None = None) -> None:
        """Defaults for what is not given; a detector without the task's index keeps its own."""
        ...

    def observe(self, batch: TelemetryBatch, ctx: NodeContext) -> list[Finding]:
        """Learn from the batch; the findings it opens, updates or resolves."""
        ...

    def forget(self, gone: Forgotten, rows: Compaction | None) -> list[Finding]:
        """Resolve these nodes' open incidents, saying why, and drop their state: the index has
        dropped them already, and `rows` renumbers every per-node array (None: none of them was
        in the index)."""
        ...

    def to_state(self) -> Any:
        """The learned state only (JSON-able): never the configuration."""
        ...

    @classmethod
    def from_state(cls, state: Any, config: Any, index: NodeIndex) -> NodeDetector:
        """State from a snapshot, configuration from the deployment, rows from the task's index
        (restored first)."""
        ...


class JobDetector(Protocol):
    """A detector of the job stage (pipeline/job_stage.py): it compares the nodes of a job with
    each other, from the job's own records (step/1, nodefeatures/1, job/1) as a columnar
    JobBatch, not from a node's telemetry. Same state contract as NodeDetector; a job's end,
    in the batch, is where it forgets the job."""

    book: IncidentBook

    def observe(self, batch: JobBatch) -> list[Finding]:
        """Learn from records of one job-keyed partition, in offset order (any of the three schemas)."""
        ...

    def forget(self, gone: Sequence[ForgottenJob]) -> list[Finding]:
        """Resolve these running jobs' open incidents as forgotten (each at its `at`, saying why)
        and drop their state: the stage forgot them without seeing them end
        (pipeline/job_members.py)."""
        ...

    def to_state(self) -> Any: ...

    @classmethod
    def from_state(cls, state: Any, config: Any) -> JobDetector: ...
