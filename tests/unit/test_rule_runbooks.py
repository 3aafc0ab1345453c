"""The Prometheus rules link their runbooks: every rule of services/prometheus/rules/ has a
runbook_url annotation = the external label `runbook_base` + `<its alert name>.md`, a page of
docs/runbooks/ that act serves; both Prometheus configurations of the repository set that label to
the /runbooks/ of the act their stack runs, and keep it out of the labels of the alerts they send.

promtool renders the template itself in tests/integration/test_prometheus_rules.py (the rule unit
tests set external_labels and expect the rendered URL); this file reads the YAML only."""

from __future__ import annotations

import re
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetwatch import runbooks
from fleetwatch.demo import ACT_METRICS
from tests.helpers.paths import REPO
from tests.helpers.promql import RULES, rules

RUNBOOKS = REPO / "docs" / "runbooks"
PROM_DIR = REPO / "services" / "prometheus"
CONFIGS = {
    "local": PROM_DIR / "prometheus.yml",
    "compose": PROM_DIR / "prometheus-compose.yml",
}
RULE_TESTS = RULES.parent / "tests" / "fleetwatch-pipeline_test.yml"
TEMPLATE = "{{ $externalLabels.runbook_base }}"
LABEL = "runbook_base"


def _config(which: str) -> dict[str, Any]:
    return yaml.safe_load(CONFIGS[which].read_text())


def _base(which: str) -> str:
    return str(_config(which)["global"]["external_labels"][LABEL])


def test_every_rule_links_its_own_page() -> None:
    served = runbooks.pages(RUNBOOKS)  # what act's /runbooks/ serves from this folder
    wrong = {}
    for rule in rules():
        name = rule["alert"]
        url = (rule.get("annotations") or {}).get("runbook_url")
        if url != f"{TEMPLATE}{name}.md":
            wrong[name] = url
        elif f"{name}.md" not in served:
            wrong[name] = f"{url} (act serves no page {name}.md from docs/runbooks/)"
    assert rules() and not wrong, f"rules whose runbook_url is not {TEMPLATE}<alert>.md: {wrong}"


@pytest.mark.parametrize("which", sorted(CONFIGS))
def test_the_configs_set_a_runbook_base(which: str) -> None:
    base = _base(which)
    url = urllib.parse.urlsplit(base)
    assert url.scheme in ("http", "https") and url.hostname, base
    assert base.endswith(runbooks.PREFIX) and url.path == runbooks.PREFIX, base
    assert not url.query and not url.fragment, base


@pytest.mark.parametrize("which", sorted(CONFIGS))
def test_the_base_is_not_sent_as_an_alert_label(which: str) -> None:
    """Prometheus adds external labels to every alert it sends, before alert_relabel_configs: the
    base would otherwise be part of every alert's identity (a new base would resolve and re-fire
    them all). It must not drop anything else, `cluster` above all (routes and inhibitions)."""
    relabel = _config(which)["alerting"].get("alert_relabel_configs") or []
    drops = [r for r in relabel if r.get("action") == "labeldrop"]
    assert any(re.fullmatch(r["regex"], LABEL) for r in drops), relabel
    for kept in ("cluster", "severity", "alertname", "node", "component", "runbook_url"):
        assert not any(re.fullmatch(r["regex"], kept) for r in drops), kept


def test_the_local_base_is_the_demo_acts() -> None:
    """services/prometheus/prometheus.sh serves the demo and local runs: their act serves its pages
    on loopback at the metrics port (fleetwatch/demo.py); act's own default base is the same URL."""
    url = urllib.parse.urlsplit(_base("local"))
    assert (url.hostname, url.port) == ("127.0.0.1", ACT_METRICS)
    assert _base("local") == runbooks.default_base(ACT_METRICS, "127.0.0.1")


def test_the_compose_base_is_the_compose_acts_port() -> None:
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    cmd = [str(a) for a in compose["services"]["act"]["command"]]
    port = int(cmd[cmd.index("--metrics-port") + 1])
    url = urllib.parse.urlsplit(_base("compose"))
    # on the Docker host's loopback, where a browser opening the alert reaches it (docker-compose.yml
    # publishes every UI there)
    assert (url.hostname, url.port) == ("127.0.0.1", port)


def test_the_rule_unit_tests_expect_the_rendered_link() -> None:
    """Every test group of the promtool unit tests sets the label, and every alert it expects has
    the URL rendered from it (promtool compares annotations exactly, so a rule without its link
    fails there too)."""
    doc = yaml.safe_load(RULE_TESTS.read_text())
    checked = 0
    for group in doc["tests"]:
        base = (group.get("external_labels") or {}).get(LABEL)
        assert base and base.endswith(runbooks.PREFIX), group.get("external_labels")
        for case in group.get("alert_rule_test") or ():
            for exp in case.get("exp_alerts") or ():
                assert exp["exp_annotations"]["runbook_url"] == f"{base}{case['alertname']}.md"
                checked += 1
    assert checked >= len(rules())


def test_the_promtool_tests_load_the_rules_file() -> None:
    doc = yaml.safe_load(RULE_TESTS.read_text())
    assert [Path(RULE_TESTS.parent, f).resolve() for f in doc["rule_files"]] == [RULES.resolve()]
