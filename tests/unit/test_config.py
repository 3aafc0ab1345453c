"""The deployment configuration (issue 24, item 6): one TOML file that the long-running commands
read (--config FILE or $FLEETWATCH_CONFIG), decoded into the dataclasses the code runs on; a bad
file is refused by key with status 2; a flag given overrides the file, the file the code; the
defaults print with their reasons and pass --check; the shipped example is the defaults; and a
restarted stage runs on the file it is restarted with, not on the one its snapshot was taken under.
"""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from fleetwatch import cli, config, topics
from fleetwatch.alerts import act
from fleetwatch.alerts.policy import PolicyConfig
from fleetwatch.census import CensusConfig
from fleetwatch.config import ConfigError
from fleetwatch.detectors.batch import TelemetryBatch
from fleetwatch.pipeline import detect
from fleetwatch.pipeline.job_stage import JobTaskConfig
from fleetwatch.pipeline.job_table import JobTable
from fleetwatch.pipeline.node_stage import NodeTaskConfig
from tests.helpers.messages import telemetry
from tests.helpers.paths import REPO

EXAMPLE = REPO / "services" / "fleetwatch.toml"
T0 = 1_764_000_000.0


@pytest.fixture(autouse=True)
def _no_config_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(config.ENV, raising=False)


def write(tmp_path: Path, text: str, name: str = "fleetwatch.toml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def defaults_text() -> str:
    return config.render(cli.all_sections(cli.build_parser()), cli.HEADER)


# ------------------------------------------------------------------ defaults, --check, the example


def test_defaults_round_trip_through_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["config", "--defaults"]) == 0
    text = capsys.readouterr().out
    path = write(tmp_path, text)
    assert cli.main(["config", "--check", path]) == 0
    assert capsys.readouterr().out.strip() == f"{path}: ok"
    # ... and decode to exactly the code's defaults, typed as the code's own classes
    decoded = config.check_sections(tomllib.loads(text), cli.all_sections(cli.build_parser()))
    assert decoded["detect.node"] == NodeTaskConfig()
    assert decoded["detect.job"] == JobTaskConfig()
    assert decoded["act.policy"] == PolicyConfig()
    assert decoded["act.census"] == CensusConfig()
    plain = cli.build_parser()
    for command in cli.CONFIGURED:
        for key, value in decoded[command].items():
            assert plain.commands[command].get_default(key) == value, (command, key)


def test_defaults_print_every_key_with_a_reason() -> None:
    text = defaults_text()
    sections = cli.all_sections(cli.build_parser())
    for name, sec in sections.items():
        assert f"[{name}]" in text
        if isinstance(sec, type):
            for key, reason in config.reasons(sec):
                assert reason, f"[{name}] {key} has no reason"
        else:
            for flag in sec:
                assert flag.reason, f"[{name}] {flag.key} has no reason"
    # each key comes right after its reason, the reason of a nested table before its header
    lines = text.splitlines()
    i = lines.index("[act.policy]")
    assert lines[i + 1] == "# max fraction of the fleet drained at once"
    assert lines[i + 2] == "drain_budget = 0.02"
    assert lines[lines.index("[detect.node.lemon]") - 1].startswith("# lemons:")
    assert "forget_after_s = 86400.0" in lines
    assert "# fleet_size = (unset)" in lines  # no default: shown, commented out


def test_every_field_of_each_typed_section_is_a_key() -> None:
    # the file reaches every field of the classes the stages and act run on, nested ones included
    data = tomllib.loads(defaults_text())
    for name, cls in {**detect.SECTIONS, **act.SECTIONS}.items():
        values = config.table(data, name)
        for key, _reason in config.reasons(cls):
            *tables, leaf = key.split(".")
            table = values
            for t in tables:
                table = table[t]
            assert leaf in table, f"[{name}] {key} is not in --defaults"


def test_the_example_file_is_the_defaults() -> None:
    assert EXAMPLE.read_text() == defaults_text(), (
        "services/fleetwatch.toml is out of date: fleetwatch config --defaults > services/fleetwatch.toml"
    )


# ------------------------------------------------------------------ errors, by key


