"""`fleetwatch xids FILE|-`: the events of a saved kernel log, one JSON object per line, with what
each means (detectors/kernel_events.py): for SREs reading a node's log, and for tests.

Each object has at least `kind` (xid | sxid | fallen_off_bus | aer), `code` (XID or SXid number),
`pci`, `gpu` (its index, where --gpus names it) and `uuid` (where the log names it), `severity`,
`action`, `ts` (unix seconds, where the line has a wall-clock time), `text`, and the event's own
fields (pid, process, link, unit, recovery_action, port, errors, ...). A summary goes to stderr:
lines read, lines that are no kernel log line, lines that broke an event's grammar.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from collections.abc import Iterable, Iterator
from typing import Any

import orjson

from fleetwatch.collectors.kernel_log.events import EventParser, KernelEvent, pci_address
from fleetwatch.collectors.kernel_log.lines import LineReader, utc_offset
from fleetwatch.detectors.kernel_events import judge
from fleetwatch.text_input import read_lines

MAX_GPU_INDEX = 4095


def gpu_map(text: str | None) -> dict[str, int]:
    """`0=0000:9b:00.0,1=00000000:BB:00.0` -> {address: index}."""
    out: dict[str, int] = {}
    for item in filter(None, (text or "").split(",")):
        index, eq, address = item.partition("=")
        index = index.strip()
        # ASCII digits only ("²".isdigit() is true), and an index a node can have
        if not eq or not (index.isascii() and index.isdigit()) or int(index) > MAX_GPU_INDEX:
            raise ValueError(f"--gpus: {item!r} is not INDEX=PCI_ADDRESS (INDEX 0-{MAX_GPU_INDEX})")
        try:
            out[pci_address(address.strip())] = int(index)
        except ValueError as e:
            raise ValueError(f"--gpus: {address!r} is not a PCI address") from e
    return out


def utc_offset_flag(text: str) -> dt.timezone:
    zone = utc_offset(text.strip())
    if zone is None:
        raise ValueError(f"--utc-offset: {text!r} is not +HH:MM")
    return zone


def events_of(
    lines: Iterable[str], reader: LineReader, parser: EventParser, gpus: dict[str, int]
) -> Iterator[dict[str, Any]]:
    """Each event as its JSON object, in the order of the log."""

    def emit(events: list[KernelEvent]) -> Iterator[dict[str, Any]]:
        for e in events:
            d = e.described(gpus, parser.uuids)
            j = judge(d)
            d.update(severity=j.severity, action=j.action, name=j.name)
            if e.severity is not None:
                d["line_severity"] = e.severity  # the line's own word (fatal, nonfatal, corrected)
            yield d

    held: list[KernelEvent] = []
    for number, raw in enumerate(lines, 1):
        line = reader.parse(raw)
        if line is not None:
            held += parser.feed(line, at=number)
        if len(held) > 64:  # folded events come out late: keep the log's order in small windows
            held.sort(key=lambda e: e.line or 0)
            yield from emit(held[:-16])
            held = held[-16:]
    held += parser.flush()
    held.sort(key=lambda e: e.line or 0)
    yield from emit(held)


def run(args: argparse.Namespace) -> int:
    gpus = gpu_map(args.gpus)
    reader = LineReader(year=args.year, tz=utc_offset_flag(args.utc_offset))
    parser = EventParser()
    n = 0
    # bytes that are not UTF-8 are kept as escapes, from a file and from stdin alike
    with read_lines(args.file, errors="backslashreplace") as lines:
        out = sys.stdout.buffer
        for event in events_of(lines, reader, parser, gpus):
            out.write(orjson.dumps(event) + b"\n")
            n += 1
        out.flush()
    print(
        f"fleetwatch xids: {parser.lines} lines, {n} events; {reader.unknown} lines no kernel log "
        f"line, {parser.rejected} lines that broke an event's grammar",
        file=sys.stderr,
    )
    return 0
