"""What a worker runs per input partition, independent of Kafka.

A *stage* owns one or more co-partitioned input topics (same key, same partition count) and
keeps one task per partition number: the per-node stage reads fleet.telemetry.v1 (key node);
the straggler stage reads fleet.nodefeatures.v1, fleet.steps.v1 and fleet.jobs.v1 (all key job).
A task turns decoded messages into outputs (topic, key, message) and can be serialised, so the
Kafka worker (pipeline/worker.py) and the clock-free evaluator (pipeline/evaluate.py) drive the
same code.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from fleetwatch.record_block import RecordBlock
from fleetwatch.schemas import ClockLimits, MessageError, decode_batch, encode

Output = tuple[str, str | None, dict[str, Any] | None]  # topic, key, message (None: a tombstone)
# (records, now=, clock=) -> (what the task is handed, [(index, error)] of the records refused)
Decoder = Callable[..., tuple[Any, list[tuple[int, MessageError]]]]


@dataclass(frozen=True, slots=True)
class Refused:
    """A record a task refuses although it decoded: it breaks a rule only the task's state can
    check (a step for a node its job does not list). The worker dead-letters it with `reason` (one
    of schemas.REASONS) and counts it as it counts records that fail to decode."""

    topic: str  # the input topic it came from
    reason: str
    detail: str
    msg: Mapping[str, Any]  # the record as decoded
    # its place in the messages of the process() call that refuses it; None for a record an earlier
    # call kept (held), whose original bytes are gone: the worker dead-letters it re-encoded
    index: int | None = None


class Task(Protocol):
    """Optionally also: `refused: Sequence[Refused]`, the records the latest process() call refused
    (the worker reads it after each call); `clock_refused(key, skew_s)`, told of each record the
    decoder refused as clock_skew; `close()`, called when the worker drops the task."""

    def process(self, topic: str, msgs: Sequence[dict[str, Any]]) -> list[Output]:
        """Handle decoded, validated messages of one input partition, in offset order (the node
        stage: one TelemetryBatch)."""
        ...

    def to_bytes(self) -> bytes:
        """The task's whole state, for a snapshot."""
        ...


@dataclass(frozen=True)
class Stage:
    name: str
    inputs: tuple[str, ...]  # co-partitioned topics
    schemas: dict[str, str]  # input topic -> the schema its messages must carry
    new_task: Callable[[int], Task]  # partition -> fresh task
    load_task: Callable[[int, bytes], Task]  # partition, snapshot -> restored task
    # input topic -> how far its messages' timestamps may lie from their arrival at the broker
    # (topics not named are not checked: those the pipeline itself produces from checked input)
    clock: Mapping[str, ClockLimits] = field(default_factory=dict)
    # Input topic -> the stage's own decoder of its records, where its tasks take something other
    # than the validated dicts of decode_messages (the node stage: telemetry straight into a
    # detectors.batch.TelemetryBatch, pipeline/telemetry_decode.py). The worker calls it alike.
    decoders: Mapping[str, Decoder] = field(default_factory=dict)
    # Loads what the tasks compile (numba) before the worker joins its group, so that a compile
    # on a fresh install never holds up a member's first batch while it owns partitions (the node
    # stage leaves its telemetry scanner compiling in the background; meanwhile batches go through
    # the message decoders).
    warm_up: Callable[[], None] | None = None
    # Input topics whose tombstones (null values) are skipped: neither handed to the task nor
    # dead-lettered or counted as rejected. For compacted inputs whose producer forgets a key that
    # way (fleet.jobs.v1); on any other input a tombstone is bad input (not_json), as before.
    skip_tombstones: frozenset[str] = frozenset()
    # Output topic -> how the stage's messages to it are written; a topic not named gets compact
    # JSON (fleetwatch.schemas.encode), as every fleetwatch topic carries. The input side is
    # `schemas`: each input topic's messages are decoded and checked as that schema.
    serializers: Mapping[str, Callable[[dict[str, Any]], bytes]] = field(default_factory=dict)
    # Told, after each poll that returns records and before any task handles them, which partitions
    # of the stage's inputs the batch holds: a stage whose tasks share work across partitions (act
    # decides once per batch, after its last partition) knows when the batch is complete.
    begin_batch: Callable[[frozenset[int]], None] | None = None
    # Time-driven work with no new input (act: resumes, freed budget, alert re-sends). Worker.run
    # calls it every tick_every_s while the worker owns a task of the stage, and produces its
    # outputs as a batch's (the stage's serializers, the size check, acknowledged before the next
    # poll). The tasks it works on are the worker's (Worker.owned).
    tick: Callable[[], list[Output]] | None = None
    tick_every_s: float = 1.0

    def serializer(self, topic: str) -> Callable[[dict[str, Any]], bytes]:
        return self.serializers.get(topic, encode)

    def decoder(self, topic: str) -> Decoder:
        """How the worker decodes a block of `topic`'s records: (what the task is handed, [(index,
        error)] of the records refused)."""
        return self.decoders.get(topic) or functools.partial(decode_messages, self.schemas[topic])


def decode_messages(
    schema: str, block: RecordBlock, *, now: float, clock: ClockLimits | None
) -> tuple[list[dict[str, Any]], list[tuple[int, MessageError]]]:
    """The default decoder: each record validated as `schema` into a dict, with its key and its
    timestamp against the time the broker took it (fleetwatch.schemas.decode_batch)."""
    refs = block.reference_times(now)
    return decode_batch(block.values(), schema, keys=block.keys(), ref_ts=refs, clock=clock)