@pytest.mark.parametrize(
    ("text", "message"),
    [
        # values out of range
        (
            "[act.policy]\ndrain_budget = 3\n",
            "[act.policy] drain_budget: expected a number >= 0 and <= 1.0, got 3",
        ),
        ("[detect.node.lemon]\ntau_s = -1.0\n", "[detect.node.lemon] tau_s: expected a number > 0, got -1.0"),
        (
            "[detect.job.straggler]\nwindow = 0\n",
            "[detect.job.straggler] window: expected an integer >= 1, got 0",
        ),
        (
            "[detect.node.stats]\nthreshold = nan\n",
            "[detect.node.stats] threshold: expected a number > 0 and <= 1, got nan",
        ),
        ("[act]\nalertmanager_timeout = -1\n", "[act] alertmanager_timeout: expected a number > 0, got -1"),
        (
            '[detect]\nstart_at = "middle"\n',
            '[detect] start_at: expected one of earliest, latest, got "middle"',
        ),
        # wrong types
        (
            '[act.policy]\ndrain_budget = "0.1"\n',
            '[act.policy] drain_budget: expected a number >= 0 and <= 1.0, got "0.1"',
        ),
        ("[act.policy]\nauto_resume = 1\n", "[act.policy] auto_resume: expected true or false, got 1"),
        ("[act.policy]\nstorm_nodes = 5.5\n", "[act.policy] storm_nodes: expected an integer >= 1, got 5.5"),
        ("[act.census]\nwarm_up_s = true\n", "[act.census] warm_up_s: expected a number >= 0, got true"),
        (
            "[detect]\nmetrics_port = 9108.5\n",
            "[detect] metrics_port: expected an integer 0-65535, got 9108.5",
        ),
        ('[detect]\nsnapshot_every = "30"\n', '[detect] snapshot_every: expected a number > 0, got "30"'),
        ('[detect]\nno_skew_check = "yes"\n', '[detect] no_skew_check: expected true or false, got "yes"'),
        ("[act]\nalertmanager = 9093\n", "[act] alertmanager: expected a string, got 9093"),
        ("[detect.node]\nhardware = 3\n", "[detect.node] hardware: expected a table, got 3"),
        ("act = 3\n", "[act]: expected a table, got 3"),
        # unknown keys and sections
        ("[act.policy]\nmax_drain_fraction = 0.1\n", "[act.policy] max_drain_fraction: unknown key"),
        ("[detect.node.lemon]\ntau = 1.0\n", "[detect.node.lemon] tau: unknown key"),
        ("[act]\ndrain_budget = 0.1\n", "[act] drain_budget: unknown key"),  # it is [act.policy]'s
        ("[act]\nidle_exit = 5.0\n", "[act] idle_exit: unknown key"),  # one run's, not the deployment's
        ("[detect.nodes]\nx = 1\n", "[detect] nodes: unknown key"),
        ("[detcet]\nx = 1\n", "[detcet]: unknown section"),
        # not a file, not TOML
        ("[act\n", "not valid TOML"),
    ],
)
def test_a_bad_file_is_refused_naming_the_key(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        config.check_sections(config.load(path), cli.all_sections(cli.build_parser()))
    assert str(e.value).startswith("config error: ")
    assert message in str(e.value)


def test_a_missing_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"config error: .*nope\.toml: No such file"):
        cli.parse(["act", "--config", str(tmp_path / "nope.toml")])


def test_a_command_checks_its_own_sections_and_every_section_name(tmp_path: Path) -> None:
    # collect on a node does not import the detectors to check [detect.node], detect does
    bad_detect = write(tmp_path, "[detect.node]\nwarm_up_s = -1.0\n")
    assert cli.parse(["collect", "--config", bad_detect]).command == "collect"
    with pytest.raises(ConfigError, match=r"\[detect.node\] warm_up_s"):
        cli.parse(["detect", "--config", bad_detect])
    with pytest.raises(ConfigError, match=r"\[detect.node\] warm_up_s"):
        cli.parse(["demo", "--config", bad_detect])  # the demo's workers read all of it
    with pytest.raises(ConfigError, match=r"\[colect\]: unknown section"):
        cli.parse(["collect", "--config", write(tmp_path, "[colect]\ninterval = 2.0\n", "b.toml")])


# ------------------------------------------------------------------ precedence: flag > file > code


