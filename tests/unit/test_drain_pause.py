"""The operator's controls in-process (alerts/drain_pause.py, alerts/actor.py, the real policy and
alert model): a signed pause holds every drain and resume fleet-wide while alerts go on and say so,
and ends by itself or when lifted; forged, malformed and replayed control records change nothing;
`act --dry-run` publishes would-be requests that no adapter executes, and labels its alerts."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from fleetwatch import schemas, topics
from fleetwatch.alerts import drain_request
from fleetwatch.alerts.drain_pause import PauseBook, make_control, parse_duration
from fleetwatch.alerts.slurm_drainer import Drainer
from fleetwatch.bus import Record
from fleetwatch.bus.memory import MemoryBus
from fleetwatch.follow import BrokerTimedFollower
from tests.helpers.act import KEY, Rig
from tests.helpers.findings import T0, finding, resolve
from tests.helpers.messages import JSONISH

NODES = {f"gpu-node-{i:02d}" for i in range(1, 11)}
NOW = T0 + 10_000  # when the follower reads the records (after every record the tests issue)


def control(paused: bool, at: float, for_s: float = 7200.0, key: bytes = KEY, **over: Any) -> bytes:
    msg = make_control(
        paused=paused,
        reason="scratch filesystem maintenance",
        by="oncall@ops-1",
        issued_at=at,
        until=at + (for_s if paused else 0.0),
        key=key,
    )
    msg.update(over)
    return schemas.encode(msg)


@pytest.mark.parametrize(
    ("text", "seconds"), [("90s", 90.0), ("30m", 1800.0), ("2h", 7200.0), ("1d", 86400.0), ("45", 45.0)]
)
def test_durations_read_as_operators_write_them(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "2 hours", "-1h", "0s", "8d", "1e9", "2h30m", "nan"])
def test_a_duration_that_is_not_one_or_longer_than_a_week_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


def test_a_signed_pause_holds_drains_alerts_go_on_and_say_so_and_it_expires_by_itself() -> None:
    book = PauseBook(KEY)
    book.read_up()  # the follower read the topic to its end
    rig = Rig(NODES, pause=book, budget_min_nodes=3)
    book.apply(b"drain_pause", control(True, T0, for_s=3600), now=T0)  # the broker took it then
    out = rig.feed(finding("gpu-node-01", ts=T0 + 10), finding("gpu-node-02", ts=T0 + 11))
    assert out == [] and rig.decide(T0 + 60) == []
    assert {n: st.refused for n, st in rig.task.nodes.items()} == {
        "gpu-node-01": "paused",
        "gpu-node-02": "paused",
    }
    assert rig.refusals() == {}  # one fleet-wide alert, not a refusal page per node
    (paused,) = rig.alerts("FleetwatchDrainsPaused")
    assert paused.labels["severity"] == "warning" and paused.annotations["drains_held"] == "2"
    assert "oncall@ops-1" in paused.annotations["summary"] and paused.annotations["runbook_url"].endswith(
        "paused.md"
    )
    xids = rig.alerts("FleetwatchXid")
    assert len(xids) == 2  # findings are alerted as usual ...
    for a in xids:  # ... and each says the drain is held, and why
        assert a.annotations["drains_paused"].startswith("drains paused until ")
        assert "scratch filesystem maintenance" in a.annotations["drains_paused"]
        assert a.annotations["action"].endswith("held, drains are paused")
    assert rig.metric("fleetwatch_act_drains_paused") == 1
    assert rig.metric("fleetwatch_act_drains_paused_until_seconds") == T0 + 3600
    assert rig.metric("fleetwatch_act_drains_refused_total", reason="paused") == 2
    # the pause ends by itself: both drains go through (the budget allows 3) and its alert ends
    out = rig.decide(T0 + 3601)
    assert sorted(m["node"] for m in out) == ["gpu-node-01", "gpu-node-02"]
    assert (
        rig.alerts("FleetwatchDrainsPaused") == [] and len(rig.alerts("FleetwatchDrainsPaused", False)) == 1
    )
    assert rig.metric("fleetwatch_act_drains_paused") == 0


def test_a_pause_holds_resumes_too_and_resume_drains_lifts_it() -> None:
    book = PauseBook(KEY)
    book.read_up()  # the follower read the topic to its end
    rig = Rig(NODES, pause=book, budget_min_nodes=3, resume_after_s=100.0)
    f = finding("gpu-node-01", ts=T0)
    (req,) = rig.feed(f)
    rig.result(req, "executed")
    rig.feed(resolve(f, T0 + 10))
    book.apply(b"drain_pause", control(True, T0 + 20), now=T0 + 20)
    assert rig.decide(T0 + 500) == []  # healthy long enough, but paused: no resume
    assert rig.task.nodes["gpu-node-01"].drained
    book.apply(b"drain_pause", control(False, T0 + 600), now=T0 + 600)
    (resume,) = rig.decide(T0 + 601)
    assert resume["action"] == "resume" and rig.alerts("FleetwatchDrainsPaused") == []


def test_forged_malformed_and_replayed_control_records_change_nothing() -> None:
    refused: list[str] = []
    book = PauseBook(KEY, refused.append)
    book.read_up()  # the follower read the topic to its end
    book.apply(b"drain_pause", control(True, T0, key=b"someone-elses-key-0123456789"), now=NOW)
    book.apply(b"drain_pause", control(True, T0, reason="edited after signing"), now=NOW)
    book.apply(b"drain_pause", b'{"schema": "control/1", "control": "drain_pause"}', now=NOW)
    book.apply(b"drain_pause", control(True, T0, until=T0 + 30 * 86400.0))  # past the week
    book.apply(b"other", control(True, T0))  # the key must name the switch
    book.apply(b"drain_pause", None)  # a tombstone is unsigned: it neither pauses nor lifts
    assert book.active(T0 + 1) is None
    assert refused == ["bad_signature", "bad_signature", "malformed", "malformed", "malformed"]
    # a real pause, then a replay of an older (real, signed) lift: the pause stands
    older_lift = control(False, T0 + 5)
    book.apply(b"drain_pause", control(True, T0 + 10), now=T0 + 10)
    book.apply(b"drain_pause", older_lift, now=T0 + 11)
    pause = book.active(T0 + 20)
    assert pause is not None and pause.until == T0 + 10 + 7200
    book.apply(b"drain_pause", control(False, T0 + 30), now=T0 + 30)
    assert book.active(T0 + 31) is None


def test_a_pause_lasts_as_long_as_asked_from_when_the_broker_took_it_whatever_the_operators_clock() -> None:
    """`until` is the operator's clock: from a host an hour behind, `pause --for 30m` ended at once
    (and "paused until" printed a time already past); two hours ahead of a host ten minutes behind
    became 1 h 50 min. Now the pause lasts what was asked from the broker's time of the record
    (and a week at most)."""
    book = PauseBook(KEY)
    book.read_up()
    broker = T0 + 3600  # the operator's clock is an hour behind
    book.apply(b"drain_pause", control(True, T0, for_s=1800), now=broker)
    pause = book.active(broker + 1)
    assert pause is not None and pause.until == broker + 1800
    assert book.active(broker + 1801) is None
    # ... but a signed pause replayed once the original has left the topic (8 days' retention) is
    # no clock a day behind: it does not pause drains anew
    replay = PauseBook(KEY)
    replay.read_up()
    later = T0 + 9 * 86_400.0
    replay.apply(b"drain_pause", control(True, T0, for_s=6 * 86_400.0), now=later)
    assert replay.active(later + 1) is None


def test_dry_run_publishes_marked_would_be_requests_and_behaves_as_if_they_ran() -> None:
    rig = Rig(NODES, dry_run=True, budget_min_nodes=1, resume_after_s=100.0)
    a, b = finding("gpu-node-01", ts=T0), finding("gpu-node-02", ts=T0 + 1)
    (req,) = rig.feed(a, b)
    assert req["node"] == "gpu-node-01" and req["dry_run"] is True
    assert drain_request.verify(req, KEY)
    schemas.validate(req, schemas.DRAIN)
    st = rig.task.nodes["gpu-node-01"]
    assert st.drained and st.confirmed  # no result will come: counted as done at once ...
    assert rig.refusals() == {"gpu-node-02": "budget"}  # ... so the budget holds as it would for real
    assert rig.decide(T0 + 1000) == []  # and no "no result from the adapter" page, ever
    assert rig.metric("fleetwatch_act_drains_unconfirmed") == 0
    assert rig.metric("fleetwatch_act_dry_run") == 1
    for r in rig.task.book.records.values():
        assert r.labels["dry_run"] == "true" and r.annotations["summary"].startswith("[dry-run] ")
    (xid,) = [r for r in rig.alerts("FleetwatchXid") if r.labels["node"] == "gpu-node-01"]
    assert xid.annotations["action"].startswith("would drain node")
    rig.feed(resolve(a, T0 + 1001))
    out = rig.decide(T0 + 1200) + rig.decide(T0 + 1201)  # a would-be resume is done at once
    assert [(m["action"], m["node"], m.get("dry_run")) for m in out] == [
        ("resume", "gpu-node-01", True),
        ("drain", "gpu-node-02", True),
    ]


class _Producer:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes | None, bytes]] = []

    def send(self, topic: str, key: bytes | None = None, value: bytes = b"", **_kw: Any) -> None:
        self.sent.append((topic, key, value))


class _NoSlurm:
    """Any call is a failure of the test: a dry-run request must never reach Slurm."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"slurm.{name} called for a dry-run request")


