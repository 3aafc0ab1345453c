"""The acting stage's drains (alerts/actor.py) in-process, with the real policy, alert model and
result book: the fleet is the census, not job/1 names or findings; a node outside the census is
refused; a node with more findings than a request may list still gets one request and act goes on;
only drains the adapter confirmed count as drained, a refused one frees its slot and is alerted and
not asked again; a drain with no result for too long is alerted and keeps counting; a finding
without detect's valid signature is refused."""

from __future__ import annotations

from typing import Any

import pytest

from fleetwatch import schemas
from fleetwatch.alerts import drain_request, drain_result
from tests.helpers.act import KEY, Rig
from tests.helpers.findings import T0, finding, resolve, signed


def test_the_fleet_is_the_census_not_job_names_nor_findings() -> None:
    census = {f"gpu-node-{i:02d}" for i in range(1, 7)}
    rig = Rig(census, budget_min_nodes=1)
    ghosts = [f"ghost-{i:05d}" for i in range(10_000)]
    rig.jobs.apply({"schema": "job/1", "job": "j-ghost", "nodes": ghosts, "state": "running", "ts": T0})
    out = rig.feed(*(finding(f"phantom-{i}", ts=T0 + i) for i in range(3)), finding("gpu-node-01", ts=T0 + 5))
    assert rig.actor.fleet_size() == 6 and rig.metric("fleetwatch_act_fleet_size") == 6
    assert [(m["action"], m["node"]) for m in out] == [("drain", "gpu-node-01")]
    assert rig.refusals() == {f"phantom-{i}": "unknown_node" for i in range(3)}  # alerted, not drained


def test_a_node_with_257_findings_gets_one_bounded_request_and_act_keeps_going() -> None:
    rig = Rig({"gpu-node-01", "gpu-node-02"}, fleet_size=100, budget_min_nodes=2)
    ports = [
        finding("gpu-node-01", "ib_link", "critical", f"ib_port_state:mlx5_{i}/1", gpu=None)
        for i in range(256)
    ]
    out = rig.feed(*ports, finding("gpu-node-01"), finding("gpu-node-02", ts=T0 + 1))
    assert [m["node"] for m in out] == ["gpu-node-01", "gpu-node-02"]
    big = out[0]
    assert len(big["findings"]) == 256 and big["reason"].endswith("(256 of 257 findings listed)")
    st = rig.task.nodes["gpu-node-01"]
    assert st.pending and st.request_id == big["request_id"]
    rig.result(big, "executed")
    assert rig.decide(T0 + 10) == [] and st.confirmed


def test_only_confirmed_drains_count_and_a_refused_one_is_alerted_freed_and_not_asked_again() -> None:
    rig = Rig({"n1", "n2", "n3"}, budget_min_nodes=2)  # a 3-node census at 2%: the floor, 2 nodes
    # Onsets 100 s apart: three at once would be a storm, and this is about the budget.
    first = rig.feed(*(finding(n, ts=T0 - 300 + 100 * i) for i, n in enumerate(("n1", "n2", "n3"))))
    assert [m["node"] for m in first] == ["n1", "n2"]
    assert (
        rig.metric("fleetwatch_act_drains_pending") == 2
        and rig.metric("fleetwatch_act_drain_budget_used") == 0
    )
    assert rig.metric("fleetwatch_act_node_drained", node="n1") is None  # requested is not drained
    assert rig.refusals() == {"n3": "budget"}  # waiting for results lets nothing more through

    rig.result(first[0], "executed")
    rig.result(first[1], "rejected_unknown_node")
    rig.result(first[1], "executed", key=b"x" * 32)  # a result not signed with our key: ignored
    out = rig.decide(T0 + 10)
    assert [(m["action"], m["node"]) for m in out] == [("drain", "n3")]  # n2's slot, freed
    assert (
        rig.metric("fleetwatch_act_drain_budget_used") == 1
        and rig.metric("fleetwatch_act_drains_pending") == 1
    )
    assert rig.metric("fleetwatch_act_node_drained", node="n1") == 1
    assert rig.refusals() == {"n2": "adapter:rejected_unknown_node"}
    assert rig.metric("fleetwatch_act_drains_refused_total", reason="adapter:rejected_unknown_node") >= 1
    assert rig.decide(T0 + 20) == []  # n2 is not asked again for the same findings


