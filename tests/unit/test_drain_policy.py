"""Drain policy (alerts/policy.py): what drains, budget, one node per job, storm, hysteresis, cooldown."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from fleetwatch.alerts.drain_request import request_id
from fleetwatch.alerts.policy import NodeState, Policy, PolicyConfig, drain_reason
from fleetwatch.pipeline.job_table import JobTable
from tests.helpers.findings import T0, finding, resolve


def sig(rid: str) -> str:
    """A stand-in for the HMAC the actor signs request `rid` with (64 hex)."""
    return hashlib.sha256(rid.encode()).hexdigest()


class Fleet:
    """Node states plus a real JobTable, driven like the actor drives the policy."""

    def __init__(self, fleet_size: int = 100, **cfg: Any) -> None:
        self.policy = Policy(PolicyConfig(**cfg))
        self.nodes: dict[str, NodeState] = {}
        self.jobs = JobTable()
        self.fleet_size = fleet_size

    def feed(self, *fs: dict[str, Any]) -> None:
        for f in fs:
            self.policy.observe(self.nodes.setdefault(f["node"], NodeState()), f)

    def step(self, now: float) -> list[tuple[str, str]]:
        ev = self.policy.evaluate(self.nodes, now, self.fleet_size, self.jobs)
        self.last = ev
        for a in ev.actions:  # as the actor does once it has signed the request
            self.nodes[a.node].request_sig = sig(self.nodes[a.node].request_id)
        return [(a.action, a.node) for a in ev.actions]

    def executed(self, node: str, action: str) -> None:
        """The adapter's answer `executed` to the node's latest request (a resume: the node passed
        its validation and the drain is lifted)."""
        st = self.nodes[node]
        self.policy.apply_result(st, st.request_id, action, "executed", "", request_sig=st.request_sig)

    def job(self, name: str, nodes: list[str], state: str = "running") -> None:
        self.jobs.apply({"schema": "job/1", "job": name, "nodes": nodes, "state": state, "ts": T0})


# ---------------------------------------------------------------- what drains


@pytest.mark.parametrize(
    ("kind", "severity", "rule", "evidence", "drains"),
    [
        # the worst code's action (NVIDIA's bucket) decides: drain_node/rma, and reset_gpu while GPU
        # resets are not automated
        ("xid", "critical", "xid_burst", {"xids": {"79": 1}, "worst_xid": 79, "action": "drain_node"}, True),
        ("xid", "critical", "xid_burst", {"xids": {"48": 2}, "worst_xid": 48, "action": "drain_node"}, True),
        ("xid", "critical", "xid_burst", {"xids": {"95": 1}, "worst_xid": 95, "action": "reset_gpu"}, True),
        ("xid", "critical", "xid_burst", {"xids": {"64": 1}, "worst_xid": 64, "action": "rma"}, True),
        ("xid", "critical", "xid_burst", {"xids": {"119": 1}, "worst_xid": 119, "action": "reset_gpu"}, True),
        (
            "xid",
            "critical",
            "xid_burst",
            {"xids": {"149": 30}, "worst_xid": 149, "action": "investigate"},
            False,
        ),
        # an escalated burst of a driver XID pages, but the GPU may recover with a reset: alert only
        ("xid", "critical", "xid_burst", {"xids": {"8": 9}, "worst_xid": 8, "action": "restart_app"}, False),
        ("xid", "warning", "xid_burst", {"xids": {"13": 1}, "worst_xid": 13}, False),
        ("ecc", "critical", "ecc_dbe", {}, True),
        ("ecc", "warning", "ecc_sbe_rate", {}, False),
        ("ecc", "critical", "retired_pages", {}, True),
        ("row_remap", "critical", "row_remap_failure", {}, True),
        ("row_remap", "warning", "row_remap_pending", {}, False),
        ("pcie", "critical", "gpu_lost", {}, True),
        ("pcie", "warning", "pcie_replay", {}, False),
        ("nvlink", "critical", "nvlink_crc", {}, True),
        ("nvlink", "warning", "nvlink_crc", {}, False),
        ("ib_link", "critical", "ib_port_state:mlx5_0/1", {}, True),
        ("ib_link", "critical", "ib_link_downed:mlx5_0/1", {}, True),
        ("ib_link", "warning", "ib_symbol_errors:mlx5_0/1", {}, False),
        ("lemon", "warning", "poisson_rate", {}, True),
        ("straggler", "critical", "peer_step_time", {}, True),
        ("straggler", "warning", "peer_step_time", {}, False),
        ("thermal", "warning", "thermal_throttle", {}, False),
        ("host", "critical", "procs_d_state", {}, False),
        ("statistical", "critical", "online", {}, False),
    ],
)
def test_drain_worthy_or_alert_only(
    kind: str, severity: str, rule: str, evidence: dict[str, Any], drains: bool
) -> None:
    f = finding("n1", kind, severity, rule, **evidence)
    assert (drain_reason(f) is not None) is drains
    assert drain_reason({**f, "resolved": True}) is None  # a resolved finding never drains


def test_a_gpu_reset_drains_only_where_resets_are_not_automated() -> None:
    f = finding("n1", "xid", "critical", "xid_burst", xids={"95": 1}, worst_xid=95, action="reset_gpu")
    assert drain_reason(f) == "XID 95"
    assert drain_reason(f, gpu_reset_automated=True) is None
    for automated, drained in ((False, [("drain", "n1")]), (True, [])):
        fl = Fleet(drain_budget=1.0, gpu_reset_automated=automated)
        fl.feed(f)
        assert fl.step(T0 + 60) == drained


def test_drain_names_the_reason_and_findings_and_alert_only_does_not_drain() -> None:
    fl = Fleet()
    xid = finding("n1")
    fl.feed(xid, finding("n2", "thermal", "warning", "thermal_throttle"))
    assert fl.step(T0) == [("drain", "n1")]
    a = fl.last.actions[0]
    assert a.reason == "XID 79" and a.severity == "critical" and a.findings == (xid["id"],)
    assert fl.step(T0 + 1) == []  # already drained: no second request


# ---------------------------------------------------------------- budget


def test_budget_never_exceeded_and_freed_by_a_resume() -> None:
    fl = Fleet(fleet_size=100, resume_after_s=60)  # 2% of 100 = 2 nodes
    a, b, c = (finding(n, ts=T0 + 100 * i) for i, n in enumerate(("n1", "n2", "n3")))
    fl.feed(a, b, c)
    assert fl.step(T0 + 300) == [("drain", "n1"), ("drain", "n2")]
    assert fl.nodes["n3"].refused == "budget" and fl.last.newly_refused == [("n3", "budget")]
    assert fl.last.budget_nodes == 2 and fl.last.drained == 2
    assert fl.step(T0 + 301) == [] and fl.last.newly_refused == []  # refused once, not every tick
    fl.feed(resolve(a, T0 + 310))
    assert fl.step(T0 + 330) == []  # not healthy long enough yet
    # A resume frees the slot only once the adapter has lifted the drain (after the node passed its
    # validation): a node that fails its test is drained again, and its slot must still be there.
    assert fl.step(T0 + 371) == [("resume", "n1")]
    assert fl.nodes["n1"].drained and fl.nodes["n1"].resuming and fl.nodes["n3"].refused == "budget"
    assert fl.step(T0 + 400) == []  # asked once, not on every decision
    fl.executed("n1", "resume")
    assert fl.step(T0 + 401) == [("drain", "n3")]
    assert fl.nodes["n3"].refused is None


def test_budget_is_strict_by_default_and_has_an_optional_floor() -> None:
    fl = Fleet(fleet_size=32)  # 2% of 32 = 0.64 -> 0 nodes
    fl.feed(finding("n1"))
    assert fl.step(T0) == [] and fl.nodes["n1"].refused == "budget"
    fl = Fleet(fleet_size=32, budget_min_nodes=1)
    fl.feed(finding("n1"))
    assert fl.step(T0) == [("drain", "n1")]


def test_flood_of_findings_stays_within_budget() -> None:
    fl = Fleet(fleet_size=500, storm_nodes=10_000, storm_fraction=1.0, storm_min_nodes=10_000)  # 10 nodes
    for i in range(200):  # spread out in event time, so no storm: the budget alone must hold
        fl.feed(finding(f"n{i:03d}", ts=T0 + i, gpu=i % 8))
        fl.feed(finding(f"n{i:03d}", "ib_link", "critical", "ib_port_state:mlx5_0/1", ts=T0 + i, gpu=None))
        fl.step(T0 + i)
        assert sum(st.drained for st in fl.nodes.values()) <= 10
    assert sum(st.drained for st in fl.nodes.values()) == 10
    assert sum(st.refused == "budget" for st in fl.nodes.values()) == 190


def test_budget_share_of_a_member_owning_part_of_the_partitions() -> None:
    p = Policy(PolicyConfig(drain_budget=0.02))
    assert p.budget_nodes(1000) == 20
    assert p.budget_nodes(1000, share=0.25) == 5  # 4 members x 5 never exceed 20
    assert sum(p.budget_nodes(130, share=s) for s in (0.25, 0.25, 0.5)) <= p.budget_nodes(130)


# ---------------------------------------------------------------- one node per job


def test_one_node_per_running_job_needs_a_human() -> None:
    fl = Fleet()
    fl.job("train-1", ["n1", "n2", "n3"])
    fl.feed(finding("n1", ts=T0), finding("n2", ts=T0 + 100))
    assert fl.step(T0 + 100) == [("drain", "n1")]
    assert fl.nodes["n2"].refused == "job" and "n1 of job train-1" in fl.nodes["n2"].refused_detail
    fl.job("train-1", ["n1", "n2", "n3"], state="failed")  # the job is gone: n2 may go now
    assert fl.step(T0 + 101) == [("drain", "n2")]


def test_job_from_the_finding_counts_too() -> None:
    fl = Fleet()
    fl.feed(finding("n1", "straggler", "critical", "peer_step_time", gpu=None, job="j9", ts=T0))
    fl.feed(finding("n2", "straggler", "critical", "peer_step_time", gpu=None, job="j9", ts=T0 + 100))
    fl.job("j9", ["n1", "n2"])
    assert fl.step(T0 + 100) == [("drain", "n1")]
    assert fl.nodes["n2"].refused == "job"


def test_a_shared_node_is_held_by_any_of_its_jobs() -> None:
    """Slurm shares n2 between jobs a and b: draining it ends both, so a drained node of EITHER job
    holds it; and a drained shared node holds the other nodes of both jobs."""
    fl = Fleet(budget_min_nodes=10)
    fl.job("a", ["n1", "n2"])
    fl.job("b", ["n2", "n3"])
    fl.feed(finding("n3", ts=T0), finding("n2", ts=T0 + 100))
    assert fl.step(T0 + 100) == [("drain", "n3")]
    assert (
        fl.nodes["n2"].refused == "job" and fl.nodes["n2"].refused_detail == "n3 of job b is already drained"
    )
    fl.job("b", ["n2", "n3"], state="finished")  # b is gone, a has nothing drained: n2 may go now
    assert fl.jobs.jobs_on("n2") == ("a",)
    assert fl.step(T0 + 101) == [("drain", "n2")]
    fl.job("b2", ["n2", "n4"])
    fl.feed(finding("n1", ts=T0 + 200), finding("n4", ts=T0 + 200))  # a's and b2's other nodes
    assert fl.step(T0 + 200) == []
    assert fl.nodes["n1"].refused_detail == "n2 of job a is already drained"
    assert fl.nodes["n4"].refused_detail == "n2 of job b2 is already drained"


def test_a_findings_job_counts_beside_the_tables() -> None:
    """The table puts n2 in job a only (it has not seen b grow onto n2 yet); n2's straggler finding
    names b, whose n1 is drained: n2 is held."""
    fl = Fleet(budget_min_nodes=10)
    fl.job("a", ["n2", "n5"])
    fl.job("b", ["n1", "n3"])
    fl.feed(finding("n1", ts=T0))
    assert fl.step(T0) == [("drain", "n1")]
    fl.feed(finding("n2", "straggler", "critical", "peer_step_time", gpu=None, job="b", ts=T0 + 10))
    assert fl.step(T0 + 10) == []
    assert fl.nodes["n2"].refused_detail == "n1 of job b is already drained"


# ---------------------------------------------------------------- storm


def test_storm_drains_nothing_and_ends() -> None:
    fl = Fleet(fleet_size=100, budget_min_nodes=10, storm_window_s=60, storm_clear_s=120)
    storm = [
        finding(f"n{i}", "ib_link", "critical", "ib_port_state:mlx5_0/1", ts=T0 + i, gpu=None)
        for i in range(6)
    ]
    fl.feed(*storm)
    assert fl.step(T0 + 10) == []
    assert fl.last.storm.active and fl.last.storm.nodes == tuple(f"n{i}" for i in range(6))
    assert fl.last.storm.threshold == 5  # min(5 nodes, 5% of 100), floor 3
    assert all(st.refused == "storm" for st in fl.nodes.values())
    for f in storm[:5]:  # the shared cause goes away: most nodes recover together
        fl.feed(resolve(f, T0 + 30))
    assert fl.step(T0 + 100) == []  # still inside the storm's clear period
    assert fl.step(T0 + 200) == [("drain", "n5")]  # over: the one still broken is drained
    assert not fl.last.storm.active


def test_onsets_spread_in_event_time_are_no_storm_even_if_they_arrive_at_once() -> None:
    fl = Fleet(fleet_size=100, budget_min_nodes=10)
    fl.feed(*(finding(f"n{i}", ts=T0 + 100 * i) for i in range(6)))  # a backlog: 6 onsets, 100 s apart
    assert len(fl.step(T0 + 600)) == 6 and not fl.last.storm.active


def test_storm_threshold_scales_with_the_fleet() -> None:
    p = Policy()
    assert p.storm_threshold(32) == 3  # 5% of 32 is 2: never below the floor of 3
    assert p.storm_threshold(100) == 5
    assert p.storm_threshold(10_000) == 5  # 5 nodes at once is a storm in any fleet


# ---------------------------------------------------------------- hysteresis, cooldown, resume


def test_resume_only_after_healthy_period_and_not_with_warnings_open() -> None:
    fl = Fleet(resume_after_s=300)
    f = finding("n1")
    fl.feed(f)
    assert fl.step(T0) == [("drain", "n1")]
    fl.feed(finding("n1", "thermal", "warning", "thermal_throttle", ts=T0 + 10))
    fl.feed(resolve(f, T0 + 20))
    assert fl.step(T0 + 1000) == []  # a warning is still open
    fl.feed(resolve(finding("n1", "thermal", "warning", "thermal_throttle", ts=T0 + 10), T0 + 1000))
    assert fl.step(T0 + 1200) == []  # healthy since T0+1000: 200 s < 300 s
    assert fl.step(T0 + 1301) == [("resume", "n1")]
    r = fl.last.actions[0]
    assert r.findings == (f["id"],)  # the resume names what the drain was for (stable request id)


def test_flapping_node_waits_the_cooldown_before_the_next_resume() -> None:
    fl = Fleet(resume_after_s=60, cooldown_s=3600)
    f1 = finding("n1", ts=T0)
    fl.feed(f1)
    fl.step(T0)
    fl.feed(resolve(f1, T0 + 10))
    assert fl.step(T0 + 100) == [("resume", "n1")]
    fl.executed("n1", "resume")
    f2 = finding("n1", "ecc", "critical", "ecc_dbe", ts=T0 + 200)
    fl.feed(f2)
    assert fl.step(T0 + 200) == [("drain", "n1")]  # broken again: drain it, safety first
    assert fl.nodes["n1"].flapping
    fl.feed(resolve(f2, T0 + 210))
    assert fl.step(T0 + 400) == []  # 60 s of health is not enough for a flapping node
    assert fl.step(T0 + 210 + 3601) == [("resume", "n1")]


def test_no_auto_resume_leaves_drained_nodes_drained() -> None:
    fl = Fleet(resume_after_s=0, auto_resume=False)
    f = finding("n1")
    fl.feed(f)
    fl.step(T0)
    fl.feed(resolve(f, T0 + 1))
    assert fl.step(T0 + 10_000) == [] and fl.nodes["n1"].drained


def test_duplicates_and_late_reopen_change_nothing() -> None:
    fl = Fleet(resume_after_s=60)
    f = finding("n1")
    fl.feed(f, f)
    assert fl.step(T0) == [("drain", "n1")]
    fl.feed(resolve(f, T0 + 5), f)  # a late duplicate of the opening after the resolution
    assert not fl.nodes["n1"].open
    assert fl.step(T0 + 100) == [("resume", "n1")]


def test_state_round_trips_and_prune_forgets_quiet_nodes() -> None:
    fl = Fleet()
    fl.feed(finding("n1"), finding("n2", "thermal", "warning", "thermal_throttle"))
    fl.step(T0)
    restored = {n: NodeState.from_dict(st.to_dict()) for n, st in fl.nodes.items()}
    assert restored == fl.nodes
    fl.feed(resolve(finding("n2", "thermal", "warning", "thermal_throttle"), T0 + 1))
    fl.policy.prune(fl.nodes, T0 + 10_000)
    assert set(fl.nodes) == {"n1"}  # n1 is drained: kept


def test_adopting_issued_requests_makes_a_replay_continue_from_them() -> None:
    fl = Fleet(fleet_size=100, resume_after_s=60)  # budget 2
    a, b = finding("n1", ts=T0), finding("n2", ts=T0 + 1)
    fl.feed(a, b)
    # Before the crash n2 and n3 were drained (the replay lacks n3's finding so far):
    fl.nodes.setdefault("n3", NodeState())
    assert fl.policy.adopt(fl.nodes["n2"], "drain", [b["id"]], "fleetwatch: XID 79", T0 + 1)
    assert fl.policy.adopt(fl.nodes["n3"], "drain", ["f3"], "fleetwatch: GPU lost", T0 + 2)
    assert not fl.policy.adopt(fl.nodes["n2"], "drain", [b["id"]], "fleetwatch: XID 79", T0 + 1)
    assert fl.step(T0 + 10) == []  # n1 is refused: the budget is already spent on n2 and n3
    assert fl.nodes["n1"].refused == "budget" and fl.nodes["n3"].drain_reason == "GPU lost"
    # n3 has no open finding: its resume clock started at the drain, so it is resumed in time.
    assert fl.step(T0 + 63) == [("resume", "n3")]
    assert fl.last.actions[0].findings == ("f3",)  # the same resume request as before the crash
    fl.executed("n3", "resume")
    assert fl.step(T0 + 64) == [("drain", "n1")]  # n3's slot, once its resume was carried out
    assert fl.policy.adopt(fl.nodes["n1"], "resume", [a["id"]], "healthy", T0 + 70)
    n1 = fl.nodes["n1"]
    assert n1.drained and n1.resuming and n1.last_resume_at == T0 + 70  # counted until it is done


# ---------------------------------------------------------------- issue 15: census, adapter results


def test_a_node_outside_the_census_never_drains_and_makes_no_storm() -> None:
    fl = Fleet(fleet_size=100, budget_min_nodes=10)
    ghosts = [finding(f"ghost-{i}", ts=T0 + i) for i in range(8)]  # 8 onsets at once: a storm if real
    fl.feed(*ghosts, finding("n1", ts=T0 + 3))
    ev = fl.policy.evaluate(fl.nodes, T0 + 10, fl.fleet_size, fl.jobs, known={"n1", "n2"})
    assert [(a.action, a.node) for a in ev.actions] == [("drain", "n1")]
    assert not ev.storm.active
    assert {fl.nodes[g["node"]].refused for g in ghosts} == {"unknown_node"}
    assert sorted(ev.newly_refused) == sorted((g["node"], "unknown_node") for g in ghosts)
    assert fl.nodes["ghost-0"].refused_detail.startswith("not in the census")


def test_a_pending_drain_holds_its_slot_and_a_refused_one_frees_it_without_being_reissued() -> None:
    fl = Fleet(fleet_size=100)  # budget 2
    a, b, c = (finding(n, ts=T0 + i) for i, n in enumerate(("n1", "n2", "n3")))
    fl.feed(a, b, c)
    assert fl.step(T0 + 10) == [("drain", "n1"), ("drain", "n2")]
    n1 = fl.nodes["n1"]
    assert n1.pending and n1.request_id == request_id("n1", "drain", [a["id"]])
    assert fl.step(T0 + 20) == [] and fl.nodes["n3"].refused == "budget"  # waiting spends no budget
    why = fl.policy.apply_result(
        n1, n1.request_id, "drain", "rejected_stale", "issued 700 s ago", request_sig=n1.request_sig
    )
    assert why == "adapter:rejected_stale" and not n1.drained and n1.refused_detail == "issued 700 s ago"
    assert fl.step(T0 + 30) == [("drain", "n3")]  # the freed slot goes to the next node ...
    assert fl.step(T0 + 40) == [] and n1.refused == "adapter:rejected_stale"  # ... never to a repeat
    assert (
        fl.policy.apply_result(
            n1, n1.request_id, "drain", "rejected_stale", "again", request_sig=n1.request_sig
        )
        is None
    )  # idempotent
    fl.feed(finding("n1", "ecc", "critical", "ecc_dbe", ts=T0 + 50))  # new evidence: a new request ...
    assert fl.step(T0 + 60) == [] and n1.refused == "budget"  # ... that waits for a slot like any other
    n2 = fl.nodes["n2"]
    fl.policy.apply_result(
        n2, n2.request_id, "drain", "failed", "scontrol: timed out", request_sig=n2.request_sig
    )
    assert fl.step(T0 + 70) == [("drain", "n1")] and n1.refused is None and n1.pending


def test_executed_confirms_and_a_refused_copy_of_a_done_drain_changes_nothing() -> None:
    fl = Fleet(fleet_size=100)
    fl.feed(finding("n1"))
    fl.step(T0)
    st = fl.nodes["n1"]
    assert (
        fl.policy.apply_result(st, st.request_id, "drain", "executed", "", request_sig=st.request_sig) is None
    )
    assert st.drained and st.confirmed and not st.pending
    # The same request delivered again reaches the adapter later and is refused (stale, say):
    assert (
        fl.policy.apply_result(
            st, st.request_id, "drain", "rejected_stale", "issued 700 s ago", request_sig=st.request_sig
        )
        is None
    )
    assert st.drained and st.confirmed
    assert (
        fl.policy.apply_result(
            st, st.request_id, "drain", "duplicate", "already executed", request_sig=st.request_sig
        )
        is None
    )
    assert st.confirmed


def test_a_refused_resume_keeps_our_drain_counted_and_is_not_asked_again() -> None:
    fl = Fleet(fleet_size=100, resume_after_s=60)
    f = finding("n1")
    fl.feed(f)
    fl.step(T0)
    st = fl.nodes["n1"]
    fl.policy.apply_result(st, st.request_id, "drain", "executed", "", request_sig=st.request_sig)
    fl.feed(resolve(f, T0 + 1))
    assert fl.step(T0 + 100) == [("resume", "n1")] and st.drained and st.resuming
    fl.policy.apply_result(
        st, st.request_id, "resume", "rejected_stale", "issued 700 s ago", request_sig=st.request_sig
    )
    assert st.drained and st.confirmed  # Slurm still has it drained under our reason
    assert fl.step(T0 + 200) == [] and fl.last.drained == 1
    # A resume refused because a human holds the node now: it is not ours to count any more.
    fl2 = Fleet(fleet_size=100, resume_after_s=60)
    fl2.feed(f)
    fl2.step(T0)
    st2 = fl2.nodes["n1"]
    fl2.feed(resolve(f, T0 + 1))
    fl2.step(T0 + 100)
    fl2.policy.apply_result(
        st2,
        st2.request_id,
        "resume",
        "rejected_not_ours",
        "drained by someone else",
        request_sig=st2.request_sig,
    )
    assert not st2.drained


def test_an_adopted_drain_is_pending_and_one_the_adapter_refused_is_not_adopted_again() -> None:
    fl = Fleet(fleet_size=100)
    f = finding("n1")
    fl.feed(f)
    st = fl.nodes["n1"]
    rid = request_id("n1", "drain", [f["id"]])
    assert fl.policy.adopt(st, "drain", [f["id"]], "fleetwatch: XID 79", T0, rid, sig(rid))
    assert st.pending and st.request_id == rid and st.request_sig == sig(rid)
    fl.policy.apply_result(
        st, rid, "drain", "rejected_stale", "issued 30 days ago", request_sig=st.request_sig
    )
    assert not fl.policy.adopt(st, "drain", [f["id"]], "fleetwatch: XID 79", T0, rid)
    assert not st.drained and fl.step(T0 + 1) == [] and st.refused == "adapter:rejected_stale"


def test_snapshots_from_before_results_keep_their_drains_as_done() -> None:
    old = {"open": {}, "drained": True, "drain_findings": ["f"], "drained_at": T0}
    st = NodeState.from_dict(old)
    assert st.drained and st.confirmed and st.request_id == ""
    assert NodeState.from_dict(st.to_dict()) == st


# ---------------------------------------------------------------- issue 23: results bound to requests


def test_a_result_counts_only_for_the_request_issued_with_that_signature() -> None:
    """A forged copy of a pending request's id got an answer (from an adapter that answered
    forgeries): it must not free the slot while Slurm still executes the real request."""
    fl = Fleet(fleet_size=100, budget_min_nodes=1, drain_budget=0.0)  # budget: one node
    fl.feed(finding("n1", ts=T0), finding("n2", ts=T0 + 1))
    assert fl.step(T0 + 10) == [("drain", "n1")]
    n1 = fl.nodes["n1"]
    for other in ("", sig("forged copy"), sig(n1.request_id).upper()):
        assert (
            fl.policy.apply_result(n1, n1.request_id, "drain", "rejected_forged", "x", request_sig=other)
            is None
        )
    assert n1.pending and not n1.rejected and n1.refused is None
    assert fl.step(T0 + 20) == [] and fl.nodes["n2"].refused == "budget"
    # An answer to the node's request under another id (same signature) is not its answer either.
    assert fl.policy.apply_result(n1, "f" * 32, "drain", "failed", "x", request_sig=n1.request_sig) is None
    assert n1.pending
    why = fl.policy.apply_result(n1, n1.request_id, "drain", "failed", "x", request_sig=n1.request_sig)
    assert why == "adapter:failed" and fl.step(T0 + 30) == [("drain", "n2")]


def test_a_result_that_arrives_before_its_request_is_never_filed() -> None:
    """Request ids are predictable from finding ids: an answer to the id before act issued it must
    not mark it refused (which would block the drain for good) nor free a slot later."""
    fl = Fleet(fleet_size=100, budget_min_nodes=1, drain_budget=0.0)
    f = finding("n1", ts=T0)
    fl.feed(f, finding("n2", ts=T0 + 1))
    n1 = fl.nodes["n1"]
    predicted = request_id("n1", "drain", [f["id"]])
    for outcome in ("rejected_forged", "rejected_stale", "executed"):
        assert fl.policy.apply_result(n1, predicted, "drain", outcome, "", request_sig=sig("planted")) is None
    assert not n1.rejected and not n1.drained and not n1.confirmed
    assert fl.step(T0 + 10) == [("drain", "n1")]  # issued, not refused as adapter:rejected_*
    assert n1.request_id == predicted and n1.pending
    # The planted answer, re-applied now that the request exists, still names another signature.
    assert (
        fl.policy.apply_result(n1, predicted, "drain", "rejected_forged", "", request_sig=sig("planted"))
        is None
    )
    assert n1.pending and fl.step(T0 + 20) == [] and fl.nodes["n2"].refused == "budget"
