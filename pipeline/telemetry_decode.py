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


def decode_telemetry(
    raws: Sequence[bytes | None],
    *,
    now: float,
    max_skew_s: float | None,
    max_bytes: int = schemas.MAX_MESSAGE_BYTES,
) -> tuple[TelemetryBatch | list[Any], list[tuple[int, schemas.MessageError]]]:
    """(the valid messages: a TelemetryBatch, or a list of decoded messages; [(index, error)] of
    the rest), the same messages and errors as schemas.decode_batch(..., struct=True)."""
    if None not in raws and max(map(len, raws), default=0) <= max_bytes:  # type: ignore[arg-type]
        offered = np.arange(len(raws))
        sc = telemetry_scan.scan(raws)  # type: ignore[arg-type]
    else:  # tombstones and oversized values: left to the decoders, which name them
        usable = [i for i, r in enumerate(raws) if r is not None and len(r) <= max_bytes]
        offered = np.array(usable, dtype=np.int64)
        sc = telemetry_scan.scan([raws[i] for i in usable])  # type: ignore[misc]
    keep = np.ones(len(sc.ts), dtype=bool) if max_skew_s is None else np.abs(sc.ts - now) <= max_skew_s
    taken = offered[sc.taken[keep]]
    bad: list[tuple[int, schemas.MessageError]] = []
    if len(taken) < len(raws):
        left = np.setdiff1d(np.arange(len(raws)), taken, assume_unique=True).tolist()
        ok, refused = schemas.decode_batch(
            [raws[i] for i in left],
            schemas.TELEMETRY,
            now=now,
            max_skew_s=max_skew_s,
            max_bytes=max_bytes,
            struct=True,
        )
        if ok:
            return schemas.decode_batch(
                raws, schemas.TELEMETRY, now=now, max_skew_s=max_skew_s, max_bytes=max_bytes, struct=True
            )
        bad = [(left[j], e) for j, e in refused]
    if not len(taken):
        return [], bad
    batch = TelemetryBatch.from_scan(sc)
    return (batch if keep.all() else batch.select(keep)), bad
