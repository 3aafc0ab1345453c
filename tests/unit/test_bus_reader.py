"""The bus's Reader and topic admin on the in-memory twin (fleetwatch/bus/memory.py), and the
TopicFollower that reads through it: what followers, the drain log and the demo rely on (assigned
partitions from the beginning, the end or given offsets, positions, end offsets, each record's
broker time and headers, keyed records on the partition Kafka's partitioner picks)."""

from __future__ import annotations

import threading
import time

import pytest

from fleetwatch import topics
from fleetwatch.bus import Record, TopicPart, reference_time
from fleetwatch.bus.memory import MemoryBus
from fleetwatch.bus.partitioner import partition_for
from fleetwatch.follow import TopicFollower
from tests.helpers.followers import following

T = "t.v1"


def _bus() -> MemoryBus:
    bus = MemoryBus(partitions=2, clock_ms=lambda: 1_800_000_000_000, log_append_time={topics.JOBS})
    bus.ensure_topics([T, topics.JOBS], partitions=2)
    return bus


def test_admin_calls_create_and_count_topics_without_making_any_by_asking() -> None:
    bus = MemoryBus(partitions=4)
    assert bus.partition_count("absent") == 0 and "absent" not in bus.list_topics()
    bus.ensure_topics(["a", "b"], partitions=3)
    bus.ensure_topics(["a"], partitions=8)  # an existing topic keeps its partitions
    assert (bus.partition_count("a"), bus.partition_count("b")) == (3, 3)
    assert bus.list_topics() == {"a", "b"}
    bus.wait_for_broker(0)  # always up


def test_keyed_records_land_where_kafkas_partitioner_puts_them() -> None:
    bus = MemoryBus(partitions=4)
    bus.ensure_topics([T], partitions=4)
    p = bus.producer(linger_ms=5, idempotent=False, options={"batch.size": 1})  # options: ignored here
    for i in range(40):
        p.send(T, key=f"node-{i}".encode(), value=b"v")
    for part, log in enumerate(bus.partitions(T)):
        assert log and all(partition_for(r.key, 4) == part for r in log if r.key is not None)


def test_a_reader_reads_from_the_beginning_in_offset_order_and_tracks_its_position() -> None:
    bus = _bus()
    for i in range(5):
        bus.append(T, None, f"{i}".encode(), headers=[("h", b"x")] if i == 2 else None, partition=i % 2)
    r = bus.reader()
    assert r.partitions(T) == [0, 1] and r.partitions("absent") == []
    parts = [TopicPart(T, 0), TopicPart(T, 1)]
    r.assign(parts)
    assert r.end_offsets(parts) == {parts[0]: 3, parts[1]: 2}
    assert [r.position(tp) for tp in parts] == [0, 0]
    got = r.poll(0.0, max_records=4)
    assert len(got) == 4 and r.poll(0.0, max_records=4)[0].value == b"3" and r.poll(0.0) == []
    assert [rec.value for rec in got if rec.partition == 0] == [b"0", b"2", b"4"]
    assert [r.position(tp) for tp in parts] == [3, 2]
    two = next(rec for rec in got if rec.value == b"2")
    assert two == Record(T, 0, 1, None, b"2", -1, False, [("h", b"x")])
    r.close()


def test_a_reader_starts_at_the_end_or_at_given_offsets() -> None:
    bus = _bus()
    for i in range(4):
        bus.append(T, None, f"{i}".encode(), partition=0)
    r = bus.reader()
    tp = TopicPart(T, 0)
    r.assign([tp], "end")
    assert r.poll(0.0) == [] and r.position(tp) == 4
    bus.append(T, None, b"new", partition=0)
    assert [rec.value for rec in r.poll(0.0)] == [b"new"]
    r.assign([tp], {tp: 2})
    assert [rec.offset for rec in r.poll(0.0)] == [2, 3, 4]
    with pytest.raises(ValueError):
        r.assign([tp], "latest")


def test_the_broker_time_is_the_reference_where_the_topic_keeps_it() -> None:
    bus = _bus()
    bus.append(topics.JOBS, b"j", b"{}")
    bus.append(T, b"j", b"{}")
    r = bus.reader()
    r.assign([TopicPart(t, p) for t in (topics.JOBS, T) for p in (0, 1)])
    by_topic = {rec.topic: rec for rec in r.poll(0.0)}
    assert by_topic[topics.JOBS].log_append and by_topic[topics.JOBS].timestamp_ms == 1_800_000_000_000
    assert reference_time(by_topic[topics.JOBS], now=5.0) == 1_800_000_000.0
    assert not by_topic[T].log_append and reference_time(by_topic[T], now=5.0) == 5.0


def test_a_follower_applies_the_whole_topic_then_says_it_caught_up() -> None:
    bus = _bus()
    for i in range(6):
        bus.append(T, f"k{i % 3}".encode(), None if i == 5 else f"{i}".encode())
    seen: list[tuple[bytes | None, bytes | None]] = []
    late = threading.Event()

    def apply(key: bytes | None, value: bytes | None) -> None:
        seen.append((key, value))
        if key == b"late":
            late.set()

    follower = TopicFollower(T, apply, bus)
    with following(follower):
        assert follower.caught_up.wait(30)
        assert sorted(seen, key=repr) == sorted(
            [(b"k0", b"0"), (b"k1", b"1"), (b"k2", b"2"), (b"k0", b"3"), (b"k1", b"4"), (b"k2", None)],
            key=repr,
        )
        bus.append(T, b"late", b"x")  # what arrives later is applied too
        assert late.wait(30) and seen[-1] == (b"late", b"x")
    assert not follower.is_alive()


def test_a_follower_of_an_empty_topic_is_caught_up_at_once_and_of_an_unseen_one_once_it_shows() -> None:
    """A topic its reader cannot see (missing, or its metadata refused by an ACL) was followed as
    empty, for good: act then took no pause (the switch failing open) and no result or census from
    it. It is asked again until it shows, and not caught up meanwhile."""
    bus = _bus()
    follower = TopicFollower(T, lambda _k, _v: None, bus)
    with following(follower):
        assert follower.caught_up.wait(30)
    seen: list[bytes | None] = []
    follower = TopicFollower("absent", lambda _k, v: seen.append(v), bus)
    with following(follower):
        assert not follower.caught_up.wait(1.5)
        bus.ensure_topics(["absent"], partitions=2)
        bus.append("absent", b"k", b"v")
        assert follower.caught_up.wait(30)
        deadline = time.monotonic() + 30
        while not seen and time.monotonic() < deadline:
            time.sleep(0.05)
        assert seen == [b"v"]
    assert not follower.is_alive()


def test_a_follower_read_once_applies_what_the_topic_holds_and_stops() -> None:
    bus = _bus()
    for i in range(6):
        bus.append(T, f"k{i % 3}".encode(), None if i == 5 else f"{i}".encode())
    seen: list[tuple[bytes | None, bytes | None]] = []
    follower = TopicFollower(T, lambda k, v: seen.append((k, v)), bus)
    assert follower.read_once(30)
    assert len(seen) == 6 and (b"k2", None) in seen  # every record the topic held, tombstone too
    assert not follower.is_alive()
