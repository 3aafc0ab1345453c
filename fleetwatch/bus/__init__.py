"""The one interface every fleetwatch process runs Kafka through: a group consumer, a producer, a
reader of assigned partitions (followers of whole topics, snapshots), and the topics' admin.
No module outside fleetwatch/bus imports a Kafka client (tests/unit/test_one_kafka_client.py).

Two implementations, with the same behaviour where a caller can tell:
- fleetwatch.bus.kafka: the real broker, through confluent-kafka (librdkafka) and its public API
  only. Chosen because it reads ~2-4x more messages per CPU-second than kafka-python and
  decompresses in C (benchmarks/README.md, "Kafka clients"); kafka-python stays only as the
  benchmarks' baseline.
- fleetwatch.bus.memory: in-process topics, for fast unit tests of stages, followers and the
  worker loop.

Where the broker is and its security settings: fleetwatch/bus/config.py. Topic creation and
inspection: fleetwatch/bus/admin.py. Kafka's default partitioner: fleetwatch/bus/partitioner.py.

Offsets are Kafka's: the offset of the next record to read. Group members follow the eager
protocol: on a rebalance every member's partitions are revoked, then the new share assigned.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

from prometheus_client import Counter

from fleetwatch.record_block import RecordBlock

log = logging.getLogger(__name__)

CONSUMERS_REPLACED = Counter(
    "fleetwatch_bus_consumers_replaced_total",
    "group consumers that hit a fatal client error (a static member fenced, e.g. after a broker "
    "restart or by a second member with the same instance id) or stalled in a rebalance, and were "
    "replaced by a new one",
    ["group"],
)
REBALANCE_ERRORS = Counter(
    "fleetwatch_bus_rebalance_errors_total",
    "assign or revoke callbacks that raised (caught: the member stays; an assignment that failed "
    "is not read until a retry of its callback succeeds)",
    ["group", "callback"],
)


class TopicPart(NamedTuple):
    topic: str
    partition: int


class Record(NamedTuple):
    """One record read by a Reader."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None  # None: a tombstone
    timestamp_ms: int  # the record's timestamp (the producer's or the broker's), -1 if none
    log_append: bool  # the broker stamped it (a LogAppendTime topic: topics.BROKER_TIMED)
    headers: list[tuple[str, bytes]] | None = None  # [(name, value)], None for none


def reference_time(record: Record, now: float) -> float:
    """A record's reference time for clock checks (seconds): when the broker appended it, or `now`
    where its topic keeps the producer's time (see topics.BROKER_TIMED)."""
    return record.timestamp_ms / 1000.0 if record.log_append else now


class Outgoing(NamedTuple):
    """One record handed to a Producer."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: Any  # [(name, bytes)] or None
    partition: int | None  # None: the producer's murmur2 partitioner (Kafka's default) on the key


class Delivery:
    """What became of one record handed to a Producer: done once the broker acknowledged it, or
    the producer gave up on it (error set). Updated while the producer flushes."""

    __slots__ = ("done", "error", "item")

    def __init__(self, item: Outgoing) -> None:
        self.item = item
        self.done = False
        self.error: Exception | None = None

    def settle(self, error: Exception | None) -> None:
        self.done, self.error = True, error

    @property
    def acked(self) -> bool:
        return self.done and self.error is None


class SendError(RuntimeError):
    """The producer refused a record outright (too large, an unknown topic, a fatal client error)."""


class RecordTooLarge(SendError):
    """send(): the client refuses this record for its size, so sending it again never helps. (A
    broker's size refusal in a delivery report is its batch's, an ordinary failed delivery.)"""


# on_assign(partitions) -> the offset each partition is to be read from
OnAssign = Callable[[list[TopicPart]], Mapping[TopicPart, int]]
OnRevoke = Callable[[list[TopicPart]], None]


class PendingAssignment:
    """What a group consumer does when its assign callback raises. An exception must not escape
    the client's rebalance callback (confluent-kafka turns it into a SystemError out of poll(),
    and a worker that exits on it meets the same cause on every restart), and the partitions must
    not be read without their owner's offsets (records would be skipped). So the consumer takes
    the assignment paused, reads nothing of it, and retries the callback from poll() with a
    backoff (1 s doubling to 60 s) until it succeeds or the partitions are revoked. Counted in
    fleetwatch_bus_rebalance_errors_total and logged."""

    def __init__(self, group: str, first_s: float = 1.0, max_s: float = 60.0) -> None:
        self.group = group
        for callback in ("assign", "revoke"):  # exported at 0: increase() sees the first error
            REBALANCE_ERRORS.labels(group, callback)
        self.parts: list[TopicPart] = []
        self.first_s, self.max_s = first_s, max_s
        self._wait_s = first_s
        self._retry_at = 0.0

    def failed(self, callback: str, parts: list[TopicPart] | None, error: BaseException) -> None:
        """A callback raised; for assign, `parts` are now held without being read."""
        REBALANCE_ERRORS.labels(self.group, callback).inc()
        log.error(
            "the %s callback of group %s raised %s: %s%s",
            callback, self.group, type(error).__name__, str(error)[:300],
            "; its partitions are not read until a retry succeeds" if parts is not None else "",
            exc_info=error,
        )  # fmt: skip
        if parts is not None:
            if not self.parts:
                self._wait_s = self.first_s
            self.parts = list(parts)
            self._retry_at = time.monotonic() + self._wait_s
            self._wait_s = min(self.max_s, self._wait_s * 2)

    def due(self) -> bool:
        return bool(self.parts) and time.monotonic() >= self._retry_at

    def clear(self) -> list[TopicPart]:
        parts, self.parts = self.parts, []
        return parts


class GroupConsumer(Protocol):
    """A member of a consumer group. Rebalance callbacks run on the thread that calls poll(),
    inside it; the member's heartbeats do not depend on that thread."""

    def subscribe(
        self, topics: Sequence[str], on_assign: OnAssign, on_revoke: OnRevoke, on_lost: OnRevoke | None = None
    ) -> None:
        """on_revoke: partitions given up in a rebalance (the owner snapshots and commits them);
        on_lost (default on_revoke): partitions the member lost without one (its session expired,
        it was fenced), which may be another member's already: the owner drops them without
        writing anything."""

    def poll(self, max_records: int, timeout_s: float) -> dict[TopicPart, RecordBlock]:
        """Up to max_records records, each partition's in offset order."""
        ...

    def assignment(self) -> set[TopicPart]: ...

    def group_offsets(self, parts: Sequence[TopicPart]) -> dict[TopicPart, int]:
        """Where the group stands on each partition: its committed offset, else the start or the
        end of the partition (the member's start_at)."""
        ...

    def seek(self, part: TopicPart, offset: int) -> None:
        """Read an assigned partition from `offset` on (records already fetched are dropped)."""
        ...

    def pause(self, parts: Sequence[TopicPart]) -> None:
        """Stop fetching these partitions (the member keeps them and its place in them)."""
        ...

    def resume(self, parts: Sequence[TopicPart]) -> None: ...

    def highwater(self, part: TopicPart) -> int | None:
        """The partition's end offset as of the last fetch, if known."""
        ...

    def commit(self, offsets: Mapping[TopicPart, int], *, asynchronous: bool) -> None:
        """Commit. An asynchronous commit that fails is reported to the member's on_commit_failure;
        a synchronous one raises."""
        ...

    def partition_count(self, topic: str) -> int: ...

    def close(self) -> None: ...


