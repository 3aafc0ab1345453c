"""The runbooks (docs/runbooks/): every alert fleetwatch can raise has its page, every page has the
five sections on-call reads, every link between pages resolves, and the index lists every page.

An alert's `runbook_url` is the runbook base + a page name (docs/runbooks/README.md); act serves
the folder flat at /runbooks/, so links must stay inside it to work there too."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from fleetwatch.alerts import alert_model
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
# finding kinds with a page besides alert_model.ALERTNAMES' keys: the pre-resume validation
EXTRA_KINDS = ("validation",)
# act's own alerts and the generic finding alert
ACT_PAGES = ("finding.md", "drain.md", "drain-refused.md", "storm.md", "paused.md")
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
    missing = [p for p in ACT_PAGES if not (RUNBOOKS / p).is_file()]
    assert not missing, f"missing: {missing}"


def test_every_prometheus_rule_has_a_page() -> None:
    alerts = _rule_alerts()
    assert len(alerts) >= 5, f"no alert rules found under {RULES}"
    missing = [a for a in alerts if not (RUNBOOKS / f"{a}.md").is_file()]
    assert not missing, f"Prometheus alert rules without docs/runbooks/<alert>.md: {missing}"


def test_alert_models_own_page_names_exist() -> None:
    """What act really links to: alert_model's page of each kind and of its own alerts, where this
    release of alert_model names them (runbook_page, ACT_PAGES)."""
    page_of = getattr(alert_model, "runbook_page", None)
    act_pages = getattr(alert_model, "ACT_PAGES", None)
    if page_of is None or act_pages is None:
        pytest.skip("alert_model names no runbook pages yet (runbook_page, ACT_PAGES)")
    pages = {page_of(k) for k in [*alert_model.ALERTNAMES, *EXTRA_KINDS, "a_kind_nobody_knows"]}
    pages |= set(act_pages.values())
    missing = sorted(p for p in pages if not (RUNBOOKS / p).is_file())
    assert not missing, f"alert_model links to pages that do not exist: {missing}"


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
    names = [
        *alert_model.ALERTNAMES.values(),
        alert_model.GENERIC_ALERTNAME,
        alert_model.NODE_DRAINED,
        alert_model.DRAIN_REFUSED,
        alert_model.DRAIN_STORM,
        "FleetwatchDrainsPaused",
        *_rule_alerts(),
    ]
    missing = [n for n in names if f"`{n}`" not in text]
    assert not missing, f"docs/runbooks/README.md does not name: {missing}"
