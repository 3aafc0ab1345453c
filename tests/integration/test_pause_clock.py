"""The drain pause's records read against the broker's time on the real broker: fleet.control.v1 is
a LogAppendTime topic, and `fleetwatch pause` / `resume-drains` find the switch's latest record
as act does (follow.BrokerTimedFollower), whatever the operator's own clock says. An operator
whose clock is an hour slow still issues a lift after the pause act holds (else every act would
ignore it as a replay), and a record act refuses (a clock a day ahead) never sets the next
record's time (else the operator's record would be a day ahead too, and refused)."""

from __future__ import annotations

import time
import types
import uuid

import pytest

from fleetwatch import follow, schemas
from fleetwatch.alerts.drain_pause import PauseBook, make_control
from fleetwatch.alerts.pause_cli import next_issued_at
from fleetwatch.bus.admin import Admin
from fleetwatch.bus.kafka import KafkaBus
from fleetwatch.follow import BrokerTimedFollower
from tests.integration.services import send

KEY = b"pause-clock-test-key-0123456789abcdef"


def _pause(issued_at: float, paused: bool = True) -> bytes:
    msg = make_control(paused=paused, reason="maintenance", by="oncall@ops-1", issued_at=issued_at,
                       until=issued_at + (3600.0 if paused else 0.0), key=KEY)  # fmt: skip
    return schemas.encode(msg)


def _as_act_reads(bus: KafkaBus, topic: str) -> PauseBook:
    book = PauseBook(KEY)
    follower = BrokerTimedFollower(topic, book.apply, bus)
    follower.start()
    assert follower.caught_up.wait(30)
    follower.stop()
    follower.join(10)
    book.read_up()
    return book


def test_an_operator_with_a_slow_clock_lifts_the_pause_act_holds(
    kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = f"test.control.{uuid.uuid4().hex[:8]}"
    with Admin(kafka_bootstrap) as admin:  # as fleet.control.v1 is made (topics.BROKER_TIMED)
        admin.create_topics(
            [topic], partitions=1, configs={topic: {"message.timestamp.type": "LogAppendTime"}}
        )
    now = time.time()
    send(kafka_bootstrap, topic, [(b"drain_pause", _pause(now + 30))])  # the pausing host 30 s ahead
    send(kafka_bootstrap, topic, [(b"drain_pause", _pause(now + 86_400))])  # a day ahead: act refuses it
    bus = KafkaBus(kafka_bootstrap)
    held = _as_act_reads(bus, topic).active(now + 31)
    assert held is not None and held.since == pytest.approx(now + 30, abs=1e-6)

    # the operator's host an hour slow: the follower's reading time and the command's `now`
    slow = types.SimpleNamespace(time=lambda: time.time() - 3600)
    monkeypatch.setattr(follow, "time", slow)
    at = next_issued_at(bus, topic, KEY, slow.time())
    monkeypatch.undo()
    assert at == pytest.approx(now + 30.001, abs=1e-4)
    send(kafka_bootstrap, topic, [(b"drain_pause", _pause(at, paused=False))])
    assert _as_act_reads(bus, topic).active(now + 31) is None  # lifted
