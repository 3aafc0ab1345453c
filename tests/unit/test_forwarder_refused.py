"""A spooled record the Kafka client refuses for its size is dropped and counted, not resent for ever.

The forwarder treated such a refusal as a broker outage: a fresh producer, a resend from the oldest
record, which was the refused one again, so every good sample behind it stayed in the spool until
the spool's bound dropped it (hours at 1 Hz). The client refuses at send() what is past its
message.max.bytes (the bus's RecordTooLarge). Through the real client: tests/integration/test_agent.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fleetwatch.bus import Delivery, Outgoing, RecordTooLarge
from fleetwatch.collectors.forwarder import SpoolForwarder
from fleetwatch.collectors.spool import Spool

LIMIT = 1000


class LimitedProducer:
    """Refuses a value over LIMIT bytes as librdkafka does: at send() (`at="send"`), or in the
    delivery report, as a broker with a lower limit does (`at="broker"`)."""

    def __init__(self, at: str, sent: list[bytes]) -> None:
        self.at, self.sent = at, sent
        self.queued: list[Delivery] = []

    def send(self, topic: str, key: bytes | None = None, value: bytes | None = None) -> Delivery:
        assert value is not None
        if self.at == "send" and len(value) > LIMIT:
            raise RecordTooLarge("KafkaError{code=MSG_SIZE_TOO_LARGE,val=10}")
        d = Delivery(Outgoing(topic, key, value, None, None))
        self.queued.append(d)
        return d

    def flush(self, timeout_s: float) -> list[Any]:
        for d in self.queued:
            value = d.item.value or b""
            if len(value) > LIMIT:
                d.settle(RecordTooLarge("Broker: Message size too large"))
            else:
                d.settle(None)
                self.sent.append(value)
        self.queued = []
        return []

    def close(self, timeout_s: float = 0) -> None:
        pass


def _run(tmp_path: Path, at: str) -> tuple[SpoolForwarder, Spool, list[bytes]]:
    spool = Spool(tmp_path / "s.sqlite", max_bytes=64 << 20)
    values = [b"a" * 10, b"b" * 10, b"X" * (LIMIT + 1), b"c" * 10, b"d" * 10]
    for v in values:
        spool.append(b"n1", v)
    sent: list[bytes] = []
    fwd = SpoolForwarder(
        spool, "t", "unused", retry_backoff_s=0.0, producer_factory=lambda: LimitedProducer(at, sent)
    )
    for _ in range(5):
        fwd.pump(0.1)
    return fwd, spool, sent


def test_a_record_the_client_refuses_for_its_size_is_dropped_and_the_rest_sent(tmp_path: Path) -> None:
    fwd, spool, sent = _run(tmp_path, "send")
    assert sent == [b"a" * 10, b"b" * 10, b"c" * 10, b"d" * 10]
    assert len(spool) == 0 and fwd.refused_total == 1 and fwd.outages == 0 and fwd.broker_up


def test_a_size_refusal_in_the_delivery_report_is_retried_not_dropped(tmp_path: Path) -> None:
    """The broker's refusal comes for a whole batch (a topic whose max.message.bytes is below the
    client's batch size): small records in it must not be dropped as if each were too large."""
    fwd, spool, sent = _run(tmp_path, "broker")
    assert fwd.refused_total == 0 and fwd.outages >= 1  # retried, as any failed delivery
    assert b"X" * (LIMIT + 1) in [r.value for r in spool.peek()]  # still spooled
    assert sent[:2] == [b"a" * 10, b"b" * 10]
