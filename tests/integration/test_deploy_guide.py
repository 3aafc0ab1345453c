"""docs/deploy.md, the deployment guide, cannot rot: every fenced block in it is run here or checked.

- A ```sh block is run, in order, with bash -euo pipefail in the repository's root, with the
  guide's site variables (its first block, `# site variables:`) pointed at the integration tier's
  services: the local broker (private topics and groups, below), Slurm, Alertmanager; temporary
  directories for /etc/fleetwatch, /etc/prometheus, /etc/grafana. A failing command fails the test.
- A ```sh block whose first line is `# host-only: <why>` is not run. It is checked: its shell
  parses, every file it copies from the repository exists (and every file it copies from a
  directory an earlier block wrote, at that point of the run), every unit it names is in
  services/systemd/, and every `fleetwatch` subcommand and flag it uses exists (fleetwatch/cli.py's
  build_parser()). Its `systemctl enable --now`, `start`, `restart` and `stop` lines are carried
  out: the unit is started as systemd would start it (its Environment=, EnvironmentFile=,
  LoadCredential= and ExecStart=, with /etc/fleetwatch read from where the guide wrote it), stopped
  with SIGTERM (it must exit 0), so the guide's checks after them run against the real services.
- ```toml blocks are checked with `fleetwatch config --check`, ```yaml blocks (Alertmanager
  receivers) with amtool inside the shipped alertmanager.yml, ```properties blocks for syntax.
- Any other block, or a sh block that is neither, fails the test.
- The names the guide uses exist: topics (fleetwatch/topics.py), FLEETWATCH_* variables, metrics
  and alert names (docs/contract.md, the rules), repository paths and links (with their anchors);
  the kafka-topics.sh alternative makes exactly fleetwatch's topics with their settings; the site
  variables' defaults agree with the units (ports, /etc/fleetwatch, the jobcomp log).

What the run does not do as a real host would: services run as this test's user, without the
units' sandbox (tests/unit/test_systemd_units.py checks that), and on the shared broker a wrapper
`fleetwatch` puts each service in a private consumer group and on private topics where it would
otherwise disturb other tests (act's findings, drain, result, control and Slurm-node topics, the
adapter's, slurm-jobs' topic, the agent's node name; detect starts at the end of the telemetry).
act follows the shared census topic, so the guide's end-to-end check (agent -> Kafka -> detect ->
signed census -> act) is real.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from fleetwatch import topics
from fleetwatch.bus.admin import Admin, ensure_topics, topic_configs
from fleetwatch.cli import build_parser
from tests.helpers.paths import REPO
from tests.integration.services import SLURM_NODES, USES_SLURM, Alertmanager, Slurm
from tests.unit.test_systemd_units import parse_unit

pytestmark = USES_SLURM

GUIDE = REPO / "docs" / "deploy.md"
CONTRACT = REPO / "docs" / "contract.md"
RULES = REPO / "services" / "prometheus" / "rules" / "fleetwatch-pipeline.yml"
AM_CONFIG = REPO / "services" / "alertmanager" / "alertmanager.yml"
UNIT_DIR = REPO / "services" / "systemd"
INSTALLED = "/usr/local/bin/fleetwatch"
HOST_ONLY = "# host-only:"
SITE_VARIABLES = "# site variables:"
LANGS = {"sh", "toml", "yaml", "properties"}
# the site variables, each of which the run points at something local (GuideRun.variables)
VARIABLES = {
    "FLEETWATCH_ETC", "BOOTSTRAP", "KAFKA_ADMIN_CONFIG", "PARTITIONS", "REPLICATION", "CLUSTER",
    "SOURCES", "NODE", "JOBCOMP", "ALERTMANAGER_URL", "ALERTMANAGER_ETC", "PROMETHEUS_URL",
    "PROMETHEUS_ETC", "GRAFANA_ETC", "GRAFANA_DASHBOARDS", "AGENT_METRICS", "DETECT_METRICS",
    "ACT_METRICS", "DRAINER_METRICS", "SLURM_JOBS_METRICS",
}  # fmt: skip
# the variable that says where each unit serves /metrics (host:port)
METRICS_VARIABLE = {
    "fleetwatch-agent.service": "AGENT_METRICS",
    "fleetwatch-detect@.service": "DETECT_METRICS",
    "fleetwatch-act.service": "ACT_METRICS",
    "fleetwatch-slurm-drainer.service": "DRAINER_METRICS",
    "fleetwatch-slurm-jobs.service": "SLURM_JOBS_METRICS",
}
# units of the site's own software a host-only block may name
OTHER_UNITS = {"prometheus", "prometheus-alertmanager", "grafana-server", "slurmctld", "munge"}
SEPARATORS = {";", "&", "&&", "|", "||", "(", ")", "{", "}", "do", "then", "else", "!"}
TOP_DIRS = ("services", "docs", "alerts", "fleetwatch", "dashboards", "benchmarks", "tests", "collectors",
            "pipeline", "detectors", "scripts")  # fmt: skip
# what the guide's runnable blocks call besides fleetwatch and coreutils
TOOLS = ("curl", "openssl", "promtool", "amtool", "sinfo", "scontrol", "timeout", "awk", "sed")
BLOCK_TIMEOUT_S = 240
STOP_TIMEOUT_S = 90.0  # the units' TimeoutStopSec


# --- the guide, parsed -----------------------------------------------------------------------


@dataclass(frozen=True)
class Block:
    lang: str
    text: str
    line: int  # of the opening fence, 1-based

    @property
    def host_only(self) -> bool:
        return self.lang == "sh" and self.text.startswith(HOST_ONLY)

    @property
    def where(self) -> str:
        return f"docs/deploy.md:{self.line}"


def parse_blocks(text: str) -> list[Block]:
    out: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^(\s*)```(.*)$", lines[i])
        if m:
            indent, lang = m.group(1), m.group(2).strip()
            start, body = i + 1, []
            i += 1
            while i < len(lines) and not re.match(r"^\s*```\s*$", lines[i]):
                body.append(lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i])
                i += 1
            assert i < len(lines), f"docs/deploy.md:{start}: a fence that is never closed"
            out.append(Block(lang, "\n".join(body) + "\n", start))
        i += 1
    return out


def site_variables(block: Block) -> dict[str, str]:
    """NAME -> default value, from the `export NAME=value  # why` lines of the variables block."""
    out: dict[str, str] = {}
    for line in block.text.splitlines()[1:]:
        words = shlex.split(line, comments=True)
        if not words:
            continue
        assert words[0] == "export" and len(words) == 2 and "=" in words[1], (
            f"{block.where}: the site variables are `export NAME=value` lines, not {line!r}"
        )
        name, _, value = words[1].partition("=")
        out[name] = value
    return out


@dataclass
class Guide:
    text: str
    blocks: list[Block]
    variables: dict[str, str]
    variables_block: Block

    @classmethod
    def load(cls) -> Guide:
        text = GUIDE.read_text()
        blocks = parse_blocks(text)
        first = next(b for b in blocks if b.lang == "sh" and not b.host_only)
        assert first.text.startswith(SITE_VARIABLES), (
            f"{first.where}: the first block to run must be the site variables ({SITE_VARIABLES!r})"
        )
        return cls(text, blocks, site_variables(first), first)


def shell_lines(text: str) -> list[str]:
    """The block's shell lines: continuations joined, comments and heredoc bodies left out."""
    out: list[str] = []
    pending = ""
    heredoc: str | None = None
    for raw in text.splitlines():
        if heredoc is not None:
            if raw.strip() == heredoc:
                heredoc = None
            continue
        if raw.rstrip().endswith("\\"):
            pending += raw.rstrip()[:-1] + " "
            continue
        line = pending + raw
        pending = ""
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = re.search(r"<<-?\s*['\"]?(\w+)['\"]?", line)
        if m:
            heredoc = m.group(1)
        out.append(line)
    return out


