"""When a group member's rebalance has stalled: the rule behind replacing its client.

librdkafka runs a member's part of a rebalance by itself (find the coordinator, JoinGroup, SyncGroup,
the application's assign and revoke calls) and says where it stands in its statistics: `cgrp.state`
(`up` once it talks to the group's coordinator) and `cgrp.join_state` (`steady` once the member holds
its assignment). A member can stall in between with its coordinator up: CI saw act's static member
lose its partitions on a session timeout after a broker restart, then log nothing and read nothing
for the test's remaining 90 s (librdkafka issue 3437 reports static members hanging the same way). A
stalled member reads nothing and no other member is given its partitions, so a node's finding waits
for as long as it lasts.

The watch is fed each statistics report as it is served (inside poll(), on the thread that polls).
A stall is timed by the reports' arrivals, only across gaps no longer than two report intervals: a
report that comes later than that was held while the application was away from poll() (its own
assign callback, a resend during an outage), and that time is the application's, not the client's
(the reports queued meanwhile arrive together, adding nothing). Only time while some broker of the
cluster is connected counts: with none, librdkafka waits for one and joins when it is back, which is
an outage, not a stall (the count pauses, it does not restart). The limits:
- out of place in its group (not `up` and `steady`) through whatever states, for longer than the
  rebalance timeout (the members' max.poll.interval.ms: the broker holds a JoinGroup until every
  member has joined or it has passed) and a session timeout: no rebalance lasts that long;
- in one state that is not the broker's to end (`wait-join` and `wait-sync` with the coordinator up
  are), for three session timeouts, at least 30 s: looking the coordinator up while a broker
  answers, or the client's own steps, each of which takes milliseconds while the application polls.
  A coordinator the cluster cannot name for that long (its offsets partition without a leader) is
  not helped by a new client, but not harmed either: replacements back off to one a minute, and
  each is logged. (The consumer does not count a member whose subscribed topics all have no
  partitions, which librdkafka leaves waiting before any join: fleetwatch/bus/kafka.py.)
A rebalance callback served (assign, revoke, lost) is progress: the counts start again.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass

BROKER_WAITS = frozenset({"wait-join", "wait-sync"})
STEADY = "steady"
MIN_LOCAL_LIMIT_S = 30.0


@dataclass(frozen=True)
class GroupState:
    """A member's place in its group, from one statistics report."""

    state: str  # cgrp.state: `up` once the coordinator is known and connected
    join_state: str  # cgrp.join_state
    cluster_up: bool  # some broker of the cluster (not the logical GroupCoordinator entry) is connected

    @classmethod
    def from_stats(cls, stats_json: str) -> GroupState | None:
        """From librdkafka's statistics JSON; None where it has no group part (not a group consumer's)
        or is not what librdkafka writes (never raises: it runs inside a client callback)."""
        try:
            report = json.loads(stats_json)
            cgrp = report["cgrp"]
            up = any(
                b.get("state") == "UP" and b.get("source") in ("configured", "learned")
                for b in report.get("brokers", {}).values()
            )
            return cls(str(cgrp["state"]), str(cgrp["join_state"]), up)
        except (ValueError, TypeError, KeyError, AttributeError):
            return None


class RebalanceWatch:
    def __init__(
        self,
        session_timeout_s: float,
        max_poll_interval_s: float,
        report_interval_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.local_limit_s = max(MIN_LOCAL_LIMIT_S, 3 * session_timeout_s)
        self.broker_limit_s = max_poll_interval_s + session_timeout_s
        self._max_gap_s = 2 * report_interval_s
        # out of place this long is said once in the log, before any limit: what a stall that
        # ends in a replacement (or a test's timeout) was doing
        self.tell_after_s = 3 * report_interval_s
        self._clock = clock
        self._state: GroupState | None = None
        self._last = 0.0  # when the last report arrived
        # counted time (see the module doc): in the current group and join state, and since the
        # member was last in place whatever states it went through (a client that cycles between
        # two states, or whose broker connection flaps, is bounded by the second)
        self._in_state = 0.0
        self._out_of_place = 0.0
        self._told = False

    def note(self, state: GroupState) -> str | None:
        """Take a report; returns a line for the log the first time the member has been out of place
        for tell_after_s."""
        now = self._clock()
        prev, gap = self._state, now - self._last
        self._state, self._last = state, now
        if prev is not None and _counts(prev) and gap <= self._max_gap_s:  # the gap was prev's
            self._in_state += gap
            self._out_of_place += gap
        if prev is None or (prev.state, prev.join_state) != (state.state, state.join_state):
            self._in_state = 0.0
        if _in_place(state):
            self._out_of_place, self._told = 0.0, False
        if self._told or not _counts(state) or self._out_of_place < self.tell_after_s:
            return None
        self._told = True
        return (
            f"out of place in its group for {self._out_of_place:.0f} s (now group state {state.state}, "
            f"join state {state.join_state})"
        )

    @property
    def state(self) -> GroupState | None:
        """The latest report's (None before the first, and after progress())."""
        return self._state

    def progress(self) -> None:
        """The client moved on (a rebalance callback was served, a new client took over): what was
        counted no longer says anything; reports from before it may still be served."""
        self._state, self._in_state, self._out_of_place, self._told = None, 0.0, 0.0, False

    def stalled(self) -> str | None:
        """Why the member is taken to have stalled (for the log), or None."""
        s = self._state
        if s is None or not _counts(s):
            return None
        if self._out_of_place > self.broker_limit_s:
            return (
                f"out of place in its group for {self._out_of_place:.0f} s while the cluster answers "
                f"(now group state {s.state}, join state {s.join_state}; limit {self.broker_limit_s:.0f} s)"
            )
        if s.state == "up" and s.join_state in BROKER_WAITS:  # the broker's to end, within the above
            return None
        if self._in_state <= self.local_limit_s:
            return None
        return (
            f"in group state {s.state}, join state {s.join_state} for {self._in_state:.0f} s while the "
            f"cluster answers (limit {self.local_limit_s:.0f} s)"
        )


def _in_place(s: GroupState) -> bool:
    return s.state == "up" and s.join_state == STEADY


def _counts(s: GroupState) -> bool:
    """Out of place while the cluster answers: the time the limits bound (an outage pauses it)."""
    return s.cluster_up and not _in_place(s)
