"""The systemd units of services/systemd/: systemd's own checker accepts them (`systemd-analyze
verify`), each keeps the hardening and restart policy chosen for its part (services/systemd/
README.md), every flag its ExecStart passes is a flag of that subcommand and parses, keys reach
the services as systemd credentials, state lives in directories systemd makes, and each unit's
environment file has an example. `systemd-analyze security --offline=yes` rates each unit's
exposure, which must stay under the bound measured for it.

systemd-analyze comes with Debian's `systemd` package (scripts/install.sh installs it); a machine
without it fails these tests rather than skipping them.
"""

from __future__ import annotations

import argparse
import inspect
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from fleetwatch.bus.config import connect_timeout_s
from fleetwatch.cli import build_parser
from tests.helpers.paths import REPO

UNIT_DIR = REPO / "services" / "systemd"
ENV_DIR = UNIT_DIR / "env"
CONTRACT = REPO / "docs" / "contract.md"
INSTALLED = "/usr/local/bin/fleetwatch"  # where the units expect the console script
KEY_DIR = "/etc/fleetwatch/keys"
INSTANCE = "9108"  # the detect template is checked as this instance (its metrics port)


@dataclass(frozen=True)
class Part:
    """What one unit must be: the subcommand it runs and the choices made for it."""

    command: str
    user: str
    caps: frozenset[str] = frozenset()
    credentials: frozenset[str] = frozenset()  # LoadCredential ids, each a key file flag's value
    jit: bool = False  # numba compiles at run time: no MemoryDenyWriteExecute
    devices: bool = False  # reads devices (NVML, /dev/kmsg): DevicePolicy=closed, no PrivateDevices
    start_limit: bool = True  # False: restarts never stop (StartLimitIntervalSec=0)
    min_stop_s: float = 30.0  # TimeoutStopSec at least this: its closing flush
    exposure: float = 0.0  # systemd-analyze security's overall exposure, at most this
    paths: dict[str, str] = field(default_factory=dict)  # flag -> StateDirectory it must be under


PARTS: dict[str, Part] = {
    "fleetwatch-agent.service": Part(
        "collect",
        "fleetwatch",
        caps=frozenset({"CAP_SYSLOG"}),
        devices=True,
        start_limit=False,
        min_stop_s=20.0,  # a sample, the spool's 10 s drain, the producer's 5 s close
        exposure=2.4,
        paths={"--spool-dir": "fleetwatch/agent"},
    ),
    "fleetwatch-detect@.service": Part(
        "detect",
        "fleetwatch",
        credentials=frozenset({"census.key"}),
        jit=True,
        min_stop_s=60.0,  # a batch, the 30 s flush, the producer's 10 s close
        exposure=1.7,
    ),
    "fleetwatch-act.service": Part(
        "act",
        "fleetwatch",
        credentials=frozenset({"drain.key", "census.key"}),
        min_stop_s=60.0,  # a batch, the alerts' 5 s, the 30 s flush, the producer's 10 s close
        exposure=1.7,
    ),
    "fleetwatch-slurm-drainer.service": Part(
        "slurm-drainer",
        "slurm",
        credentials=frozenset({"drain.key"}),
        start_limit=False,
        min_stop_s=60.0,  # a scontrol (30 s at most), the 30 s flush
        exposure=1.8,
        paths={"--state-dir": "fleetwatch/slurm-drainer"},
    ),
    "fleetwatch-slurm-jobs.service": Part(
        "slurm-jobs", "fleetwatch", start_limit=False, min_stop_s=30.0, exposure=1.7
    ),
    "fleetwatch-account.service": Part(
        "account",
        "fleetwatch",
        credentials=frozenset({"census.key", "drain.key"}),
        start_limit=False,
        min_stop_s=30.0,  # a batch's one transaction, the producer's 10 s close
        exposure=1.7,
        paths={"--db": "fleetwatch/account"},  # the store, a file in its state directory
    ),
}

