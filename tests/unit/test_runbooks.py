"""The runbooks (docs/runbooks/): every alert fleetwatch can raise has its page, titled by the alert,
every page has the five sections on-call reads, every link between pages resolves, and the index
lists every page and every alert beside its page. (The Prometheus rules' runbook_url and the base
their Prometheus sets: tests/unit/test_rule_runbooks.py.)

An alert's `runbook_url` is the runbook base + a page name (docs/runbooks/README.md); act serves
the folder flat at /runbooks/, so links must stay inside it to work there too."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
import yaml

from fleetwatch.alerts import alert_model, validation
from fleetwatch.alerts.alert_model import AlertBuilder
from fleetwatch.cli import build_parser
from tests.helpers.paths import REPO

RUNBOOKS = REPO / "docs" / "runbooks"
RULES = REPO / "services" / "prometheus" / "rules"
INDEX = RUNBOOKS / "README.md"
SECTIONS = (
    "What it means",
    "How sure we are, and why",
    "What to do",
    "When to escalate",
    "How to silence it",
)
# finding kinds with a page besides alert_model.ALERTNAMES' keys (the pre-resume validation)
EXTRA_KINDS = tuple(sorted(alert_model.DOCUMENTED_KINDS - set(alert_model.ALERTNAMES)))
# act's own alerts (and the generic finding alert) -> their pages, as act links them
ACT_PAGES: dict[str, str] = dict(alert_model.ACT_PAGES)
# [text](target) and [text](target "title"); images too
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def _pages() -> list[Path]:
    return sorted(p for p in RUNBOOKS.glob("*.md") if p != INDEX)


def _rule_alerts() -> list[str]:
    names: list[str] = []
    for f in sorted(RULES.glob("*.yml")):
        doc = yaml.safe_load(f.read_text()) or {}
        for group in doc.get("groups") or ():
            names += [r["alert"] for r in group.get("rules") or () if "alert" in r]
    return names


def _links(text: str) -> list[str]:
    return LINK.findall(FENCE.sub("", text))


def _relative(target: str) -> bool:
    return not re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) and not target.startswith(("#", "/"))


def test_every_finding_kind_has_a_page() -> None:
    kinds = [*alert_model.ALERTNAMES, *EXTRA_KINDS]
    missing = [k for k in kinds if not (RUNBOOKS / f"{k}.md").is_file()]
    assert not missing, f"finding kinds without docs/runbooks/<kind>.md: {missing}"


def test_acts_own_alerts_have_pages() -> None:
    missing = [p for p in ACT_PAGES.values() if not (RUNBOOKS / p).is_file()]
    assert not missing, f"missing: {missing}"
    # every alert act raises of its own, and the page it links
    assert ACT_PAGES[alert_model.VALIDATION_FAILED] == "validation.md"
    assert ACT_PAGES[alert_model.DRAINS_PAUSED] == "paused.md"
    ours = {
        alert_model.NODE_DRAINED,
        alert_model.DRAIN_REFUSED,
        alert_model.DRAIN_STORM,
        alert_model.DRAINS_PAUSED,
        alert_model.VALIDATION_FAILED,
        alert_model.GENERIC_ALERTNAME,
    }
    assert ours <= set(ACT_PAGES), f"act alerts without a page: {ours - set(ACT_PAGES)}"


def test_every_prometheus_rule_has_a_page() -> None:
    alerts = _rule_alerts()
    assert len(alerts) >= 5, f"no alert rules found under {RULES}"
    missing = [a for a in alerts if not (RUNBOOKS / f"{a}.md").is_file()]
    assert not missing, f"Prometheus alert rules without docs/runbooks/<alert>.md: {missing}"


def test_alert_models_own_page_names_exist() -> None:
    """What act really links to: alert_model's page of each kind and of its own alerts."""
    kinds = [*alert_model.ALERTNAMES, *EXTRA_KINDS, "a_kind_nobody_knows"]
    pages = {alert_model.runbook_page(k) for k in kinds} | set(ACT_PAGES.values())
    missing = sorted(p for p in pages if not (RUNBOOKS / p).is_file())
    assert not missing, f"alert_model links to pages that do not exist: {missing}"


def test_the_alerts_act_builds_link_their_pages() -> None:
    """The runbook_url of each alert as AlertBuilder builds it ends in the page documented for it."""
    b = AlertBuilder("c1", runbook_base="http://act.test:9110/runbooks/")
    built = {
        alert_model.NODE_DRAINED: b.node_drained("n1", "XID 79", ["f1"], False),
        alert_model.DRAIN_REFUSED: b.drain_refused("n1", "budget", "1 of 1", ["f1"]),
        alert_model.DRAIN_STORM: b.storm(("n1", "n2", "n3"), 3, 60.0, 3),
        alert_model.DRAINS_PAUSED: b.drains_paused("drains paused until ...", 2),
        alert_model.VALIDATION_FAILED: b.validation_failed(
            "n1", "dcgmi diag -r 1: memory failed on GPU 3", ["f1"]
        ),
    }
    for name, alert in built.items():
        assert alert["labels"]["alertname"] == name
        url = alert["annotations"]["runbook_url"]
        assert url == f"http://act.test:9110/runbooks/{ACT_PAGES[name]}", (name, url)
        assert (RUNBOOKS / ACT_PAGES[name]).is_file()