def test_a_drain_without_a_result_past_the_timeout_is_alerted_and_still_counts() -> None:
    rig = Rig({"n1", "n2"}, budget_min_nodes=1)
    assert [m["node"] for m in rig.feed(finding("n1", ts=T0), finding("n2", ts=T0 + 1))] == ["n1"]
    rig.decide(T0 + 200)
    assert "n1" not in rig.refusals() and rig.metric("fleetwatch_act_drains_unconfirmed") == 0
    assert rig.decide(T0 + 301) == []  # the adapter may be down: n2 still waits for the budget
    assert rig.refusals() == {"n1": "adapter:no_result", "n2": "budget"}
    assert rig.metric("fleetwatch_act_drains_unconfirmed") == 1 and rig.actor.last.drained == 1


# ---------------------------------------------------------------- issue 23: results bound to requests


def signed_result(req: dict[str, Any], outcome: str, request_signature: str | None) -> bytes:
    """A result signed with act's key for `req`'s id, bound to `request_signature` (None: unbound,
    as adapters of an earlier release wrote them, answering forged requests too)."""
    r = drain_result.make_result(
        request_id=req["request_id"],
        node=req["node"],
        action=req["action"],
        outcome=outcome,
        detail="by the test",
        ts=T0,
        request_signature=request_signature or "0" * 64,
        key=KEY,
    )
    if request_signature is None:
        r = {k: v for k, v in r.items() if k not in ("request_signature", "signature")}
        r["signature"] = drain_request.sign(r, KEY)
    return schemas.encode(r)


def test_an_answer_planted_before_the_request_or_given_to_a_forged_copy_frees_no_slot() -> None:
    rig = Rig({"n1", "n2"}, budget_min_nodes=1)  # budget: one node
    first, second = finding("n1", ts=T0), finding("n2", ts=T0 + 1)
    predicted = drain_request.make_request(
        node="n1",
        action="drain",
        reason="fleetwatch: XID 79",
        severity="critical",
        findings=[first["id"]],
        issued_at=T0,
        key=b"attacker-key-attacker-key-123456",
    )
    unbound = rig.metric("fleetwatch_act_drain_results_ignored_total", reason="unbound") or 0.0
    # Before the request exists: answers to its predictable id, unbound and bound to a guess.
    rig.results.apply(b"n1", signed_result(predicted, "rejected_forged", None))
    rig.results.apply(b"n1", signed_result(predicted, "rejected_forged", predicted["signature"]))
    out = rig.feed(first, second)
    assert [m["node"] for m in out] == ["n1"] and out[0]["request_id"] == predicted["request_id"]
    real = out[0]
    assert rig.decide(T0 + 10) == [] and rig.refusals() == {"n2": "budget"}
    # While Slurm executes it: an answer to a forged copy of it (its id, another signature), and an
    # answer bound to it that names another node.
    rig.results.apply(b"n1", signed_result(real, "rejected_forged", "f" * 64))
    rig.result(real, "rejected_forged", node="n2")
    assert rig.decide(T0 + 20) == [] and rig.refusals() == {"n2": "budget"}
    st = rig.task.nodes["n1"]
    assert st.pending and not st.rejected
    assert rig.metric("fleetwatch_act_drain_results_ignored_total", reason="unbound") == unbound + 1
    assert rig.metric("fleetwatch_act_drain_results_ignored_total", reason="wrong_node") >= 1
    rig.result(real, "executed")  # the adapter's answer to the request act issued
    assert rig.decide(T0 + 30) == [] and st.confirmed
    assert rig.metric("fleetwatch_act_drain_budget_used") == 1


