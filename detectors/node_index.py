"""The nodes a node-stage task holds: one row per node, shared by the task and every detector.

Every per-node array of the stage (a detector's baselines, counters, histories; the task's census
times) is indexed by these rows, so a node is looked up once per batch, not once per detector,
and forgetting nodes renumbers every array with the same `Compaction`.

The index also keeps, per node, where its agent's numbering stands (instance, seq) and the node's
event time, and `admit` is the one place where duplicate and late samples are dropped before any
detector sees them: at-least-once delivery upstream makes duplicates normal, and an XID must not
count twice. The agent's numbering, not the node's clock, says which sample is newer, and each
new sample gets the event time the detectors see (detectors/admission_kernels.py has the rules).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from fleetwatch.detectors.admission_kernels import admission_pass
from fleetwatch.detectors.batch import TelemetryBatch
from fleetwatch.detectors.rows import Compaction, RowIndex, grow

# How far ahead of the broker's append time a sample's own time is believed (event time is capped
# there): a sample cannot reach the broker before it was taken, and NTP keeps well-run clocks
# within milliseconds of each other; 2 s leaves room for a sloppy one.
CLOCK_LEAD_S = 2.0


@dataclass(frozen=True, slots=True)
class Admission:
    """Which samples of a batch are new, what their nodes had before it, and their event times."""

    rows: np.ndarray  # (M,) each sample's node's row
    keep: np.ndarray  # (M,) bool: new samples; the rest are duplicates or late
    before: np.ndarray  # (M,) each sample's node's event time before the batch (NaN: a new node)
    ts: np.ndarray  # (M,) each new sample's event time (NaN for the others)
    jump: np.ndarray  # (M,) each new sample's own time minus its event time (> 0: clock ahead)


class NodeIndex(RowIndex):
    def __init__(
        self,
        names: Iterable[str] = (),
        last_ts: Sequence[float] = (),
        last_seq: Sequence[int] = (),
        instances: Sequence[Sequence[int]] = (),
    ) -> None:
        """last_ts, last_seq (the current instance's), instances ((current instance, the one before
        it, that one's last seq)): each node's, in the order of `names`; nodes past their ends have
        none (a seq of -1: not known)."""
        super().__init__(names)
        n = max(16, len(self))  # spare rows after len(self): no sample yet
        self._last_ts = np.full(n, np.nan)
        self._last_ts[: len(last_ts)] = last_ts
        self._seq = np.full(n, -1, dtype=np.int64)
        self._seq[: len(last_seq)] = last_seq
        agents = np.asarray(instances, dtype=np.int64).reshape(-1, 3)
        self._instance = np.zeros(n, dtype=np.int64)  # the current instance's code (0: none given)
        self._instance[: len(agents)] = agents[:, 0]
        self._replaced = np.zeros(n, dtype=np.int64)  # the instance before it (0: none)
        self._replaced[: len(agents)] = agents[:, 1]
        self._replaced_seq = np.full(n, -1, dtype=np.int64)  # that one's last seq (-1: none)
        self._replaced_seq[: len(agents)] = agents[:, 2]

    @property
    def last_ts(self) -> np.ndarray:
        """(N,) every node's event time (its latest accepted sample's), by row (a view: read only)."""
        return self._last_ts[: len(self)]

    @property
    def last_seq(self) -> np.ndarray:
        """(N,) every node's current instance's last accepted seq (-1: not known), by row (a view:
        read only)."""
        return self._seq[: len(self)]

    @property
    def instances(self) -> np.ndarray:
        """(N, 3) every node's current agent instance code, the one before it (0: none) and that
        one's last seq (-1: none), a copy."""
        n = len(self)
        return np.column_stack([self._instance[:n], self._replaced[:n], self._replaced_seq[:n]])

    @property
    def allocated(self) -> int:
        """Rows the arrays have room for (they grow by doubling; compaction shrinks them)."""
        return len(self._last_ts)

    def admit(self, names: Sequence[str], ts: np.ndarray) -> Admission:
        """admit_rows for samples known by their nodes' names and times alone (no agent numbering:
        later in time is newer), registering new nodes. For tools and tests."""
        m = len(names)
        no_seq = np.full(m, -1, dtype=np.int64)
        return self.admit_rows(
            self.lookup(names), np.zeros(m, dtype=np.int64), no_seq, ts, np.full(m, np.nan)
        )

    def admit_batch(self, batch: TelemetryBatch, lead_s: float = CLOCK_LEAD_S) -> Admission:
        """Which of a columnar batch's samples are new (registering new nodes): see
        detectors/admission_kernels.py. The nodes' state moves on to the new samples."""
        return self.admit_rows(
            self.rows_of(batch), batch.instance, batch.seq, batch.ts, batch.received, lead_s
        )

    def rows_of(self, batch: TelemetryBatch) -> np.ndarray:
        """(M,) each message's node's row, registering new nodes: the batch's distinct nodes are
        looked up once each."""
        return self.lookup(batch.node_names)[batch.node_idx]

    def admit_rows(
        self,
        rows: np.ndarray,
        instance: np.ndarray,
        seq: np.ndarray,
        ts: np.ndarray,
        received: np.ndarray,
        lead_s: float = CLOCK_LEAD_S,
    ) -> Admission:
        """admit_batch for samples given by their nodes' rows (from lookup) and their columns."""
        n = len(self)
        self._last_ts = grow(self._last_ts, n, np.nan)
        self._seq = grow(self._seq, n, -1)
        self._instance = grow(self._instance, n, 0)
        self._replaced = grow(self._replaced, n, 0)
        self._replaced_seq = grow(self._replaced_seq, n, -1)
        before = self._last_ts[rows]
        m = len(rows)
        keep = np.zeros(m, dtype=bool)
        event_ts, jump = np.full(m, np.nan), np.full(m, np.nan)
        admission_pass(
            rows,
            instance,
            seq,
            ts,
            received,
            float(lead_s),
            self._instance,
            self._seq,
            self._replaced,
            self._replaced_seq,
            self._last_ts,
            keep,
            event_ts,
            jump,
        )
        return Admission(rows, keep, before, event_ts, jump)

    def drop(self, names: Iterable[str]) -> Compaction | None:
        rows = super().drop(names)
        if rows is not None:
            self._last_ts = rows.take(self._last_ts, np.nan)
            self._seq = rows.take(self._seq, -1, size=len(self._last_ts))
            self._instance = rows.take(self._instance, 0, size=len(self._last_ts))
            self._replaced = rows.take(self._replaced, 0, size=len(self._last_ts))
            self._replaced_seq = rows.take(self._replaced_seq, -1, size=len(self._last_ts))
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
