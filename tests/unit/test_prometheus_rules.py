"""The pipeline's own alert rules (services/prometheus/rules/fleetwatch-pipeline.yml) read as
YAML: every required alert is there, routes by severity, and names only metrics the code defines.
The checks with the real promtool are in tests/integration/test_prometheus_rules.py."""

from __future__ import annotations

from tests.helpers.promql import PROMETHEUS_BUILTINS, exported_names, metric_names, rules

REQUIRED_ALERTS = {
    "FleetwatchTargetDown",  # worker down
    "FleetwatchConsumerLagGrowing",
    "FleetwatchDeadLetters",
    "FleetwatchAgentSpoolDropping",
    "FleetwatchNoTelemetryProcessed",
}


def test_rules_cover_the_pipeline_and_route() -> None:
    alerts = {r["alert"]: r for r in rules()}
    assert set(alerts) >= REQUIRED_ALERTS, f"missing {REQUIRED_ALERTS - set(alerts)}"
    defined = exported_names()
    for name, rule in alerts.items():
        # Alertmanager (services/alertmanager/alertmanager.yml) routes on severity.
        assert rule["labels"]["severity"] in {"critical", "warning"}, name
        assert rule["labels"]["component"] == "fleetwatch-pipeline", name
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], name
        # A rule over a misspelt metric never fires and nobody notices: names must be the code's.
        unknown = metric_names(rule["expr"]) - set(defined) - PROMETHEUS_BUILTINS
        assert not unknown, f"{name} uses metrics no fleetwatch code defines: {unknown}"