class Producer(Protocol):
    def send(
        self,
        topic: str,
        key: bytes | None = None,
        value: bytes | None = None,
        headers: Any = None,
        partition: int | None = None,
    ) -> Delivery:
        """Queue one record (None value: a tombstone); raises SendError if it is refused outright."""
        ...

    def poll(self, timeout_s: float = 0.0) -> None:
        """Serve delivery reports (the Deliveries of earlier sends settle) without flushing."""
        ...

    def flush(self, timeout_s: float) -> list[Outgoing]:
        """Wait for everything queued since the last flush; the records the broker did not
        acknowledge (failed, or still pending at the timeout), in the order sent."""
        ...

    def close(self, timeout_s: float = 10.0) -> None:
        """Flush what it can within timeout_s, then drop the rest."""
        ...


class Reader(Protocol):
    """A consumer of assigned partitions, outside any group: it never commits. What a follower of a
    whole topic, or a reader of one partition, uses."""

    def partitions(self, topic: str, wait_s: float = 0.0) -> list[int]:
        """The topic's partitions, sorted; waits up to wait_s for a topic just created ([] if none)."""
        ...

    def assign(self, parts: Sequence[TopicPart], start: Mapping[TopicPart, int] | str = "beginning") -> None:
        """Read these partitions (replacing any assigned before) from their beginning, their end
        ("end"), or the given offsets."""
        ...

    def end_offsets(self, parts: Sequence[TopicPart]) -> dict[TopicPart, int]:
        """Each partition's end (the offset the next record appended gets), asked of the broker now."""
        ...

    def position(self, part: TopicPart) -> int:
        """The offset of the next record poll() returns of this assigned partition."""
        ...

    def poll(self, timeout_s: float, max_records: int = 500) -> list[Record]:
        """The records that are there now, else waits up to timeout_s for some; offset order per partition."""
        ...

    def close(self) -> None: ...


class Bus(Protocol):
    def group_consumer(
        self,
        group: str,
        *,
        client_id: str,
        start_at: str = "earliest",
        session_timeout_ms: int = 10000,
        heartbeat_interval_ms: int | None = None,
        instance_id: str | None = None,
        on_commit_failure: Callable[[Exception], None] = lambda _e: None,
    ) -> GroupConsumer:
        """start_at: where a partition with no committed offset is read from ("earliest" or
        "latest"). instance_id: static membership (a restarted member with the same id gets its
        partitions back without waiting out its old session)."""
        ...

    def producer(
        self,
        *,
        linger_ms: int = 20,
        delivery_timeout_s: float | None = None,
        idempotent: bool = True,
        max_message_bytes: int | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> Producer:
        """acks=all, zstd, murmur2 on keys. idempotent=False: a best-effort producer (no sequence
        state for an outage to wedge). delivery_timeout_s: a record not acknowledged by then fails.
        options: further librdkafka settings (the in-memory bus ignores them)."""
        ...

    def reader(self) -> Reader: ...

    def wait_for_broker(self, timeout_s: float | None = None) -> None:
        """Block until the broker answers, or raise BrokerUnavailable (config.connect_timeout_s())."""
        ...

    def ensure_topics(
        self, names: Iterable[str] = ..., partitions: int = 4, replication: int | None = None
    ) -> None:
        """Create the missing topics with admin.topic_configs(); keep admin.kept_configs() on the others."""
        ...

    def partition_count(self, topic: str) -> int:
        """0 where the topic does not exist."""
        ...

    def list_topics(self) -> set[str]: ...

    def read_to_end(
        self,
        topic: str,
        partitions: Sequence[int],
        on_record: Callable[[int, bytes | None, bytes | None], None],
        timeout_s: float,
    ) -> set[int]:
        """Call on_record(partition, key, value) for every record of these partitions from their
        start to their end as of the call, in offset order per partition; the partitions not read
        to the end within timeout_s."""
        ...