POLICY_FILE = """
[act]
alertmanager_timeout = 12.0
fleet_size = 40
cluster = "site-a"

[act.policy]
drain_budget = 0.1
storm_nodes = 7
auto_resume = false

[act.census]
burst_min = 20
"""


def test_act_flag_over_file_over_code(tmp_path: Path) -> None:
    path = write(tmp_path, POLICY_FILE)
    args = cli.parse(["act", "--config", path, "--storm-nodes", "9", "--cluster", "site-b"])
    policy = act.policy_config(args)
    assert isinstance(policy, PolicyConfig)
    assert policy.storm_nodes == 9  # flag
    assert policy.drain_budget == 0.1 and policy.auto_resume is False  # file
    assert policy.cooldown_s == PolicyConfig().cooldown_s  # code
    census = act.census_config(args)
    assert census == dataclasses.replace(CensusConfig(), burst_min=20)
    assert args.cluster == "site-b" and args.alertmanager_timeout == 12.0 and args.fleet_size == 40
    assert args.group is None  # not in the file: the code's, by mode
    assert act.mode_defaults(args) == (False, "fleetwatch-act", "scheduler.drain.v1")
    # flags given, the file loses; the file names the same keys through the environment
    args = cli.parse(
        ["act", "--drain-budget", "0.3", "--census-burst-min", "4", "--alertmanager-timeout", "3"]
    )
    assert act.policy_config(args).drain_budget == 0.3 and act.census_config(args).burst_min == 4
    assert args.alertmanager_timeout == 3.0


def test_no_file_is_the_code_defaults() -> None:
    args = cli.parse(["act"])
    assert args.settings == {}
    assert act.policy_config(args) == PolicyConfig() and act.census_config(args) == CensusConfig()
    assert detect.node_config(cli.parse(["detect"])) == NodeTaskConfig()
    # --no-auto-resume still turns resumes off
    assert act.policy_config(cli.parse(["act", "--no-auto-resume"])).auto_resume is False


@pytest.mark.parametrize(
    ("command", "key", "value", "flag"),
    [
        ("collect", "interval", 5.0, "--interval"),
        ("collect", "spool_dir", "/var/spool/fleetwatch", "--spool-dir"),
        ("simulate", "speed", 0.0, "--speed"),
        ("slurm-jobs", "jobcomp", "/var/log/slurm/jobcomp.log", "--jobcomp"),
        ("slurm-drainer", "max_age", 120.0, "--max-age"),
        ("detect", "no_skew_check", True, "--no-skew-check"),
    ],
)
def test_each_command_takes_its_flags_from_its_section(
    tmp_path: Path, command: str, key: str, value: Any, flag: str
) -> None:
    text = json.dumps(value) if isinstance(value, str) else str(value).lower()  # TOML's spelling
    path = write(tmp_path, f"[{command}]\n{key} = {text}\n")
    assert getattr(cli.parse([command, "--config", path]), key) == value
    plain = cli.parse([command])
    assert getattr(plain, key) != value  # not the code's default: the file set it
    if isinstance(value, bool):
        return
    given = cli.parse([command, "--config", path, flag, "9"])
    assert getattr(given, key) == (9.0 if isinstance(value, float) else "9")  # the flag wins


def test_the_environment_names_the_file_and_config_overrides_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(config.ENV, write(tmp_path, "[act.policy]\ndrain_budget = 0.2\n", "env.toml"))
    assert act.policy_config(cli.parse(["act"])).drain_budget == 0.2
    other = write(tmp_path, "[act.policy]\ndrain_budget = 0.4\n", "flag.toml")
    assert act.policy_config(cli.parse(["act", "--config", other])).drain_budget == 0.4


