"""fleetwatch.socket_reads: kafka-python's plaintext read loop, reading 256 KB a call."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from kafka import KafkaProducer, TopicPartition
from kafka.errors import KafkaConnectionError
from kafka.net import transport

from fleetwatch import kafka_io, socket_reads


class ChunkSocket:
    """A non-blocking socket with `chunks` waiting, then `end` (an exception, or b"": closed)."""

    def __init__(self, chunks: list[bytes], end: Any) -> None:
        self.chunks = list(chunks)
        self.end = end
        self.asked: list[int] = []

    def recv(self, n: int) -> bytes:
        self.asked.append(n)
        if self.chunks:
            return self.chunks.pop(0)[:n]
        if isinstance(self.end, BaseException):
            raise self.end
        return self.end


class Conn:
    def __init__(self, sock: ChunkSocket) -> None:
        self._sock = sock


def test_reads_everything_waiting_until_the_socket_would_block() -> None:
    sock = ChunkSocket([b"a" * 300_000, b"b" * 10], BlockingIOError())
    data, err = socket_reads._sock_recv(Conn(sock))
    assert data == b"a" * socket_reads.READ_BYTES + b"b" * 10 and err is None
    assert set(sock.asked) == {socket_reads.READ_BYTES} and len(sock.asked) == 3


def test_a_closed_or_failed_socket_is_a_connection_error_after_what_was_read() -> None:
    data, err = socket_reads._sock_recv(Conn(ChunkSocket([b"x"], b"")))
    assert data == b"x" and isinstance(err, KafkaConnectionError) and "disconnected" in str(err)
    data, err = socket_reads._sock_recv(Conn(ChunkSocket([], ConnectionResetError("reset"))))
    assert data == b"" and isinstance(err, KafkaConnectionError) and "reset" in str(err)


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
