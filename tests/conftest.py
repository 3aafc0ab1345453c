"""Shared fixtures. Tests that need the real Kafka broker use `kafka_bootstrap`: it starts the
repo's local broker (services/kafka/kafka.sh, idempotent) and fails loudly if it cannot."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaConsumer, TopicPartition

from fleetwatch import kafka_io, schemas

REPO = Path(__file__).resolve().parent.parent
KAFKA_SH = REPO / "services" / "kafka" / "kafka.sh"
ASD_DIR = REPO.parent / "shared" / "data" / "asd"


@pytest.fixture(scope="session")
def kafka_bootstrap() -> str:
    bootstrap = os.environ.get("FLEETWATCH_TEST_BOOTSTRAP", "127.0.0.1:19092")
    if "FLEETWATCH_TEST_BOOTSTRAP" not in os.environ:
        r = subprocess.run(["bash", str(KAFKA_SH), "start"], capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            pytest.fail(f"could not start the local Kafka broker: {r.stderr.strip()[-2000:]}")
    kafka_io.wait_for_broker(bootstrap, timeout_s=60)
    kafka_io.ensure_topics(bootstrap)
    return bootstrap


class TopicTail:
    """A consumer placed at the current end of a topic: it sees only what a test produces next."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self.consumer = KafkaConsumer(
            **kafka_io.client_config(bootstrap), enable_auto_commit=False, consumer_timeout_ms=200
        )
        parts = self.consumer.partitions_for_topic(topic)
        deadline = time.monotonic() + 10
        while not parts and time.monotonic() < deadline:
            time.sleep(0.2)
            parts = self.consumer.partitions_for_topic(topic)
        assert parts, f"topic {topic} has no partitions"
        self.tps = [TopicPartition(topic, p) for p in sorted(parts)]
        self.consumer.assign(self.tps)
        self.consumer.seek_to_end(*self.tps)
        for tp in self.tps:  # force the lazy seek now, before the test produces anything
            self.consumer.position(tp)

    def collect(self, until: Callable[[list[Any]], bool], timeout_s: float = 30.0) -> list[Any]:
        """Poll records until `until(records)` holds or the timeout passes; returns raw records."""
        records: list[Any] = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not until(records):
            for batch in self.consumer.poll(timeout_ms=200).values():
                records.extend(batch)
        return records

    def messages(self, records: list[Any]) -> list[dict[str, Any]]:
        return [schemas.decode(r.value) for r in records]

    def close(self) -> None:
        self.consumer.close()


@pytest.fixture
def topic_tail(kafka_bootstrap: str) -> Iterator[Callable[[str], TopicTail]]:
    tails: list[TopicTail] = []

    def make(topic: str) -> TopicTail:
        t = TopicTail(kafka_bootstrap, topic)
        tails.append(t)
        return t

    yield make
    for t in tails:
        t.close()


class PrivateBroker:
    """A second local broker on its own ports, for tests that stop and restart Kafka without
    disturbing the shared one. For the tests of authenticated clients it also listens with
    SASL_PLAINTEXT (PLAIN, user "fleetwatch", password SASL_PASSWORD) on port + 2, and with SSL
    requiring a client certificate on port + 3 (CA and client certificate in tls_dir)."""

    SASL_PASSWORD = "fleetwatch-test-only"

    def __init__(self, port: int) -> None:
        self.port = port
        self.bootstrap = f"127.0.0.1:{port}"
        self.sasl_bootstrap = f"127.0.0.1:{port + 2}"
        self.ssl_bootstrap = f"127.0.0.1:{port + 3}"
        home = Path(os.environ.get("FLEETWATCH_HOME", REPO / ".fleetwatch"))
        self.tls_dir = home / f"kafka-{port}" / "tls"
        self.env = {
            **os.environ,
            "KAFKA_PORT": str(port),
            "KAFKA_CONTROLLER_PORT": str(port + 1),
            "KAFKA_SASL_PORT": str(port + 2),
            "KAFKA_SASL_PASSWORD": self.SASL_PASSWORD,
            "KAFKA_SSL_PORT": str(port + 3),
        }

    def _sh(self, verb: str) -> None:
        r = subprocess.run(
            ["bash", str(KAFKA_SH), verb], env=self.env, capture_output=True, text=True, timeout=300
        )
        if r.returncode != 0:
            pytest.fail(f"kafka.sh {verb} on port {self.port} failed: {r.stderr.strip()[-2000:]}")

    def start(self) -> None:
        self._sh("start")
        kafka_io.wait_for_broker(self.bootstrap, timeout_s=60)

    def stop(self) -> None:
        self._sh("stop")


@pytest.fixture(scope="session")
def private_broker(kafka_bootstrap: str) -> Iterator[PrivateBroker]:
    broker = PrivateBroker(int(os.environ.get("FLEETWATCH_TEST_PRIVATE_PORT", "19192")))
    broker.start()
    kafka_io.ensure_topics(broker.bootstrap)
    yield broker
    broker.stop()