def test_a_duplicate_answers_a_reissued_request_with_the_first_answer_to_its_id() -> None:
    """act restarted without its drain log and issued the same request again (same id, a new
    signature): the adapter says `duplicate`, and the first answer to that id is the answer."""
    rig = Rig({"n1"}, budget_min_nodes=1)
    first = rig.feed(finding("n1", ts=T0))[0]
    again = drain_request.make_request(
        node="n1",
        action="drain",
        reason=first["reason"],
        severity="critical",
        findings=first["findings"],
        issued_at=T0 + 5,
        key=KEY,
    )
    assert again["request_id"] == first["request_id"] and again["signature"] != first["signature"]
    rig.result(first, "executed")
    rig.result(again, "duplicate")
    [answer] = rig.results.answers(again["request_id"], again["signature"])
    assert (answer.outcome, answer.request_signature) == ("executed", again["signature"])
    assert rig.results.answers(again["request_id"], "e" * 64) == ()


def test_an_executed_answer_naming_another_node_neither_counts_nor_blocks_the_genuine_answer() -> None:
    """A defective adapter answers n1's request (its id and signature, signed) with `executed` for n2,
    under either node's key: n1 stays pending and n2 is not drained; counted once, however many
    decisions see it. n1's genuine answer behind it is filed and counted (done is done per node
    named, not per request), and a `duplicate` naming n2 borrows nothing from n1's answer."""
    rig = Rig({"n1", "n2"}, budget_min_nodes=1)
    real = rig.feed(finding("n1", ts=T0))[0]
    rig.result(real, "executed", node="n2")
    rig.result(real, "duplicate", node="n2")
    for at in (T0 + 10, T0 + 11, T0 + 12):
        assert rig.decide(at) == []
    st = rig.task.nodes["n1"]
    assert st.pending and not st.confirmed and "n2" not in rig.task.nodes
    assert rig.metric("fleetwatch_act_drain_results_ignored_total", reason="wrong_node") == 1
    assert rig.metric("fleetwatch_act_drain_budget_used") == 0
    rig.result(real, "executed")  # the genuine answer
    rig.result(real, "duplicate", node="n2")  # a copy for n2 still finds no answer about n2
    assert rig.decide(T0 + 20) == [] and st.confirmed and not st.pending
    assert rig.metric("fleetwatch_act_drain_budget_used") == 1
    assert rig.metric("fleetwatch_act_drain_results_total", action="drain", outcome="executed") == 1
    assert rig.metric("fleetwatch_act_drain_results_ignored_total", reason="wrong_node") == 1
    assert [a.node for a in rig.results.answers(real["request_id"], real["signature"])] == ["n2", "n1"]


DETECT_KEY = b"test-detect-key-0123456789abcdef"


def wire(f: dict[str, Any], key: bytes = DETECT_KEY) -> dict[str, Any]:
    """`f` as act decodes it from fleet.findings.v1 after detect signed it with `key`."""
    return schemas.decode(signed(f, key))


