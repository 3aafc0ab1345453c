"""`fleetwatch replay FILE.jsonl`: produce recorded messages, one JSON object per line.

Each line goes to the topic its schema belongs on, keyed as docs/contract.md says ("Topics"). A line that is
not a valid message goes to the dead-letter topic with its reason (the original bytes are
kept), is counted, and the replay carries on.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from fleetwatch import schemas, topics
from fleetwatch.bus.kafka import KafkaBus
from fleetwatch.deadletter import send_deadletter

log = logging.getLogger(__name__)

# schema -> (topic, field used as the Kafka key)
ROUTES: dict[str, tuple[str, str]] = {
    schemas.TELEMETRY: (topics.TELEMETRY, "node"),
    schemas.JOB: (topics.JOBS, "job"),
    schemas.STEP: (topics.STEPS, "job"),
    schemas.TRUTH: (topics.TRUTH, "node"),
}


def route(msg: dict[str, Any], topic_override: str | None = None) -> tuple[str, bytes | None]:
    topic, key_field = ROUTES.get(msg["schema"], (topics.DEADLETTER, ""))
    key = msg.get(key_field)
    return topic_override or topic, key.encode() if isinstance(key, str) else None


def _lines(stream: BinaryIO) -> Iterator[tuple[int, bytes]]:
    for n, line in enumerate(stream, 1):
        line = line.rstrip(b"\r\n")
        if line.strip():
            yield n, line


def run(args: argparse.Namespace) -> int:
    if args.file == "-":
        stream: BinaryIO = sys.stdin.buffer
        name = "stdin"
    else:
        path = Path(args.file)
        if not path.is_file():
            raise FileNotFoundError(f"no such file: {path}")
        try:
            stream = path.open("rb")
        except OSError as e:  # no permission: a one-line argument error, before the broker is asked
            raise ValueError(f"cannot read {path}: {e.strerror or e}") from None
        name = str(path)
    bus = KafkaBus(args.bootstrap)
    bus.wait_for_broker()
    bus.ensure_topics()
    producer = bus.producer(linger_ms=5)
    rejected: Counter[str] = Counter()
    sent = 0
    failed: list[Any] = []
    last_report = time.monotonic()
    try:
        for lineno, raw in _lines(stream):
            try:
                msg = schemas.decode(raw)
            except schemas.MessageError as e:
                rejected[e.reason] += 1
                log.warning("%s:%d rejected: %s", name, lineno, e)
                send_deadletter(producer, raw, e.reason, e.detail, f"replay:{name}:{lineno}", "replay")
                continue
            topic, key = route(msg, args.topic)
            producer.send(topic, key=key, value=raw)
            sent += 1
            if time.monotonic() - last_report > 5:
                log.info("replayed %d messages so far", sent)
                last_report = time.monotonic()
        failed = producer.flush(30)
    finally:
        producer.close(10)
        if stream is not sys.stdin.buffer:
            stream.close()
    total_rejected = sum(rejected.values())
    log.info(
        "replayed %d messages; %d rejected to %s %s", sent, total_rejected, topics.DEADLETTER, dict(rejected)
    )
    print(f"replayed {sent} messages, rejected {total_rejected}", file=sys.stderr)
    if failed:
        print(f"fleetwatch replay: {len(failed)} messages were not delivered to Kafka", file=sys.stderr)
        return 1
    return 0
