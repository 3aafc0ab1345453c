"""Decode one polled batch of fleet.telemetry.v1 records for the node stage.

Straight to columns where the compiled scanner takes a message (fleetwatch/telemetry_scan.py:
no Python object per value, about a third of the cost); every message it leaves goes through
the message decoders (fleetwatch/schemas.py), which decide and name what is wrong with it. If
they accept one the scanner left (a string with an escape, say), the whole batch is decoded
their way, so that the task still sees every message in offset order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from detectors.batch import TelemetryBatch
from fleetwatch import schemas, telemetry_scan
from fleetwatch.record_blocks import RecordBlock


def decode_telemetry(
    records: RecordBlock | Sequence[bytes | None],
    *,
    now: float,
    max_skew_s: float | None,
    max_bytes: int = schemas.MAX_MESSAGE_BYTES,
) -> tuple[TelemetryBatch | list[Any], list[tuple[int, schemas.MessageError]]]:
    """(the valid messages: a TelemetryBatch, or a list of decoded messages; [(index, error)] of
    the rest), the same messages and errors as schemas.decode_batch(..., struct=True) of the
    records' values."""
    block = records if isinstance(records, RecordBlock) else RecordBlock.from_values(records)
    n = len(block)
    # tombstones and oversized values are left to the decoders, which name them
    usable = (block.starts >= 0) & (block.ends - block.starts <= max_bytes)
    if usable.all():
        offered = np.arange(n)
        sc = telemetry_scan.scan_spans(block.buf, block.starts, block.ends)
    else:
        offered = np.flatnonzero(usable)
        sc = telemetry_scan.scan_spans(block.buf, block.starts[offered], block.ends[offered])
    keep = np.ones(len(sc.ts), dtype=bool) if max_skew_s is None else np.abs(sc.ts - now) <= max_skew_s
    taken = offered[sc.taken[keep]]
    bad: list[tuple[int, schemas.MessageError]] = []
    if len(taken) < n:
        left = np.setdiff1d(np.arange(n), taken, assume_unique=True).tolist()
        ok, refused = schemas.decode_batch(
            [block.value(i) for i in left],
            schemas.TELEMETRY,
            now=now,
            max_skew_s=max_skew_s,
            max_bytes=max_bytes,
            struct=True,
        )
        if ok:
            values = block.values()
            return schemas.decode_batch(
                values, schemas.TELEMETRY, now=now, max_skew_s=max_skew_s, max_bytes=max_bytes, struct=True
            )
        bad = [(left[j], e) for j, e in refused]
    if not len(taken):
        return [], bad
    batch = TelemetryBatch.from_scan(sc)
    return (batch if keep.all() else batch.select(keep)), bad
