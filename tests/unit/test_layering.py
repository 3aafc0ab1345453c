"""One import name, and dependencies that point one way (issue 17, item 1).

Everything installs under `fleetwatch.*` (pyproject's package-dir maps the repository's top-level
folders there), so nothing may import the folders by their own names: `pipeline` or `alerts` as
top-level modules would claim generic names in a user's environment, and one file imported under
two names runs twice (two sets of Prometheus metrics). And the layers: the node-side collectors and
the detectors know only fleetwatch's core (schemas, topics, the bus), the pipeline runs detectors,
the action layer runs on the pipeline's worker, and the CLI and the demo sit on top.

Every package folder is checked at every depth (issue 24, item 7: the core's sub-packages such as
fleetwatch/bus/ were once skipped), and imports inside functions count as much as those at the top.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

from tests.helpers.paths import REPO

FOLDERS = ("collectors", "pipeline", "detectors", "alerts")
# what each part may import besides fleetwatch's core and itself
ALLOWED = {
    "collectors": set(),
    "detectors": set(),
    "pipeline": {"detectors", "collectors"},  # `fleetwatch eval` runs the simulator
    "alerts": {"pipeline", "detectors"},
    "core": set(),
}
TOP = {"fleetwatch/cli.py", "fleetwatch/demo.py", "fleetwatch/demo_plot.py"}  # may import anything


def _imports(path: Path) -> set[str]:
    """Every module a file imports, anywhere in it; `from fleetwatch import pipeline` counts as
    fleetwatch.pipeline."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            if node.module == "fleetwatch":
                found.update(f"fleetwatch.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


def _python_files() -> list[Path]:
    skip = {"node_modules", ".git", ".fleetwatch", "__pycache__"}
    return [p for p in REPO.rglob("*.py") if not skip & set(p.relative_to(REPO).parts)]


def _part_files(root: Path, part: str) -> list[Path]:
    """A part's modules at every depth: the core is fleetwatch/ with its sub-packages (bus/, ...)."""
    return sorted((root / ("fleetwatch" if part == "core" else part)).rglob("*.py"))


def _offenders(root: Path, part: str) -> list[str]:
    offenders = []
    for p in _part_files(root, part):
        rel = p.relative_to(root).as_posix()
        if rel in TOP:
            continue
        for m in sorted(_imports(p)):
            parts = m.split(".")
            if parts[0] != "fleetwatch" or len(parts) < 2 or parts[1] not in FOLDERS:
                continue
            if parts[1] != part and parts[1] not in ALLOWED[part]:
                offenders.append(f"{rel}: {m}")
    return offenders


def test_nothing_imports_the_folders_by_their_own_names() -> None:
    offenders = [
        f"{p.relative_to(REPO)}: {m}"
        for p in _python_files()
        for m in _imports(p)
        if m.split(".")[0] in FOLDERS
    ]
    assert offenders == []


def test_the_layers_cover_every_package_folder() -> None:
    """A package folder added to pyproject without a layer here would go unchecked."""
    package_dir = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    # docs/runbooks is data (the pages act serves, fleetwatch/runbooks.py), no code to layer
    data = {"fleetwatch.runbook_pages": "docs/runbooks"}
    assert package_dir == {"fleetwatch": "fleetwatch", **{f"fleetwatch.{f}": f for f in FOLDERS}, **data}
    assert not list((REPO / "docs" / "runbooks").glob("*.py"))
    assert set(ALLOWED) == {*FOLDERS, "core"}


@pytest.mark.parametrize("part", [*FOLDERS, "core"])
def test_each_part_imports_only_the_layers_below_it(part: str) -> None:
    assert _part_files(REPO, part)
    assert _offenders(REPO, part) == []


def test_an_upward_import_is_found_at_any_depth(tmp_path: Path) -> None:
    """The checker itself: a core sub-package or a nested collector that reaches up is named, in
    either import form and inside a function, and an import of the layers below is not."""
    files = {
        "fleetwatch/bus/deep/client.py": "def f():\n    from fleetwatch.pipeline import worker\n",
        "fleetwatch/bus/other.py": "from fleetwatch import alerts\nfrom fleetwatch import schemas\n",
        "collectors/sim/nested/gen.py": "import fleetwatch.detectors.batch\n",
        "alerts/sub/ok.py": "from fleetwatch.pipeline import worker\nimport fleetwatch.detectors.batch\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert _offenders(tmp_path, "core") == [
        "fleetwatch/bus/deep/client.py: fleetwatch.pipeline",
        "fleetwatch/bus/other.py: fleetwatch.alerts",
    ]
    assert _offenders(tmp_path, "collectors") == ["collectors/sim/nested/gen.py: fleetwatch.detectors.batch"]
    assert _offenders(tmp_path, "alerts") == []


def test_the_packages_install_under_one_name() -> None:
    import fleetwatch.alerts.policy
    import fleetwatch.collectors.sim
    import fleetwatch.pipeline.worker

    assert Path(fleetwatch.pipeline.worker.__file__).parent == REPO / "pipeline"
    assert Path(fleetwatch.alerts.policy.__file__).parent == REPO / "alerts"
    assert (Path(fleetwatch.collectors.sim.__file__).parent / "scenarios" / "default.yaml").is_file()
