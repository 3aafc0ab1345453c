"""Detectors fed as the node stage feeds them, for tests that drive one detector without the task:
through the task's own admission (detectors/protocol.admit, which pipeline/node_stage.NodeTask
calls), so that no test re-implements which samples are new."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fleetwatch.detectors.batch import TelemetryBatch
from fleetwatch.detectors.node_index import NodeIndex
from fleetwatch.detectors.protocol import NodeDetector, admit


def observe(
    detector: NodeDetector, index: NodeIndex, msgs: Sequence[dict[str, Any]] | TelemetryBatch
) -> list[dict[str, Any]]:
    """The detector's findings on these messages (dicts or a batch) after the task's admission on
    `index` (the detector's: duplicates and late samples dropped, event times)."""
    batch = msgs if isinstance(msgs, TelemetryBatch) else TelemetryBatch.from_messages(msgs)
    _admission, new, ctx = admit(batch, index)
    return detector.observe(new, ctx) if new.size else []


def restored_index(index: NodeIndex) -> NodeIndex:
    """The index as NodeTask.from_bytes restores it from a snapshot (names, times, agent numbering)."""
    return NodeIndex(index.names, index.last_ts.tolist(), index.last_seq.tolist(), index.instances.tolist())
