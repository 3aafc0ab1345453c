"""act's metrics are injected (alerts/act_metrics.py): an Actor and a ResultBook given none export
nothing and leave the global registry (what /metrics serves) alone; given a set made on a private
registry, their counts appear there under the names docs/contract.md lists."""

from __future__ import annotations

from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, generate_latest

from fleetwatch import schemas
from fleetwatch.alerts import act_metrics
from fleetwatch.alerts.act_metrics import ActMetrics
from fleetwatch.alerts.alert_model import AlertBook, AlertBuilder
from fleetwatch.alerts.alertmanager import AlertmanagerClient, AlertMetrics, AlertSender, Dispatcher
from fleetwatch.census import Census, CensusConfig, CensusMetrics, export_metrics, node_message
from fleetwatch.signing import signed
from tests.helpers.act import Rig
from tests.helpers.findings import T0, finding

CENSUS_KEY = b"test-census-key-0123456789abcdef"


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


def send_and_count(alerts: AlertMetrics | None, census_metrics: CensusMetrics | None) -> None:
    """act's alert sender and dispatcher post one alert to an Alertmanager that is not there, and its
    census applies a verified record and a malformed one."""
    book = AlertBook()
    f = finding("n1")
    labels, annotations = AlertBuilder("test").from_finding(f, None)
    book.fire(f["id"], labels, annotations, T0)
    client = AlertmanagerClient("http://127.0.0.1:9", timeout_s=1, retries=0)  # nothing listens there
    sender = AlertSender(client, clock=lambda: T0 + 1, start=False, metrics=alerts)
    sender.flush([book])
    assert sender.post_next() == 1 and not sender.flush([book])  # unavailable: buffered
    assert not Dispatcher(client, clock=lambda: T0 + 1, metrics=alerts).flush([book])
    census = Census(CENSUS_KEY, CensusConfig(warm_up_s=0.0), census_metrics)
    m = node_message("n1", T0 - 60, T0, steady_since=T0 - 60, seen_at=T0)
    census.apply(b"n1", schemas.encode(signed(m, CENSUS_KEY)))
    census.apply(b"n2", b"not a node record")
    export_metrics(census, lambda: T0)
    assert census.fleet_size() == 1 and census.refused() == {"malformed": 1}


def test_alerts_and_census_without_metrics_leave_the_global_registry_alone() -> None:
    before = act_samples()
    send_and_count(None, None)
    assert act_samples() == before


def test_alerts_and_census_count_in_acts_private_registry() -> None:
    before = act_samples()
    registry = CollectorRegistry()
    metrics = ActMetrics(registry)
    send_and_count(metrics.alerts, metrics.census)

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    assert value("fleetwatch_act_alerts_failed_total") == 2  # the sender's post and the dispatcher's
    assert value("fleetwatch_act_alerts_active") == 1 and value("fleetwatch_act_alerts_pending") == 1
    assert value("fleetwatch_act_alerts_sent_total") == 0
    assert value("fleetwatch_alerts_rejected_total", reason="other") == 0  # exported at 0 from the start
    assert value("fleetwatch_act_census_new_nodes_total") == 1
    assert value("fleetwatch_act_census_refused_total", reason="malformed") == 1
    assert value("fleetwatch_act_census_refused_total", reason="stale") == 0
    assert value("fleetwatch_act_census_nodes", warmth="warm") == 1
    assert value("fleetwatch_act_census_nodes", warmth="cold") == 0
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