def test_the_adapter_dead_letters_a_dry_run_request_and_never_answers_it(tmp_path: Any) -> None:
    from fleetwatch.alerts.journal import Journal

    producer = _Producer()
    drainer = Drainer(_NoSlurm(), Journal(tmp_path / "j.sqlite"), KEY, producer, clock=lambda: T0)  # type: ignore[arg-type]
    req = drain_request.make_request(
        node="gpu-node-01",
        action="drain",
        reason="fleetwatch: XID 79",
        severity="critical",
        findings=["f1"],
        issued_at=T0,
        key=KEY,
        dry_run=True,
    )
    assert drainer.handle(schemas.encode(req), "test:0:0", key=b"gpu-node-01") == "dry_run"
    assert [t for t, _k, _v in producer.sent] == ["fleet.deadletter.v1"]  # no drain_result/1


@settings(max_examples=300, deadline=None)
@given(
    key=st.none() | st.binary(max_size=20) | st.just(b"drain_pause"),
    raw=st.binary(max_size=300),
    field=st.sampled_from(
        ["schema", "control", "paused", "reason", "by", "issued_at", "until", "signature", "x"]
    ),
    value=JSONISH,
)
def test_no_control_record_raises_and_only_a_signed_one_switches(
    key: bytes | None, raw: bytes, field: str, value: Any
) -> None:
    """Hostile bytes, and a real record with any field set to anything after signing: refused and
    counted, never an exception in the follower's thread, never a pause."""
    refused: list[str] = []
    book = PauseBook(KEY, refused.append)
    book.read_up()  # the follower read the topic to its end
    book.apply(key, raw, now=NOW)
    msg = schemas.decode(control(True, T0))
    assume(field not in msg or type(msg[field]) is not type(value) or msg[field] != value)  # a change
    msg[field] = value
    book.apply(b"drain_pause", json.dumps(msg).encode(), now=NOW)
    assert book.active(T0 + 1) is None
    assert len(refused) == 2