def _title(page: Path) -> str:
    return page.read_text().split("\n", 1)[0]


def _alert_pages() -> dict[str, str]:
    """Every alertname -> the page its runbook_url names."""
    pages = {name: f"{kind}.md" for kind, name in alert_model.ALERTNAMES.items()}
    pages |= ACT_PAGES
    pages |= {a: f"{a}.md" for a in _rule_alerts()}
    return pages


def test_every_page_is_titled_by_its_alert() -> None:
    """On-call arrives from an alert: the page's first line names that alert."""
    wrong = [
        f"{page}: {_title(RUNBOOKS / page)!r}"
        for name, page in sorted(_alert_pages().items())
        if not _title(RUNBOOKS / page).startswith(f"# {name}:")
    ]
    assert not wrong, f"pages not titled '# <alertname>: ...': {wrong}"


@pytest.mark.parametrize("page", _pages(), ids=lambda p: p.name)
def test_page_has_the_five_sections_in_order(page: Path) -> None:
    headings = [m.group(1).strip() for m in re.finditer(r"^## (.+)$", FENCE.sub("", page.read_text()), re.M)]
    found = [h for h in headings if h in SECTIONS]
    assert found == list(SECTIONS), f"{page.name}: sections {headings}, want {list(SECTIONS)} in order"


@pytest.mark.parametrize("page", [*_pages(), INDEX], ids=lambda p: p.name)
def test_relative_links_resolve_inside_the_folder(page: Path) -> None:
    bad = []
    for target in _links(page.read_text()):
        if not _relative(target):
            continue
        path = target.split("#", 1)[0]
        resolved = (page.parent / path).resolve()
        if resolved.parent != RUNBOOKS.resolve() or not resolved.is_file():
            bad.append(target)
    assert not bad, f"{page.name}: links that do not resolve to a page of docs/runbooks/: {bad}"


def test_the_index_lists_every_page() -> None:
    listed = {t.split("#", 1)[0] for t in _links(INDEX.read_text()) if _relative(t)}
    missing = sorted(p.name for p in _pages() if p.name not in listed)
    assert not missing, f"docs/runbooks/README.md does not list: {missing}"


def test_the_index_names_every_alert() -> None:
    text = INDEX.read_text()
    names = [*alert_model.ALERTNAMES.values(), *ACT_PAGES, *_rule_alerts()]
    missing = [n for n in names if f"`{n}`" not in text]
    assert not missing, f"docs/runbooks/README.md does not name: {missing}"


def test_the_index_lists_each_alert_beside_its_page() -> None:
    rows = {
        m.group(1): m.group(2)
        for m in re.finditer(r"^\| `(\w+)` \| \[[^\]]*\]\(([^)]+)\)", INDEX.read_text(), re.M)
    }
    wrong = {n: (rows.get(n), page) for n, page in _alert_pages().items() if rows.get(n) != page}
    assert not wrong, f"index rows (found, want): {wrong}"


# `--flags` the pages give to other tools: kafka-consumer-groups.sh / kafka-console-consumer.sh,
# amtool, srun, nvidia-smi, du, journalctl, squeue
FOREIGN_FLAGS = {
    "--alertmanager.url",
    "--bootstrap-server",
    "--comment",
    "--describe",
    "--disk-usage",
    "--exclusive",
    "--format",
    "--from-beginning",
    "--gres",
    "--list",
    "--max-depth",
    "--max-messages",
    "--members",
    "--property",
    "--query-gpu",
    "--reservation",
    "--since",
    "--state",
    "--version",
}


def test_every_flag_a_page_names_exists() -> None:
    """A page's flags are fleetwatch's own (of some subcommand: `fleetwatch <cmd> --help`) or a
    listed tool's: a made-up or renamed flag fails here, not at 3 am."""
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    ours = {flag for p in sub.choices.values() for flag in p._option_string_actions}
    unknown: dict[str, list[str]] = {}
    for page in [*_pages(), INDEX]:
        for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9.-]*[a-z0-9]", page.read_text()):
            if flag not in ours and flag not in FOREIGN_FLAGS:
                unknown.setdefault(flag, []).append(page.name)
    assert not unknown, f"flags no fleetwatch command has (or add the tool's to FOREIGN_FLAGS): {unknown}"


def test_the_validation_page_names_what_the_adapter_really_does() -> None:
    text = (RUNBOOKS / ACT_PAGES[alert_model.VALIDATION_FAILED]).read_text()
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    drainer = sub.choices["slurm-drainer"]._option_string_actions
    for flag in ("--validate", "--validate-level", "--validate-command", "--validate-timeout", "--dcgmi"):
        assert flag in drainer and f"`{flag}" in text, flag
    assert f"`{validation.RESERVATION_PREFIX}<node>`" in text
    assert f"({validation.ValidationSettings().timeout_s:.0f} s)" in text  # the default timeout
    assert "rejected_validation" in text and alert_model.VALIDATION_FAILED in text