# systemd directives every unit sets to exactly this value
COMMON = {
    "NoNewPrivileges": "yes",
    "ProtectSystem": "strict",
    "ProtectHome": "yes",
    "PrivateTmp": "yes",
    "ProtectKernelTunables": "yes",
    "ProtectKernelModules": "yes",
    "ProtectControlGroups": "yes",
    "ProtectClock": "yes",
    "ProtectHostname": "yes",
    "RestrictNamespaces": "yes",
    "RestrictRealtime": "yes",
    "RestrictSUIDSGID": "yes",
    "LockPersonality": "yes",
    "RemoveIPC": "yes",
    "UMask": "0077",
    "SystemCallArchitectures": "native",
    "SystemCallErrorNumber": "EPERM",
    "Restart": "always",
    "KillMode": "mixed",
}
ADDRESS_FAMILIES = {"AF_UNIX", "AF_INET", "AF_INET6", "AF_NETLINK"}
# The environment variables an env file may set: the contract's (docs/contract.md, 2.1)
ENV_VARS = re.compile(r"^#?\s*([A-Z][A-Z0-9_]*)=", re.M)


def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """{section: {key: [values in order]}}: comments dropped, backslash continuations joined as
    systemd joins them (with a space), repeated keys kept (an empty value is kept too: it resets
    a list in systemd)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line[0] in "#;"):
            continue
        if line.endswith("\\"):
            pending += line[:-1].rstrip() + " "
            continue
        logical.append(pending + line)
        pending = ""
    for line in logical:
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None, f"a setting outside any section: {line!r}"
        key, _, value = line.partition("=")
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


UNITS = sorted(p.name for p in UNIT_DIR.glob("*.service"))


def unit(name: str) -> dict[str, dict[str, list[str]]]:
    return parse_unit((UNIT_DIR / name).read_text())


def last(values: dict[str, list[str]], key: str) -> str | None:
    got = values.get(key)
    return got[-1] if got else None


def words(values: dict[str, list[str]], key: str) -> set[str]:
    """A list setting's words: assignments accumulate, an empty one resets."""
    out: set[str] = set()
    for v in values.get(key, []):
        out = set() if not v else out | set(v.split())
    return out


def exec_argv(name: str) -> list[str]:
    (line,) = unit(name)["Service"]["ExecStart"]
    return shlex.split(line)


def systemd_analyze() -> str:
    found = shutil.which("systemd-analyze")
    assert found, "systemd-analyze not found: install Debian's systemd package (scripts/install.sh)"
    return found


