"""Nodes people hold (alerts/slurm_nodes.py) in act (alerts/actor.py, the real policy and alert model):
a node Slurm shows in a MAINT reservation, down, or drained by someone else, and a node opted out by
name, host list or Slurm feature, is never drained or resumed, not paged for silence, labelled on
its other alerts, and counted neither in the fleet nor in a storm; only signed, fresh records hold a
node; the adapter's publisher sends what changed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from fleetwatch import schemas, topics
from fleetwatch.alerts import drain_request
from fleetwatch.alerts.slurm import NodeInfo, ReservationsNotUnderstood, SlurmError
from fleetwatch.alerts.slurm_nodes import NodeStatePublisher, SlurmNodeBook, held_by, make_record
from fleetwatch.bus import Record
from fleetwatch.bus.memory import MemoryBus
from fleetwatch.follow import BrokerTimedFollower
from tests.helpers.act import KEY, Rig
from tests.helpers.findings import T0, finding, resolve
from tests.helpers.memory_slurm import KEY as MEMORY_KEY
from tests.helpers.memory_slurm import T0 as MEMORY_T0
from tests.helpers.memory_slurm import MemorySlurm, validating_drainer
from tests.helpers.messages import JSONISH

NODES = {f"gpu-node-{i:02d}" for i in range(1, 51)}


def read_at() -> float:
    """act's wall clock where a test does not say: after every record here (T0 is in 2027)."""
    return T0 + 1e6


def record(
    node: str, state: str = "idle", reason: str = "", maint: bool = False, ts: float = T0, **kw: Any
) -> bytes:
    msg = make_record(NodeInfo(node, state, reason), kw.pop("features", ()), maint, ts, kw.pop("key", KEY))
    msg.update(kw)
    return schemas.encode(msg)


def drained_then_healthy(rig: Rig, node: str, healthy_at: float) -> None:
    """An XID drains `node` (the adapter executes it), and its finding resolves at `healthy_at`."""
    f = finding(node, ts=T0)
    (req,) = rig.feed(f)
    rig.result(req, "executed")
    rig.feed(resolve(f, healthy_at))


@pytest.mark.parametrize(
    ("state", "reason", "maint", "features", "why"),
    [
        ("idle", "", False, (), None),
        ("mixed", "", False, ("a100",), None),
        ("idle", "", True, (), "maintenance"),
        ("maint", "", False, (), None),  # sinfo's maint alone: the adapter's own validation sets it
        ("down*", "Not responding", False, (), "down"),
        ("down", "hardware swap", False, (), "down"),
        ("fail", "bad DIMM", False, (), "down"),
        ("drained", "bad fan (alice)", False, (), "drained_by_other"),
        ("draining", "firmware update", False, (), "drained_by_other"),
        ("drained", "fleetwatch: XID 79 [fw:0123456789ab]", False, (), None),  # our own drain
        ("idle", "", False, ("a100", "fleetwatch_opt_out"), "opted_out"),
        ("reserved", "", False, (), None),  # a reservation for users, not maintenance
        ("idle+drain", "bob: PSU swap", False, (), "drained_by_other"),  # a compound state
        ("mixed+drain", "bob: PSU swap", False, (), "drained_by_other"),
        ("idle+down", "rack power", False, (), "down"),
    ],
)
def test_what_slurm_shows_says_whether_people_hold_the_node(
    state: str, reason: str, maint: bool, features: tuple[str, ...], why: str | None
) -> None:
    rec = make_record(NodeInfo("gpu-node-01", state, reason), features, maint, T0, KEY)
    assert held_by(rec, "fleetwatch_opt_out") == why


