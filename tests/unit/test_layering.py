"""One import name, and dependencies that point one way (issue 17, item 1).

Everything installs under `fleetwatch.*` (pyproject's package-dir maps the repository's top-level
folders there), so nothing may import the folders by their own names: `pipeline` or `alerts` as
top-level modules would claim generic names in a user's environment, and one file imported under
two names runs twice (two sets of Prometheus metrics). And the layers: the node-side collectors and
the detectors know only fleetwatch's core (schemas, topics, Kafka helpers), the pipeline runs
detectors, the action layer runs on the pipeline's worker, and the CLI and the demo sit on top.
"""

from __future__ import annotations

import ast
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
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


def _python_files() -> list[Path]:
    skip = {"node_modules", ".git", ".fleetwatch", "__pycache__"}
    return [p for p in REPO.rglob("*.py") if not skip & set(p.relative_to(REPO).parts)]


def test_nothing_imports_the_folders_by_their_own_names() -> None:
    offenders = [
        f"{p.relative_to(REPO)}: {m}"
        for p in _python_files()
        for m in _imports(p)
        if m.split(".")[0] in FOLDERS
    ]
    assert offenders == []


@pytest.mark.parametrize("part", [*FOLDERS, "core"])
def test_each_part_imports_only_the_layers_below_it(part: str) -> None:
    files = (REPO / "fleetwatch").glob("*.py") if part == "core" else (REPO / part).rglob("*.py")
    offenders = []
    for p in files:
        rel = str(p.relative_to(REPO))
        if rel in TOP:
            continue
        for m in _imports(p):
            parts = m.split(".")
            if parts[0] != "fleetwatch" or len(parts) < 2 or parts[1] not in FOLDERS:
                continue
            if parts[1] != part and parts[1] not in ALLOWED[part]:
                offenders.append(f"{rel}: {m}")
    assert offenders == []


def test_the_packages_install_under_one_name() -> None:
    import fleetwatch.alerts.policy
    import fleetwatch.collectors.sim
    import fleetwatch.pipeline.worker

    assert Path(fleetwatch.pipeline.worker.__file__).parent == REPO / "pipeline"
    assert Path(fleetwatch.alerts.policy.__file__).parent == REPO / "alerts"
    assert (Path(fleetwatch.collectors.sim.__file__).parent / "scenarios" / "default.yaml").is_file()
