"""A partition whose leader is not known yet (just created, or its broker just restarted) is asked
again; any other error, or one that outlasts the timeout, reaches the caller as the broker gave it."""

from __future__ import annotations

import pytest

# the client's types as the bus module holds them: only fleetwatch/bus imports the client
from fleetwatch.bus.kafka import KafkaError, KafkaException, TopicPartition, watermarks


class ScriptedConsumer:
    """Answers get_watermark_offsets from a script: an error code raises as confluent-kafka does."""

    def __init__(self, script: list[int | tuple[int, int]]) -> None:
        self.script = script
        self.calls = 0

    def get_watermark_offsets(self, part: TopicPartition, timeout: float) -> tuple[int, int]:
        step = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        if isinstance(step, int):
            raise KafkaException(KafkaError(step))
        return step


PART = TopicPartition("fleet.telemetry.v1", 0)


@pytest.mark.parametrize(
    "pending",
    [KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE, KafkaError.UNKNOWN_TOPIC_OR_PART],
)
def test_a_partition_without_a_known_leader_is_asked_again(pending: int) -> None:
    consumer = ScriptedConsumer([pending, pending, (3, 17)])
    assert watermarks(consumer, PART, timeout_s=5) == (3, 17)
    assert consumer.calls == 3


def test_other_errors_are_raised_at_once() -> None:
    consumer = ScriptedConsumer([KafkaError.TOPIC_AUTHORIZATION_FAILED, (0, 1)])
    with pytest.raises(KafkaException) as e:
        watermarks(consumer, PART, timeout_s=5)
    assert e.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert consumer.calls == 1


def test_a_leader_that_never_comes_is_raised_after_the_timeout() -> None:
    consumer = ScriptedConsumer([KafkaError.NOT_LEADER_FOR_PARTITION])
    with pytest.raises(KafkaException) as e:
        watermarks(consumer, PART, timeout_s=0.5)
    assert e.value.args[0].code() == KafkaError.NOT_LEADER_FOR_PARTITION
    assert 2 <= consumer.calls <= 5