def test_only_signed_fresh_records_hold_a_node_and_a_replayed_older_one_changes_nothing() -> None:
    refused: list[str] = []
    book = SlurmNodeBook(KEY, clock=read_at, on_refused=refused.append, max_age_s=900.0)
    book.apply(b"gpu-node-01", record("gpu-node-01", maint=True, key=b"not-the-drain-key-0123456789"))
    book.apply(b"gpu-node-01", record("gpu-node-01", maint=True, ours="no"))  # a wrong type
    book.apply(b"gpu-node-02", record("gpu-node-01", maint=True))  # key names another node
    book.apply(b"gpu-node-01", record("gpu-node-01", maint=False, maintenance=True))  # edited after signing
    book.apply(b"gpu-node-01", None)
    assert book.held_nodes(T0) == {} and refused == [
        "bad_signature",
        "malformed",
        "malformed",
        "bad_signature",
    ]
    book.apply(b"gpu-node-01", record("gpu-node-01", maint=True, ts=T0 + 10))
    book.apply(b"gpu-node-01", record("gpu-node-01", maint=False, ts=T0 + 5))  # older: ignored
    assert book.held("gpu-node-01", T0 + 20) == "maintenance"
    assert book.held("gpu-node-01", T0 + 10 + 901) is None  # a dead adapter's last word ages out
    book.apply(b"gpu-node-01", record("gpu-node-01", maint=False, ts=T0 + 30))
    assert book.held("gpu-node-01", T0 + 31) is None


def test_opt_out_by_name_and_by_host_list() -> None:
    book = SlurmNodeBook(KEY, clock=read_at, opt_out=("gpu-node-[01-03,07]", "login-1"))
    assert {n for n in NODES | {"login-1"} if book.held(n, T0)} == {
        "gpu-node-01",
        "gpu-node-02",
        "gpu-node-03",
        "gpu-node-07",
        "login-1",
    }


def test_a_held_node_is_never_drained_nor_paged_for_silence_nor_counted_in_the_fleet() -> None:
    book = SlurmNodeBook(KEY, clock=read_at)
    rig = Rig(NODES, held_book=book, drain_budget=0.1)  # 50 nodes: 5 may drain ...
    for i in range(1, 11):  # ... but 10 are in a maintenance reservation
        book.apply(f"gpu-node-{i:02d}".encode(), record(f"gpu-node-{i:02d}", maint=True))
    silent = finding("gpu-node-01", "host", "critical", "silent", gpu=None)
    out = rig.feed(finding("gpu-node-02", ts=T0 + 1), silent, finding("gpu-node-20", ts=T0 + 2))
    assert [m["node"] for m in out] == ["gpu-node-20"]  # the held node's XID drains nothing
    assert rig.actor.fleet_size() == 40 and rig.metric("fleetwatch_act_fleet_size") == 40
    assert rig.actor.last is not None and rig.actor.last.budget_nodes == 4
    assert rig.metric("fleetwatch_act_nodes_held") == 10
    assert rig.task.nodes["gpu-node-02"].refused == "maintenance"
    assert rig.refusals() == {}  # nobody is paged about a node they hold
    assert rig.metric("fleetwatch_act_drains_refused_total", reason="maintenance") == 1
    assert rig.alerts("FleetwatchHost") == []  # its silence is expected
    (xid,) = [a for a in rig.alerts("FleetwatchXid") if a.labels["node"] == "gpu-node-02"]
    assert xid.labels["node_state"] == "maintenance" and xid.annotations["action"] == "alert only"
    (other,) = [a for a in rig.alerts("FleetwatchXid") if a.labels["node"] == "gpu-node-20"]
    assert "node_state" not in other.labels


def test_held_nodes_make_no_storm() -> None:
    book = SlurmNodeBook(KEY, clock=read_at)
    rig = Rig(NODES, held_book=book, budget_min_nodes=10)
    for i in range(1, 9):  # a firmware update in a maintenance window: XIDs on 8 nodes at once
        book.apply(f"gpu-node-{i:02d}".encode(), record(f"gpu-node-{i:02d}", maint=True))
    out = rig.feed(
        *(finding(f"gpu-node-{i:02d}", ts=T0 + i) for i in range(1, 9)), finding("gpu-node-30", ts=T0 + 9)
    )
    assert [m["node"] for m in out] == ["gpu-node-30"] and rig.alerts("FleetwatchDrainStorm") == []


