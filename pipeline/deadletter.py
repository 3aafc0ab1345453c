"""The dead-letter topic: a message that cannot be accepted is kept there, bytes untouched,
with its reason in the record headers, and counted by reason (a bounded label set)."""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter

from fleetwatch import topics

DEADLETTERS = Counter(
    "fleetwatch_deadletter_total", "messages sent to the dead-letter topic", ["reason", "source_topic"]
)


def deadletter_headers(reason: str, detail: str, source: str) -> list[tuple[str, bytes]]:
    return [("reason", reason.encode()), ("detail", detail[:500].encode()), ("source", source.encode())]


def send_deadletter(
    producer: Any, raw: bytes | None, reason: str, detail: str, source: str, source_topic: str = ""
) -> None:
    """Produce `raw` to the dead-letter topic; `source` says where it came from (topic:partition:offset)."""
    producer.send(
        topics.DEADLETTER,
        value=raw if raw is not None else b"",
        headers=deadletter_headers(reason, detail, source),
    )
    DEADLETTERS.labels(reason, source_topic).inc()
