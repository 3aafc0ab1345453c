"""`fleetwatch pause` and `fleetwatch resume-drains`: the operator's switch (alerts/drain_pause.py).

Each writes one signed control/1 record to fleet.control.v1 and waits until the broker has it:
every running act obeys within about a second, and one that starts later reads it back. The
command prints what it set, and exits 3 when the broker does not take the record (nothing is
paused then: the operator must know).
"""

from __future__ import annotations

import argparse
import sys
import time

from fleetwatch import schemas
from fleetwatch.alerts import drain_request
from fleetwatch.alerts.alert_model import event_time
from fleetwatch.alerts.drain_pause import SWITCH, make_control, operator, parse_duration
from fleetwatch.bus.kafka import KafkaBus


def _publish(args: argparse.Namespace, msg: dict[str, object]) -> int:
    bus = KafkaBus(args.bootstrap)
    bus.wait_for_broker(timeout_s=30)
    bus.ensure_topics([args.control_topic])
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
    key = drain_request.load_key(args.drain_key_file)
    seconds = parse_duration(args.duration)
    now = time.time()
    msg = make_control(
        paused=True, reason=args.reason, by=args.by or operator(), issued_at=now, until=now + seconds, key=key
    )
    rc = _publish(args, msg)
    if rc == 0:
        until = event_time(float(msg["until"]))  # type: ignore[arg-type]
        print(f"automatic drains and resumes paused until {until} ({args.duration}): {msg['reason']}")
    return rc


def resume_drains(args: argparse.Namespace) -> int:
    key = drain_request.load_key(args.drain_key_file)
    now = time.time()
    msg = make_control(
        paused=False, reason=args.reason, by=args.by or operator(), issued_at=now, until=now, key=key
    )
    rc = _publish(args, msg)
    if rc == 0:
        print("drain pause lifted: automatic drains and resumes go on")
    return rc
