"""Real services for the action layer's tests: Alertmanager (services/alertmanager/alertmanager.sh)
and Slurm (services/slurm/slurm.sh). Fixtures fail loudly when a service cannot start: these
tests are about the real thing, so there is nothing to skip to. Other test modules import the
fixtures and helpers from here."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO

AM_SH = REPO / "services" / "alertmanager" / "alertmanager.sh"
SLURM_SH = REPO / "services" / "slurm" / "slurm.sh"
AM_PORT = int(os.environ.get("FLEETWATCH_TEST_AM_PORT", "19094"))
SLURM_NODES = [f"gpu-node-{i:02d}" for i in range(1, 5)]


def service(script: Path, verb: str, **env: str) -> str:
    r = subprocess.run(
        ["bash", str(script), verb], env={**os.environ, **env}, capture_output=True, text=True, timeout=60
    )
    if r.returncode != 0:
        pytest.fail(f"{script.name} {verb} failed (rc {r.returncode}): {r.stderr.strip()[-2000:]}")
    return r.stdout


class Alertmanager:
    """An Alertmanager on a loopback port, started (or reused) with alertmanager.sh."""

    def __init__(self, port: int, config: Path | None = None) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.env = {"ALERTMANAGER_PORT": str(port)}
        if config is not None:
            self.env["ALERTMANAGER_CONFIG"] = str(config)

    def start(self) -> None:
        service(AM_SH, "start", **self.env)

    def stop(self) -> None:
        service(AM_SH, "stop", **self.env)

    def alerts(self, **labels: str) -> list[dict[str, Any]]:
        """GET /api/v2/alerts?filter=k="v"... (active, silenced and inhibited ones; not resolved)."""
        q = urllib.parse.urlencode([("filter", f'{k}="{v}"') for k, v in labels.items()])
        with urllib.request.urlopen(f"{self.url}/api/v2/alerts?{q}", timeout=5) as r:
            return json.load(r)

    def wait_for(
        self, until: Callable[[list[dict[str, Any]]], bool], timeout_s: float = 20.0, **labels: str
    ) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout_s
        got = self.alerts(**labels)
        while not until(got) and time.monotonic() < deadline:
            time.sleep(0.1)
            got = self.alerts(**labels)
        return got


@pytest.fixture(scope="session")
def alertmanager() -> Alertmanager:
    """The shared test Alertmanager, running the shipped alertmanager.yml."""
    am = Alertmanager(AM_PORT)
    am.start()
    return am


@pytest.fixture
def cluster() -> str:
    """A cluster label of this test's own: the shared Alertmanager holds other tests' alerts too."""
    return f"t-{uuid.uuid4().hex[:10]}"


class Slurm:
    def __init__(self, conf: str) -> None:
        self.conf = conf
        self.env = {**os.environ, "SLURM_CONF": conf}

    def state(self, node: str) -> tuple[str, str]:
        """(state, reason) as sinfo -h -N -n NODE -o '%T|%E' prints them."""
        r = subprocess.run(
            ["sinfo", "-h", "-N", "-n", node, "-o", "%T|%E"],
            env=self.env,
            capture_output=True,
            text=True,
            check=True,
        )
        state, _, reason = r.stdout.strip().partition("|")
        return state, reason

    def reset(self, *nodes: str) -> None:
        """Put nodes back to service (a test may leave them drained)."""
        for n in nodes:
            subprocess.run(
                ["scontrol", "update", f"NodeName={n}", "State=RESUME"],
                env=self.env,
                capture_output=True,
                check=False,
            )


@pytest.fixture(scope="session")
def slurm() -> Iterator[Slurm]:
    service(SLURM_SH, "start")
    conf = service(SLURM_SH, "env").strip().partition("=")[2]
    s = Slurm(conf)
    s.reset(*SLURM_NODES)
    yield s
    s.reset(*SLURM_NODES)


def test_service_scripts_are_idempotent(alertmanager: Alertmanager, slurm: Slurm) -> None:
    alertmanager.start()  # a second start reuses the running instance
    service(AM_SH, "status", **alertmanager.env)
    service(SLURM_SH, "start")
    service(SLURM_SH, "status")
    assert alertmanager.alerts(cluster="nobody") == []
    assert {slurm.state(n)[0].rstrip("*") for n in SLURM_NODES} <= {"idle", "drained"}
