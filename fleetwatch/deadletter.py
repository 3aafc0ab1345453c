"""The dead-letter topic: a message that cannot be accepted is kept there with its reason in the
record headers, and counted by reason (a bounded label set).

A dead letter must always fit the broker, or the worker that sends it stops and the message is
lost: one up to MAX_MESSAGE_BYTES plus headers is over Kafka's default max.message.bytes (1 MiB).
So the value keeps the original bytes up to KEPT_BYTES, and the headers say how long the original
was and its SHA-256, which identify it (in the producer's own spool or logs) when it was cut.
"""

from __future__ import annotations

import hashlib
from typing import Any

from prometheus_client import Counter

from fleetwatch import topics

DEADLETTERS = Counter(
    "fleetwatch_deadletter_total", "messages sent to the dead-letter topic", ["reason", "source_topic"]
)
KEPT_BYTES = 256 * 1024  # a quarter of the broker's default limit: room for headers and batching
DETAIL_BYTES = 500


def deadletter_headers(
    reason: str, detail: str, source: str, raw: bytes | None = None
) -> list[tuple[str, bytes]]:
    headers = [
        ("reason", reason.encode()),
        ("detail", detail.encode("utf-8", "replace")[:DETAIL_BYTES]),
        ("source", source.encode("utf-8", "replace")[:DETAIL_BYTES]),
    ]
    if raw is not None:
        headers += [
            ("original_bytes", str(len(raw)).encode()),
            ("original_sha256", hashlib.sha256(raw).hexdigest().encode()),
        ]
        if len(raw) > KEPT_BYTES:
            headers.append(("truncated", b"1"))
    return headers


def send_deadletter(
    producer: Any, raw: bytes | None, reason: str, detail: str, source: str, source_topic: str = ""
) -> None:
    """Produce `raw` (cut to KEPT_BYTES) to the dead-letter topic; `source` says where it came
    from (topic:partition:offset)."""
    producer.send(
        topics.DEADLETTER,
        value=b"" if raw is None else raw[:KEPT_BYTES],
        headers=deadletter_headers(reason, detail, source, raw),
    )
    DEADLETTERS.labels(reason, source_topic).inc()
