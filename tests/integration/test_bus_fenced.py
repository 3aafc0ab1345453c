"""A group consumer whose client hits a fatal error is replaced (fleetwatch/bus/kafka.py,
KafkaGroupConsumer._replace), on the real broker. The fatal error here is the one a broker restart
gave act (test_act_hostile_inputs.py's outage test): a static member fenced by a member with the same
group.instance.id. Before, the fenced client went on returning from poll() with nothing, and the
worker sat in the group reading nothing, alive, for good."""

from __future__ import annotations

import time
import uuid

from prometheus_client import REGISTRY

from fleetwatch.bus import TopicPart
from fleetwatch.bus.admin import ensure_topics
from fleetwatch.bus.kafka import KafkaBus, KafkaGroupConsumer
from tests.integration.services import send


def replacements(group: str) -> float:
    return REGISTRY.get_sample_value("fleetwatch_bus_consumers_replaced_total", {"group": group}) or 0.0


def member(
    bus: KafkaBus, group: str, name: str, topic: str, revoked: list[TopicPart], lost: list[TopicPart]
) -> KafkaGroupConsumer:
    c = bus.group_consumer(group, client_id=name, instance_id="one-id", session_timeout_ms=6000)
    c.subscribe([topic], lambda parts: dict.fromkeys(parts, 0), revoked.extend, lost.extend)
    return c


def test_a_fenced_static_member_is_replaced_and_reads_on(kafka_bootstrap: str) -> None:
    topic, group = f"bus.fenced.{uuid.uuid4().hex[:8]}", f"fenced-{uuid.uuid4().hex[:8]}"
    ensure_topics(kafka_bootstrap, [topic], partitions=2)
    send(kafka_bootstrap, topic, [(b"k%d" % i, b"before-%d" % i) for i in range(20)])
    bus = KafkaBus(kafka_bootstrap)
    revoked: list[TopicPart] = []
    lost: list[TopicPart] = []
    first = member(bus, group, "first", topic, revoked, lost)
    read: list[bytes] = []
    deadline = time.monotonic() + 60
    while len(read) < 20 and time.monotonic() < deadline:
        read += [v for b in first.poll(100, 0.2).values() for v in b.values()]
    assert sorted(read) == sorted(b"before-%d" % i for i in range(20))
    replaced = replacements(group)

    # a second member with the same instance id takes the first one's place: the broker fences the first
    second = member(bus, group, "second", topic, [], [])
    deadline = time.monotonic() + 60
    while not second.assignment() and time.monotonic() < deadline:
        second.poll(100, 0.2)
    assert second.assignment(), "the second member never got the partitions"
    second.close()
    # the first learns it was fenced at its next heartbeat (it may fetch until then)
    deadline = time.monotonic() + 30
    while replacements(group) == replaced and time.monotonic() < deadline:
        first.poll(100, 0.2)

    send(kafka_bootstrap, topic, [(b"k%d" % i, b"after-%d" % i) for i in range(20)])
    after: list[bytes] = []
    deadline = time.monotonic() + 90
    while len([v for v in after if v.startswith(b"after")]) < 20 and time.monotonic() < deadline:
        after += [v for b in first.poll(100, 0.2).values() for v in b.values()]
    given_up, revoked_before_close = sorted(lost), list(revoked)
    first.close()
    assert replacements(group) == replaced + 1
    # the fenced client's partitions were lost, not revoked (the owner writes nothing for them)
    assert given_up == [TopicPart(topic, 0), TopicPart(topic, 1)] and revoked_before_close == []
    assert sorted(v for v in after if v.startswith(b"after")) == sorted(b"after-%d" % i for i in range(20))
