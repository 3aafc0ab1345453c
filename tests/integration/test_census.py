"""The census of reporting nodes (fleetwatch/census.py): the table act builds from the compacted
fleet.nodes.v1 through a TopicFollower (fleetwatch/follow.py), read from the real broker: records
add and refresh nodes, tombstones forget them, bad records change nothing. node/1 validation is
in tests/unit/test_census.py."""

from __future__ import annotations

import time
import uuid

from fleetwatch import kafka_io, schemas
from fleetwatch.census import Census, node_message
from fleetwatch.follow import TopicFollower


def test_census_follows_the_topic_and_forgets_tombstoned_nodes(kafka_bootstrap: str) -> None:
    topic = f"test.nodes.{uuid.uuid4().hex[:8]}"
    kafka_io.ensure_topics(kafka_bootstrap, [topic])
    producer = kafka_io.make_producer(kafka_bootstrap)
    now = time.time()
    records: list[tuple[str, bytes | None]] = [
        ("gpu-node-01", schemas.encode(node_message("gpu-node-01", now - 600, now - 5))),
        ("gpu-node-02", schemas.encode(node_message("gpu-node-02", now - 600, now - 5))),
        ("gpu-node-03", schemas.encode(node_message("gpu-node-03", now - 600, now - 5))),
        ("gpu-node-02", None),  # forgotten
        ("gpu-node-04", b"{not json"),  # bad: ignored
        ("gpu-node-05", schemas.encode(node_message("gpu-node-06", now, now))),  # key != node: ignored
    ]
    for key, value in records:
        producer.send(topic, key=key.encode(), value=value)
    producer.flush(10)
    producer.close(5)
    census = Census()
    follower = TopicFollower(topic, census.apply, lambda: kafka_io.make_consumer(kafka_bootstrap))
    follower.start()
    try:
        assert follower.caught_up.wait(30)
        assert census.nodes() == {"gpu-node-01", "gpu-node-03"} and len(census) == 2
        assert "gpu-node-02" not in census and "gpu-node-03" in census
    finally:
        follower.stop()
        follower.join(10)