def test_a_node_we_drained_that_people_took_over_is_not_resumed() -> None:
    book = SlurmNodeBook(KEY, clock=read_at)
    rig = Rig(NODES, held_book=book, budget_min_nodes=1, resume_after_s=100.0)
    drained_then_healthy(rig, "gpu-node-05", healthy_at=T0 + 10)
    book.apply(b"gpu-node-05", record("gpu-node-05", "down", "swapping the GPU board (bob)", ts=T0 + 200))
    assert rig.decide(T0 + 500) == []  # healthy, but down for repair: not ours to resume
    ours = "fleetwatch: XID 79 [fw:3180243276ee]"  # the Reason the adapter writes: its request's token last
    book.apply(b"gpu-node-05", record("gpu-node-05", "drained", ours, ts=T0 + 600))
    (resume,) = rig.decide(T0 + 601)
    assert resume["action"] == "resume"


class FakeSlurm:
    """sinfo and the MAINT reservations as SlurmClient parses them (its parsing runs against the
    real Slurm in tests/integration/test_slurm_node_states.py)."""

    def __init__(self) -> None:
        self.states = [
            (NodeInfo("gpu-node-01", "idle", ""), ()),
            (NodeInfo("gpu-node-02", "mixed", ""), ("a100",)),
        ]
        self.maint: set[str] = set()
        self.validating = ""  # a node in the adapter's own validation reservation
        self.down = False

    def node_states(self) -> list[tuple[NodeInfo, tuple[str, ...]]]:
        if self.down:
            raise SlurmError("sinfo did not answer in 30 s")
        return list(self.states)

    def maintenance_nodes(self, except_prefix: str = "") -> set[str]:
        return {n for n in self.maint if not except_prefix or n != self.validating}


class Producer:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def send(self, topic: str, key: bytes, value: bytes) -> None:
        msg = schemas.decode(value, schemas.SLURM_NODE, key=key)
        assert topic == "scheduler.nodes.v1"
        self.sent.append(msg)


def test_the_publisher_sends_what_changed_and_everything_at_a_refresh() -> None:
    slurm, producer = FakeSlurm(), Producer()
    pub = NodeStatePublisher(
        slurm, producer, KEY, "scheduler.nodes.v1", every_s=0.0, refresh_s=3600.0, clock=lambda: T0
    )  # type: ignore[arg-type]
    assert pub.publish() == 2  # the first read is a refresh
    assert pub.publish() == 0  # nothing changed
    slurm.maint = {"gpu-node-02"}
    assert (
        pub.publish() == 1 and producer.sent[-1]["node"] == "gpu-node-02" and producer.sent[-1]["maintenance"]
    )
    slurm.down = True
    assert pub.publish() == 0  # logged, tried again next period; never raises into the drainer
    slurm.down = False
    slurm.states.append((NodeInfo("bad name; rm -rf", "idle", ""), ()))
    slurm.states.append((NodeInfo("gpu-node-03", "weird-state-from-a-new-slurm!!", "x\ny"), ("f" * 500,)))
    assert pub.publish() == 1
    last = producer.sent[-1]
    assert last["node"] == "gpu-node-03" and last["state"] == "unknown" and last["reason"] == "x y"
    assert last["features"] == ["f" * 128]
    slurm.states.append((NodeInfo("gpu-node-04", "drained", " \n\0 "), ()))  # published as "fleetwatch"
    assert pub.publish() == 1 and producer.sent[-1]["reason"] == "" and not producer.sent[-1]["ours"]


def test_a_view_is_dated_before_slurm_is_read() -> None:
    # a validation can end (and drain its node again, answering with its own time) while sinfo
    # runs: the view that shows the node in service must be dated before that answer
    clock = [T0]

    class SlowSlurm(FakeSlurm):
        def node_states(self) -> list[tuple[NodeInfo, tuple[str, ...]]]:
            clock[0] += 5.0  # sinfo takes 5 s
            return super().node_states()

    producer = Producer()
    topic = "scheduler.nodes.v1"
    pub = NodeStatePublisher(
        SlowSlurm(), producer, KEY, topic, every_s=0.0, refresh_s=3600.0, clock=lambda: clock[0]
    )  # type: ignore[arg-type]
    assert pub.publish() == 2
    assert {m["ts"] for m in producer.sent} == {T0}


