"""docs/contract.md is the whole contract, and it keeps up with the code.

The repository holds its contract: no tracked file points outside it for the contract, and every
schema the decoder knows, every topic, every subcommand and every flag of it is written down, so
adding one without documenting it fails here (and so does a flag the contract names that the
command no longer has).
"""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
from pathlib import Path

import pytest

from fleetwatch import schemas, topics
from fleetwatch.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
CONTRACT = ROOT / "docs" / "contract.md"
# Built from parts so that this file does not match its own check.
OLD_CONTRACT = "DESIGN" + ".md"
OUTSIDE = re.compile(r"\.\./shared/[^\s`'\")]*", re.IGNORECASE)


def _contract() -> str:
    return CONTRACT.read_text(encoding="utf-8")


def _tracked_text_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True
    ).stdout.split(b"\0")
    files = []
    for name in listed:
        path = ROOT / name.decode()
        if name and path.is_file():
            files.append(path)
    return files


def _text(path: Path) -> str | None:
    raw = path.read_bytes()
    if b"\0" in raw[:8192]:
        return None  # binary
    return raw.decode("utf-8", "replace")


def outside_references(text: str) -> list[str]:
    """Lines of `text` that point outside the repository for the contract: the old design file
    anywhere, or a ../shared/ path on a line that speaks of the contract or the design (the
    shared data sets, ../shared/data/, are data, not contract)."""
    about_contract = re.compile(r"contract|design", re.IGNORECASE)
    return [
        line.strip()
        for line in text.splitlines()
        if OLD_CONTRACT.lower() in line.lower() or (OUTSIDE.search(line) and about_contract.search(line))
    ]


def test_the_checker_finds_references_outside_the_repository() -> None:
    assert outside_references(f"see ../shared/{OLD_CONTRACT}, section CLI")
    assert outside_references(f'"""Topic names ({OLD_CONTRACT}, "Data flow")."""')
    assert outside_references("the contract is in ../shared/contract.txt")
    assert not outside_references("ASD machines in `../shared/data/asd/` (19 metrics)")
    assert not outside_references("docs/contract.md, section 4.2")


def test_no_tracked_file_points_outside_the_repository_for_the_contract() -> None:
    here = Path(__file__).resolve()
    offenders = {}
    for path in _tracked_text_files():
        if path.resolve() == here:
            continue
        text = _text(path)
        if text is not None and (lines := outside_references(text)):
            offenders[str(path.relative_to(ROOT))] = lines[:3]
    assert not offenders, f"point to docs/contract.md instead: {offenders}"


def test_every_registered_schema_has_its_section() -> None:
    headings = [line for line in _contract().splitlines() if line.startswith("#")]
    assert len(schemas.VALIDATORS) >= 5
    missing = [s for s in schemas.VALIDATORS if not any(f"`{s}`" in h for h in headings)]
    assert not missing, f"schemas without a section in docs/contract.md: {missing}"


def test_every_topic_and_group_is_in_the_topics_table() -> None:
    text = _contract()
    rows = {m.group(1) for m in re.finditer(r"^\| `([a-z0-9_.-]+)` \|", text, re.MULTILINE)}
    missing = [t for t in topics.ALL if t not in rows]
    assert not missing, f"topics without a row in docs/contract.md: {missing}"
    for group in (topics.DETECT_GROUP, topics.ACT_GROUP):
        assert f"`{group}`" in text


def _help(argv: list[str]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        build_parser().parse_args([*argv, "--help"])
    return out.getvalue()


def subcommands() -> list[str]:
    """The subcommands, as the top-level --help lists them (four spaces in, under COMMAND)."""
    names = re.findall(r"^    ([a-z][a-z0-9-]*)(?:\s|$)", _help([]), re.MULTILINE)
    assert "detect" in names and "act" in names, names
    return names


def _section(text: str, command: str) -> str:
    """The command's section: from its heading to the next heading."""
    body = text.index("\n", text.index(f"#### `fleetwatch {command}`"))
    nxt = re.search(r"^#{1,4} ", text[body:], re.MULTILINE)
    return text[body : body + nxt.start()] if nxt else text[body:]


@pytest.mark.parametrize("command", subcommands())
def test_every_subcommand_and_its_flags_are_documented(command: str) -> None:
    text = _contract()
    assert f"#### `fleetwatch {command}`" in text, f"no section for `fleetwatch {command}`"
    section = _section(text, command)
    flags = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", _help([command]))) - {"--help"}
    documented = set(re.findall(r"^\| `(--[a-z][a-z0-9-]*)", section, re.MULTILINE))
    assert not flags - documented, f"fleetwatch {command}: flags missing from the contract"
    assert not documented - flags, f"fleetwatch {command}: the contract names flags it does not have"


METRIC_DEF = re.compile(
    r"\b(?:Counter|Gauge|Histogram|Summary|GaugeMetricFamily|CounterMetricFamily)\(\s*\"(fleetwatch_[a-z0-9_]+)\""
)
PACKAGE = ("fleetwatch", "collectors", "detectors", "pipeline", "alerts")


def test_every_exported_metric_is_in_the_contract() -> None:
    text = _contract()
    names = {
        m.group(1)
        for folder in PACKAGE
        for path in (ROOT / folder).rglob("*.py")
        for m in METRIC_DEF.finditer(path.read_text(encoding="utf-8"))
    }
    assert len(names) > 20, names  # the pattern still finds the definitions
    # prometheus_client exports a counter named without _total with the suffix
    missing = sorted(n for n in names if n not in text and f"{n}_total" not in text)
    assert not missing, f"metrics missing from docs/contract.md: {missing}"
