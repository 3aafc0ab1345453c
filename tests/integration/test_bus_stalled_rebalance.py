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

from fleetwatch.bus.admin import ensure_topics
from fleetwatch.bus.kafka import KafkaBus, KafkaGroupConsumer
from tests.integration.services import send


def replacements(group: str) -> float:
    return REGISTRY.get_sample_value("fleetwatch_bus_consumers_replaced_total", {"group": group}) or 0.0


def member(bus: KafkaBus, group: str, name: str, topic: str) -> KafkaGroupConsumer:
    c = bus.group_consumer(group, client_id=name, session_timeout_ms=6000)
    c.subscribe([topic], lambda parts: dict.fromkeys(parts, 0), lambda _p: None)
    return c


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
    joiner = member(bus, group, "joiner", topic)
    joiner.rebalance_watch.broker_limit_s = 8.0
    joiner.rebalance_watch.tell_after_s = 5.0  # said in the log first
    before = replacements(group)
    try:
        deadline = time.monotonic() + 60
        while replacements(group) == before and time.monotonic() < deadline:
            joiner.poll(100, 0.2)
        assert replacements(group) == before + 1, "the joiner was never taken for stalled"
        assert any(
            "stalled in group state up, join state wait-join" in r.getMessage() for r in caplog.records
        )
        assert not joiner.assignment()

        # the holder polls again: the rebalance ends, and the joiner's new client is in it and reads
        read: list[bytes] = []
        deadline = time.monotonic() + 90
        while len(read) < 10 and time.monotonic() < deadline:
            holder.poll(100, 0.2)
            read += [v for b in joiner.poll(100, 0.2).values() for v in b.values()]
        assert len(joiner.assignment()) == 1, "the joiner's new client never got a partition"
        (mine,) = joiner.assignment()
        assert sorted(read) == sorted(b"v-%d-%d" % (mine.partition, i) for i in range(10))
    finally:
        joiner.close()
        holder.close()