def test_a_node_that_fails_its_validation_stays_drained_is_alerted_and_not_asked_again() -> None:
    rig = Rig(NODES, budget_min_nodes=1, resume_after_s=100.0)
    drained_then_healthy(rig, "gpu-node-05", healthy_at=T0 + 10)
    (resume,) = rig.decide(T0 + 200)
    assert resume["action"] == "resume"
    why = "dcgmi diag -r 1: memory failed on GPU 3"
    rig.result(resume, "rejected_validation", detail=why)
    assert rig.decide(T0 + 201) == [] and rig.decide(T0 + 5000) == []  # never asked again
    st = rig.task.nodes["gpu-node-05"]
    assert st.drained and st.confirmed and st.validation == why
    assert rig.metric("fleetwatch_act_drain_budget_used") == 1  # its slot stays taken
    (a,) = rig.alerts("FleetwatchValidationFailed")
    assert a.labels["severity"] == "critical" and a.labels["kind"] == "validation"
    assert why in a.annotations["summary"] and a.annotations["runbook_url"].endswith("validation.md")
    assert rig.metric("fleetwatch_act_validations_total", outcome="failed") == 1


def test_slurms_view_during_a_failed_validation_is_not_an_operators_resume() -> None:
    # The validation RESUMEs the node inside the adapter's own reservation (not maintenance in its
    # view) and drains it again when the test fails; the view taken meanwhile can reach act after
    # the failed result (CI saw this: the failed node's slot was freed as "resumed by hand").
    book = SlurmNodeBook(KEY, clock=read_at)
    rig = Rig(NODES, held_book=book, budget_min_nodes=1, resume_after_s=100.0)
    rig.now = T0
    drained_then_healthy(rig, "gpu-node-05", healthy_at=T0 + 10)
    rig.now = T0 + 200
    (resume,) = rig.decide(T0 + 200)
    rig.now = T0 + 215  # the adapter drained it again, then answered
    rig.result(resume, "rejected_validation", detail="dcgmi diag -r 1: memory failed on GPU 3")
    rig.decide(T0 + 216)
    book.apply(b"gpu-node-05", record("gpu-node-05", "idle", ts=T0 + 210))  # during the test
    rig.decide(T0 + 217)
    st = rig.task.nodes["gpu-node-05"]
    assert st.drained and st.confirmed and st.validation
    assert rig.metric("fleetwatch_act_resumed_by_hand_total") == 0
    assert rig.metric("fleetwatch_act_drain_budget_used") == 1
    # an operator who resumes it afterwards is seen in a later view, as always
    book.apply(b"gpu-node-05", record("gpu-node-05", "idle", ts=T0 + 900))
    rig.decide(T0 + 901)
    assert not rig.task.nodes["gpu-node-05"].drained
    assert rig.metric("fleetwatch_act_resumed_by_hand_total") == 1


def test_a_node_an_operator_resumed_by_hand_frees_its_slot_once_slurm_shows_it() -> None:
    book = SlurmNodeBook(KEY, clock=read_at)
    rig = Rig(NODES, held_book=book, budget_min_nodes=1)
    (drain,) = rig.feed(finding("gpu-node-05", ts=T0))
    rig.now = T0 + 40  # the adapter executes the drain late (it was restarting)
    rig.result(drain, "executed")
    rig.decide(T0 + 41)
    # the adapter's view from before it executed our drain: not evidence of a resume
    book.apply(b"gpu-node-05", record("gpu-node-05", "idle", ts=T0 + 30))
    rig.decide(T0 + 42)
    assert rig.task.nodes["gpu-node-05"].drained
    book.apply(b"gpu-node-05", record("gpu-node-05", "idle", ts=T0 + 600))
    rig.decide(T0 + 601)
    st = rig.task.nodes["gpu-node-05"]
    assert not st.drained and st.last_resume_at == T0 + 601
    assert rig.metric("fleetwatch_act_resumed_by_hand_total") == 1
    assert rig.metric("fleetwatch_act_drain_budget_used") == 0
    assert rig.alerts("FleetwatchNodeDrained") == []
    assert rig.task.nodes["gpu-node-05"].refused is None and rig.refusals() == {}
    assert rig.decide(T0 + 650) == []  # the same open finding never drains it again ...
    rig.feed(finding("gpu-node-05", ts=T0))  # ... not even re-sent by a replaying detect
    assert rig.decide(T0 + 660) == []
    # new evidence does
    (again,) = rig.feed(
        finding(
            "gpu-node-05", ts=T0 + 700, rule="xid_burst", xids={"48": 1}, worst_xid=48, action="drain_node"
        )
    )
    assert again["action"] == "drain"