def test_a_finding_without_detects_valid_signature_is_refused_never_alerted_drained_or_resolving() -> None:
    rig = Rig({"n1", "n2", "n3"}, fleet_size=100, budget_min_nodes=5, finding_key=DETECT_KEY)
    real = finding("n3", ts=T0 + 2)
    # a warning detect signed, made an XID 79 drain: the signature no longer covers it
    altered = {**wire(finding("n2", "thermal", "warning", "thermal_throttle", ts=T0 + 1))}
    altered.update(kind="xid", severity="critical", evidence=finding("n2")["evidence"])
    out = rig.feed(
        finding("n1"),  # unsigned
        wire(finding("n2", ts=T0 + 1), b"not-detects-key-0123456789abcdef"),
        altered,
        wire(real),
    )
    assert [(m["action"], m["node"]) for m in out] == [("drain", "n3")]
    assert [(r.reason, r.msg["node"], r.index) for r in rig.task.refused] == [
        ("unsigned", "n1", 0),
        ("bad_signature", "n2", 1),
        ("bad_signature", "n2", 2),
    ]
    assert set(rig.task.nodes) == {"n3"}  # the refused ones left no state: nothing to alert on
    assert set(rig.task.book.by_source) == {real["id"], "drained:n3"}

    # a forged end of the real alert, under the real finding's signature, ends nothing ...
    rig.feed(resolve(wire(real), T0 + 10))
    assert [r.reason for r in rig.task.refused] == ["bad_signature"]
    assert rig.task.nodes["n3"].open and real["id"] in rig.task.book.by_source
    # ... and the signed one does, each call reporting only its own refusals
    rig.feed(wire(resolve(real, T0 + 10)))
    assert rig.task.refused == [] and real["id"] not in rig.task.book.by_source


def test_a_replayed_signed_opening_after_its_end_pages_again_about_nothing() -> None:
    """A signature says who wrote a finding, not that it is new: detect's own opening, sent again
    after the finding resolved (a replay by whoever can write the topic), must not page again
    while act remembers the end (its node's state: here the node stays drained for another)."""
    rig = Rig({"n1"}, fleet_size=100, budget_min_nodes=5, finding_key=DETECT_KEY)
    opening = finding("n1", "thermal", "warning", "thermal_throttle", ts=T0)
    rig.feed(wire(finding("n1", ts=T0)), wire(opening))
    assert opening["id"] in rig.task.book.by_source
    rig.feed(wire(resolve(opening, T0 + 60)))
    assert opening["id"] not in rig.task.book.by_source
    rig.feed(wire(opening))  # the replay
    assert rig.task.refused == []  # it verifies: it is detect's ...
    assert opening["id"] not in rig.task.book.by_source  # ... but pages about nothing
    assert opening["id"] not in rig.task.nodes["n1"].open


def test_a_decision_that_fails_keeps_the_batchs_findings_and_the_next_tick_drains() -> None:
    """The decision after a batch is the actor's (over every owned node, reading the drain log),
    not the batch's findings': when it fails (the drain log out of reach, say), the findings stay
    observed and alerted, none is refused or dead-lettered, and the next tick decides."""
    rig = Rig({"gpu-node-01", "gpu-node-02"}, budget_min_nodes=1)
    calls: list[int] = []

    def drain_log_once_unreachable() -> dict[str, dict[str, Any]]:
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionError("the drain log could not be read")
        return {}

    rig.actor.issued = drain_log_once_unreachable
    assert rig.feed(finding("gpu-node-01", ts=T0)) == []
    assert rig.task.refused == [] and "gpu-node-01" in rig.task.nodes
    assert [(m["action"], m["node"]) for m in rig.decide(T0 + 1)] == [("drain", "gpu-node-01")]


def test_the_results_book_keeps_a_bounded_number_of_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    """A long-running act's answers: the first answered request ids leave past MAX_REQUESTS (a node's
    state keeps what its answer decided; only its latest request is looked up)."""
    from fleetwatch.alerts import drain_log

    monkeypatch.setattr(drain_log, "MAX_REQUESTS", 3)
    rig = Rig({f"n{i}" for i in range(5)}, budget_min_nodes=5)
    reqs = []
    for i in range(5):  # minutes apart: no storm
        rig.now = T0 + 600 * i
        [r] = rig.feed(finding(f"n{i}", ts=rig.now))
        rig.result(r, "executed")
        assert rig.decide(rig.now + 1) == [] and rig.task.nodes[f"n{i}"].confirmed
        reqs.append(r)
    kept = [bool(rig.results.answers(r["request_id"], r["signature"])) for r in reqs]
    assert kept == [False, False, True, True, True]
    assert rig.decide(T0 + 3000) == [] and all(rig.task.nodes[f"n{i}"].confirmed for i in range(5))
    assert rig.metric("fleetwatch_act_drain_budget_used") == 5


