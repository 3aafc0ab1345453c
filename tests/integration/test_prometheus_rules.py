"""The pipeline's own alert rules (services/prometheus/rules/fleetwatch-pipeline.yml), checked with
the real promtool (Debian package `prometheus`): `promtool check rules`, the unit tests under
rules/tests/ with `promtool test rules`, and that the checks fail when they should. What the
rules name, read as YAML, is checked in tests/unit/test_prometheus_rules.py."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.helpers.paths import REPO
from tests.helpers.promql import RULES, rules

PROM_DIR = REPO / "services" / "prometheus"
RULE_TESTS = PROM_DIR / "rules" / "tests" / "fleetwatch-pipeline_test.yml"


def promtool(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("promtool")
    if binary is None:
        pytest.fail("promtool not found: apt-get install prometheus (scripts/install.sh installs it)")
    return subprocess.run([binary, *args], capture_output=True, text=True, cwd=cwd, timeout=60)


def test_rules_pass_promtool_check() -> None:
    r = promtool("check", "rules", str(RULES))
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"SUCCESS: {len(rules())} rules found" in r.stdout, r.stdout


def test_rule_unit_tests_pass_and_cover_every_alert() -> None:
    r = promtool("test", "rules", RULE_TESTS.name, cwd=RULE_TESTS.parent)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout
    # Every alert has at least one case where it is expected to fire.
    doc = yaml.safe_load(RULE_TESTS.read_text())
    fired = {
        case["alertname"]
        for t in doc["tests"]
        for case in t.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    assert {r["alert"] for r in rules()} <= fired, (
        f"no firing test for { ({r['alert'] for r in rules()} - fired) }"
    )


def test_promtool_rejects_broken_rules_and_wrong_expectations(tmp_path: Path) -> None:
    # Bad PromQL in a copy of the rules: check rules must fail.
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "tests").mkdir()
    text = RULES.read_text()
    broken = text.replace('expr: up{job=~"fleetwatch-.*"} == 0', 'expr: up{job=~"fleetwatch-.*" == 0', 1)
    assert broken != text
    (tmp_path / "rules" / "fleetwatch-pipeline.yml").write_text(broken)
    r = promtool("check", "rules", str(tmp_path / "rules" / "fleetwatch-pipeline.yml"))
    assert r.returncode != 0 and "FAILED" in r.stdout + r.stderr
    # The intact rules against a test expecting the wrong severity: test rules must fail.
    (tmp_path / "rules" / "fleetwatch-pipeline.yml").write_text(text)
    tests_text = RULE_TESTS.read_text()
    wrong = re.sub(r"(job: fleetwatch-detect\n\s+instance: w1:9108\n\s+cluster: c1\n\s+severity:) warning",
                   r"\1 critical", tests_text, count=1)  # fmt: skip
    assert wrong != tests_text
    (tmp_path / "rules" / "tests" / RULE_TESTS.name).write_text(wrong)
    r = promtool("test", "rules", RULE_TESTS.name, cwd=tmp_path / "rules" / "tests")
    assert r.returncode != 0 and "FleetwatchTargetDown" in r.stdout + r.stderr


def test_local_prometheus_config_is_valid() -> None:
    r = promtool("check", "config", "prometheus.yml", cwd=PROM_DIR)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS: 1 rule files found" in r.stdout + r.stderr
