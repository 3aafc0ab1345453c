"""A group consumer whose rebalance stalls is given a new client (fleetwatch/bus/rebalance_watch.py,
KafkaGroupConsumer.poll), on the real broker, judged from the real client's statistics reports.

The stall here is one the broker makes: a member that stopped polling holds every rebalance of its
group (the broker waits for it to rejoin until its poll interval runs out), so a member joining sits
in `wait-join`. The watch's broker-side limit is lowered from the poll interval (300 s) to seconds so
that the test sees the member replaced, and the group completes once the other member polls again."""

from __future__ import annotations

import time
import uuid

import pytest
from prometheus_client import REGISTRY

from fleetwatch.bus import TopicPart
from fleetwatch.bus.admin import ensure_topics
from fleetwatch.bus.kafka import KafkaBus, KafkaGroupConsumer
from tests.integration.services import APART, send

# a long file: in the third pytest process, whose share of the tier's time it evens out
pytestmark = APART


def replacements(group: str) -> float:
    return REGISTRY.get_sample_value("fleetwatch_bus_consumers_replaced_total", {"group": group}) or 0.0


def member(
    bus: KafkaBus, group: str, name: str, topic: str, called: list[str] | None = None
) -> KafkaGroupConsumer:
    """A member that reads every partition it is given from the start; `called` gets the owner's
    callbacks it is served ("assign", "revoke", "lost" with the partitions' count)."""
    calls = called if called is not None else []

    def assign(parts: list[TopicPart]) -> dict[TopicPart, int]:
        calls.append(f"assign {len(parts)}")
        return dict.fromkeys(parts, 0)

    c = bus.group_consumer(group, client_id=name, session_timeout_ms=6000)
    c.subscribe(
        [topic], assign, lambda p: calls.append(f"revoke {len(p)}"), lambda p: calls.append(f"lost {len(p)}")
    )
    return c


def said(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "fleetwatch.bus.kafka"]


def test_a_member_held_in_a_rebalance_past_its_limit_gets_a_new_client_and_joins_when_it_ends(
    kafka_bootstrap: str, caplog: pytest.LogCaptureFixture
) -> None:
    topic, group = f"bus.stall.{uuid.uuid4().hex[:8]}", f"stall-{uuid.uuid4().hex[:8]}"
    ensure_topics(kafka_bootstrap, [topic], partitions=2)
    for p in (0, 1):
        send(kafka_bootstrap, topic, [(b"k", b"v-%d-%d" % (p, i)) for i in range(10)], partition=p)
    bus = KafkaBus(kafka_bootstrap)
    holder = member(bus, group, "holder", topic)
    deadline = time.monotonic() + 60
    while len(holder.assignment()) < 2 and time.monotonic() < deadline:
        holder.poll(100, 0.2)
    assert len(holder.assignment()) == 2
    # the holder stops polling: its client heartbeats on, but cannot give its partitions up
    called: list[str] = []
    joiner = member(bus, group, "joiner", topic, called)
    watch = joiner.rebalance_watch
    watch.broker_limit_s, watch.tell_after_s = 8.0, 5.0  # (310 s and 15 s in service)
    before = replacements(group)
    try:
        deadline = time.monotonic() + 60
        while replacements(group) == before and time.monotonic() < deadline:
            joiner.poll(100, 0.2)
        assert replacements(group) == before + 1, "the joiner was never taken for stalled"
        watch.broker_limit_s = 310.0  # the new client is judged as in service
        lines = said(caplog)
        told = [i for i, m in enumerate(lines) if "has been out of place in its group for" in m]
        stalled = [i for i, m in enumerate(lines) if "stalled out of place in its group for" in m]
        assert told and stalled and told[0] < stalled[0], lines
        assert "join state wait-join" in lines[stalled[0]], lines

        # the holder polls again: the rebalance ends, and the joiner's new client is in it and reads
        read: list[bytes] = []
        deadline = time.monotonic() + 90
        while len(read) < 10 and time.monotonic() < deadline:
            holder.poll(100, 0.2)
            read += [v for b in joiner.poll(100, 0.2).values() for v in b.values()]
        assert len(joiner.assignment()) == 1, "the joiner's new client never got a partition"
        (mine,) = joiner.assignment()
        assert sorted(read) == sorted(b"v-%d-%d" % (mine.partition, i) for i in range(10))
        assert replacements(group) == before + 1  # once
        # the given-up client's close served no callback to the owner: only the new client's assign
        assert called == ["assign 1"], called
    finally:
        joiner.close()
        holder.close()


def test_a_member_whose_topic_is_missing_waits_for_it_and_is_not_replaced(
    kafka_bootstrap: str, caplog: pytest.LogCaptureFixture
) -> None:
    """librdkafka joins no group while no subscribed topic has partitions: the member sits in
    `init`, its coordinator up. That is waiting for the topic (said in the log), not a stall; it
    joins once the topic is made."""
    topic, group = f"bus.missing.{uuid.uuid4().hex[:8]}", f"missing-{uuid.uuid4().hex[:8]}"
    bus = KafkaBus(kafka_bootstrap)
    called: list[str] = []
    waiting = member(bus, group, "waiting", topic, called)
    waiting.rebalance_watch.local_limit_s = 6.0  # (30 s in service)
    before = replacements(group)
    try:
        deadline = time.monotonic() + 25
        while time.monotonic() < deadline:
            waiting.poll(100, 0.2)
        assert replacements(group) == before
        assert any(f"waits for its topics ({topic})" in m for m in said(caplog)), said(caplog)
        ensure_topics(kafka_bootstrap, [topic], partitions=1)
        send(kafka_bootstrap, topic, [(b"k", b"there")])
        read: list[bytes] = []
        deadline = time.monotonic() + 60
        while not read and time.monotonic() < deadline:
            read += [v for b in waiting.poll(100, 0.2).values() for v in b.values()]
        assert read == [b"there"] and called == ["assign 1"] and replacements(group) == before
    finally:
        waiting.close()