def test_wrong_node_answers_after_the_genuine_one_do_not_push_it_out() -> None:
    """A defective adapter answering one request for many other nodes after its genuine answer:
    the genuine one stays filed; a `duplicate` answer with no answer before it leaves no entry."""
    rig = Rig({"n1"}, budget_min_nodes=1)
    [real] = rig.feed(finding("n1", ts=T0))
    rig.result(real, "executed")
    for i in range(20):
        rig.result(real, "executed", node=f"other-{i}")
    assert "n1" in [a.node for a in rig.results.answers(real["request_id"], real["signature"])]
    assert rig.decide(T0 + 10) == [] and rig.task.nodes["n1"].confirmed
    before = len(rig.results)
    ghost = {**real, "request_id": "f" * 32}
    rig.result(ghost, "duplicate")
    assert len(rig.results) == before


def test_a_deferred_drain_pages_nobody_frees_its_slot_and_is_asked_again_signed_anew() -> None:
    """`deferred` (drains paused at the adapter, or the node down or in maintenance in Slurm) is not
    a refusal a human must look at: no FleetwatchDrainRefused, the slot goes to the next node, and
    the same request is issued again after [act.policy] retry_deferred_s."""
    rig = Rig({"n1", "n2", "n3"}, budget_min_nodes=1, retry_deferred_s=60.0)
    first = rig.feed(finding("n1", ts=T0 - 300), finding("n2", ts=T0 - 200))
    assert [m["node"] for m in first] == ["n1"]
    rig.result(first[0], "deferred")
    out = rig.decide(T0 + 10)
    assert [m["node"] for m in out] == ["n2"]  # n1's slot, freed: nothing was done to it
    assert rig.refusals() == {}  # no page about n1
    assert rig.metric("fleetwatch_act_drains_refused_total", reason="adapter:deferred") == 1
    rig.result(out[0], "deferred")
    assert rig.decide(T0 + 20) == []  # neither is due yet
    (asked,) = rig.decide(T0 + 75)  # n1's retry is due (read at T0 + 10); n2's at T0 + 80
    assert asked["node"] == "n1" and asked["request_id"] == first[0]["request_id"]
    assert asked["signature"] != first[0]["signature"]  # signed anew: the adapter judges it afresh
    assert rig.task.nodes["n1"].pending and rig.refusals() == {}


def test_deferrals_act_cannot_explain_page_after_an_hour_and_a_retrys_answer_is_counted() -> None:
    """An adapter that still sees a pause act saw lifted, or a node down that act's view does not
    show, defers every retry: nothing is done meanwhile, so after an hour someone is paged. The
    retry's own answer (same request id, another signature) is counted like any first answer."""
    rig = Rig({"n1", "n2"}, budget_min_nodes=1, retry_deferred_s=60.0)
    (first,) = rig.feed(finding("n1", ts=T0 - 300))
    rig.result(first, "deferred")
    rig.decide(T0 + 10)
    retried = []
    for t in range(80, 3700, 70):  # asked again every ~70 s, deferred every time
        out = rig.decide(T0 + t)
        for m in out:
            retried.append(m)
            rig.result(m, "deferred")
        rig.decide(T0 + t + 1)
        if t < 3500:
            assert rig.refusals() == {}, t  # not within the hour
    assert len(retried) > 40 and {m["request_id"] for m in retried} == {first["request_id"]}
    assert rig.refusals() == {"n1": "adapter:deferred"}  # paged now

    def executed() -> float:
        return rig.metric("fleetwatch_act_drain_results_total", action="drain", outcome="executed") or 0.0

    before = executed()
    (last,) = rig.decide(T0 + 3800)
    rig.result(last, "executed")
    rig.decide(T0 + 3801)
    assert rig.refusals() == {}  # done: the page ends
    assert executed() == before + 1