@pytest.fixture(scope="module")
def runnable(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The units as systemd would load them here: ExecStart's console script, which verify checks
    is an executable, replaced by this Python running fleetwatch.cli (the same arguments)."""
    out = tmp_path_factory.mktemp("units")
    for name in UNITS:
        text = (UNIT_DIR / name).read_text()
        assert f"ExecStart={INSTALLED} " in text, f"{name}: ExecStart does not run {INSTALLED}"
        text = text.replace(f"ExecStart={INSTALLED} ", f"ExecStart={sys.executable} -m fleetwatch.cli ")
        (out / name).write_text(text)
    return out


def loaded_as(name: str) -> str:
    """The unit name systemd-analyze is given: a template as one of its instances."""
    return name.replace("@.", f"@{INSTANCE}.")


def test_every_unit_has_its_part() -> None:
    assert set(UNITS) == set(PARTS), "a unit without its row in PARTS, or a row without its unit"


@pytest.mark.parametrize("name", UNITS)
def test_systemd_analyze_verify_accepts_the_unit(name: str, runnable: Path) -> None:
    """verify loads the unit as systemd would: an unknown or misspelt key, a value it cannot
    parse, a bad specifier or a missing executable is a line on stderr (most with exit 0)."""
    r = subprocess.run(
        [systemd_analyze(), "verify", "--man=no", str(runnable / loaded_as(name))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    output = (r.stdout + r.stderr).strip()
    ours = [ln for ln in output.splitlines() if str(runnable) in ln or "fleetwatch" in ln]
    assert r.returncode == 0 and not ours, f"systemd-analyze verify {name} (status {r.returncode}):\n{output}"


@pytest.mark.parametrize("name", UNITS)
def test_hardening(name: str) -> None:
    part = PARTS[name]
    svc = unit(name)["Service"]
    assert last(svc, "User") == part.user and part.user not in ("root", "0")
    assert last(svc, "Group"), "Group= unset: the user's primary group is implied, say it"
    for key, want in COMMON.items():
        assert last(svc, key) == want, f"{name}: {key}={last(svc, key)}, want {want}"
    assert words(svc, "CapabilityBoundingSet") == part.caps
    assert words(svc, "AmbientCapabilities") == part.caps
    assert words(svc, "RestrictAddressFamilies") == ADDRESS_FAMILIES
    filters = svc.get("SystemCallFilter", [])
    assert "@system-service" in filters
    assert any(f.startswith("~") and "@privileged" in f[1:].split() for f in filters)
    # numba compiles into memory it then executes: MemoryDenyWriteExecute would stop detect
    assert last(svc, "MemoryDenyWriteExecute") == (None if part.jit or part.devices else "yes")
    if part.devices:
        # NVML's devices and /dev/kmsg, nothing else; ProtectKernelLogs would hide /dev/kmsg and
        # drop CAP_SYSLOG; ProtectProc would hide the processes procs_d_state counts
        assert last(svc, "PrivateDevices") is None
        assert last(svc, "DevicePolicy") == "closed"
        assert set(svc["DeviceAllow"]) == {"/dev/kmsg r", "char-nvidia* rw"}
        assert last(svc, "ProtectKernelLogs") == "no"
        assert last(svc, "ProtectProc") is None and last(svc, "ProcSubset") is None
    else:
        assert last(svc, "PrivateDevices") == "yes"
        assert last(svc, "ProtectKernelLogs") == "yes"
        assert last(svc, "ProtectProc") == "invisible"


@pytest.mark.parametrize("name", UNITS)
def test_restart_policy(name: str) -> None:
    part = PARTS[name]
    parsed = unit(name)
    svc, head = parsed["Service"], parsed["Unit"]
    assert "2" in words(svc, "RestartPreventExitStatus"), "status 2 (bad configuration) is restarted"
    restart_s = float(last(svc, "RestartSec") or "nan")
    assert restart_s >= 1
    assert float(last(svc, "TimeoutStopSec") or 0) >= part.min_stop_s
    interval = last(head, "StartLimitIntervalSec")
    assert interval is not None, "StartLimitIntervalSec= unset: systemd's default (5 starts in 10 s) applies"
    if not part.start_limit:
        assert interval == "0"
        return
    burst = int(last(head, "StartLimitBurst") or 0)
    # A broker outage is status 3 after the connect timeout, then RestartSec: those restarts must
    # never reach the limit, or the worker would not come back after the outage.
    wait_s = inspect.signature(connect_timeout_s).parameters["default"].default
    assert burst * (wait_s + restart_s) > float(interval), (
        f"{name}: a broker outage starts it every {wait_s + restart_s:g} s, which reaches "
        f"{burst} starts in {interval} s"
    )


def subcommand(command: str) -> argparse.ArgumentParser:
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return sub.choices[command]


def resolved(name: str, argv: list[str]) -> list[str]:
    """argv as systemd would pass it on a host: specifiers and variables filled in."""
    service = loaded_as(name)
    values = {
        "${FLEETWATCH_BOOTSTRAP}": "kafka-1.example.org:9093",
        "${CREDENTIALS_DIRECTORY}": f"/run/credentials/{service}",
        "%S": "/var/lib",
        "%C": "/var/cache",
        "%H": "svc-1.example.org",
        "%i": INSTANCE,
    }
    out = []
    for arg in argv:
        for k, v in values.items():
            arg = arg.replace(k, v)
        assert "$" not in arg and "%" not in arg, (
            f"{name}: {arg!r} has a specifier or variable this test does not know"
        )
        out.append(arg)
    return out


@pytest.mark.parametrize("name", UNITS)
def test_exec_start_flags_are_the_subcommands_own(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    part = PARTS[name]
    argv = exec_argv(name)
    assert argv[:2] == [INSTALLED, part.command]
    parser = subcommand(part.command)
    flags = {a.split("=", 1)[0] for a in argv[2:] if a.startswith("-")}
    unknown = flags - set(parser._option_string_actions)
    assert not unknown, f"{name}: `fleetwatch {part.command}` has no {sorted(unknown)}"
    try:
        build_parser().parse_args(resolved(name, argv)[1:])
    except SystemExit:
        pytest.fail(f"{name}: `fleetwatch {part.command}` refuses its ExecStart: {capsys.readouterr().err}")


@pytest.mark.parametrize("name", UNITS)
def test_keys_are_credentials(name: str) -> None:
    """A key reaches the service as a systemd credential (a root-owned file systemd reads), named
    by its flag; never in the environment or on the command line."""
    part = PARTS[name]
    svc = unit(name)["Service"]
    loaded = {}
    for spec in svc.get("LoadCredential", []):
        ident, _, path = spec.partition(":")
        loaded[ident] = path
    assert set(loaded) == part.credentials
    for ident, path in loaded.items():
        assert path == f"{KEY_DIR}/{ident}"
    argv = exec_argv(name)
    passed = {argv[i + 1] for i, a in enumerate(argv) if a.endswith("-key-file")}
    assert passed == {f"${{CREDENTIALS_DIRECTORY}}/{ident}" for ident in part.credentials}
    env = " ".join(svc.get("Environment", []))
    assert "_KEY=" not in env, f"{name}: a key in Environment="


@pytest.mark.parametrize("name", UNITS)
def test_written_paths_are_systemds_directories(name: str) -> None:
    """ProtectSystem=strict leaves a service only the directories systemd makes for it."""
    part = PARTS[name]
    svc = unit(name)["Service"]
    argv = exec_argv(name)
    for flag, directory in part.paths.items():
        value = argv[argv.index(flag) + 1]
        assert value == f"%S/{directory}" or value.startswith(f"%S/{directory}/"), (flag, value)
        assert directory in words(svc, "StateDirectory")
    if part.jit:  # numba's cache: beside its source is read-only here
        env = dict(e.split("=", 1) for e in svc.get("Environment", []))
        assert env["NUMBA_CACHE_DIR"] == "%C/" + last(svc, "CacheDirectory")


@pytest.mark.parametrize("name", UNITS)
def test_environment_file_has_an_example(name: str) -> None:
    part = PARTS[name]
    svc = unit(name)["Service"]
    env_name = "agent" if part.command == "collect" else part.command
    assert svc["EnvironmentFile"] == [f"-/etc/fleetwatch/{env_name}.env"]
    example = ENV_DIR / f"{env_name}.env"
    text = example.read_text()
    assert re.search(r"^FLEETWATCH_BOOTSTRAP=\S+", text, re.M), f"{example}: no FLEETWATCH_BOOTSTRAP"
    contract = CONTRACT.read_text()
    for var in ENV_VARS.findall(text):
        assert f"`{var}`" in contract, f"{example}: {var} is not an environment variable of the contract"


def test_metrics_ports_are_distinct() -> None:
    ports = {}
    for name in UNITS:
        argv = exec_argv(name)
        ports[name] = argv[argv.index("--metrics-port") + 1]
    fixed = [p for p in ports.values() if p != "%i"]
    assert len(fixed) == len(set(fixed)), ports
    assert ports["fleetwatch-detect@.service"] == "%i"  # the instance name is its port


def offline_security_supported() -> bool:
    r = subprocess.run([systemd_analyze(), "security", "--help"], capture_output=True, text=True, timeout=30)
    return "--offline" in r.stdout


@pytest.mark.parametrize("name", UNITS)
def test_security_exposure(name: str, runnable: Path) -> None:
    if not offline_security_supported():
        pytest.skip("this systemd-analyze has no `security --offline` (systemd < 250)")
    r = subprocess.run(
        [systemd_analyze(), "security", "--offline=yes", "--no-pager", str(runnable / loaded_as(name))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    found = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", r.stdout)
    assert found, f"systemd-analyze security {name} (status {r.returncode}):\n{r.stdout}{r.stderr}"
    exposure = float(found.group(1))
    print(f"{name}: exposure {exposure}")
    assert exposure <= PARTS[name].exposure, f"{name}: exposure {exposure}, bound {PARTS[name].exposure}"
