"""fleetwatch.record_blocks on the real broker: a worker's consumer polls blocks for plain records
and kafka-python's records for compressed ones (the reader against kafka-python's own, without a
broker: tests/unit/test_record_blocks.py)."""

from __future__ import annotations

import time
import uuid

import pytest
from kafka import KafkaProducer, TopicPartition
from kafka.admin import NewTopic

from fleetwatch import kafka_io, record_blocks
from tests.helpers.record_batches import as_pairs


@pytest.mark.kafka
def test_a_worker_consumer_polls_blocks_from_the_real_broker(kafka_bootstrap: str) -> None:
    """install() takes on this kafka-python (a version that changed the reader fails here, not
    silently slower); poll() then returns blocks for plain records and kafka-python's records for
    compressed ones, and gather() gives every value once, in order, with its offset, key and the
    time the broker appended it (the topic keeps LogAppendTime, as fleetwatch's input topics do)."""
    topic = f"test-blocks-{uuid.uuid4().hex[:8]}"
    admin = kafka_io.make_admin(kafka_bootstrap)
    admin.create_topics([NewTopic(topic, 1, 1, topic_configs={"message.timestamp.type": "LogAppendTime"})])
    admin.close()
    before_ms = int(time.time() * 1000)
    sent: list[bytes | None] = [f"plain-{i}".encode() for i in range(300)] + [None]
    producer = KafkaProducer(**kafka_io.client_config(kafka_bootstrap), linger_ms=5)
    for v in sent:
        producer.send(topic, key=b"k", value=v)
    producer.flush()
    gz = KafkaProducer(**kafka_io.client_config(kafka_bootstrap), compression_type="gzip")
    zipped = [f"zipped-{i}".encode() for i in range(50)]
    for v in zipped:
        gz.send(topic, value=v)
    gz.flush()
    producer.close()
    gz.close()
    consumer = kafka_io.make_consumer(kafka_bootstrap)
    assert record_blocks.install(consumer)
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    kinds: set[str] = set()
    got: list[tuple[int, bytes | None, bytes | None, int]] = []
    deadline = time.monotonic() + 30
    while len(got) < len(sent) + len(zipped) and time.monotonic() < deadline:
        for items in consumer.poll(timeout_ms=500).values():
            kinds |= {type(item).__name__ for item in items}
            got += as_pairs(items)
    consumer.close()
    assert [(o, v) for o, _k, v, _t in got] == list(enumerate(sent + zipped))
    assert [k for _o, k, _v, _t in got] == [b"k"] * len(sent) + [None] * len(zipped)
    assert all(before_ms - 5000 <= t <= time.time() * 1000 + 5000 for *_, t in got)
    assert kinds == {"RecordBlock", "ConsumerRecord"}
