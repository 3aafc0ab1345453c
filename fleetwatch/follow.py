"""Follow a whole topic from its beginning on a background thread (a broadcast table).

For small topics that every reader needs in full, such as the census of reporting nodes
(fleet.nodes.v1) or the Slurm adapter's drain results: no consumer group, every partition assigned,
each record handed to `apply(key, value)` in partition order (a tombstone arrives as value None);
a subclass that needs more of the record (its timestamp) overrides apply_record instead, and
BrokerTimedFollower hands a reader that checks its messages' clocks the time to check them against. It reads
through the bus (fleetwatch/bus: a Reader of every partition), on the real broker or in memory.
`caught_up` is set once everything that was on the topic when the thread started has been applied,
so a caller can wait for the table to be complete before deciding anything on it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from fleetwatch.bus import Bus, Reader, Record, TopicPart, reference_time

log = logging.getLogger(__name__)

Apply = Callable[[bytes | None, bytes | None], None]
# (key, value, the time the message's own timestamp is checked against, whether that time is the
# broker's: a LogAppendTime topic; else the reading time, which orders nothing across a restart)
TimedApply = Callable[[bytes | None, bytes | None, float, bool], None]


class TopicFollower(threading.Thread):
    def __init__(self, topic: str, apply: Apply | None, bus: Bus) -> None:
        super().__init__(name=f"follow-{topic}", daemon=True)
        self.topic = topic
        self._apply = apply
        self._bus = bus
        self._stopping = threading.Event()  # not _stop: Thread.join calls its own _stop()
        self.caught_up = threading.Event()

    def run(self) -> None:
        reader = self._bus.reader()
        try:
            tps = self._partitions(reader)
            if not tps:
                return  # stopped before the topic could be seen
            reader.assign(tps, "beginning")
            end = reader.end_offsets(tps)
            if all(reader.position(tp) >= end[tp] for tp in tps):  # empty: read at once, not after a poll
                self.caught_up.set()
            while not self._stopping.is_set():
                records = reader.poll(0.2)
                now = time.time()
                for r in records:
                    self.apply_record(r, now)
                if not self.caught_up.is_set() and all(reader.position(tp) >= end[tp] for tp in tps):
                    self.caught_up.set()
        except Exception:
            # A dead follower must be loud: its table silently going stale would be worse.
            log.exception("following %s failed", self.topic)
            raise
        finally:
            reader.close()

    def _partitions(self, reader: Reader) -> list[TopicPart]:
        """The topic's partitions, asked until it has some: a topic its reader cannot see (missing,
        or its metadata refused: an ACL) is not read, so not caught up. It was followed as empty,
        for good: act then took no pause (fail open) and no result or census from it."""
        next_warning = 0.0
        while not self._stopping.is_set():
            tps = [TopicPart(self.topic, p) for p in reader.partitions(self.topic)]
            if tps:
                return tps
            if time.monotonic() >= next_warning:
                log.warning(
                    "topic %s shows no partitions (missing, or not readable); asking again", self.topic
                )
                next_warning = time.monotonic() + 60.0
            self._stopping.wait(1.0)
        return []

    def apply_record(self, record: Record, now: float) -> None:
        """One record, read at wall time `now`."""
        assert self._apply is not None, "a follower without `apply` overrides apply_record"
        self._apply(record.key, record.value)

    def stop(self) -> None:
        self._stopping.set()

    def read_once(self, timeout_s: float) -> bool:
        """Start, apply what the topic holds now, stop: whether it was all applied within
        timeout_s (for a command that reads a table once, not a service that follows it)."""
        self.start()
        try:
            return self.caught_up.wait(timeout_s)
        finally:
            self.stop()
            self.join(10)


class BrokerTimedFollower(TopicFollower):
    """A follower whose reader checks each message's own timestamp: `apply(key, value, ref, broker)`
    with ref the time the broker took the record on a LogAppendTime topic (topics.BROKER_TIMED;
    broker True), else the time it was read (broker False). Against the broker's time, a reader's
    own clock (behind or ahead) changes nothing, and a re-read after a restart decides as the first
    reading did."""

    def __init__(self, topic: str, apply: TimedApply, bus: Bus) -> None:
        super().__init__(topic, None, bus)
        self._timed = apply

    def apply_record(self, record: Record, now: float) -> None:
        self._timed(record.key, record.value, reference_time(record, now), record.log_append)
