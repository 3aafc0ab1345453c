"""fleetwatch.socket_reads on the real broker: a consumer reads large fetches whole with the larger
reads (the read loop on a stand-in socket: tests/unit/test_socket_reads.py)."""

from __future__ import annotations

import time
import uuid

import pytest
from kafka import KafkaProducer, TopicPartition
from kafka.net import transport

from fleetwatch import kafka_io, socket_reads


@pytest.mark.kafka
def test_a_consumer_reads_large_fetches_whole_with_the_larger_reads(kafka_bootstrap: str) -> None:
    assert socket_reads.install()
    assert transport.KafkaTCPTransport._sock_recv is socket_reads._sock_recv
    topic = f"test-reads-{uuid.uuid4().hex[:8]}"
    kafka_io.ensure_topics(kafka_bootstrap, [topic], partitions=1)
    sent = [bytes([i % 251]) * 20_000 for i in range(300)]  # 6 MB: fetches span many reads
    producer = KafkaProducer(**kafka_io.client_config(kafka_bootstrap), linger_ms=5, max_request_size=4 << 20)
    for v in sent:
        producer.send(topic, value=v)
    producer.flush()
    producer.close()
    consumer = kafka_io.make_consumer(kafka_bootstrap, max_partition_fetch_bytes=8 << 20)
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    got: list[bytes] = []
    deadline = time.monotonic() + 30
    while len(got) < len(sent) and time.monotonic() < deadline:
        for records in consumer.poll(timeout_ms=500).values():
            got += [r.value for r in records]
    consumer.close()
    assert got == sent
