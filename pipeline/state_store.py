"""Worker state snapshots on the compacted topic fleet.state.v1.

A stage's state for one input partition is serialised, split into chunks below Kafka's
message size limit, and written to the SAME partition number of the state topic (so a worker
that takes over input partition p reads only state partition p). A manifest record,
written last, names the generation, the chunk count and the input offset the state
corresponds to; chunks of another generation are ignored, so a snapshot interrupted half
way is never half-loaded. Compaction keeps the newest record per key, so the chunks past a
snapshot's count (left by a larger one before it) are deleted with tombstones once its manifest
is written: a flood's high-water snapshot must not stay on the topic, read at every restore, for
good. A state over MAX_CHUNKS chunks is not written at all (no reader would load it): the
previous snapshot stays the one to restore.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import orjson

from fleetwatch import topics
from fleetwatch.bus import Bus

log = logging.getLogger(__name__)

CHUNK_BYTES = 512 * 1024
# A manifest naming more chunks than this is not one this module wrote (512 MiB of state for one
# partition); trusting the count would make the reader loop for ever on a hostile record.
MAX_CHUNKS = 1024
MAX_OFFSET = 2**63 - 1  # Kafka's offsets are int64
# why a snapshot that exists could not be restored: not read in time, chunks missing, or read but
# not loadable (a manifest that is not one, or state its stage cannot load, pipeline/worker.py)
LOST_REASONS = ("timeout", "incomplete", "unreadable")


class Unreadable(ValueError):
    """A record on the state topic that is not what write_snapshot writes."""


class TooLarge(ValueError):
    """A state of more than MAX_CHUNKS chunks: written, no reader would load it."""


@dataclass(frozen=True)
class Snapshot:
    offsets: dict[str, int]  # input topic -> next offset to process after restoring this state
    state: bytes
    written_at: float


def _key(stage: str, partition: int, part: str) -> bytes:
    return f"{stage}/{partition}/{part}".encode()


def write_snapshot(
    producer: Any,
    stage: str,
    partition: int,
    offsets: dict[str, int],
    state: bytes,
    on_topic: Iterable[int] = (),
) -> int:
    """Queue the chunks and the manifest on the producer (the caller flushes), then tombstones for
    the chunks of `on_topic` (the chunk numbers the topic holds for this key, read_snapshots'
    `stored`) past this snapshot's; returns its chunk count. TooLarge, with nothing queued, for a
    state of more than MAX_CHUNKS chunks."""
    if len(state) > MAX_CHUNKS * CHUNK_BYTES:
        raise TooLarge(
            f"state of {len(state) / 2**20:.0f} MiB, over the {MAX_CHUNKS * CHUNK_BYTES / 2**20:.0f} MiB "
            "a snapshot may hold: not written, the previous snapshot stays the one to restore"
        )
    generation = hashlib.sha1(state + orjson.dumps(offsets, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]
    chunks = [state[i : i + CHUNK_BYTES] for i in range(0, len(state), CHUNK_BYTES)] or [b""]
    for i, chunk in enumerate(chunks):
        producer.send(
            topics.STATE,
            key=_key(stage, partition, f"chunk-{i:05d}"),
            value=generation.encode() + b":" + chunk,
            partition=partition,
        )
    manifest = {
        "generation": generation,
        "chunks": len(chunks),
        "offsets": offsets,
        "written_at": time.time(),
    }
    producer.send(
        topics.STATE,
        key=_key(stage, partition, "manifest"),
        value=orjson.dumps(manifest),
        partition=partition,
    )
    for i in sorted(i for i in set(on_topic) if len(chunks) <= i < MAX_CHUNKS):
        tombstone = _key(stage, partition, f"chunk-{i:05d}")
        producer.send(topics.STATE, key=tombstone, value=None, partition=partition)
    return len(chunks)


def read_snapshots(
    bus: Bus,
    wanted: Iterable[tuple[str, int]],
    timeout_s: float = 60.0,
    on_lost: Callable[[tuple[str, int], str], None] = lambda _key, _reason: None,
    stored: dict[tuple[str, int], set[int]] | None = None,
) -> dict[tuple[str, int], Snapshot | None]:
    """The newest complete snapshot of each (stage, partition) in `wanted` (None: there is none).

    Every state partition involved is read to its end once: a rebalance that hands a worker many
    partitions costs one pass, not one per partition. A snapshot that exists but cannot be used
    is reported to `on_lost(key, reason)`, reason "timeout" (its partition was not read to the
    end in `timeout_s`), "incomplete" (a chunk of its generation is missing) or "unreadable" (its
    manifest or a chunk is not what write_snapshot writes). Whatever the topic holds, this returns:
    the state topic is written by every worker of the group, and a record that raised here would
    stop every worker that is assigned its partition, on every restart (compaction keeps it).
    `stored`, where given, gets the chunk numbers (below MAX_CHUNKS) the topic holds for each
    (stage, partition) read, whatever their generation: the next write_snapshot deletes those past
    its own."""
    keys = set(wanted)
    found: dict[tuple[str, int], Snapshot | None] = dict.fromkeys(keys)
    if not keys:
        return found
    prefixes = {_key(stage, p, ""): (stage, p) for stage, p in keys}
    records: dict[bytes, bytes | None] = {}

    def keep(_partition: int, key: bytes | None, value: bytes | None) -> None:
        if key and key[: key.rfind(b"/") + 1] in prefixes:
            records[key] = value

    late = bus.read_to_end(topics.STATE, sorted({p for _s, p in keys}), keep, timeout_s)
    if late:
        log.warning("timed out reading state partitions %s; they start cold", sorted(late))
        for key in sorted(k for k in keys if k[1] in late):
            on_lost(key, "timeout")
        prefixes = {k: v for k, v in prefixes.items() if v[1] not in late}
    for prefix, key in prefixes.items():
        found[key] = _assemble(records, prefix, key, on_lost)
    if stored is not None:
        stored.update((key, set()) for key in prefixes.values())
        for k, v in records.items():  # one pass: chunk numbers below MAX_CHUNKS with a live record
            prefix, _, part = k.rpartition(b"/")
            key = prefixes.get(prefix + b"/")
            if key is None or v is None or not part.startswith(b"chunk-"):
                continue
            digits = part[6:]
            if 0 < len(digits) <= 5 and digits.isdigit() and int(digits) < MAX_CHUNKS:
                stored[key].add(int(digits))
    return found


def _assemble(
    records: dict[bytes, bytes | None],
    prefix: bytes,
    key: tuple[str, int],
    on_lost: Callable[[tuple[str, int], str], None],
) -> Snapshot | None:
    raw_manifest = records.get(prefix + b"manifest")
    if raw_manifest is None:
        return None
    try:
        manifest = parse_manifest(raw_manifest)
        gen = manifest.generation.encode() + b":"
        parts = []
        for i in range(manifest.chunks):
            chunk = records.get(prefix + f"chunk-{i:05d}".encode())
            if chunk is None or not chunk.startswith(gen):
                log.warning("state for %s %s is incomplete (chunk %d); starting cold", key[0], key[1], i)
                on_lost(key, "incomplete")
                return None
            parts.append(chunk[len(gen) :])
        return Snapshot(offsets=manifest.offsets, state=b"".join(parts), written_at=manifest.written_at)
    except Exception as e:  # Unreadable, or a case no check foresaw: that partition starts cold
        log.error("state for %s %s is unreadable (%s); starting cold", key[0], key[1], _describe(e))
        on_lost(key, "unreadable")
        return None


@dataclass(frozen=True)
class Manifest:
    generation: str
    chunks: int
    offsets: dict[str, int]
    written_at: float


def parse_manifest(raw: bytes) -> Manifest:
    """A manifest as write_snapshot writes it, checked field by field; Unreadable if it is not one."""
    try:
        d = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise Unreadable(f"not JSON: {e}") from None
    if not isinstance(d, dict):
        raise Unreadable(f"not a JSON object but {type(d).__name__}")
    gen, chunks, offsets, written_at = (d.get(k) for k in ("generation", "chunks", "offsets", "written_at"))
    if not isinstance(gen, str) or not 0 < len(gen) <= 64 or ":" in gen:
        raise Unreadable(f"generation {str(gen)[:80]!r}")
    if type(chunks) is not int or not 1 <= chunks <= MAX_CHUNKS:
        raise Unreadable(f"chunks {str(chunks)[:80]!r} (1 to {MAX_CHUNKS})")
    if type(written_at) not in (int, float) or not math.isfinite(written_at):
        raise Unreadable(f"written_at {str(written_at)[:80]!r}")
    return Manifest(gen, chunks, check_offsets(offsets), float(written_at))


def check_offsets(offsets: Any, topics_of: Iterable[str] | None = None) -> dict[str, int]:
    """A snapshot's input offsets: topic -> an offset (an int64 of at least 0), every topic one of
    `topics_of` where given (a snapshot of another stage's partitions must not steer this one's
    reads); Unreadable if not."""
    if not isinstance(offsets, dict):
        raise Unreadable(f"offsets {str(offsets)[:80]!r}")
    allowed = None if topics_of is None else set(topics_of)
    for topic, off in offsets.items():
        if type(off) is not int or not 0 <= off <= MAX_OFFSET:
            raise Unreadable(f"offset {str(off)[:80]!r} of {topic[:200]!r}")
        if allowed is not None and topic not in allowed:
            raise Unreadable(f"an offset of {topic[:200]!r}, not an input of this stage")
    return dict(offsets)


def _describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e)[:300]}"
