"""Decode one polled batch of fleet.telemetry.v1 records for the node stage.

Straight to columns where the compiled scanner takes a message (fleetwatch/telemetry_scan.py:
no Python object per value, about a third of the cost); every message it leaves goes through
the message decoders (fleetwatch/schemas.py), which decide and name what is wrong with it. If
they accept one the scanner left (a string with an escape, say), its columns join the scanner's
in offset order (TelemetryBatch.concat, then take), so that the task still sees every message in
offset order and no message is decoded twice.

Both ways apply the same checks after the message itself: the record's key must be the message's
node, and its timestamp must lie within the clock limits of the record's reference time.

On a fresh install numba compiles the scanner first (~1.5-2 min on 2 cores; later starts load it
from numba's cache in about a second). `fleetwatch detect` does not wait for that:
load_scanner(background=True) compiles it on a thread, and until it is ready every batch goes
through the message decoders, which give the same messages and errors, ~3x slower per record.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator, Sequence

import numpy as np

from fleetwatch import schemas
from fleetwatch.detectors.batch import TelemetryBatch
from fleetwatch.record_block import RecordBlock

log = logging.getLogger(__name__)

_scanner_ready = threading.Event()
_scanner_lock = threading.Lock()
_scanner_loader: threading.Thread | None = None  # the thread loading it in the background, if any
_decoders_only = 0  # > 0: inside message_decoders_only()


def load_scanner(background: bool = False) -> None:
    """Make the compiled scanner ready: load it from numba's cache, compiling it first where there
    is none. With background=True on a thread, and decode_telemetry uses the message decoders
    until it is done; else now (a background load under way is waited for)."""
    global _scanner_loader
    with _scanner_lock:
        loader = _scanner_loader
        if loader is None and not _scanner_ready.is_set():
            loader = _scanner_loader = threading.Thread(
                target=_load_scanner, name="scanner-load", daemon=True
            )
            loader.start()
    if not background and loader is not None:
        loader.join()


def scanner_ready() -> bool:
    return _scanner_ready.is_set()


@contextlib.contextmanager
def message_decoders_only() -> Iterator[None]:
    """Decode every batch with the message decoders, as while the scanner loads in the background:
    to compare the two ways (tests/unit/test_telemetry_scan.py) and to time the worker without the
    scanner (benchmarks/detect_throughput.py --decoder msgspec)."""
    global _decoders_only
    _decoders_only += 1
    try:
        yield
    finally:
        _decoders_only -= 1


def _use_scanner() -> bool:
    """Whether this batch goes through the scanner: not while it loads in the background (it is
    not waited for), nor inside message_decoders_only(); a first call with no loader loads it now."""
    if _decoders_only:
        return False
    if not _scanner_ready.is_set():
        if _scanner_loader is not None:
            return False
        load_scanner()
    return True


def _load_scanner() -> None:
    t0 = time.monotonic()
    from fleetwatch import telemetry_scan  # numba's compile happens on the first call

    telemetry_scan.warm_up()
    _scanner_ready.set()
    log.info("telemetry scanner ready after %.1f s", time.monotonic() - t0)


def decode_telemetry(
    records: RecordBlock | Sequence[bytes | None],
    *,
    now: float,
    clock: schemas.ClockLimits | None,
    max_bytes: int = schemas.MAX_MESSAGE_BYTES,
    check_keys: bool = True,
) -> tuple[TelemetryBatch, list[tuple[int, schemas.MessageError]]]:
    """(the valid messages as a TelemetryBatch whose `received` holds their reference times, empty
    if none; [(index, error)] of the rest), the same messages and errors as
    schemas.decode_batch(..., struct=True) of the
    records' values, keys and reference times (RecordBlock.reference_times(now)). Keys are checked
    for a RecordBlock (records from Kafka) unless check_keys is False; plain values have none.
    Each record is decoded once: by the scanner, or (what it leaves) by the message decoders."""
    block = records if isinstance(records, RecordBlock) else RecordBlock.from_values(records)
    n = len(block)
    refs = block.reference_times(now)
    keys = block.keys() if check_keys and isinstance(records, RecordBlock) else None
    parts: list[tuple[TelemetryBatch, np.ndarray]] = []  # (batch, the records it holds)
    left = np.arange(n)
    bad: list[tuple[int, schemas.MessageError]] = []
    if _use_scanner():
        scanned, taken, bad = _scan(block, keys, refs, clock, max_bytes)
        if len(taken):
            parts.append((scanned, taken))
        done = np.concatenate([taken, np.array([i for i, _e in bad], dtype=np.int64)])
        if len(done):
            left = np.setdiff1d(left, done, assume_unique=True)
    if len(left):
        rest = left.tolist()
        ok, refused = schemas.decode_batch(
            [block.value(i) for i in rest],
            schemas.TELEMETRY,
            keys=None if keys is None else [keys[i] for i in rest],
            ref_ts=refs[left],
            clock=clock,
            max_bytes=max_bytes,
            struct=True,
        )
        bad = sorted(bad + [(rest[j], e) for j, e in refused], key=lambda ie: ie[0])
        if ok:
            parts.append((TelemetryBatch.from_messages(ok), np.delete(left, [j for j, _e in refused])))
    if not parts:  # the task is still handed a batch (one form, whatever the records)
        return TelemetryBatch.from_structs([]), bad
    if len(parts) == 1:
        batch, held = parts[0]
    else:  # the scanner's and the decoders' messages, back in offset order for the task
        held = np.concatenate([rows for _b, rows in parts])
        order = np.argsort(held, kind="stable")
        batch, held = TelemetryBatch.concat([b for b, _r in parts]).take(order), held[order]
    batch.received = np.asarray(refs[held], dtype=np.float64)
    return batch, bad


def _scan(
    block: RecordBlock,
    keys: list[bytes | None] | None,
    refs: np.ndarray,
    clock: schemas.ClockLimits | None,
    max_bytes: int,
) -> tuple[TelemetryBatch, np.ndarray, list[tuple[int, schemas.MessageError]]]:
    """The records the compiled scanner takes and that pass the checks after the message (key,
    clock) as a batch, and their indices; [(index, error)] of those it took that fail a check
    (named here, as the decoders would: key first, then clock). The decoders see only the rest."""
    from fleetwatch import telemetry_scan

    n = len(block)
    # tombstones and oversized values are left to the decoders, which name them
    usable = (block.starts >= 0) & (block.ends - block.starts <= max_bytes)
    if usable.all():
        offered = np.arange(n)
        sc = telemetry_scan.scan_spans(block.buf, block.starts, block.ends)
    else:
        offered = np.flatnonzero(usable)
        sc = telemetry_scan.scan_spans(block.buf, block.starts[offered], block.ends[offered])
    scanned = offered[sc.taken]
    keep = np.ones(len(sc.ts), dtype=bool) if clock is None else schemas.clock_ok(sc.ts, refs[scanned], clock)
    if keys is not None and keep.any():
        names = sc.node_names
        keep &= np.fromiter(
            (
                keys[k] == names[c].encode()
                for k, c in zip(scanned.tolist(), sc.node_idx.tolist(), strict=True)
            ),
            dtype=bool,
            count=len(scanned),
        )
    taken = scanned[keep]
    bad: list[tuple[int, schemas.MessageError]] = []
    for row in np.flatnonzero(~keep).tolist():
        i = int(scanned[row])
        node = sc.node_names[int(sc.node_idx[row])]
        e = None if keys is None else schemas.key_error(schemas.TELEMETRY, node, keys[i])
        if e is None and clock is not None:
            e = schemas.clock_error(float(sc.ts[row]), float(refs[i]), clock)
        if e is not None:  # else (a time no check could name) the decoders judge it
            bad.append((i, e))
    if not len(taken):
        return TelemetryBatch.from_structs([]), taken, bad
    batch = TelemetryBatch.from_scan(sc)
    return (batch if keep.all() else batch.select(keep)), taken, bad