def words(line: str) -> list[str]:
    lex = shlex.shlex(line, posix=True, punctuation_chars=";&|()")
    lex.whitespace_split = True
    lex.commenters = "#"
    try:
        return list(lex)
    except ValueError:  # an unbalanced quote spanning lines inside bash -c '...': not ours to parse
        return []


def commands(text: str) -> Iterator[list[str]]:
    """Each simple command of the block, as its words (quotes removed, variables left as written)."""
    for line in shell_lines(text):
        current: list[str] = []
        for w in words(line):
            if w in SEPARATORS or set(w) <= set(";&|()"):
                if current:
                    yield current
                current = []
            else:
                current.append(w)
        if current:
            yield current


def subparser(name: str) -> argparse.ArgumentParser | None:
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return sub.choices.get(name)


def fleetwatch_problems(block: Block) -> list[str]:
    """Every `fleetwatch SUBCOMMAND --flag` in the block names a subcommand and flags that exist."""
    problems = []
    for cmd in commands(block.text):
        if not cmd or cmd[0] not in ("fleetwatch", INSTALLED):
            continue
        args = [a for a in cmd[1:] if a not in ("-v", "--verbose")]
        if not args or args[0] in ("-h", "--help"):
            continue
        parser = subparser(args[0])
        if parser is None:
            problems.append(f"{block.where}: `fleetwatch {args[0]}` is no subcommand")
            continue
        for a in args[1:]:
            flag = a.split("=", 1)[0]
            if flag.startswith("-") and flag not in parser._option_string_actions:
                problems.append(f"{block.where}: `fleetwatch {args[0]}` has no {flag}")
    return problems


