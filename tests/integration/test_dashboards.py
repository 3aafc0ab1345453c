"""The Grafana dashboards (dashboards/json/) type-check against @grafana/schema, with the real
TypeScript compiler under Node.js (dashboards/typecheck.mjs; its npm packages installed by
scripts/install.sh), and the check bites on broken JSON. The checks without Node.js are in
tests/unit/test_dashboards.py."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers.promql import (
    DASH_DIR,
    JSON_DIR,
)


def _typecheck(src: Path) -> subprocess.CompletedProcess[str]:
    node = shutil.which("node")
    if node is None:
        pytest.fail("node not found: the dashboard type check needs Node.js (apt-get install nodejs npm)")
    if not (DASH_DIR / "node_modules" / "@grafana" / "schema").is_dir():
        pytest.fail(
            "dashboards/node_modules missing: run (cd dashboards && npm ci), as scripts/install.sh does"
        )
    return subprocess.run(
        [node, str(DASH_DIR / "typecheck.mjs"), str(src)], capture_output=True, text=True, timeout=120
    )


def test_dashboards_typecheck_against_grafana_schema(tmp_path: Path) -> None:
    r = _typecheck(JSON_DIR)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"{len(list(JSON_DIR.glob('*.json')))} dashboards" in r.stdout
    # ... and the check bites: a wrong type, a misspelt field and a bad enum value are all errors.
    d = json.loads((JSON_DIR / "pipeline-health.json").read_text())
    d["panels"][1]["gridPos"]["w"] = "8"
    d["panels"][2]["tragets"] = d["panels"][2].pop("targets")
    d["panels"][3]["fieldConfig"]["defaults"]["color"]["mode"] = "rainbow"
    (tmp_path / "broken.json").write_text(json.dumps(d, indent=2))
    r = _typecheck(tmp_path)
    assert r.returncode != 0
    out = r.stdout + r.stderr
    assert "Type 'string' is not assignable to type 'number'" in out, out
    assert "'\"tragets\"' does not exist" in out, out
    assert '"rainbow"' in out, out
