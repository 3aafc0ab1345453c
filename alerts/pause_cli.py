"""`fleetwatch pause` and `fleetwatch resume-drains`: the operator's switch (alerts/drain_pause.py).

Each reads the switch's records, then writes one signed control/1 record to fleet.control.v1,
issued after the latest one (operators' clocks differ: the latest `issued_at` is the switch's
state), and waits until the broker has it: every running act obeys within about a second, and one
that starts later reads it back. The command prints what it set, and exits 3 when the broker does
not take the record (nothing changed then: the operator must know).
"""

from __future__ import annotations

import argparse
import sys
import time

from fleetwatch import schemas
from fleetwatch.alerts.alert_model import event_time
from fleetwatch.alerts.drain_pause import (
    SWITCH,
    PauseBook,
    load_control_key,
    make_control,
    operator,
    parse_duration,
)
from fleetwatch.bus.config import BrokerUnavailable
from fleetwatch.bus.kafka import KafkaBus
from fleetwatch.follow import BrokerTimedFollower

READ_S = 30.0  # to read the switch's records (a week of them at most) before writing one


def next_issued_at(bus: KafkaBus, topic: str, key: bytes, now: float) -> float:
    """`now`, or just after the switch's latest record that act takes, where that is later (a
    resume-drains from a host whose clock is behind the pausing host's would otherwise be ignored
    by every act). The records are read as act reads them (follow.BrokerTimedFollower, each checked
    against the time the broker took it), so a record act refuses never sets the next one's time.
    BrokerUnavailable where the topic is not read to its end within READ_S: nothing is sent then."""
    book = PauseBook(key)
    if not BrokerTimedFollower(topic, book.apply, bus).read_once(READ_S):
        raise BrokerUnavailable(
            f"{topic} was not read to its end in {READ_S:.0f} s (a Read ACL missing?); nothing changed"
        )
    return max(now, book.latest_issued_at() + 0.001)


def _bus(args: argparse.Namespace) -> KafkaBus:
    bus = KafkaBus(args.bootstrap)
    bus.wait_for_broker(timeout_s=30)
    bus.ensure_topics([args.control_topic])
    return bus


def _publish(args: argparse.Namespace, bus: KafkaBus, msg: dict[str, object]) -> int:
    producer = bus.producer(linger_ms=0)
    try:
        producer.send(args.control_topic, key=SWITCH.encode(), value=schemas.encode(msg))
        unsent = producer.flush(30)
    finally:
        producer.close(10)
    if unsent:
        print(
            f"fleetwatch {args.command}: the broker did not take the record; nothing changed", file=sys.stderr
        )
        return 3
    return 0


def pause(args: argparse.Namespace) -> int:
    key = load_control_key(args.control_key_file, args.drain_key_file)
    seconds = parse_duration(args.duration)
    bus = _bus(args)
    now = next_issued_at(bus, args.control_topic, key, time.time())
    msg = make_control(
        paused=True, reason=args.reason, by=args.by or operator(), issued_at=now, until=now + seconds, key=key
    )
    rc = _publish(args, bus, msg)
    if rc == 0:
        until = event_time(float(msg["until"]))
        print(f"automatic drains and resumes paused until {until} ({args.duration}): {msg['reason']}")
    return rc


def resume_drains(args: argparse.Namespace) -> int:
    key = load_control_key(args.control_key_file, args.drain_key_file)
    bus = _bus(args)
    now = next_issued_at(bus, args.control_topic, key, time.time())
    msg = make_control(
        paused=False, reason=args.reason, by=args.by or operator(), issued_at=now, until=now, key=key
    )
    rc = _publish(args, bus, msg)
    if rc == 0:
        print("drain pause lifted: automatic drains and resumes go on")
    return rc
