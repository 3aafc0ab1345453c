"""`fleetwatch demo`, the README's first command, end to end (its own fresh broker, the real
Alertmanager, detect/act/simulate as processes), on a shortened run of the demo scenario."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO


def test_demo_runs_and_writes_its_scorecard_and_picture(kafka_bootstrap: str) -> None:
    out = REPO / ".fleetwatch" / "demo"
    for f in ("scorecard.json", "fleet.png"):
        (out / f).unlink(missing_ok=True)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "fleetwatch.cli",
            "demo",
            "--duration",
            "100",
            "--speed",
            "25",
            "--settle",
            "4",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "INJECT" in r.stdout and "CRITICAL" in r.stdout and "scorecard" in r.stdout, r.stdout[-4000:]
    card = json.loads((out / "scorecard.json").read_text())
    sudden = [k for k in card["per_fault_kind"].values() if k["category"] == "sudden"]
    assert sudden and all(k["recall"] == 1.0 for k in sudden)
    assert card["false_findings_on_healthy_nodes"] == 0
    png = (out / "fleet.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    assert "DRAIN" in r.stdout  # the action layer asked for at least one drain
