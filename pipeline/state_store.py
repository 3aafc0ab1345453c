"""Worker state snapshots on the compacted topic fleet.state.v1.

A stage's state for one input partition is serialised, split into chunks below Kafka's
message size limit, and written to the SAME partition number of the state topic (so a worker
that takes over input partition p reads only state partition p). A manifest record,
written last, names the generation, the chunk count and the input offset the state
corresponds to; chunks of another generation are ignored, so a snapshot interrupted half
way is never half-loaded. Compaction keeps the newest record per key.
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass
from typing import Any

import orjson
from kafka import TopicPartition

from fleetwatch import topics

log = logging.getLogger(__name__)

CHUNK_BYTES = 512 * 1024


@dataclass(frozen=True)
class Snapshot:
    offsets: dict[str, int]  # input topic -> next offset to process after restoring this state
    state: bytes
    written_at: float


def _key(stage: str, partition: int, part: str) -> bytes:
    return f"{stage}/{partition}/{part}".encode()


def write_snapshot(producer: Any, stage: str, partition: int, offsets: dict[str, int], state: bytes) -> None:
    """Queue the chunks and the manifest on the producer (the caller flushes)."""
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


def read_snapshot(
    consumer_factory: Any, stage: str, partition: int, timeout_s: float = 30.0
) -> Snapshot | None:
    """Read state partition `partition` to its end and return the newest complete snapshot."""
    consumer = consumer_factory()
    try:
        stp = TopicPartition(topics.STATE, partition)
        consumer.assign([stp])
        consumer.seek_to_beginning(stp)
        end = consumer.end_offsets([stp])[stp]
        prefix = _key(stage, partition, "")
        records: dict[bytes, bytes] = {}
        deadline = time.monotonic() + timeout_s
        while consumer.position(stp) < end:
            if time.monotonic() > deadline:
                log.warning("timed out reading state for %s %s; starting cold", stage, partition)
                return None
            for batch in consumer.poll(timeout_ms=200).values():
                for r in batch:
                    if r.key and r.key.startswith(prefix):
                        records[r.key] = r.value
    finally:
        consumer.close()
    raw_manifest = records.get(prefix + b"manifest")
    if raw_manifest is None:
        return None
    manifest = orjson.loads(raw_manifest)
    gen = manifest["generation"].encode() + b":"
    parts = []
    for i in range(manifest["chunks"]):
        chunk = records.get(prefix + f"chunk-{i:05d}".encode())
        if chunk is None or not chunk.startswith(gen):
            log.warning("state for %s %s is incomplete (chunk %d); starting cold", stage, partition, i)
            return None
        parts.append(chunk[len(gen) :])
    return Snapshot(offsets=manifest["offsets"], state=b"".join(parts), written_at=manifest["written_at"])
