"""The bus on the real broker, through confluent-kafka (librdkafka) and its public API.

Security settings come from the FLEETWATCH_KAFKA_* variables (fleetwatch/bus/config.py), translated
to librdkafka's names. Producers compress with zstd and partition keys with murmur2, as Kafka's Java
client does, so a node's records land on the partition fleetwatch/bus/partitioner.py computes.

Fork: librdkafka's threads do not survive os.fork(). A client inherited by a forked child (a
PyTorch DataLoader worker forked from a training rank that reports steps) goes inert there: it never
calls into the inherited handle, and the handle is never destroyed in the child either (destroying
it waits for the parent's threads, which the child does not have: it would hang at the child's
exit). The child makes clients of its own.
"""

from __future__ import annotations

import ctypes
import logging
import os
import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_INVALID,
    TIMESTAMP_LOG_APPEND_TIME,
    TIMESTAMP_NOT_AVAILABLE,
    Consumer,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka import Producer as _Producer

from fleetwatch import topics
from fleetwatch.bus import (
    CONSUMERS_REPLACED,
    Delivery,
    OnAssign,
    OnRevoke,
    Outgoing,
    PendingAssignment,
    Record,
    RecordTooLarge,
    SendError,
    TopicPart,
    admin,
)
from fleetwatch.bus.config import (
    COMPRESSION,
    BrokerUnavailable,
    ConfigError,
    protocol,
    rdkafka_config,
    unavailable,
)
from fleetwatch.bus.rebalance_watch import GroupState, RebalanceWatch
from fleetwatch.record_block import RecordBlock

__all__ = ["KafkaBus", "KafkaGroupConsumer", "KafkaProducer", "KafkaReader", "rdkafka_config"]

log = logging.getLogger(__name__)

METADATA_TIMEOUT_S = 10.0
PRUNE_AT = 10_000  # sent records a producer keeps before it drops the acknowledged ones
# A group consumer whose client hit a fatal error is replaced, the first time at once, then no
# sooner than this after the last replacement, doubling to the most: two members given one
# instance id fence each other in turn, and must not do so in a tight loop.
REPLACE_FIRST_S, REPLACE_MAX_S = 1.0, 60.0
# A group consumer reports where it stands in its group this often (fleetwatch/bus/rebalance_watch.py)
STATS_INTERVAL_S = 5.0
# librdkafka's default, set so that the rebalance watch's limit follows it: how long a member may go
# without polling before it leaves its group, and how long the broker waits for members to rejoin
MAX_POLL_INTERVAL_S = 300.0

# Answers a partition gives for a while after a topic is created or its broker restarts, before a
# leader is elected and known: asked again, it answers.
_LEADER_PENDING = frozenset(
    {KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE, KafkaError.UNKNOWN_TOPIC_OR_PART}
)


# a record the client refuses for its size at produce() (past its message.max.bytes)
_TOO_LARGE = frozenset({KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE})


def _is_fatal(err: KafkaError) -> bool:
    """A fatal client error: a group consumer's comes out of consume() as a message with code
    _FATAL, whose fatal() is False (the flag is on the error_cb's)."""
    return bool(err.fatal() or err.code() == KafkaError._FATAL)


def watermarks(consumer: Any, part: TopicPartition, timeout_s: float = METADATA_TIMEOUT_S) -> tuple[int, int]:
    """The partition's (low, high) offsets; a partition whose leader is not known yet is asked again
    until timeout_s has passed, then the broker's last answer is raised."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            low, high = consumer.get_watermark_offsets(part, timeout=max(0.1, deadline - time.monotonic()))
            return int(low), int(high)
        except KafkaException as e:
            if e.args[0].code() not in _LEADER_PENDING or time.monotonic() >= deadline:
                raise
            time.sleep(0.2)


class _Native:
    """Holds one librdkafka handle (a confluent-kafka Producer or Consumer) for a bus client, and
    makes it inert in a forked child (see the module doc)."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self.pid = os.getpid()
        _LIVE.add(self)

    @property
    def inherited(self) -> bool:
        return os.getpid() != self.pid

    def forget_in_child(self) -> None:
        # One reference that is never released: no finaliser of this process (garbage collection,
        # interpreter exit) ever destroys the parent's handle. Py_IncRef is CPython's public API.
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(self.handle))


