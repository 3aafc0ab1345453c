"""The drain pause's records read against the broker's time on the real broker: fleet.control.v1 is
a LogAppendTime topic, and `fleetwatch pause` / `resume-drains` find the switch's latest record
as act does (follow.BrokerTimedFollower), whatever the operator's own clock says. An operator
whose clock is an hour slow still issues a lift after the pause act holds (else every act would
ignore it as a replay), and a record act refuses (a clock a day ahead) never sets the next
record's time (else the operator's record would be a day ahead too, and refused). The real command
reads past garbage, oversized, truncated and forged records to the genuine one."""

from __future__ import annotations

import os
import subprocess
import sys
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
    assert BrokerTimedFollower(topic, book.apply, bus).read_once(30)
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


def test_resume_drains_reads_past_hostile_records_and_lifts_the_genuine_pause(kafka_bootstrap: str) -> None:
    """The real `fleetwatch resume-drains` on a switch that holds garbage, a 900 KB value, a
    truncated genuine record and a pause forged with another key, dated a day ahead: it exits 0,
    and its lift comes just after the genuine pause (what act takes), not after the forged one."""
    topic = f"test.control.{uuid.uuid4().hex[:8]}"
    with Admin(kafka_bootstrap) as admin:
        admin.create_topics(
            [topic], partitions=1, configs={topic: {"message.timestamp.type": "LogAppendTime"}}
        )
    now = time.time()
    genuine = _pause(now + 30)
    forged = schemas.encode(
        make_control(
            paused=True,
            reason="forged",
            by="mallory@x",
            issued_at=now + 86_400,
            until=now + 86_400 + 3600,
            key=b"someone-elses-key-0123456789abcdef",
        )
    )
    hostile = [b"\x00" * 64, b"{" * 10_000, b"x" * 900_000, genuine[: len(genuine) // 2], forged]
    send(
        kafka_bootstrap,
        topic,
        [(b"drain_pause", v) for v in [*hostile, genuine, *hostile]],
        max_message_bytes=2 << 20,
    )
    env = {**os.environ, "FLEETWATCH_DRAIN_KEY": KEY.decode()}
    r = subprocess.run(
        [sys.executable, "-m", "fleetwatch.cli", "resume-drains", "--reason", "done",
         "--bootstrap", kafka_bootstrap, "--control-topic", topic],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    book = _as_act_reads(KafkaBus(kafka_bootstrap), topic)
    assert book.active(now + 31) is None  # lifted
    assert now + 30 < book.latest_issued_at() < now + 600  # after the genuine pause, not the forged one


def test_a_pause_lasts_as_asked_from_a_slow_clock_and_an_old_one_replayed_pauses_nothing(
    kafka_bootstrap: str,
) -> None:
    """Through the real broker, as act reads it: a pause from a host an hour behind lasts its hour
    from the broker's time (it ended at once, on the host's own `until`); a genuine signed pause of
    nine days ago, written again by whoever can write the topic once the original left it (8 days'
    retention), pauses nothing."""
    now = time.time()
    for issued, active in ((now - 3600, True), (now - 9 * 86_400, False)):
        topic = f"test.control.{uuid.uuid4().hex[:8]}"
        with Admin(kafka_bootstrap) as admin:
            admin.create_topics(
                [topic], partitions=1, configs={topic: {"message.timestamp.type": "LogAppendTime"}}
            )
        send(kafka_bootstrap, topic, [(b"drain_pause", _pause(issued))])
        held = _as_act_reads(KafkaBus(kafka_bootstrap), topic).active(time.time() + 60)
        if active:
            assert held is not None and held.until == pytest.approx(now + 3600, abs=60)
        else:
            assert held is None
