"""When a group member's rebalance counts as stalled (fleetwatch/bus/rebalance_watch.py), from
librdkafka's own statistics reports: a real one (tests/fixtures/librdkafka) and the same report with
the group's and the brokers' states changed, fed on a clock the test moves."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from fleetwatch.bus.rebalance_watch import GroupState, RebalanceWatch

REPORT = json.loads(
    (Path(__file__).parents[1] / "fixtures/librdkafka/consumer_stats_steady.json").read_text()
)


def report(state: str = "up", join_state: str = "steady", broker: str = "UP") -> str:
    r = copy.deepcopy(REPORT)
    r["cgrp"]["state"], r["cgrp"]["join_state"] = state, join_state
    for b in r["brokers"].values():
        # the logical GroupCoordinator entry follows the coordinator; the learned broker the cluster
        b["state"] = ("UP" if state == "up" else "INIT") if b["source"] == "logical" else broker
    return json.dumps(r)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def watch(clock: Clock) -> RebalanceWatch:
    # act's and detect's settings: a 10 s session, librdkafka's 300 s poll interval, a report each 5 s
    return RebalanceWatch(session_timeout_s=10, max_poll_interval_s=300, report_interval_s=5, clock=clock)


def feed(w: RebalanceWatch, clock: Clock, text: str, seconds: float, every_s: float = 5.0) -> None:
    """The same report every `every_s` for `seconds`, as a polling member is served them (a state's
    time counts from the first report that shows it)."""
    state = GroupState.from_stats(text)
    assert state is not None
    end = clock.now + seconds
    while clock.now < end:
        clock.now += every_s
        w.note(state)


def test_the_real_report_reads_as_a_member_in_place() -> None:
    state = GroupState.from_stats(json.dumps(REPORT))
    assert state == GroupState("up", "steady", cluster_up=True)


def test_a_member_in_place_never_stalls() -> None:
    clock = Clock()
    w = watch(clock)
    feed(w, clock, report(), 3600)
    assert w.stalled() is None


def test_a_client_step_that_does_not_end_while_the_cluster_answers_stalls_after_three_sessions() -> None:
    """The CI case: the assignment lost on a session timeout, the coordinator back, and the client
    never joining again (its own steps take milliseconds while the member polls)."""
    clock = Clock()
    w = watch(clock)
    feed(w, clock, report(), 60)
    # counted from the first report that shows it: 7 reports, 30 s
    feed(w, clock, report(join_state="wait-unassign-to-complete"), 35)
    assert w.stalled() is None  # at the limit, not past it
    feed(w, clock, report(join_state="wait-unassign-to-complete"), 5)
    why = w.stalled()
    assert why is not None and "join state wait-unassign-to-complete for 35 s" in why


def test_a_coordinator_the_cluster_does_not_name_while_it_answers_stalls() -> None:
    clock = Clock()
    w = watch(clock)
    feed(w, clock, report(state="wait-coord", join_state="init"), 40)
    assert w.stalled() is not None


def test_an_outage_is_not_a_stall_however_long() -> None:
    """No broker connected: librdkafka waits for one and joins when it is back."""
    clock = Clock()
    w = watch(clock)
    feed(w, clock, report(state="query-coord", join_state="wait-unassign-to-complete", broker="DOWN"), 600)
    assert w.stalled() is None
    # back: the count starts then, not at the outage's start
    feed(w, clock, report(join_state="wait-unassign-to-complete"), 10)
    assert w.stalled() is None


def test_a_broker_connection_that_flaps_pauses_the_count_and_does_not_restart_it() -> None:
    clock = Clock()
    w = watch(clock)
    for _ in range(3):  # held in wait-join 100 s, then 20 s with no broker connected, three times
        feed(w, clock, report(join_state="wait-join"), 100)
        feed(w, clock, report(state="query-coord", join_state="wait-join", broker="DOWN"), 20)
    assert w.stalled() is None  # ~300 s counted, the outages not
    feed(w, clock, report(join_state="wait-join"), 20)
    why = w.stalled()
    assert why is not None and "out of place in its group for 3" in why


def test_a_join_the_broker_holds_may_last_the_rebalance_timeout() -> None:
    """The broker answers a JoinGroup once every member has joined or the members' poll interval has
    passed: waiting that long is the protocol, longer is not (librdkafka itself gives a JoinGroup up
    at 303 s and joins again: the bound on the whole time out of place catches the loop)."""
    clock = Clock()
    w = watch(clock)
    feed(w, clock, report(join_state="wait-join"), 315)
    assert w.stalled() is None
    feed(w, clock, report(join_state="wait-join"), 5)
    assert w.stalled() is not None


def test_a_rebalance_moving_from_state_to_state_is_bounded_by_the_rebalance_timeout() -> None:
    """Each state shorter than its limit: no stall until the member has been out of place longer
    than any rebalance lasts (a client that cycles init -> wait-join on errors is caught)."""
    clock = Clock()
    w = watch(clock)
    for join_state in ("init", "wait-join", "wait-sync", "wait-assign-call") * 3:
        feed(w, clock, report(join_state=join_state), 25)
    assert w.stalled() is None  # 300 s out of place
    for join_state in ("init", "wait-join"):
        feed(w, clock, report(join_state=join_state), 10)
    why = w.stalled()
    assert why is not None and "out of place in its group for 3" in why and "limit 310 s" in why


def test_a_rebalance_callback_served_is_progress() -> None:
    clock = Clock()
    w = watch(clock)
    feed(w, clock, report(join_state="wait-unassign-to-complete"), 60)
    assert w.stalled() is not None
    w.progress()
    assert w.stalled() is None and w.state is None
    feed(w, clock, report(join_state="wait-unassign-to-complete"), 20)  # a stale report after it
    assert w.stalled() is None


def test_time_away_from_poll_is_the_applications_not_the_clients() -> None:
    """Reports are served inside poll(): a member away from it for a minute (its own assign callback,
    a resend in an outage) is served the reports queued meanwhile at once, after a long gap."""
    clock = Clock()
    w = watch(clock)
    stuck = GroupState.from_stats(report(join_state="wait-unassign-call"))
    assert stuck is not None
    w.note(stuck)
    clock.now += 60  # away from poll()
    for _ in range(12):  # the twelve reports queued meanwhile, served together
        w.note(stuck)
    assert w.stalled() is None
    feed(w, clock, report(join_state="wait-unassign-call"), 25)  # then polling again: 25 s counted
    assert w.stalled() is None
    feed(w, clock, report(join_state="wait-unassign-call"), 10)
    assert w.stalled() is not None


def test_a_state_not_in_place_is_told_once_before_any_limit() -> None:
    """One log line per state that lasts 15 s (three reports): what a stall was doing, said before
    the watch's limit (or a test's timeout) ends it; a member in place, or in an outage, says
    nothing."""
    clock = Clock()
    w = watch(clock)
    said: list[str] = []

    def feed_said(text: str, seconds: float) -> None:
        state = GroupState.from_stats(text)
        assert state is not None
        end = clock.now + seconds
        while clock.now < end:
            clock.now += 5
            if (line := w.note(state)) is not None:
                said.append(line)

    feed_said(report(), 60)
    feed_said(report(state="query-coord", join_state="init", broker="DOWN"), 60)
    assert said == []
    feed_said(report(join_state="wait-join"), 100)
    assert said == ["out of place in its group for 15 s (now group state up, join state wait-join)"]
    feed_said(report(join_state="wait-sync"), 10)
    feed_said(report(), 5)
    feed_said(report(join_state="wait-join"), 20)
    assert len(said) == 2


def test_the_local_limit_follows_a_longer_session() -> None:
    w = RebalanceWatch(session_timeout_s=45, max_poll_interval_s=300, report_interval_s=5)
    assert w.local_limit_s == 135 and w.broker_limit_s == 345


@pytest.mark.parametrize(
    "text",
    [
        "",
        "not json",
        "[]",
        "null",
        json.dumps({"name": "producer-1", "type": "producer", "brokers": {}}),  # no group part
        json.dumps({"cgrp": {"state": "up"}}),  # no join state
        json.dumps({"cgrp": None}),
        json.dumps({"cgrp": {"state": "up", "join_state": "steady"}, "brokers": []}),
    ],
)
def test_a_report_that_is_not_a_group_consumers_is_ignored_without_raising(text: str) -> None:
    assert GroupState.from_stats(text) is None
