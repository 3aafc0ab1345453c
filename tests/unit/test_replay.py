"""`fleetwatch replay`'s one-line errors, with no broker to reach: a missing file, an unreachable
broker. Against the real broker: tests/integration/test_replay.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from fleetwatch import schemas
from tests.helpers.messages import telemetry
from tests.helpers.paths import REPO


def test_replay_missing_file_is_one_line_error() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "fleetwatch.cli", "replay", "/nonexistent.jsonl"],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=REPO,
    )
    assert r.returncode == 2
    assert r.stderr.strip() == "fleetwatch replay: no such file: /nonexistent.jsonl"


def test_unreachable_broker_is_one_line_error(tmp_path: Path) -> None:
    f = tmp_path / "x.jsonl"
    f.write_bytes(schemas.encode(telemetry()) + b"\n")
    r = subprocess.run(
        [sys.executable, "-m", "fleetwatch.cli", "replay", str(f), "--bootstrap", "127.0.0.1:1"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env={**os.environ, "FLEETWATCH_CONNECT_TIMEOUT_S": "2"},
    )
    assert r.returncode == 3
    assert (
        r.stderr.strip()
        .splitlines()[-1]
        .startswith("fleetwatch replay: no Kafka broker answered at 127.0.0.1:1")
    )
