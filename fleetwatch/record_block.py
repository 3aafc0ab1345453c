"""One partition's polled records as columns over one byte buffer.

The worker hands these to its decoders: the telemetry scanner (fleetwatch/telemetry_scan.py)
reads every value in place from `buf` by its span, without a Python object per record; the other
decoders take value(k)/key(k). Built by the Kafka interface (fleetwatch/bus) from the records a
poll returned, or from plain values in tests and benchmarks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True, eq=False)
class RecordBlock:
    """Records of one partition in offset order: record k's value is buf[starts[k]:ends[k]]
    (starts[k] = -1: a null value, a tombstone), its key buf[key_starts[k]:key_ends[k]] (-1: no
    key), append_ms[k] the time the broker appended it in ms where the topic keeps LogAppendTime
    (-1 where it keeps the producer's CreateTime, which says nothing the producer does not). buf is
    read-only."""

    buf: np.ndarray  # uint8
    offsets: np.ndarray  # int64
    starts: np.ndarray  # int64
    ends: np.ndarray  # int64
    key_starts: np.ndarray  # int64
    key_ends: np.ndarray  # int64
    append_ms: np.ndarray  # int64

    def __len__(self) -> int:
        return len(self.offsets)

    def value(self, k: int) -> bytes | None:
        a = int(self.starts[k])
        return None if a < 0 else self.buf[a : int(self.ends[k])].tobytes()

    def values(self) -> list[bytes | None]:
        return [self.value(k) for k in range(len(self))]

    def key(self, k: int) -> bytes | None:
        a = int(self.key_starts[k])
        return None if a < 0 else self.buf[a : int(self.key_ends[k])].tobytes()

    def keys(self) -> list[bytes | None]:
        return [self.key(k) for k in range(len(self))]

    def reference_times(self, now: float) -> np.ndarray:
        """Each record's reference time for clock checks, in seconds: when the broker appended it,
        or `now` (the reader's clock) where the topic does not keep append times."""
        return np.where(self.append_ms >= 0, self.append_ms / 1000.0, now)

    def subset(self, rows: Sequence[int] | np.ndarray) -> RecordBlock:
        """The records at these positions, in the order given, over the same buffer."""
        rows = np.asarray(rows, dtype=np.int64)
        cols = (self.offsets, self.starts, self.ends, self.key_starts, self.key_ends, self.append_ms)
        return RecordBlock(self.buf, *(c[rows] for c in cols))

    def split(self, k: int) -> tuple[RecordBlock, RecordBlock]:
        """(the first k records, the rest), both over the same buffer."""
        cols = (self.offsets, self.starts, self.ends, self.key_starts, self.key_ends, self.append_ms)
        return RecordBlock(self.buf, *(c[:k] for c in cols)), RecordBlock(self.buf, *(c[k:] for c in cols))

    @classmethod
    def from_values(
        cls,
        values: Sequence[bytes | None],
        offsets: Sequence[int] | None = None,
        keys: Sequence[bytes | None] | None = None,
        append_ms: Sequence[int] | None = None,
    ) -> RecordBlock:
        """A block holding copies of `values` (offsets 0.. unless given; no keys and no append
        times unless given)."""
        n = len(values)
        keys = [None] * n if keys is None else keys
        parts = [*values, *keys]
        lens = np.fromiter((-1 if v is None else len(v) for v in parts), dtype=np.int64, count=2 * n)
        ends = np.cumsum(np.maximum(lens, 0))
        starts = np.where(lens < 0, -1, ends - np.maximum(lens, 0))
        buf = _read_only(np.frombuffer(b"".join(v for v in parts if v is not None), dtype=np.uint8))
        return cls(
            buf,
            np.arange(n, dtype=np.int64) if offsets is None else np.asarray(offsets, dtype=np.int64),
            starts[:n],
            ends[:n],
            starts[n:],
            ends[n:],
            np.full(n, -1, dtype=np.int64) if append_ms is None else np.asarray(append_ms, dtype=np.int64),
        )


def _read_only(a: np.ndarray) -> np.ndarray:
    # numba compiles one copy of a kernel per array flavour: every block is read-only, so the
    # scanner's cached read-only build serves them all (a writable one would be a ~1.5 min compile).
    if a.flags.writeable:
        a = a.view()
        a.flags.writeable = False
    return a