def test_an_adapter_clock_that_steps_ahead_and_back_makes_no_earlier_view_a_resume_by_hand() -> None:
    # Within the minute the ts check allows, the adapter's clock steps 50 s ahead as it publishes
    # the node in service, then back before it executes our drain and answers. By its ts that view
    # is after the drain; the broker took it before the answer, the order the adapter read Slurm in
    # (scheduler.nodes.v1 and scheduler.drain.results.v1 are LogAppendTime): no resume by hand, and
    # the node keeps its budget slot.
    book = SlurmNodeBook(KEY, clock=read_at)
    rig = Rig(NODES, held_book=book, budget_min_nodes=1)
    (drain,) = rig.feed(finding("gpu-node-05", ts=T0))
    book.apply(
        b"gpu-node-05", record("gpu-node-05", "idle", ts=T0 + 55), now=T0 + 5, broker=True
    )  # 50 s ahead
    rig.now = T0 + 10  # the clock back: the drain executed, and answered
    rig.result(drain, "executed", seen=T0 + 11)
    rig.decide(T0 + 12)
    rig.decide(T0 + 40)
    st = rig.task.nodes["gpu-node-05"]
    assert st.drained and st.confirmed and st.confirmed_seen == T0 + 11
    assert rig.metric("fleetwatch_act_resumed_by_hand_total") == 0
    assert rig.metric("fleetwatch_act_drain_budget_used") == 1
    # an operator's resume afterwards: a view taken, and taken by the broker, after the answer
    book.apply(b"gpu-node-05", record("gpu-node-05", "idle", ts=T0 + 600), now=T0 + 601, broker=True)
    rig.decide(T0 + 602)
    assert not rig.task.nodes["gpu-node-05"].drained
    assert rig.metric("fleetwatch_act_resumed_by_hand_total") == 1
    assert rig.metric("fleetwatch_act_drain_budget_used") == 0


def test_a_view_from_an_adapter_clock_ahead_is_refused_and_frees_no_budget_slot() -> None:
    # The adapter's clock ran a day ahead when it published the node in service; its clock is
    # right again when it executes our drain. Taken, that view would outrank every later one (the
    # latest ts wins), stay young for a day, and read as a resume by hand after our drain: the
    # slot of a node still drained freed, so the budget lets one more node go.
    refused: list[str] = []
    book = SlurmNodeBook(KEY, on_refused=refused.append, clock=lambda: T0)
    rig = Rig(NODES, held_book=book, budget_min_nodes=1)
    book.apply(b"gpu-node-05", record("gpu-node-05", "idle", ts=T0 + 86_400))
    book.apply(b"gpu-node-06", record("gpu-node-06", "idle", ts=T0 + 59))  # within 60 s: taken
    assert refused == ["clock_skew"] and book.latest("gpu-node-05") is None
    assert book.latest("gpu-node-06") is not None
    (drain,) = rig.feed(finding("gpu-node-05", ts=T0))
    rig.now = T0 + 40
    rig.result(drain, "executed")
    rig.decide(T0 + 41)
    rig.decide(T0 + 600)
    assert rig.task.nodes["gpu-node-05"].drained
    assert rig.metric("fleetwatch_act_resumed_by_hand_total") == 0
    assert rig.metric("fleetwatch_act_drain_budget_used") == 1
    # the adapter's next views, on its right clock, are taken as always
    view = record("gpu-node-05", "drained", "fleetwatch: XID 79", ts=T0 + 60)
    book.apply(b"gpu-node-05", view, now=T0 + 61)
    assert book.latest("gpu-node-05")["state"] == "drained"


