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
an outage, not a stall. A state that changes is progress and restarts the count. The limits:
- waiting on the broker (`wait-join`, `wait-sync`, the coordinator up): the broker holds a JoinGroup
  until every member has joined or the rebalance timeout (the members' max.poll.interval.ms) has
  passed, and answers within a session timeout after that; longer than both will not end;
- anything else that is not `up` and `steady` (looking the coordinator up while a broker answers, the
  client's own steps): three session timeouts, at least 30 s. A coordinator the cluster cannot name
  for that long (its offsets partition without a leader) is not helped by a new client, but not
  harmed either: replacements back off to one a minute, and each is logged.
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
        # a state not in place this long is said once in the log, before any limit: what a stall
        # that ends in a replacement (or a test's timeout) was doing
        self.tell_after_s = 3 * report_interval_s
        self._clock = clock
        self._state: GroupState | None = None
        self._last = 0.0  # when the last report arrived
        self._waited = 0.0  # how long the reports have shown the current state, by the rule above
        self._told = False

    def note(self, state: GroupState) -> str | None:
        """Take a report; returns a line for the log the first time a state not in place has lasted
        tell_after_s."""
        now = self._clock()
        if state != self._state:
            self._state, self._waited, self._told = state, 0.0, False
        elif now - self._last <= self._max_gap_s:
            self._waited += now - self._last
        self._last = now
        if self._told or not self._counts(state) or self._waited < self.tell_after_s:
            return None
        self._told = True
        return f"in group state {state.state}, join state {state.join_state} for {self._waited:.0f} s"

    @staticmethod
    def _counts(s: GroupState) -> bool:
        """Not in place while the cluster answers: the time the limits bound."""
        return s.cluster_up and not (s.state == "up" and s.join_state == STEADY)

    def restart(self) -> None:
        """A new client: nothing it has not reported yet is known."""
        self._state, self._waited, self._told = None, 0.0, False

    def stalled(self) -> str | None:
        """Why the member is taken to have stalled (for the log), or None."""
        s = self._state
        if s is None or not self._counts(s):
            return None
        broker_wait = s.state == "up" and s.join_state in BROKER_WAITS
        limit = self.broker_limit_s if broker_wait else self.local_limit_s
        if self._waited <= limit:
            return None
        return (
            f"in group state {s.state}, join state {s.join_state} for {self._waited:.0f} s while the "
            f"cluster answers (limit {limit:.0f} s)"
        )
