"""The bus in memory: topics as lists, consumer groups with the eager rebalance protocol.

For fast unit tests of stages and the worker loop. It keeps what the worker depends on: offsets,
each partition's order, murmur2 partitioning of keyed records (as the real producers), committed
offsets per group, a rebalance that revokes every member's partitions and assigns the new shares
inside the members' next poll(), LogAppendTime on the topics that keep it, and producers whose
records can be made to fail (`fail_next`), as a broker outage fails them. Its readers, admin calls
and producer options take the real bus's arguments (the librdkafka `options` are ignored).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fleetwatch import topics as fleet_topics
from fleetwatch.bus import (
    Delivery,
    OnAssign,
    OnRevoke,
    Outgoing,
    PendingAssignment,
    Record,
    TopicPart,
)
from fleetwatch.bus.partitioner import partition_for
from fleetwatch.record_block import RecordBlock


@dataclass
class Stored:
    key: bytes | None
    value: bytes | None
    headers: Any
    append_ms: int


@dataclass
class _Group:
    members: list[MemoryGroupConsumer] = field(default_factory=list)
    generation: int = 0
    committed: dict[TopicPart, int] = field(default_factory=dict)


class MemoryBus:
    def __init__(
        self,
        partitions: int = 4,
        clock_ms: Callable[[], int] | None = None,
        log_append_time: Iterable[str] = fleet_topics.BROKER_TIMED,
    ) -> None:
        """partitions: of each topic made on first use. clock_ms: the broker's clock (append times)."""
        self.default_partitions = partitions
        self.logs: dict[str, list[list[Stored]]] = {}
        self.log_append_time = set(log_append_time)
        self._clock_ms = clock_ms or _counter_ms()
        self._groups: dict[str, _Group] = {}
        self._lock = threading.RLock()
        self.fail_next = 0  # records the next sends fail (as in a broker outage)

    # --------------------------------------------------------- topics

    def create_topic(self, name: str, partitions: int | None = None) -> None:
        with self._lock:
            self.logs.setdefault(name, [[] for _ in range(partitions or self.default_partitions)])

    def partitions(self, topic: str) -> list[list[Stored]]:
        self.create_topic(topic)
        return self.logs[topic]

    def append(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Any = None,
        partition: int | None = None,
    ) -> tuple[int, int]:
        """Append one record as the broker would; (partition, offset)."""
        with self._lock:
            parts = self.partitions(topic)
            if partition is None:
                partition = self.partition_of(topic, key)
            ms = self._clock_ms() if topic in self.log_append_time else -1
            parts[partition].append(Stored(key, value, headers, ms))
            return partition, len(parts[partition]) - 1

    def partition_of(self, topic: str, key: bytes | None) -> int:
        """Where a keyed record goes: murmur2, as the real producers partition."""
        return partition_for(key, len(self.partitions(topic))) if key is not None else 0

    def committed(self, group: str) -> dict[TopicPart, int]:
        """The group's committed offsets (for test assertions)."""
        return dict(self._group(group).committed)

    def records(self, topic: str) -> list[Stored]:
        """Every record of the topic, partition by partition (for test assertions)."""
        return [r for part in self.partitions(topic) for r in part]

    # --------------------------------------------------------- the Bus protocol

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
    ) -> MemoryGroupConsumer:
        return MemoryGroupConsumer(self, group, start_at)

    def producer(
        self,
        *,
        linger_ms: int = 20,
        delivery_timeout_s: float | None = None,
        idempotent: bool = True,
        max_message_bytes: int | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> MemoryProducer:
        return MemoryProducer(self)

    def reader(self) -> MemoryReader:
        return MemoryReader(self)

    def wait_for_broker(self, timeout_s: float | None = None) -> None:
        return None  # always up

    def ensure_topics(
        self, names: Iterable[str] = fleet_topics.ALL, partitions: int = 4, replication: int | None = None
    ) -> None:
        for name in names:
            self.create_topic(name, partitions)

    def partition_count(self, topic: str) -> int:
        with self._lock:
            return len(self.logs.get(topic, ()))

    def list_topics(self) -> set[str]:
        with self._lock:
            return set(self.logs)

    def read_to_end(
        self,
        topic: str,
        partitions: Sequence[int],
        on_record: Callable[[int, bytes | None, bytes | None], None],
        timeout_s: float,
    ) -> set[int]:
        logs = self.partitions(topic)
        for p in sorted(set(partitions)):
            for r in list(logs[p]):
                on_record(p, r.key, r.value)
        return set()

    # --------------------------------------------------------- groups

    def _group(self, name: str) -> _Group:
        return self._groups.setdefault(name, _Group())

    def _rebalance(self, group: _Group) -> None:
        group.generation += 1

    def _share(self, group: _Group, member: MemoryGroupConsumer) -> list[TopicPart]:
        """Kafka's range assignment: each topic's partitions split into contiguous runs over the
        members in join order, so a member gets the same partition numbers of every topic (what
        a stage with several inputs relies on)."""
        m, i = len(group.members), group.members.index(member)
        share: list[TopicPart] = []
        for topic in sorted({t for mem in group.members for t in mem.topics}):
            if topic not in member.topics:
                continue
            n = len(self.partitions(topic))
            first = i * (n // m) + min(i, n % m)
            share += [TopicPart(topic, p) for p in range(first, first + n // m + (i < n % m))]
        return share


def _counter_ms() -> Callable[[], int]:
    ticks = itertools.count(1_700_000_000_000)
    return lambda: next(ticks)


class MemoryGroupConsumer:
    def __init__(self, bus: MemoryBus, group: str, start_at: str) -> None:
        self.bus = bus
        self.group_name = group
        self.start_at = start_at
        self.topics: list[str] = []
        self._generation = -1
        self._assigned: set[TopicPart] = set()
        self._position: dict[TopicPart, int] = {}
        self._paused: set[TopicPart] = set()
        self._on_assign: OnAssign | None = None
        self._on_revoke: OnRevoke | None = None
        self._pending = PendingAssignment(group, first_s=0.0)  # an assignment whose callback raised
        self.closed = False

    @property
    def _group(self) -> _Group:
        return self.bus._group(self.group_name)

    def subscribe(
        self, topics: Sequence[str], on_assign: OnAssign, on_revoke: OnRevoke, on_lost: OnRevoke | None = None
    ) -> None:
        self.topics = list(topics)  # on_lost: a member of the in-memory bus never loses its partitions
        self._on_assign, self._on_revoke = on_assign, on_revoke
        with self.bus._lock:
            self._group.members.append(self)
            self.bus._rebalance(self._group)

    def _sync(self) -> None:
        """The rebalance, inside poll() as the real client runs it: revoke all, assign the share."""
        group = self._group
        if self._generation == group.generation:
            return
        assert self._on_revoke is not None
        self._pending.clear()
        if self._assigned:
            try:  # as the real consumer: nothing escapes a rebalance callback (PendingAssignment)
                self._on_revoke(sorted(self._assigned))
            except Exception as e:
                self._pending.failed("revoke", None, e)
        self._assigned, self._position, self._paused = set(), {}, set()
        self._generation = group.generation
        self._take(self.bus._share(group, self))

    def _take(self, share: list[TopicPart]) -> None:
        assert self._on_assign is not None
        try:
            starts = self._on_assign(share)
        except Exception as e:  # held, not read, until a retry succeeds
            self._pending.failed("assign", share, e)
            return
        self._assigned = set(share)
        self._position = {tp: int(starts[tp]) for tp in share}

    def poll(self, max_records: int, timeout_s: float) -> dict[TopicPart, RecordBlock]:
        with self.bus._lock:
            if self._pending.due():  # failed in an earlier poll: retried in this one
                self._take(self._pending.clear())
            self._sync()
            out: dict[TopicPart, RecordBlock] = {}
            left = max_records
            for tp in sorted(self._assigned - self._paused):
                log = self.bus.partitions(tp.topic)[tp.partition]
                start = self._position[tp]
                records = log[start : start + left]
                if not records:
                    continue
                out[tp] = RecordBlock.from_values(
                    [r.value for r in records],
                    range(start, start + len(records)),
                    [r.key for r in records],
                    [r.append_ms for r in records],
                )
                self._position[tp] = start + len(records)
                left -= len(records)
                if not left:
                    break
            return out

    def assignment(self) -> set[TopicPart]:
        return set(self._assigned)

    def group_offsets(self, parts: Sequence[TopicPart]) -> dict[TopicPart, int]:
        committed = self._group.committed
        return {
            tp: committed.get(
                tp, 0 if self.start_at == "earliest" else len(self.bus.partitions(tp.topic)[tp.partition])
            )
            for tp in parts
        }

    def seek(self, part: TopicPart, offset: int) -> None:
        if part not in self._assigned:
            raise ValueError(f"{part} is not assigned")
        self._position[part] = int(offset)

    def pause(self, parts: Sequence[TopicPart]) -> None:
        self._paused.update(p for p in parts if p in self._assigned)

    def resume(self, parts: Sequence[TopicPart]) -> None:
        self._paused.difference_update(parts)

    def highwater(self, part: TopicPart) -> int | None:
        return len(self.bus.partitions(part.topic)[part.partition])

    def commit(self, offsets: Mapping[TopicPart, int], *, asynchronous: bool) -> None:
        self._group.committed.update({tp: int(o) for tp, o in offsets.items()})

    def partition_count(self, topic: str) -> int:
        return len(self.bus.partitions(topic))

    def close(self) -> None:
        with self.bus._lock:
            if self in self._group.members:
                self._group.members.remove(self)
                self.bus._rebalance(self._group)
        self.closed = True


class MemoryProducer:
    def __init__(self, bus: MemoryBus) -> None:
        self.bus = bus
        self._failed: list[Outgoing] = []

    def send(
        self,
        topic: str,
        key: bytes | None = None,
        value: bytes | None = None,
        headers: Any = None,
        partition: int | None = None,
    ) -> Delivery:
        item = Outgoing(topic, key, value, headers, partition)
        delivery = Delivery(item)
        with self.bus._lock:
            if self.bus.fail_next > 0:
                self.bus.fail_next -= 1
                self._failed.append(item)
                delivery.settle(ConnectionError("the in-memory broker failed this record (fail_next)"))
                return delivery
        self.bus.append(topic, key, value, headers, partition)
        delivery.settle(None)
        return delivery

    def flush(self, timeout_s: float) -> list[Outgoing]:
        failed, self._failed = self._failed, []
        return failed

    def close(self, timeout_s: float = 10.0) -> None:
        self._failed = []


class MemoryReader:
    def __init__(self, bus: MemoryBus) -> None:
        self.bus = bus
        self._position: dict[TopicPart, int] = {}
        self.closed = False

    def partitions(self, topic: str, wait_s: float = 0.0) -> list[int]:
        return list(range(self.bus.partition_count(topic)))

    def assign(self, parts: Sequence[TopicPart], start: Mapping[TopicPart, int] | str = "beginning") -> None:
        if isinstance(start, str):
            if start not in ("beginning", "end"):
                raise ValueError(f"start must be 'beginning', 'end' or offsets, not {start!r}")
            ends = self.end_offsets(parts)
            self._position = {t: 0 if start == "beginning" else ends[t] for t in parts}
        else:
            self._position = {t: int(start[t]) for t in parts}

    def end_offsets(self, parts: Sequence[TopicPart]) -> dict[TopicPart, int]:
        with self.bus._lock:
            return {t: len(self.bus.partitions(t.topic)[t.partition]) for t in parts}

    def position(self, part: TopicPart) -> int:
        return self._position[part]

    def poll(self, timeout_s: float, max_records: int = 500) -> list[Record]:
        out: list[Record] = []
        with self.bus._lock:
            for tp in sorted(self._position):
                start = self._position[tp]
                stored = self.bus.partitions(tp.topic)[tp.partition][start : start + max_records - len(out)]
                appended = tp.topic in self.bus.log_append_time
                out += [
                    Record(
                        tp.topic, tp.partition, start + i, r.key, r.value, r.append_ms, appended, r.headers
                    )
                    for i, r in enumerate(stored)
                ]
                self._position[tp] = start + len(stored)
                if len(out) >= max_records:
                    break
        if not out and timeout_s > 0:
            time.sleep(min(timeout_s, 0.01))  # nothing yet: a caller's loop must not spin
        return out

    def close(self) -> None:
        self.closed = True