def test_a_views_clock_is_checked_against_the_brokers_time_not_acts() -> None:
    # scheduler.nodes.v1 is a LogAppendTime topic: act's own clock, behind or ahead, changes
    # nothing, and a re-read after a restart (act's clock a day later) decides as the first did
    assert topics.SLURM_NODES in topics.BROKER_TIMED
    refused: list[str] = []
    book = SlurmNodeBook(KEY, on_refused=refused.append)
    broker = T0

    def rec(node: str, ts: float) -> Record:
        value = record(node, "idle", maint=True, ts=ts)
        return Record(topics.SLURM_NODES, 0, 0, node.encode(), value, int(broker * 1000), True)

    follower = BrokerTimedFollower(topics.SLURM_NODES, book.apply, MemoryBus())  # as act follows it
    follower.apply_record(rec("gpu-node-01", broker + 30), now=broker - 3600)  # act's clock an hour slow
    follower.apply_record(rec("gpu-node-02", broker + 86_400), now=broker + 86_400)  # read a day later
    assert book.latest("gpu-node-01") is not None and book.latest("gpu-node-02") is None
    assert refused == ["clock_skew"]
    # a topic that keeps the producer's time (a site's own, not made by fleetwatch): act's clock
    plain = Record("site.nodes", 0, 0, b"gpu-node-03", record("gpu-node-03", ts=T0 + 30), 0, False)
    follower.apply_record(plain, now=T0)
    assert book.latest("gpu-node-03") is not None


@settings(max_examples=300, deadline=None)
@given(
    key=st.none() | st.binary(max_size=20) | st.just(b"gpu-node-01"),
    raw=st.binary(max_size=300),
    field=st.sampled_from(
        ["schema", "node", "state", "reason", "features", "maintenance", "ours", "ts", "signature", "x"]
    ),
    value=JSONISH,
)
def test_no_slurm_node_record_raises_and_only_a_signed_one_holds_a_node(
    key: bytes | None, raw: bytes, field: str, value: Any
) -> None:
    refused: list[str] = []
    book = SlurmNodeBook(KEY, clock=read_at, on_refused=refused.append)
    book.apply(key, raw)
    msg = schemas.decode(record("gpu-node-01", maint=True))
    assume(field not in msg or type(msg[field]) is not type(value) or msg[field] != value)
    msg[field] = value
    book.apply(b"gpu-node-01", json.dumps(msg).encode())
    assert book.held_nodes(T0) == {} and len(refused) == 2


def test_the_adapters_own_validation_reservation_is_no_maintenance_and_a_validated_node_keeps_its_slot() -> (
    None
):
    slurm, producer = FakeSlurm(), Producer()
    pub = NodeStatePublisher(slurm, producer, KEY, "scheduler.nodes.v1", every_s=0.0, clock=lambda: T0)  # type: ignore[arg-type]
    slurm.maint, slurm.validating = {"gpu-node-01"}, "gpu-node-01"
    slurm.states[0] = (NodeInfo("gpu-node-01", "maint", ""), ())  # sinfo shows our reservation's flag
    pub.publish()
    rec = next(m for m in producer.sent if m["node"] == "gpu-node-01")
    assert rec["maintenance"] is False and held_by(rec) is None
    # and act: a node resuming (being validated) counts against the budget whoever holds it
    book = SlurmNodeBook(KEY, clock=read_at)
    rig = Rig(NODES, held_book=book, budget_min_nodes=1, resume_after_s=10.0)
    drained_then_healthy(rig, "gpu-node-05", healthy_at=T0 + 1)
    ((_, resume),) = [(m["node"], m["action"]) for m in rig.decide(T0 + 100)]
    assert resume == "resume"
    book.apply(
        b"gpu-node-05", record("gpu-node-05", "idle", maint=True, ts=T0 + 101)
    )  # (a site's reservation)
    assert rig.feed(finding("gpu-node-06", ts=T0 + 102)) == []  # the slot is still taken
    assert rig.task.nodes["gpu-node-06"].refused == "budget"


def test_a_resume_with_no_answer_for_an_hour_pages() -> None:
    rig = Rig(NODES, budget_min_nodes=1, resume_after_s=10.0)
    drained_then_healthy(rig, "gpu-node-05", healthy_at=T0 + 1)
    ((_, resume),) = [(m["node"], m["action"]) for m in rig.decide(T0 + 100)]
    assert resume == "resume"
    rig.decide(T0 + 100 + 3000)
    assert rig.refusals() == {}
    rig.decide(T0 + 100 + 3601)
    assert rig.refusals() == {"gpu-node-05": "adapter:no_result"}


