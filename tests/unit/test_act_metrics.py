"""act's metrics are injected (alerts/act_metrics.py): an Actor and a ResultBook given none export
nothing and leave the global registry (what /metrics serves) alone; given a set made on a private
registry, their counts appear there under the names docs/contract.md lists."""

from __future__ import annotations

from typing import Any

from prometheus_client import REGISTRY, generate_latest

from fleetwatch.alerts import act_metrics
from tests.helpers.act import Rig
from tests.helpers.findings import T0, finding


def act_samples() -> list[str]:
    """The global registry's fleetwatch_act_* sample lines."""
    return [x for x in generate_latest(REGISTRY).decode().splitlines() if x.startswith("fleetwatch_act_")]


def run(rig: Rig) -> list[dict[str, Any]]:
    """Findings, a drain, a refusal, an executed result and one naming the wrong node."""
    out = rig.feed(finding("n1", ts=T0 - 200), finding("n2", ts=T0 - 100), finding("ghost", ts=T0 - 50))
    rig.result(out[0], "executed")
    rig.result(out[1], "executed", node="n1")  # answers n2's request about another node: ignored
    rig.decide(T0 + 10)
    return out


def test_an_actor_without_metrics_leaves_the_global_registry_alone() -> None:
    before = act_samples()
    rig = Rig({"n1", "n2"}, fleet_size=100, budget_min_nodes=5, metrics=False)
    out = run(rig)
    assert [m["node"] for m in out] == ["n1", "n2"] and rig.task.nodes["n1"].confirmed  # it did act
    assert rig.refusals() == {"ghost": "unknown_node"}
    assert act_samples() == before
    assert rig.metric("fleetwatch_act_findings_total", kind="xid", severity="critical") is None


def test_an_actor_with_a_private_registry_counts_there_only() -> None:
    before = act_samples()
    rig = Rig({"n1", "n2"}, fleet_size=100, budget_min_nodes=5)
    run(rig)
    f = finding("n1")
    assert rig.metric("fleetwatch_act_findings_total", kind=f["kind"], severity=f["severity"]) == 3
    assert rig.metric("fleetwatch_act_drain_requests_total", action="drain") == 2
    assert rig.metric("fleetwatch_act_drains_refused_total", reason="unknown_node") == 1
    assert rig.metric("fleetwatch_act_drain_results_total", action="drain", outcome="executed") == 1
    assert rig.metric("fleetwatch_act_drain_results_ignored_total", reason="wrong_node") == 1
    assert rig.metric("fleetwatch_act_node_drained", node="n1") == 1
    assert (
        rig.metric("fleetwatch_act_drain_budget_used") == 1
        and rig.metric("fleetwatch_act_drains_pending") == 1
    )
    assert rig.metric("fleetwatch_act_fleet_size") == 100 and rig.metric("fleetwatch_act_storm_active") == 0
    assert act_samples() == before


def test_the_command_exports_one_set_in_the_global_registry() -> None:
    """What `fleetwatch act` uses: made once per process, a second call returns the same set."""
    first = act_metrics.exported()
    assert act_metrics.exported() is first
    names = {m.name for m in REGISTRY.collect()}
    assert {
        "fleetwatch_act_findings",
        "fleetwatch_act_drain_budget_used",
        "fleetwatch_act_node_drained",
    } <= names
