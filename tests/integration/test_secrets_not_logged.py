"""The signing keys never reach a log line, even at debug level: act's drain and census keys, and
the census key detect signs with (issue 23, item 9)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

from tests.helpers.paths import REPO
from tests.integration.services import APART

pytestmark = APART  # (balance, scripts/test.sh: the Slurm process, with the ACL test, was the longest)


def run_cli(env: dict[str, str], *argv: str) -> str:
    r = subprocess.run(
        [sys.executable, "-m", "fleetwatch.cli", "-v", *argv], capture_output=True, text=True, timeout=180,
        cwd=REPO, env=env,
    )  # fmt: skip
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-2000:]
    # it really ran, at debug level: the settings it ran with are logged, and the worker got its share
    assert f"DEBUG fleetwatch: {argv[0]}: {{" in out, out[-2000:]
    assert "assigned [" in out, out[-2000:]
    return out


def test_act_never_logs_the_drain_key(kafka_bootstrap: str) -> None:
    key, census_key = f"KEY-{uuid.uuid4().hex}", f"CENSUS-{uuid.uuid4().hex}"
    env = {**os.environ, "FLEETWATCH_DRAIN_KEY": key, "FLEETWATCH_CENSUS_KEY": census_key}
    group = f"test-secret-{uuid.uuid4().hex[:6]}"
    out = run_cli(env, "act", "--bootstrap", kafka_bootstrap, "--group", group,
                  "--alertmanager", "http://127.0.0.1:1", "--idle-exit", "3")  # fmt: skip
    assert key not in out
    assert key[4:] not in out  # nor the hex part on its own
    assert census_key not in out and census_key[7:] not in out


def test_detect_never_logs_the_census_key(kafka_bootstrap: str) -> None:
    census_key = f"CENSUS-{uuid.uuid4().hex}"
    env = {**os.environ, "FLEETWATCH_CENSUS_KEY": census_key}
    group = f"test-secret-{uuid.uuid4().hex[:6]}"
    out = run_cli(env, "detect", "--bootstrap", kafka_bootstrap, "--group", group,
                  "--start-at", "latest", "--metrics-port", "0", "--idle-exit", "3")  # fmt: skip
    assert census_key not in out and census_key[7:] not in out


def test_detect_and_act_refuse_to_start_without_a_census_key(kafka_bootstrap: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "FLEETWATCH_CENSUS_KEY"}
    env["FLEETWATCH_DRAIN_KEY"] = f"KEY-{uuid.uuid4().hex}"
    for argv in (["detect"], ["act", "--alertmanager", "http://127.0.0.1:1"]):
        r = subprocess.run(
            [sys.executable, "-m", "fleetwatch.cli", *argv, "--bootstrap", kafka_bootstrap],
            capture_output=True, text=True, timeout=120, cwd=REPO, env=env,
        )  # fmt: skip
        assert r.returncode == 2 and "FLEETWATCH_CENSUS_KEY" in r.stderr, (argv, r.stderr[-2000:])
        assert "Traceback" not in r.stderr