_LIVE: weakref.WeakSet[_Native] = weakref.WeakSet()
_IN_FORKED_CHILD = False  # this process was forked from one that had loaded librdkafka


def _after_fork_in_child() -> None:
    global _IN_FORKED_CHILD
    _IN_FORKED_CHILD = True
    for native in list(_LIVE):
        native.forget_in_child()
    _LIVE.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


class InheritedClient(RuntimeError):
    """A Kafka client was used in a process forked after it was made (it is the parent's)."""


def _check_reachable(client: Any, bootstrap: str, cfg: Mapping[str, Any], timeout_s: float) -> None:
    """librdkafka connects lazily and retries for ever: one metadata request says now whether the
    broker answers (with the given security settings), as kafka-python's constructors do."""
    try:
        client.list_topics(timeout=timeout_s)
    except KafkaException as e:
        if _IN_FORKED_CHILD:
            # In a child forked while the parent's librdkafka threads held its locks, destroying
            # a handle (here, or when the exception's frames are freed) can wait for ever on them
            # (a step reporter's sender hung so): the failed handle is never closed or destroyed.
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(client))
        elif isinstance(client, Consumer):  # stop its retries now (left to the GC it reconnects)
            client.close()
        else:
            client.purge()
        raise BrokerUnavailable(unavailable(bootstrap, protocol(cfg))) from e


def _native(part: TopicPart, offset: int = OFFSET_INVALID) -> TopicPartition:
    """confluent-kafka's TopicPartition (its default offset, OFFSET_INVALID: none given)."""
    return TopicPartition(part.topic, part.partition, int(offset))


class KafkaBus:
    """The real broker at `bootstrap`."""

    def __init__(self, bootstrap: str, connect_timeout_s: float = METADATA_TIMEOUT_S) -> None:
        self.bootstrap = bootstrap
        self.connect_timeout_s = connect_timeout_s

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
    ) -> KafkaGroupConsumer:
        return KafkaGroupConsumer(
            self,
            group,
            client_id=client_id,
            start_at=start_at,
            session_timeout_ms=session_timeout_ms,
            heartbeat_interval_ms=heartbeat_interval_ms,
            instance_id=instance_id,
            on_commit_failure=on_commit_failure,
        )

    def producer(
        self,
        *,
        linger_ms: int = 20,
        delivery_timeout_s: float | None = None,
        idempotent: bool = True,
        max_message_bytes: int | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> KafkaProducer:
        """delivery_timeout_s: a record not acknowledged by then fails (librdkafka's default: 300 s).
        options: further librdkafka settings, applied last."""
        return KafkaProducer(
            self,
            linger_ms=linger_ms,
            delivery_timeout_s=delivery_timeout_s,
            idempotent=idempotent,
            max_message_bytes=max_message_bytes,
            options=options,
        )

    def reader(self) -> KafkaReader:
        return KafkaReader(self)

    # --------------------------------------------------------- admin (fleetwatch/bus/admin.py)

    def wait_for_broker(self, timeout_s: float | None = None) -> None:
        admin.wait_for_broker(self.bootstrap, timeout_s)

    def ensure_topics(
        self, names: Iterable[str] = topics.ALL, partitions: int = 4, replication: int | None = None
    ) -> None:
        admin.ensure_topics(self.bootstrap, names, partitions, replication)

    def partition_count(self, topic: str) -> int:
        with admin.Admin(self.bootstrap, self.connect_timeout_s) as a:
            return a.partition_count(topic)

    def list_topics(self) -> set[str]:
        with admin.Admin(self.bootstrap, self.connect_timeout_s) as a:
            return a.list_topics()

    def read_to_end(
        self,
        topic: str,
        partitions: Sequence[int],
        on_record: Callable[[int, bytes | None, bytes | None], None],
        timeout_s: float,
    ) -> set[int]:
        left = set(partitions)
        if not left:
            return left
        cfg = rdkafka_config(self.bootstrap) | {
            # a throwaway group: this consumer is assigned partitions and never joins nor commits
            "group.id": f"fleetwatch-reader-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,  # an event at each partition's end: when to stop
            # a fetch at the end answers at once (the default waits 500 ms for more to arrive)
            "fetch.wait.max.ms": 10,
        }
        consumer = Consumer(cfg)
        try:
            _check_reachable(consumer, self.bootstrap, cfg, self.connect_timeout_s)
            consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in sorted(left)])
            deadline = time.monotonic() + timeout_s
            while left and time.monotonic() < deadline:
                for m in consumer.consume(1000, 0.2):
                    err = m.error()
                    if err is None:
                        on_record(m.partition(), m.key(), m.value())
                    elif err.code() == KafkaError._PARTITION_EOF:
                        left.discard(m.partition())
                    else:
                        _reader_error(f"reading {topic}", err)
        finally:
            consumer.close()
        return left