def test_detect_flag_over_file_over_code(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
[detect]
group = "site-detect"
snapshot_every = 10.0

[detect.node]
forget_after_s = 3600.0
warm_up_s = 600.0

[detect.node.hardware]
pcie_replay_per_min = 1000.0

[detect.node.lemon]
tau_s = 1000.0

[detect.job.straggler]
min_slowdown = 0.2
""",
    )
    args = cli.parse(["detect", "--config", path, "--forget-after", "inf"])
    node = detect.node_config(args)
    assert math.isinf(node.forget_after_s)  # flag
    assert node.warm_up_s == 600.0 and node.hardware.pcie_replay_per_min == 1000.0  # file
    assert node.hardware.sbe_per_hour == NodeTaskConfig().hardware.sbe_per_hour  # code
    assert args.group == "site-detect" and args.snapshot_every == 10.0
    assert args.settings["detect.job"].straggler.min_slowdown == 0.2
    # the stages run on it; --time-scale shortens the file's lemon windows as it does the code's
    node_stage, job_stage = detect.stages(
        JobTable(), None, 0.5, node_config=node, job_config=args.settings["detect.job"]
    )
    task, job_task = node_stage.new_task(0), job_stage.new_task(0)
    try:
        assert task.config.lemon.tau_s == 500.0 and task.config.hardware.pcie_replay_per_min == 1000.0
        assert job_task.config.straggler.min_slowdown == 0.2
    finally:
        task.close()
        job_task.close()


# ------------------------------------------------------------------ a restart applies a changed file


def _tick(task: Any, t: int, nodes: tuple[str, ...]) -> list[Any]:
    batch = TelemetryBatch.from_messages([telemetry(node=n, ts=T0 + t, seq=t) for n in nodes])
    return task.process(topics.TELEMETRY, batch)


def _node_stage(path: str) -> Any:
    args = cli.parse(["detect", "--config", path])
    (stage,) = [
        s
        for s in detect.stages(JobTable(), None, node_config=detect.node_config(args))
        if s.name == "detect-node"
    ]
    return stage


def test_a_restart_with_a_changed_file_runs_on_the_new_file(tmp_path: Path) -> None:
    # Under file A nodes are never forgotten; the partition's snapshot is restored under file B,
    # which forgets them after 30 s: node a, gone quiet, is forgotten by the task restored under B
    # (its node/1 says gone) and not by the one restored under A from the same snapshot. Two nodes
    # keep reporting: the partition's clock is judged by more than one (SilenceConfig.min_nodes).
    before = _node_stage(write(tmp_path, "[detect.node]\nforget_after_s = inf\n", "a.toml"))
    after = _node_stage(
        write(tmp_path, "[detect.node]\nforget_after_s = 30.0\nforget_every_s = 5.0\n", "b.toml")
    )
    task = before.new_task(0)
    for t in range(10):
        _tick(task, t, ("a", "b", "c"))
    raw = task.to_bytes()
    task.close()

    restored = {"A": before.load_task(0, raw), "B": after.load_task(0, raw)}
    gone: dict[str, set[str]] = {}
    try:
        assert restored["B"].config.forget_after_s == 30.0 and restored["B"].config.forget_every_s == 5.0
        assert math.isinf(restored["A"].config.forget_after_s)
        for name, t in restored.items():
            out = [o for k in range(10, 70) for o in _tick(t, k, ("b", "c"))]
            gone[name] = {
                node for topic, node, msg in out if topic == topics.NODES and msg and msg.get("gone")
            }
    finally:
        for t in restored.values():
            t.close()
    assert gone == {"A": set(), "B": {"a"}}


# ------------------------------------------------------------------ the real command


def test_a_command_with_a_bad_file_exits_2_naming_the_key(tmp_path: Path) -> None:
    path = write(tmp_path, "[act.policy]\ndrain_budget = 3\n")
    r = subprocess.run(
        [sys.executable, "-m", "fleetwatch.cli", "act", "--config", path, "--bootstrap", "127.0.0.1:1"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "FLEETWATCH_DRAIN_KEY": "k" * 32, "FLEETWATCH_CENSUS_KEY": "c" * 32},
    )
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == (
        "fleetwatch act: config error: [act.policy] drain_budget: expected a number >= 0 and <= 1.0, got 3"
    )
    # the same file through the environment, to detect: its own keys are checked the same way
    r = subprocess.run(
        [sys.executable, "-m", "fleetwatch.cli", "detect", "--bootstrap", "127.0.0.1:1"],
        capture_output=True,
        text=True,
        timeout=60,
        env={
            "PATH": "/usr/bin:/bin",
            config.ENV: write(tmp_path, "[detect.node.silence]\nmin_nodes = 0\n", "d.toml"),
        },
    )
    assert r.returncode == 2, r.stderr
    assert "config error: [detect.node.silence] min_nodes: expected an integer >= 1, got 0" in r.stderr
