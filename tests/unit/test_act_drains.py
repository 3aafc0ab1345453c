"""The acting stage's drains (alerts/actor.py) in-process, with the real policy, alert model and
result book: the fleet is the census, not job/1 names or findings; a node outside the census is
refused; a node with more findings than a request may list still gets one request and act goes on;
only drains the adapter confirmed count as drained, a refused one frees its slot and is alerted and
not asked again; a drain with no result for too long is alerted and keeps counting."""

from __future__ import annotations

from prometheus_client import REGISTRY

from tests.helpers.act import Rig
from tests.helpers.findings import T0, finding


def metric(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def test_the_fleet_is_the_census_not_job_names_nor_findings() -> None:
    census = {f"gpu-node-{i:02d}" for i in range(1, 7)}
    rig = Rig(census, budget_min_nodes=1)
    ghosts = [f"ghost-{i:05d}" for i in range(10_000)]
    rig.jobs.apply({"schema": "job/1", "job": "j-ghost", "nodes": ghosts, "state": "running", "ts": T0})
    out = rig.feed(*(finding(f"phantom-{i}", ts=T0 + i) for i in range(3)), finding("gpu-node-01", ts=T0 + 5))
    assert rig.actor.fleet_size() == 6 and metric("fleetwatch_act_fleet_size") == 6
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
    assert metric("fleetwatch_act_drains_pending") == 2 and metric("fleetwatch_act_drain_budget_used") == 0
    assert metric("fleetwatch_act_node_drained", node="n1") is None  # requested is not drained
    assert rig.refusals() == {"n3": "budget"}  # waiting for results lets nothing more through

    rig.result(first[0], "executed")
    rig.result(first[1], "rejected_unknown_node")
    rig.result(first[1], "executed", key=b"x" * 32)  # a result not signed with our key: ignored
    out = rig.decide(T0 + 10)
    assert [(m["action"], m["node"]) for m in out] == [("drain", "n3")]  # n2's slot, freed
    assert metric("fleetwatch_act_drain_budget_used") == 1 and metric("fleetwatch_act_drains_pending") == 1
    assert metric("fleetwatch_act_node_drained", node="n1") == 1
    assert rig.refusals() == {"n2": "adapter:rejected_unknown_node"}
    assert metric("fleetwatch_act_drains_refused_total", reason="adapter:rejected_unknown_node") >= 1
    assert rig.decide(T0 + 20) == []  # n2 is not asked again for the same findings


def test_a_drain_without_a_result_past_the_timeout_is_alerted_and_still_counts() -> None:
    rig = Rig({"n1", "n2"}, budget_min_nodes=1)
    assert [m["node"] for m in rig.feed(finding("n1", ts=T0), finding("n2", ts=T0 + 1))] == ["n1"]
    rig.decide(T0 + 200)
    assert "n1" not in rig.refusals() and metric("fleetwatch_act_drains_unconfirmed") == 0
    assert rig.decide(T0 + 301) == []  # the adapter may be down: n2 still waits for the budget
    assert rig.refusals() == {"n1": "adapter:no_result", "n2": "budget"}
    assert metric("fleetwatch_act_drains_unconfirmed") == 1 and rig.actor.last.drained == 1