def used_variables(block: Block) -> set[str]:
    """$NAME and ${NAME} the block's shell expands itself (single-quoted text is another program's)."""
    names: set[str] = set()
    for line in shell_lines(block.text):
        line = re.sub(r"'[^']*'", "''", line)
        names |= set(re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", line))
    return names


def defined_variables(block: Block) -> set[str]:
    names: set[str] = set()
    for line in shell_lines(block.text):
        names |= set(re.findall(r"\bfor\s+([A-Za-z_]\w*)\s+in\b", line))
        names |= set(re.findall(r"(?:^|[\s;(])([A-Za-z_]\w*)=", line))
    return names


def unit_file(name: str) -> tuple[str, str]:
    """(the unit's file in services/systemd, its instance) for a name as systemctl takes it."""
    full = name if name.endswith(".service") else f"{name}.service"
    m = re.match(r"^(.+@)([^.]*)\.service$", full)
    if m:
        return f"{m.group(1)}.service", m.group(2)
    return full, ""


def systemctl(cmd: list[str]) -> tuple[str, bool, list[str]]:
    """(verb, --now given, units) of a systemctl command."""
    rest = cmd[1:]
    verb = next((w for w in rest if not w.startswith("-")), "")
    units = [w for w in rest[rest.index(verb) + 1 :] if not w.startswith("-")] if verb else []
    return verb, "--now" in rest, units


def unit_problems(block: Block) -> list[str]:
    problems = []
    for cmd in commands(block.text):
        if cmd[0] not in ("systemctl", "journalctl", "systemd-analyze"):
            continue
        if cmd[0] == "systemctl":
            verb, _, units = systemctl(cmd)
            if verb in ("daemon-reload", ""):
                continue
        elif cmd[0] == "journalctl":
            units = [cmd[i + 1] for i, w in enumerate(cmd[:-1]) if w == "-u"]
        else:
            units = [Path(w).name for w in cmd[1:] if w.endswith(".service")]
        for u in units:
            file, _ = unit_file(u.replace("*", ""))
            if u.removesuffix(".service") in OTHER_UNITS:
                continue
            if not (UNIT_DIR / file).is_file():
                problems.append(f"{block.where}: no unit {file} in services/systemd/ (for {u!r})")
    return problems


def copy_sources(cmd: list[str]) -> list[str]:
    """The files an install / cp / scp command copies (the last word is where to)."""
    if cmd[0] not in ("install", "cp", "scp") or "-d" in cmd:
        return []
    out, skip = [], False
    for w in cmd[1:-1]:
        if skip:
            skip = False
        elif w in ("-m", "-o", "-g", "-t", "-S"):
            skip = True
        elif not w.startswith("-"):
            out.append(w)
    return out


def repo_path(word: str) -> Path | None:
    """The repository file a word names, if it names one (a relative path under a top folder)."""
    if word.split("/", 1)[0] in TOP_DIRS and "$" not in word:
        return REPO / word
    return None


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it."""
    s = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return s.replace(" ", "-")


def anchors(md: Path) -> set[str]:
    return {slug(m) for m in re.findall(r"^#+\s+(.+)$", md.read_text(), re.M)}


# --- checks that need no service --------------------------------------------------------------


@pytest.fixture(scope="module")
def guide() -> Guide:
    return Guide.load()


def test_every_block_is_run_or_checked(guide: Guide) -> None:
    bad = []
    for b in guide.blocks:
        if b.lang not in LANGS:
            bad.append(f"{b.where}: a ```{b.lang or '(no language)'} block: neither run nor checked")
        elif "host-only" in b.text.splitlines()[0] and not re.match(r"^# host-only: \S", b.text):
            bad.append(f"{b.where}: a host-only block says why on its first line: `# host-only: <why>`")
    assert not bad, "\n".join(bad)
    assert sum(b.lang == "sh" and not b.host_only for b in guide.blocks) > 20


def test_the_site_variables_are_the_ones_this_test_sets(guide: Guide) -> None:
    assert set(guide.variables) == VARIABLES, (
        f"the guide's site variables changed: new {sorted(set(guide.variables) - VARIABLES)}, "
        f"gone {sorted(VARIABLES - set(guide.variables))}: point each new one at a local service in "
        "GuideRun.variables"
    )


def test_the_site_variables_agree_with_the_units(guide: Guide) -> None:
    """The defaults an SRE keeps are the units' own: where they read files, their ports."""
    v = guide.variables
    assert v["FLEETWATCH_ETC"] == "/etc/fleetwatch"
    for unit, var in METRICS_VARIABLE.items():
        (line,) = parse_unit((UNIT_DIR / unit).read_text())["Service"]["ExecStart"]
        argv = shlex.split(line)
        port = argv[argv.index("--metrics-port") + 1]
        # a template's port is its instance name: the instances the guide starts
        ports = set(re.findall(r"fleetwatch-detect@(\d+)", guide.text)) if port == "%i" else {port}
        for target in v[var].split():
            assert target.rpartition(":")[2] in ports, f"{var}={v[var]}: {unit} serves on {sorted(ports)}"
    (line,) = parse_unit((UNIT_DIR / "fleetwatch-slurm-jobs.service").read_text())["Service"]["ExecStart"]
    argv = shlex.split(line)
    assert v["JOBCOMP"] == argv[argv.index("--jobcomp") + 1]


def test_every_shell_block_parses_and_uses_what_exists(guide: Guide) -> None:
    problems: list[str] = []
    for b in guide.blocks:
        if b.lang != "sh":
            continue
        r = subprocess.run(["bash", "-n"], input=b.text, capture_output=True, text=True, timeout=30)
        if r.returncode:
            problems.append(f"{b.where}: bash -n: {r.stderr.strip()}")
        problems += fleetwatch_problems(b)
        problems += unit_problems(b)
        # EDITOR, HOME: the SRE's shell; FLEETWATCH_BOOTSTRAP: from a sourced services/systemd/env file
        known = set(guide.variables) | defined_variables(b) | {"EDITOR", "HOME", "FLEETWATCH_BOOTSTRAP"}
        undefined = used_variables(b) - known
        if undefined:
            problems.append(f"{b.where}: variables that are not site variables: {sorted(undefined)}")
        for cmd in commands(b.text):
            for src in copy_sources(cmd):
                p = repo_path(src)
                if p is not None and not any(p.parent.glob(p.name)):
                    problems.append(f"{b.where}: copies {src}, which is not in the repository")
    assert not problems, "\n".join(problems)


def test_the_names_the_guide_uses_exist(guide: Guide) -> None:
    text, contract = guide.text, CONTRACT.read_text()
    rules = RULES.read_text()
    problems = []
    for t in sorted(set(re.findall(r"\b(?:fleet|scheduler)\.[a-z]+(?:\.[a-z]+)*\.v\d+\b", text))):
        if t not in topics.ALL:
            problems.append(f"topic {t}: not in fleetwatch/topics.py")
    for v in sorted(set(re.findall(r"\bFLEETWATCH_[A-Z0-9_]*[A-Z0-9]", text)) - set(guide.variables)):
        if v not in contract:
            problems.append(f"environment variable {v}: not in docs/contract.md")
    for m in sorted(set(re.findall(r"\bfleetwatch_[a-z0-9_]+", text))):
        if m not in contract:
            problems.append(f"metric {m}: not in docs/contract.md")
    for a in sorted(set(re.findall(r"\bFleetwatch[A-Z][A-Za-z]+\b", text))):
        if a not in contract and a not in rules:
            problems.append(f"alert {a}: neither in docs/contract.md nor in the rules")
    prose = re.sub(r"^\s*```.*?^\s*```", "", text, flags=re.M | re.S)  # blocks' paths: their own tests
    top = "|".join(TOP_DIRS)
    for p in sorted(set(re.findall(rf"(?<![\w/.$-])((?:{top})/[\w./@-]*)", prose))):
        p = p.rstrip(".,:)")
        if not (REPO / p).exists() and not any((REPO / p).parent.glob((REPO / p).name + "*")):
            problems.append(f"path {p}: not in the repository")
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"^[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        md = (GUIDE.parent / path).resolve() if path else GUIDE
        if not md.exists():
            problems.append(f"link {target}: no such file")
        elif anchor and md.suffix == ".md" and anchor not in anchors(md):
            problems.append(f"link {target}: no such heading in {md.name}")
    assert not problems, "\n".join(problems)


def test_the_kafka_cli_alternative_makes_fleetwatchs_topics(guide: Guide) -> None:
    """The host-only kafka-topics.sh block makes the topics ensure_topics makes, with their settings."""
    (block,) = [b for b in guide.blocks if "kafka-topics.sh" in b.text]
    made: dict[str, dict[str, str]] = {}
    for cmd in commands(block.text):
        if cmd[0] == "mk" and len(cmd) > 1:  # not the function's own definition
            configs = dict(cmd[i + 1].split("=", 1) for i, w in enumerate(cmd) if w == "--config")
            made[cmd[1]] = configs
    assert made == {t: topic_configs(t) for t in topics.ALL}


def test_config_blocks_are_valid(guide: Guide, tmp_path: Path) -> None:
    problems = []
    for i, b in enumerate(guide.blocks):
        if b.lang == "toml":
            f = tmp_path / f"block-{i}.toml"
            f.write_text(b.text)
            r = subprocess.run(
                [sys.executable, "-m", "fleetwatch.cli", "config", "--check", str(f)],
                capture_output=True,
                text=True,
                timeout=60,
            )
            if r.returncode:
                problems.append(f"{b.where}: {r.stderr.strip()}")
        elif b.lang == "properties":
            for line in b.text.splitlines():
                if line.strip() and not line.startswith("#") and not re.match(r"^[A-Za-z][\w.-]*=\S", line):
                    problems.append(f"{b.where}: not a key=value line: {line!r}")
        elif b.lang == "yaml":
            problems += yaml_problems(b, tmp_path / f"block-{i}.yml")
    assert not problems, "\n".join(problems)


def yaml_problems(b: Block, out: Path) -> list[str]:
    """An Alertmanager receivers block: the shipped configuration with these receivers in place of
    its own must pass amtool check-config."""
    got = yaml.safe_load(b.text)
    if not isinstance(got, dict) or set(got) != {"receivers"}:
        return [f"{b.where}: a yaml block this test has no check for (only Alertmanager receivers)"]
    config = yaml.safe_load(AM_CONFIG.read_text())
    names = {r["name"] for r in config["receivers"]}
    if {r["name"] for r in got["receivers"]} != names:
        return [f"{b.where}: receivers must keep the shipped routes' names {sorted(names)}"]
    config["receivers"] = got["receivers"]
    out.write_text(yaml.safe_dump(config))
    amtool = shutil.which("amtool")
    assert amtool, "amtool not found (apt-get install prometheus-alertmanager)"
    r = subprocess.run([amtool, "check-config", str(out)], capture_output=True, text=True, timeout=60)
    return [] if r.returncode == 0 else [f"{b.where}: amtool check-config: {(r.stdout + r.stderr).strip()}"]


# --- the run ----------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_env_file(path: Path) -> dict[str, str]:
    """systemd's EnvironmentFile= syntax, the part the examples use: VAR=value, comments, quotes."""
    out = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        k, _, v = line.partition("=")
        out[k.strip()] = v.strip().strip('"').strip("'")
    return out


@dataclass
class Service:
    unit: str  # as systemctl names it, e.g. fleetwatch-detect@9108.service
    proc: subprocess.Popen[bytes]
    log: Path


@dataclass
class GuideRun:
    """One run of the guide: the variables' local values, the wrapper, the services it started."""

    bootstrap: str
    am: Alertmanager
    slurm: Slurm
    cluster: str
    tmp: Path
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    services: dict[str, Service] = field(default_factory=dict)
    installed_units: set[str] = field(default_factory=set)
    timings: list[tuple[str, float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        t = self.tag
        self.private = {
            "findings": f"test.deploy.{t}.findings",
            "drain": f"test.deploy.{t}.drain",
            "results": f"test.deploy.{t}.results",
            "control": f"test.deploy.{t}.control",
            "slurm_nodes": f"test.deploy.{t}.slurmnodes",
            "jobs": f"test.deploy.{t}.jobs",
        }
        ensure_topics(self.bootstrap, list(self.private.values()))
        self.etc = self.tmp / "etc-fleetwatch"
        self.state, self.creds, self.logs = self.tmp / "state", self.tmp / "credentials", self.tmp / "logs"
        # numba's cache (the detect unit's CacheDirectory): kept between runs, or detect compiles cold
        self.cache = REPO / ".fleetwatch" / "deploy-guide-cache"
        self.bin = self.tmp / "bin"
        for d in (
            self.state,
            self.creds,
            self.logs,
            self.cache,
            self.bin,
            self.tmp / "home",
            self.tmp / "run",
        ):
            d.mkdir(parents=True, exist_ok=True)
        self.ports = {var: free_port() for var in METRICS_VARIABLE.values()}
        self.jobcomp = str(Path(self.slurm.conf).parent / "jobcomp.log")
        self.variables = {
            "FLEETWATCH_ETC": str(self.etc),
            "BOOTSTRAP": self.bootstrap,
            "KAFKA_ADMIN_CONFIG": str(self.tmp / "kafka-admin.properties"),  # host-only blocks only
            "PARTITIONS": "4",  # the shared broker's topics (services/kafka/kafka.sh)
            "REPLICATION": "1",
            "CLUSTER": self.cluster,
            "SOURCES": "host,net,kernel",  # no GPU here
            "NODE": SLURM_NODES[0],
            "JOBCOMP": self.jobcomp,
            "ALERTMANAGER_URL": self.am.url,
            "ALERTMANAGER_ETC": str(self.tmp / "etc-alertmanager"),
            "PROMETHEUS_URL": "http://127.0.0.1:19090",  # only written into Grafana's file here
            "PROMETHEUS_ETC": str(self.tmp / "etc-prometheus"),
            "GRAFANA_ETC": str(self.tmp / "etc-grafana"),
            "GRAFANA_DASHBOARDS": str(self.tmp / "grafana-dashboards"),
            **{var: f"127.0.0.1:{port}" for var, port in self.ports.items()},
        }
        assert set(self.variables) == VARIABLES
        self.write_wrapper()
        self.env = {
            "PATH": f"{self.bin}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "HOME": str(self.tmp / "home"),
            "LANG": "C.UTF-8",
            "TMPDIR": str(self.tmp),
            "SLURM_CONF": self.slurm.conf,  # the admin host's slurm.conf
            **self.variables,
        }

    def write_wrapper(self) -> None:
        """`fleetwatch` (and python3) for the guide's commands and the units' ExecStart: this
        interpreter's fleetwatch, with private groups and topics on the shared broker."""
        p, t = self.private, self.tag
        extra = {
            "detect": ["--group", f"deploy-{t}-detect", "--start-at", "latest"],
            "act": ["--group", f"deploy-{t}-act", "--findings-topic", p["findings"],
                    "--drain-topic", p["drain"], "--results-topic", p["results"],
                    "--control-topic", p["control"], "--slurm-nodes-topic", p["slurm_nodes"]],
            "slurm-drainer": ["--group", f"deploy-{t}-slurm", "--drain-topic", p["drain"],
                              "--results-topic", p["results"], "--slurm-nodes-topic", p["slurm_nodes"],
                              "--control-topic", p["control"]],
            "slurm-jobs": ["--topic", p["jobs"]],
            "collect": ["--node", f"deploy-{t}-node"],
            "pause": ["--control-topic", p["control"]],
            "resume-drains": ["--control-topic", p["control"]],
        }  # fmt: skip
        cases = "\n".join(f'  {sub}) set -- "$@" {shlex.join(args)} ;;' for sub, args in extra.items())
        script = f"""#!/bin/bash
# tests/integration/test_deploy_guide.py: fleetwatch, kept off other tests' groups and topics
sub=""
for a in "$@"; do case "$a" in -*) ;; *) sub="$a"; break ;; esac; done
case "$sub" in
{cases}
esac
exec {shlex.quote(sys.executable)} -m fleetwatch.cli "$@"
"""
        wrapper = self.bin / "fleetwatch"
        wrapper.write_text(script)
        wrapper.chmod(0o755)
        (self.bin / "python3").symlink_to(sys.executable)

    # host paths, as the units and host-only blocks name them -> where this run keeps them
    def host_path(self, path: str) -> str:
        if path == "/etc/fleetwatch" or path.startswith("/etc/fleetwatch/"):
            return str(self.etc) + path.removeprefix("/etc/fleetwatch")
        return {"/etc/slurm/slurm.conf": self.slurm.conf, "/var/log/slurm/jobcomp.log": self.jobcomp}.get(
            path, path
        )

    def expand(self, word: str) -> str:
        return re.sub(r"\$\{?(\w+)\}?", lambda m: self.variables.get(m.group(1), m.group(0)), word)

    # --- blocks ---

    def run_block(self, b: Block) -> None:
        started = time.monotonic()
        try:
            r = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", b.text],
                env=self.env,
                cwd=REPO,
                capture_output=True,
                text=True,
                timeout=BLOCK_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired as e:
            pytest.fail(f"{b.where}: did not finish in {BLOCK_TIMEOUT_S} s\n{b.text}\n{e.stdout}\n{e.stderr}"
                        f"{self.service_logs()}")  # fmt: skip
        self.timings.append((b.where, time.monotonic() - started))
        if r.returncode:
            pytest.fail(
                f"{b.where}: exit status {r.returncode}\n--- block\n{b.text}--- stdout\n{r.stdout[-3000:]}"
                f"--- stderr\n{r.stderr[-3000:]}{self.service_logs()}"
            )

    def host_only(self, b: Block) -> None:
        """What a host-only block would do to this run: the units it installs, starts, restarts or
        stops; and the files it copies out of directories earlier blocks wrote must exist now."""
        started = time.monotonic()
        for cmd in commands(b.text):
            for src in copy_sources(cmd):
                local = self.host_path(self.expand(src))
                if "$" not in local and local.startswith(str(self.tmp)):
                    assert Path(local).exists(), f"{b.where}: copies {src}, which no earlier block made"
            if cmd[0] == "install" and cmd[-1].startswith("/etc/systemd/system"):
                self.installed_units |= {Path(s).name for s in copy_sources(cmd)}
            if cmd[0] != "systemctl":
                continue
            verb, now, units = systemctl(cmd)
            for u in units:
                if u.removesuffix(".service") in OTHER_UNITS or "*" in u:
                    continue
                if verb in ("start", "restart") or (verb == "enable" and now):
                    if verb == "restart":
                        self.stop(u)
                    self.start(u, b)
                elif verb == "stop":
                    self.stop(u)
        self.timings.append((b.where + " (host-only)", time.monotonic() - started))

    # --- units ---

    def start(self, name: str, b: Block) -> None:
        file, instance = unit_file(name)
        full = file.replace("@.", f"@{instance}.") if instance else file
        assert file in self.installed_units, f"{b.where}: starts {full} before any block installs {file}"
        assert full not in self.services, f"{b.where}: {full} is running already"
        running = [s for s in self.services if unit_file(s)[0] == file]
        assert not running, f"{b.where}: a second instance of {file} ({full}); this run serves one's metrics"
        svc = parse_unit((UNIT_DIR / file).read_text())["Service"]
        creds = self.creds / full
        creds.mkdir(exist_ok=True)
        env = {
            "PATH": f"{self.bin}:/usr/local/bin:/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "HOME": str(self.tmp / "home"),
            "SLURM_CONF": self.slurm.conf,  # the host's default slurm.conf
            "CREDENTIALS_DIRECTORY": str(creds),
        }

        def spec(s: str) -> str:
            table = {"%i": instance, "%S": str(self.state), "%C": str(self.cache), "%H": socket.gethostname(),
                     "%d": str(creds), "%%": "%"}  # fmt: skip
            return re.sub(r"%.", lambda m: table[m.group(0)], s)

        for line in svc.get("Environment", []):
            for item in shlex.split(line):
                k, _, v = item.partition("=")
                env[k] = self.host_path(spec(v))
        for line in svc.get("EnvironmentFile", []):
            path = Path(self.host_path(spec(line.lstrip("-"))))
            assert path.exists() or line.startswith("-"), f"{full}: no {line} (the guide never writes it)"
            if path.exists():
                env.update(parse_env_file(path))
        for line in svc.get("LoadCredential", []):
            ident, _, src = line.partition(":")
            local = Path(self.host_path(src))
            assert local.is_file(), f"{b.where}: {full} loads {src}, which the guide never made"
            shutil.copyfile(local, creds / ident)
            (creds / ident).chmod(0o400)
        for key in ("StateDirectory", "CacheDirectory"):
            root = self.state if key == "StateDirectory" else self.cache
            for d in " ".join(svc.get(key, [])).split():
                (root / d).mkdir(parents=True, exist_ok=True)

        (line,) = svc["ExecStart"]
        argv = []
        for word in shlex.split(line):
            word = re.sub(r"\$\{(\w+)\}", lambda m: env[m.group(1)], spec(word))
            argv.append(self.host_path(word))
        assert argv[0] == INSTALLED, f"{file}: ExecStart runs {argv[0]}, not {INSTALLED}"
        argv[0] = str(self.bin / "fleetwatch")
        argv[argv.index("--metrics-port") + 1] = str(self.ports[METRICS_VARIABLE[file]])
        log = self.logs / f"{full}.{len([p for p in self.logs.iterdir() if p.name.startswith(full)])}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                argv,
                env=env,
                cwd=self.tmp / "run",
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.services[full] = Service(full, proc, log)

    def stop(self, name: str) -> None:
        """SIGTERM, as systemd stops these units (KillMode=mixed): the service finishes what it
        holds and exits 0 (docs/contract.md 2.1)."""
        file, instance = unit_file(name)
        full = file.replace("@.", f"@{instance}.") if instance else file
        s = self.services.pop(full, None)
        assert s is not None, f"stopping {full}, which is not running"
        if s.proc.poll() is None:
            s.proc.send_signal(signal.SIGTERM)
        try:
            rc = s.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            s.proc.kill()
            s.proc.wait(10)
            pytest.fail(f"{full} did not stop within {STOP_TIMEOUT_S} s of SIGTERM{self.tail(s.log)}")
        assert rc == 0, f"{full} exited {rc} on SIGTERM{self.tail(s.log)}"

    def tail(self, log: Path) -> str:
        return f"\n--- {log.name}\n" + log.read_text(errors="replace")[-2500:]

    def service_logs(self) -> str:
        return "".join(self.tail(s.log) for s in self.services.values())

    def close(self) -> list[str]:
        errors = []
        for name in list(self.services):
            try:
                self.stop(name)
            except BaseException as e:  # one that will not stop must not keep the others running
                errors.append(str(e))
        try:
            with Admin(self.bootstrap) as admin:
                admin.delete_topics(self.private.values())
        except Exception as e:
            errors.append(f"deleting the run's topics: {e}")
        return errors


@pytest.mark.timeout(600)
def test_the_guide_runs(
    guide: Guide, kafka_bootstrap: str, alertmanager: Alertmanager, slurm: Slurm, cluster: str, tmp_path: Path
) -> None:
    """Step by step, as an SRE would: the blocks in order, the units started where the guide starts
    them, every check after them run against them."""
    missing = [t for t in TOOLS if shutil.which(t) is None]
    assert not missing, (
        f"the guide's commands need {missing} (Debian: curl, prometheus, prometheus-alertmanager)"
    )
    run = GuideRun(kafka_bootstrap, alertmanager, slurm, cluster, tmp_path)
    started = time.monotonic()
    errors: list[str] = []
    try:
        for b in guide.blocks:
            if b.lang != "sh" or b is guide.variables_block:
                continue
            if b.host_only:
                run.host_only(b)
            else:
                run.run_block(b)
        assert run.services, "the guide started no service"
    finally:
        errors = run.close()
    slow = sorted(run.timings, key=lambda t: -t[1])[:5]
    print(f"the guide ran in {time.monotonic() - started:.1f} s; slowest: "
          + ", ".join(f"{w} {s:.1f} s" for w, s in slow))  # fmt: skip
    assert not errors, "\n".join(errors)
