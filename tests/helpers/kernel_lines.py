"""Raw kernel log lines through the parser as the kernel source and `fleetwatch xids` feed it."""

from __future__ import annotations

from collections.abc import Iterable

from fleetwatch.collectors.kernel_log.events import EventParser, KernelEvent
from fleetwatch.collectors.kernel_log.lines import LineReader


def parse_all(raw_lines: Iterable[str], parser: EventParser | None = None) -> list[KernelEvent]:
    """Every event of the lines, the still-open ones flushed at the end (`parser`: one to look
    into afterwards)."""
    reader, parser = LineReader(), parser or EventParser()
    events: list[KernelEvent] = []
    for raw in raw_lines:
        line = reader.parse(raw)
        if line is not None:
            events += parser.feed(line)
    return events + parser.flush()
