"""The nodes a node-stage task holds: one row per node, shared by the task and every detector.

Every per-node array of the stage (a detector's baselines, counters, histories; the task's census
times) is indexed by these rows, so a node is looked up once per batch, not once per detector,
and forgetting nodes renumbers every array with the same `Compaction`.

The index also keeps each node's latest accepted sample time, and `admit` is the one place where
duplicate and late samples (ts not after the node's latest) are dropped before any detector sees
them: at-least-once delivery upstream makes duplicates normal, and an XID must not count twice.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from fleetwatch.detectors.batch import TelemetryBatch
from fleetwatch.detectors.counters import Segments, increasing_in_group
from fleetwatch.detectors.rows import Compaction, RowIndex, grow


@dataclass(frozen=True, slots=True)
class Admission:
    """Which samples of a batch are new, and what their nodes had before it."""

    rows: np.ndarray  # (M,) each sample's node's row
    keep: np.ndarray  # (M,) bool: new samples; the rest are duplicates or late
    before: np.ndarray  # (M,) each sample's node's latest ts before the batch (NaN: a new node)


class NodeIndex(RowIndex):
    def __init__(self, names: Iterable[str] = (), last_ts: Sequence[float] = ()) -> None:
        super().__init__(names)
        self._last_ts = np.full(max(16, len(self)), np.nan)  # spare rows after len(self): NaN
        self._last_ts[: len(last_ts)] = last_ts

    @property
    def last_ts(self) -> np.ndarray:
        """(N,) every node's latest accepted sample time, by row (a view: read only)."""
        return self._last_ts[: len(self)]

    @property
    def allocated(self) -> int:
        """Rows the arrays have room for (they grow by doubling; compaction shrinks them)."""
        return len(self._last_ts)

    def admit(self, names: Sequence[str], ts: np.ndarray) -> Admission:
        """admit_rows for samples given by their nodes' names (registering the new ones)."""
        return self.admit_rows(self.lookup(names), ts)

    def admit_batch(self, batch: TelemetryBatch) -> Admission:
        """admit_rows for a columnar batch."""
        return self.admit_rows(self.rows_of(batch), batch.ts)

    def rows_of(self, batch: TelemetryBatch) -> np.ndarray:
        """(M,) each message's node's row, registering new nodes: the batch's distinct nodes are
        looked up once each."""
        return self.lookup(batch.node_names)[batch.node_idx]

    def admit_rows(self, rows: np.ndarray, ts: np.ndarray) -> Admission:
        """Keep the samples (each its node's row, from lookup) with ts after everything their
        node sent before (earlier samples in the batch included); their nodes' latest ts move on."""
        self._last_ts = grow(self._last_ts, len(self), np.nan)
        before = self._last_ts[rows]
        if len(np.unique(rows)) == len(rows):  # one sample per node, as a batch nearly always has
            keep = np.isnan(before) | (ts > before)
            self._last_ts[rows[keep]] = ts[keep]
            return Admission(rows, keep, before)
        # a node twice or more: each sample against its node's latest before it, in arrival order
        seg = Segments.of(rows)
        floor = np.nan_to_num(before[seg.order], nan=-np.inf)
        ok = increasing_in_group(seg, ts[seg.order], floor)
        keep = np.zeros(len(rows), dtype=bool)
        keep[seg.order[ok]] = True
        np.fmax.at(self._last_ts, rows[keep], ts[keep])
        return Admission(rows, keep, before)

    def drop(self, names: Iterable[str]) -> Compaction | None:
        rows = super().drop(names)
        if rows is not None:
            self._last_ts = rows.take(self._last_ts, np.nan)
        return rows

    def place(self, saved: Sequence[str], values: np.ndarray, into: np.ndarray) -> np.ndarray:
        """A snapshot's per-node rows (`values`, laid out in the node order `saved`) written into
        `into` at this index's rows; rows of nodes the snapshot lacks keep what `into` holds.
        Snapshots from before the shared index kept each detector's own order."""
        if list(saved) == self.names:
            into[: len(values)] = values
            return into
        src = self.sources(saved)
        ok = (src >= 0) & (src < len(values))
        into[np.flatnonzero(ok)] = values[src[ok]]
        return into
