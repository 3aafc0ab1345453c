"""The drain-signing key never reaches a log line, even at debug level."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

from tests.helpers.paths import REPO


def test_act_never_logs_the_drain_key(kafka_bootstrap: str) -> None:
    key = f"KEY-{uuid.uuid4().hex}"
    env = {**os.environ, "FLEETWATCH_DRAIN_KEY": key}
    r = subprocess.run(
        [sys.executable, "-m", "fleetwatch.cli", "-v", "act", "--bootstrap", kafka_bootstrap, "--group",
         f"test-secret-{uuid.uuid4().hex[:6]}", "--alertmanager", "http://127.0.0.1:1", "--idle-exit", "3"],
        capture_output=True, text=True, timeout=120, cwd=REPO, env=env,
    )  # fmt: skip
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-2000:]
    assert len(out.splitlines()) > 50  # it really ran, and logged at debug level
    assert key not in out
    assert key[4:] not in out  # nor the hex part on its own