def _reader_error(what: str, err: KafkaError) -> None:
    """An error a reader outside any group met, for the log. Its group id is one librdkafka requires
    and nothing uses (no join, no commit), but librdkafka still looks its coordinator up, which a
    broker whose ACLs give this principal no right on that group refuses (docs/security.md gives
    none): harmless, so not a warning at every start."""
    if err.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
        log.debug("%s: %s (the reader's unused group id; reading goes on)", what, err)
    else:
        log.warning("%s: %s", what, err)


class KafkaGroupConsumer:
    def __init__(
        self,
        bus: KafkaBus,
        group: str,
        *,
        client_id: str,
        start_at: str,
        session_timeout_ms: int,
        heartbeat_interval_ms: int | None,
        instance_id: str | None,
        on_commit_failure: Callable[[Exception], None],
    ) -> None:
        if start_at not in ("earliest", "latest"):
            raise ValueError(f"start_at must be earliest or latest, not {start_at!r}")
        self.start_at = start_at
        self._on_commit_failure = on_commit_failure
        cfg = rdkafka_config(bus.bootstrap) | {
            "group.id": group,
            "client.id": client_id,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": start_at,
            # A crashed member's partitions wait this long for a new owner.
            "session.timeout.ms": session_timeout_ms,
            "heartbeat.interval.ms": heartbeat_interval_ms or max(500, min(3000, session_timeout_ms // 3)),
            # With 5 KB records the prefetch queue fills by bytes (64 MB), not by count, and
            # librdkafka then postpones the next fetch by this long (default 1 s): the worker
            # emptied the queue and idled 0.4-0.6 s every ~14,000 records.
            "fetch.queue.backoff.ms": 20,
            "on_commit": self._committed,
            "max.poll.interval.ms": int(MAX_POLL_INTERVAL_S * 1000),
            "statistics.interval.ms": int(STATS_INTERVAL_S * 1000),
            "stats_cb": self._stats,
        }
        if instance_id:
            cfg["group.instance.id"] = instance_id
        consumer = Consumer(cfg)
        _check_reachable(consumer, bus.bootstrap, cfg, bus.connect_timeout_s)
        self._native = _Native(consumer)
        self._cfg, self._group = cfg, group
        CONSUMERS_REPLACED.labels(group)  # exported at 0: increase() sees the first
        self._topics: list[str] = []
        self._given_up: str | None = None  # why the current client was given up, if it was
        # when a stalled rebalance gets a new client (its limits may be set lower, as tests do)
        self.rebalance_watch = RebalanceWatch(
            session_timeout_ms / 1000, MAX_POLL_INTERVAL_S, STATS_INTERVAL_S
        )
        self._on_lost: OnRevoke | None = None
        self._replaced_at = -float("inf")  # when the last new client joined
        self._replace_wait_s = 0.0  # how long after that the next may
        self._assigned: set[TopicPart] = set()
        self._on_assign: OnAssign | None = None
        self._on_revoke: OnRevoke | None = None
        self._pending = PendingAssignment(group)  # an assignment whose callback raised
        # the owner's starting offsets of the pending assignment, where its callback succeeded and
        # only the client's assign() failed: a retry must not ask the owner again (its tasks
        # already stand at these offsets)
        self._starts: dict[TopicPart, int] | None = None

    @property
    def _consumer(self) -> Consumer:
        if self._native.inherited:
            raise InheritedClient("this group consumer belongs to the process that forked this one")
        return self._native.handle

    # --------------------------------------------------------- group membership

    def subscribe(
        self, topics: Sequence[str], on_assign: OnAssign, on_revoke: OnRevoke, on_lost: OnRevoke | None = None
    ) -> None:
        self._on_assign, self._on_revoke = on_assign, on_revoke
        self._on_lost = on_lost or on_revoke
        self._topics = list(topics)
        self._consumer.subscribe(
            self._topics, on_assign=self._assign, on_revoke=self._revoke, on_lost=self._lose
        )

    def _give_up(self, why: str) -> None:
        """The first half of replacing a client, at once, where a fatal error ended it or its
        rebalance stalled (fleetwatch/bus/rebalance_watch.py). A fatal error is final for a
        librdkafka consumer (it fetches, heartbeats and commits nothing more, while poll() goes on
        returning: seen, a static member fenced after a broker restart, sitting in the group's place
        reading nothing), and librdkafka unassigns without calling back. Its partitions are the
        owner's no longer, and may be another member's already: they go to the owner's on_lost (no
        snapshot, no commit; whoever has them replays from the last snapshot)."""
        self._given_up = why
        owned = sorted(self._assigned | set(self._starts or ()))
        log.error(
            "the consumer of group %s %s: %d partitions given up; a new consumer joins in %.0f s",
            self._group, why, len(owned), self._replace_wait_s,
        )  # fmt: skip
        self._pending.clear()  # a held (pending) assignment was never the owner's
        if owned:
            assert self._on_lost is not None
            self._hand_back(owned, self._on_lost)

    def _next_wait_s(self) -> float:
        """How long after the last replacement the next may come: none the first time (or ten
        minutes after the last), then 1 s doubling to REPLACE_MAX_S."""
        if time.monotonic() - self._replaced_at > 10 * REPLACE_MAX_S:
            return 0.0
        return min(max(2 * self._replace_wait_s, REPLACE_FIRST_S), REPLACE_MAX_S)

    def _rejoin(self) -> None:
        """The second half: a new client under the same settings (the same instance id) in place of
        the failed one, subscribed as the owner subscribed."""
        try:
            # at once on a fatal client, calling nothing back; a stalled one may first wait for a
            # request in flight (seen: 5 s for a JoinGroup the broker held), and serves the
            # rebalance callbacks still queued: they reach no owner while _given_up is set (_assign,
            # _revoke), its partitions having gone to on_lost in _give_up
            self._native.handle.close()
        except Exception as e:
            log.warning("closing the failed consumer of group %s: %s", self._group, e)
        self._native = _Native(Consumer(self._cfg))
        self.rebalance_watch.progress()
        self._replaced_at = time.monotonic()
        if self._topics:
            assert self._on_assign is not None and self._on_revoke is not None
            self.subscribe(self._topics, self._on_assign, self._on_revoke, self._on_lost)
        self._given_up = None  # only once the new client stands
        CONSUMERS_REPLACED.labels(self._group).inc()
        log.info("the consumer of group %s replaced", self._group)

    # Nothing may escape these two: librdkafka's callbacks run inside poll(), and an exception
    # there comes out of consume() as a SystemError (see PendingAssignment).

    def _assign(self, consumer: Consumer, parts: list[TopicPartition]) -> None:
        if self._given_up is not None:  # a client being given up (closed in _rejoin): not the owner's
            return
        self.rebalance_watch.progress()
        tps = [TopicPart(p.topic, p.partition) for p in parts]
        self._pending.clear()
        self._starts = None
        try:
            self._take(tps)
        except Exception as e:
            self._pending.failed("assign", tps, e)
            try:  # held, not read: no record is skipped, and a retry starts them where it says
                consumer.assign([_native(t) for t in tps])
                consumer.pause([_native(t) for t in tps])
            except Exception as e2:  # nothing may escape the callback
                log.error("could not hold the failed assignment: %s", e2)
            self._assigned = set()

    def _take(self, tps: list[TopicPart]) -> None:
        """Ask the owner where to read these partitions from, and read them from there. The
        starting offsets go into assign(): librdkafka refuses a seek() on a partition whose
        fetching has not started yet. (Outside the rebalance callback, assign() replaces the
        assignment all the same.)"""
        assert self._on_assign is not None
        if self._starts is None:
            starts = self._on_assign(tps)
            self._starts = {t: int(starts[t]) for t in tps}
        self._consumer.assign([_native(t, self._starts[t]) for t in tps])
        self._consumer.resume([_native(t) for t in tps])  # held paused after a failed attempt
        self._starts = None
        self._assigned = set(tps)

    def _retry_assign(self) -> None:
        tps = self._pending.clear()
        try:
            self._take(tps)
            log.info("assignment of %d partitions taken on retry", len(tps))
        except Exception as e:
            self._pending.failed("assign", tps, e)

    def _revoke(self, consumer: Consumer, parts: list[TopicPartition], owner: OnRevoke | None = None) -> None:
        owner = owner or self._on_revoke
        assert owner is not None
        try:
            if self._given_up is None:  # a client being given up has nothing of the owner's left
                self.rebalance_watch.progress()
                self._hand_back([TopicPart(p.topic, p.partition) for p in parts], owner)
        finally:
            try:
                consumer.unassign()
            except Exception as e:  # nothing may escape the callback
                log.error("unassign after revoke: %s", e)

    def _hand_back(self, tps: list[TopicPart], owner: OnRevoke) -> None:
        """The owner's partitions among `tps` to `owner` (its on_revoke or on_lost), and forgotten
        here; nothing escapes (a rebalance callback's rule)."""
        self._pending.clear()
        if self._starts is not None:  # the owner took them (only assign() failed): it gives them up
            self._assigned.update(self._starts)
            self._starts = None
        try:
            owner([t for t in tps if t in self._assigned])
        except Exception as e:  # the owner goes on without them; what it did not commit is replayed
            self._pending.failed("revoke", None, e)
        finally:
            self._assigned.difference_update(tps)

    def _lose(self, consumer: Consumer, parts: list[TopicPartition]) -> None:
        """librdkafka's on_lost (the session expired, or the member was fenced): as _revoke, but
        the owner's on_lost, which neither snapshots nor commits (the partitions may be another
        member's already, and its newer snapshot must stand)."""
        self._revoke(consumer, parts, self._on_lost)

    def _waiting_for_topics(self) -> bool:
        """librdkafka joins no group while none of the subscribed topics has partitions (all missing,
        or not visible to this principal): a member waiting so, its group state `up` and its join
        state `init` or `wait-metadata`, has not stalled; said in the log at each limit, and counted
        anew."""
        state = self.rebalance_watch.state
        if state is None or state.join_state not in ("init", "wait-metadata"):
            return False
        if any(self.partition_count(t) for t in self._topics):
            return False
        log.warning(
            "the consumer of group %s waits for its topics (%s): none has partitions it can see",
            self._group, ", ".join(self._topics),
        )  # fmt: skip
        self.rebalance_watch.progress()
        return True

    def _stats(self, report: str) -> None:
        """librdkafka's statistics report, served inside poll(): where the member stands in its
        group, for the rebalance watch (nothing may escape a client callback; from_stats never
        raises)."""
        state = GroupState.from_stats(report)
        if state is not None and (lasting := self.rebalance_watch.note(state)) is not None:
            log.warning("the consumer of group %s has been %s", self._group, lasting)

    def _committed(self, err: KafkaError | None, _parts: list[TopicPartition]) -> None:
        if err is not None:
            self._on_commit_failure(KafkaException(err))

    def assignment(self) -> set[TopicPart]:
        return set(self._assigned)

    def group_offsets(self, parts: Sequence[TopicPart]) -> dict[TopicPart, int]:
        if not parts:
            return {}
        committed = self._consumer.committed([_native(t) for t in parts], timeout=METADATA_TIMEOUT_S)
        out: dict[TopicPart, int] = {}
        for t, c in zip(parts, committed, strict=True):
            if c.offset >= 0:
                out[t] = c.offset
            else:
                low, high = watermarks(self._consumer, _native(t))
                out[t] = low if self.start_at == "earliest" else high
        return out

    # --------------------------------------------------------- reading

    def poll(self, max_records: int, timeout_s: float) -> dict[TopicPart, RecordBlock]:
        # consume(n, timeout) waits until n records are there or the timeout passes: asked for a
        # full batch while fewer were fetched, it idled the worker (70% of a plain topic's time).
        # So: what is there now; if nothing, wait for one record, and take what came with it.
        if self._given_up is not None:
            left = self._replace_wait_s - (time.monotonic() - self._replaced_at)
            if left > 0:
                time.sleep(min(timeout_s, left))  # as an empty poll: the caller's loop does not spin
                return {}
            self._rejoin()
        if (stalled := self.rebalance_watch.stalled()) is not None and not self._waiting_for_topics():
            self._replace_wait_s = self._next_wait_s()  # as after a fatal error: a new client
            self._give_up(f"stalled {stalled}")
            return {}
        if self._pending.due():
            self._retry_assign()
        msgs = self._consumer.consume(max_records, 0)
        if not msgs:
            msgs = self._consumer.consume(1, timeout_s)
            if not msgs:
                return {}
            msgs += self._consumer.consume(max_records - 1, 0)
        fatal = next((e for m in msgs if (e := m.error()) is not None and _is_fatal(e)), None)
        if fatal is not None:  # the batch's partitions are given up with it: their owners replay it
            self._replace_wait_s = self._next_wait_s()
            self._give_up(f"hit a fatal error ({fatal})")
            return {}
        columns: dict[TopicPart, tuple[list[Any], list[Any], list[int], list[int]]] = {}
        for m in msgs:
            if m.error() is not None:
                # librdkafka retries what it can itself; what reaches here is for the log only
                log.warning("consumer: %s", m.error())
                continue
            tp = TopicPart(m.topic(), m.partition())
            cols = columns.get(tp)
            if cols is None:
                cols = columns[tp] = ([], [], [], [])
            kind, ms = m.timestamp()
            cols[0].append(m.value())
            cols[1].append(m.key())
            cols[2].append(m.offset())
            cols[3].append(ms if kind == TIMESTAMP_LOG_APPEND_TIME else -1)
        return {
            tp: RecordBlock.from_values(values, offsets, keys, append_ms)
            for tp, (values, keys, offsets, append_ms) in columns.items()
        }

    def seek(self, part: TopicPart, offset: int) -> None:
        self._consumer.seek(_native(part, offset))

    def pause(self, parts: Sequence[TopicPart]) -> None:
        if parts:
            self._consumer.pause([_native(t) for t in parts])

    def resume(self, parts: Sequence[TopicPart]) -> None:
        if parts:
            self._consumer.resume([_native(t) for t in parts])

    def highwater(self, part: TopicPart) -> int | None:
        _low, high = self._consumer.get_watermark_offsets(_native(part), cached=True)
        return None if high < 0 else int(high)

    def commit(self, offsets: Mapping[TopicPart, int], *, asynchronous: bool) -> None:
        if not offsets:
            return
        self._consumer.commit(
            offsets=[_native(t, o) for t, o in offsets.items()],
            asynchronous=asynchronous,
        )

    def partition_count(self, topic: str) -> int:
        """The topic's partitions; 0 when not known now (no such topic, or no broker answers: a
        caller on a timer, act's decision, must not die of an outage)."""
        try:
            meta = self._consumer.list_topics(topic, timeout=METADATA_TIMEOUT_S).topics.get(topic)
        except KafkaException:
            return 0
        return 0 if meta is None or meta.error is not None else len(meta.partitions)

    def close(self) -> None:
        if not self._native.inherited:
            self._consumer.close()  # leaves the group: its partitions move at once


class KafkaProducer:
    def __init__(
        self,
        bus: KafkaBus,
        *,
        linger_ms: int = 20,
        delivery_timeout_s: float | None = None,
        idempotent: bool = True,
        max_message_bytes: int | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        cfg = rdkafka_config(bus.bootstrap) | {
            # acks=all + idempotence: an acknowledged record is on every in-sync replica once.
            "acks": "all",
            "enable.idempotence": idempotent,
            "linger.ms": linger_ms,
            "compression.type": COMPRESSION,
            "partitioner": "murmur2_random",  # Kafka's default for keyed records (see module doc)
        }
        if delivery_timeout_s is not None:
            cfg["message.timeout.ms"] = int(delivery_timeout_s * 1000)
        if max_message_bytes is not None:
            cfg["message.max.bytes"] = max_message_bytes
        cfg.update(options or {})
        try:
            producer = _Producer(cfg)
        except KafkaException as e:
            raise ConfigError(f"the Kafka producer refused its settings: {e.args[0].str()}") from e
        _check_reachable(producer, bus.bootstrap, cfg, bus.connect_timeout_s)
        self._native = _Native(producer)
        self._sent: list[Delivery] = []
        self._prune_at = PRUNE_AT

    def send(
        self,
        topic: str,
        key: bytes | None = None,
        value: bytes | None = None,
        headers: Any = None,
        partition: int | None = None,
    ) -> Delivery:
        if self._native.inherited:
            raise SendError("this producer belongs to the process that forked this one")
        producer = self._native.handle
        delivery = Delivery(Outgoing(topic, key, value, headers, partition))

        def settle(err: KafkaError | None, _msg: Any) -> None:
            delivery.settle(None if err is None else KafkaException(err))

        kwargs: dict[str, Any] = {"key": key, "value": value, "on_delivery": settle}
        if headers:
            kwargs["headers"] = headers
        if partition is not None:
            kwargs["partition"] = partition
        while True:
            try:
                producer.produce(topic, **kwargs)
                break
            except BufferError:  # the local queue is full: let deliveries drain it
                producer.poll(0.1)
            except KafkaException as e:
                if e.args and isinstance(e.args[0], KafkaError) and e.args[0].code() in _TOO_LARGE:
                    raise RecordTooLarge(str(e)) from e
                raise SendError(str(e)) from e
        self._sent.append(delivery)
        producer.poll(0)  # serve callbacks of earlier sends
        if len(self._sent) >= self._prune_at:
            # A producer that seldom flushes (the simulator, replay) must not keep every record it
            # sent: the acknowledged ones are done; what failed or waits stays for flush().
            self._sent = [d for d in self._sent if not d.acked]
            self._prune_at = max(PRUNE_AT, 2 * len(self._sent))
        return delivery

    def poll(self, timeout_s: float = 0.0) -> None:
        if not self._native.inherited:
            self._native.handle.poll(timeout_s)

    def flush(self, timeout_s: float) -> list[Outgoing]:
        if not self._native.inherited:
            self._native.handle.flush(timeout_s)
        sent, self._sent = self._sent, []
        return [d.item for d in sent if not d.acked]

    def close(self, timeout_s: float = 10.0) -> None:
        """Bounded: what is not delivered within timeout_s is dropped (its Deliveries fail)."""
        self._sent = []
        if self._native.inherited:
            return
        producer = self._native.handle
        if producer.flush(timeout_s):
            producer.purge()  # drop what is still queued or in flight
            producer.flush(0)


class KafkaReader:
    """Assigned partitions of any topics, outside any consumer group (a throwaway group id that never
    joins nor commits)."""

    def __init__(self, bus: KafkaBus) -> None:
        cfg = rdkafka_config(bus.bootstrap) | {
            "group.id": f"fleetwatch-reader-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            # The broker answers a connection's requests in order, so a fetch waiting for data
            # (500 ms by default) holds back the watermark query behind it: a reader's end_offsets()
            # of 4 partitions took 1.5 s after assign(), and every follower's catch-up with it.
            "fetch.wait.max.ms": 50,
            # An offset the log no longer holds (retention moved its start past it: the accounting
            # stage's first start, offset 0, beside a week-old topic; one down longer than the
            # retention) reads from the oldest record kept. librdkafka's default, the end, skipped
            # every record the topic still had.
            "auto.offset.reset": "earliest",
        }
        consumer = Consumer(cfg)
        _check_reachable(consumer, bus.bootstrap, cfg, bus.connect_timeout_s)
        self._native = _Native(consumer)
        self._position: dict[TopicPart, int] = {}

    @property
    def _consumer(self) -> Consumer:
        if self._native.inherited:
            raise InheritedClient("this reader belongs to the process that forked this one")
        return self._native.handle

    def partitions(self, topic: str, wait_s: float = 0.0) -> list[int]:
        deadline = time.monotonic() + wait_s
        while True:
            meta = self._consumer.list_topics(topic, timeout=METADATA_TIMEOUT_S).topics.get(topic)
            if meta is not None and meta.error is None and meta.partitions:
                return sorted(meta.partitions)
            if time.monotonic() >= deadline:
                return []
            time.sleep(0.2)  # the metadata of a topic just created lags

    def assign(self, parts: Sequence[TopicPart], start: Mapping[TopicPart, int] | str = "beginning") -> None:
        if isinstance(start, str):
            if start not in ("beginning", "end"):
                raise ValueError(f"start must be 'beginning', 'end' or offsets, not {start!r}")
            marks = {t: self._watermarks(t) for t in parts}
            offsets = {t: marks[t][0] if start == "beginning" else marks[t][1] for t in parts}
        else:
            offsets = {t: int(start[t]) for t in parts}
        self._consumer.assign([_native(t, o) for t, o in offsets.items()])
        self._position = dict(offsets)

    def _watermarks(self, part: TopicPart) -> tuple[int, int]:
        return watermarks(self._consumer, _native(part))

    def end_offsets(self, parts: Sequence[TopicPart]) -> dict[TopicPart, int]:
        return {t: self._watermarks(t)[1] for t in parts}

    def position(self, part: TopicPart) -> int:
        return self._position[part]

    def poll(self, timeout_s: float, max_records: int = 500) -> list[Record]:
        consumer = self._consumer
        msgs = consumer.consume(max_records, 0)
        if not msgs:
            msgs = consumer.consume(1, timeout_s)
            if not msgs:
                return []
            msgs += consumer.consume(max_records - 1, 0)
        out: list[Record] = []
        for m in msgs:
            if m.error() is not None:
                # librdkafka retries what it can itself; what reaches here is for the log only
                _reader_error("reader", m.error())
                continue
            kind, ms = m.timestamp()
            rec = Record(
                m.topic(),
                m.partition(),
                m.offset(),
                m.key(),
                m.value(),
                -1 if kind == TIMESTAMP_NOT_AVAILABLE else int(ms),
                kind == TIMESTAMP_LOG_APPEND_TIME,
                m.headers(),
            )
            self._position[TopicPart(rec.topic, rec.partition)] = rec.offset + 1
            out.append(rec)
        return out

    def close(self) -> None:
        if not self._native.inherited:
            self._native.handle.close()