def test_a_record_from_a_clock_ahead_is_refused_and_no_pause_outlives_a_week_from_its_reading() -> None:
    refused: list[str] = []
    book = PauseBook(KEY, refused.append)
    book.read_up()  # the follower read the topic to its end
    book.apply(b"drain_pause", control(True, T0 + 3600), now=T0)  # an hour ahead of this reader
    assert book.active(T0 + 1) is None and refused == ["clock_skew"]
    book.apply(b"drain_pause", control(True, T0 + 30, for_s=7 * 86400.0), now=T0)
    pause = book.active(T0 + 31)
    assert pause is not None and pause.until == T0 + 7 * 86400.0  # read at T0: a week from then


def test_a_records_clock_is_checked_against_the_brokers_time_and_its_week_counted_from_it() -> None:
    """fleet.control.v1 is a LogAppendTime topic, read as act reads it (BrokerTimedFollower): act's
    own clock, behind or ahead, changes nothing; a re-read after a restart, a day later, takes and
    refuses the same records and ends the pause at the same time."""
    assert topics.CONTROL in topics.BROKER_TIMED
    broker = T0

    def rec(value: bytes) -> Record:
        return Record(topics.CONTROL, 0, 0, b"drain_pause", value, int(broker * 1000), True)

    def read(now: float) -> tuple[PauseBook, list[str]]:
        refused: list[str] = []
        book = PauseBook(KEY, refused.append)
        book.read_up()
        follower = BrokerTimedFollower(topics.CONTROL, book.apply, MemoryBus())
        follower.apply_record(rec(control(True, broker + 3600)), now)  # an operator's clock an hour ahead
        follower.apply_record(rec(control(True, broker + 30, for_s=7 * 86400.0)), now)
        return book, refused

    for now in (broker - 3600, broker + 86_400):  # act's clock an hour slow; a restart a day later
        book, refused = read(now)
        assert refused == ["clock_skew"]
        pause = book.active(broker + 40)
        assert pause is not None and pause.until == broker + 7 * 86400.0  # a week from the broker's time
    # a topic that keeps the producer's time (one a site made itself): the reader's clock
    refused: list[str] = []
    book = PauseBook(KEY, refused.append)
    follower = BrokerTimedFollower("site.control", book.apply, MemoryBus())
    follower.apply_record(
        Record("site.control", 0, 0, b"drain_pause", control(True, T0 + 3600), 0, False), T0
    )
    assert refused == ["clock_skew"]


def test_until_the_control_topic_is_read_drains_are_held() -> None:
    """Fail closed: an act that has not read the switch yet (the topic unreachable, an ACL
    missing) must not drain during a pause it has not seen; once read, no record means no pause."""
    book = PauseBook(KEY)
    rig = Rig(NODES, pause=book, budget_min_nodes=1)
    assert rig.feed(finding("gpu-node-01", ts=T0)) == []
    assert rig.task.nodes["gpu-node-01"].refused == "paused"
    (paused,) = rig.alerts("FleetwatchDrainsPaused")
    assert "not been read yet" in paused.annotations["summary"]
    book.read_up()
    (req,) = rig.decide(T0 + 1)
    assert req["node"] == "gpu-node-01" and rig.alerts("FleetwatchDrainsPaused") == []