def test_a_drain_never_overwrites_someone_elses_drain_shown_as_a_compound_state(tmp_path: Path) -> None:
    slurm = MemorySlurm("idle+drain", "bob: PSU swap, ticket 17")
    drainer, results = validating_drainer(slurm, tmp_path)
    drain = drain_request.make_request(
        node="gpu01", action="drain", reason="XID 79", severity="critical", findings=["f1"],
        issued_at=MEMORY_T0, key=MEMORY_KEY,
    )  # fmt: skip
    assert drainer.handle(schemas.encode(drain), "t:0:0", key=b"gpu01") == "not_ours"
    assert slurm.reason == "bob: PSU swap, ticket 17" and slurm.updates == 0
    assert results.outcomes == ["rejected_not_ours"]


def test_a_view_of_a_compound_drained_state_is_no_resume_by_hand() -> None:
    book = SlurmNodeBook(KEY, clock=read_at)
    rig = Rig(NODES, held_book=book, budget_min_nodes=1)
    (drain,) = rig.feed(finding("gpu-node-05", ts=T0))
    rig.result(drain, "executed")
    ours = "fleetwatch: XID 79 [fw:0123456789ab]"
    book.apply(b"gpu-node-05", record("gpu-node-05", "idle+drain", ours, ts=T0 + 600))
    rig.decide(T0 + 601)
    assert rig.task.nodes["gpu-node-05"].drained
    assert rig.metric("fleetwatch_act_resumed_by_hand_total") == 0


def test_the_opt_out_feature_is_kept_among_many_features() -> None:
    features = (*(f"f{i}" for i in range(40)), "fleetwatch_opt_out")
    rec = make_record(NodeInfo("gpu-node-02", "idle", ""), features, False, T0, KEY)
    assert len(rec["features"]) == schemas.MAX_FEATURES
    assert held_by(rec, "fleetwatch_opt_out") == "opted_out"
    few = make_record(NodeInfo("gpu-node-02", "idle", ""), ("b", "fleetwatch_opt_out", "a"), False, T0, KEY)
    assert few["features"] == ["b", "fleetwatch_opt_out", "a"]  # Slurm's order, where all fit


def test_an_opt_out_feature_the_adapter_does_not_keep_first_is_warned_of_at_start(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The adapter keeps fleetwatch's own features first (it does not know act's setting): a name
    outside them may be cut from the view of a node with many features, and the node then drained."""
    features = (*(f"f{i}" for i in range(40)), "site_opt_out")
    rec = make_record(NodeInfo("gpu-node-02", "idle", ""), features, False, T0, KEY)
    assert held_by(rec, "site_opt_out") is None  # the limit the warning names
    with caplog.at_level("WARNING", logger="fleetwatch.alerts.slurm_nodes"):
        SlurmNodeBook(KEY, opt_out_feature="fleetwatch_opt_out")
        SlurmNodeBook(KEY, opt_out_feature="")
        assert caplog.records == []
        SlurmNodeBook(KEY, opt_out_feature="site_opt_out")
    (line,) = [r.getMessage() for r in caplog.records]
    assert "'site_opt_out' does not start with 'fleetwatch'" in line and "32 Slurm features" in line


def test_one_unreadable_reservation_does_not_withhold_every_nodes_record() -> None:
    class Unreadable(FakeSlurm):
        def maintenance_nodes(self, except_prefix: str = "") -> set[str]:
            raise ReservationsNotUnderstood("a reservation's node list not understood", {"gpu-node-02"})

    producer = Producer()
    pub = NodeStatePublisher(Unreadable(), producer, KEY, "scheduler.nodes.v1", every_s=0.0, clock=lambda: T0)  # type: ignore[arg-type]
    assert pub.publish() == 2
    assert {m["node"]: m["maintenance"] for m in producer.sent} == {"gpu-node-01": False, "gpu-node-02": True}
