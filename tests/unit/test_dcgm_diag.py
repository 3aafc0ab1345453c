"""Reading `dcgmi diag -j` (alerts/dcgm_diag.py) on real and source-reconstructed outputs
(tests/fixtures/dcgm_diag, cited in its README) with their real exit statuses, on hostile output
(huge, truncated, NaN, deep, wrong types, control characters), as a property (never raises; only
exit 0 passes), and the fake `dcgmi` (tests/fakes/dcgmi) run as a process with plans."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetwatch.alerts.dcgm_diag import (
    EXIT_CONNECTION_NOT_VALID,
    EXIT_NVVS_ERROR,
    EXIT_NVVS_ISOLATE_ERROR,
    EXIT_NVVS_KILLED,
    MAX_FAILURES,
    MAX_OUTPUT_CHARS,
    MAX_TEXT,
    DiagOutcome,
    clean_text,
    exit_meaning,
    parse_command,
    parse_diag,
    summary,
)

TESTS = Path(__file__).resolve().parents[1]
FIXTURES = TESTS / "fixtures" / "dcgm_diag"
FAKE = TESTS / "fakes" / "dcgmi"
EXIT_CODES: dict[str, int] = json.loads((FIXTURES / "exit_codes.json").read_text())
BAD_CHARS = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u200b-\u200f\u202a-\u202e\u2066-\u2069]")


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def run_fixture(name: str, rc: int | None = None) -> DiagOutcome:
    return parse_diag(fixture(name), EXIT_CODES[name] if rc is None else rc)


def assert_clean(outcome: DiagOutcome) -> None:
    """Every string an outcome carries is one bounded line without control characters."""
    texts = [outcome.detail, *outcome.warnings]
    for f in outcome.failures:
        texts += [f.test, f.message]
        assert f.gpu is None or (isinstance(f.gpu, int) and f.gpu >= 0)
    for text in texts:
        assert isinstance(text, str) and len(text) <= MAX_TEXT
        assert not BAD_CHARS.search(text), text
    assert len(outcome.failures) <= MAX_FAILURES
    assert outcome.shape in ("dcgm4", "dcgm3", "none")
    assert len(summary(outcome, "dcgmi diag -r 1")) <= MAX_TEXT


# ---- every fixture with its real exit status ----------------------------------------------------

# file -> (passed, shape, [(test, gpu) of the failures], warnings, summary with "dcgmi diag -r N")
EXPECTED: dict[str, tuple[bool, str, list[tuple[str, int | None]], int, str]] = {
    "dcgm3_pass_r2.json": (True, "dcgm3", [], 0, "dcgmi diag -r 2: passed"),
    "dcgm3_fail_memory_gpu1.json": (
        False,
        "dcgm3",
        [("GPU Memory", 1)],
        0,
        "dcgmi diag -r 2: GPU Memory failed on GPU 1",
    ),
    "dcgm3_skip_r3_t400.json": (True, "dcgm3", [], 7, "dcgmi diag -r 3: passed (7 skipped/warned)"),
    "dcgm4_pass_r2_4gpu.json": (True, "dcgm4", [], 0, "dcgmi diag -r 2: passed"),
    "dcgm4_pass_r2_8gpu.json": (True, "dcgm4", [], 0, "dcgmi diag -r 2: passed"),
    "dcgm4_fail_memory_gpu3.json": (
        False,
        "dcgm4",
        [("memory", 3)],
        0,
        "dcgmi diag -r 2: memory failed on GPU 3",
    ),
    "dcgm4_fail_software_gb10.json": (
        False,
        "dcgm4",
        [("software", 0)],
        0,
        "dcgmi diag -r 1: software failed on GPU 0",
    ),
    "dcgm4_skip_r3_1gpu.json": (True, "dcgm4", [], 6, "dcgmi diag -r 3: passed (6 skipped/warned)"),
    "dcgm4_runtime_error_already_running.json": (
        False,
        "dcgm4",
        [("dcgmi", None)],
        0,
        "dcgmi diag -r 2: runtime error: Error: Unable to complete diagnostic for entities 0,1,2,3,4,5,6,7.",
    ),
    "hostengine_not_running.txt": (
        False,
        "none",
        [("dcgmi", None)],
        0,
        "dcgmi diag -r 1: exit 235 (DCGM_ST_CONNECTION_NOT_VALID: no host engine); no JSON document: "
        "Error: unable to establish a connection to the specified host: localhost",
    ),
    "text_table_not_json.txt": (
        False,
        "none",
        [("dcgmi", None)],
        0,
        "dcgmi diag -r 3: exit 0 (success); no JSON document: Successfully ran diagnostic for group.",
    ),
    "truncated_issue215.json": (
        False,
        "none",
        [("dcgmi", None)],
        0,
        "dcgmi diag -r 3: exit 0 (success); JSON",
    ),
}


def test_every_fixture_is_expected_and_has_an_exit_status() -> None:
    on_disk = {p.name for p in FIXTURES.iterdir() if p.name not in ("README.md", "exit_codes.json")}
    assert on_disk == set(EXPECTED) == set(EXIT_CODES)
    readme = fixture("README.md")
    for name, rc in EXIT_CODES.items():
        assert f"| `{name}` | {rc} |" in readme, name


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_outcome(name: str) -> None:
    passed, shape, failures, n_warnings, line = EXPECTED[name]
    outcome = run_fixture(name)
    assert outcome.passed is passed
    assert outcome.shape == shape
    assert [(f.test, f.gpu) for f in outcome.failures] == failures
    assert len(outcome.warnings) == n_warnings
    level = re.search(r"-r (\d)", line)
    assert level is not None
    assert summary(outcome, f"dcgmi diag -r {level.group(1)}").startswith(line)
    assert_clean(outcome)


def test_failures_carry_dcgms_own_explanation() -> None:
    memory = run_fixture("dcgm4_fail_memory_gpu3.json")
    assert memory.failures[0].message.startswith("A memory mismatch was detected on GPU 3")
    assert "exit 205 (DCGM_ST_NVVS_ISOLATE_ERROR" in memory.detail
    gb10 = run_fixture("dcgm4_fail_software_gb10.json")
    assert "Persistence mode for GPU 0 is disabled" in gb10.failures[0].message
    assert "exit 226 (DCGM_ST_NVVS_ERROR" in gb10.detail
    v3 = run_fixture("dcgm3_fail_memory_gpu1.json")
    assert v3.failures[0].message.startswith("A memory mismatch was detected on GPU 1")
    skipped = run_fixture("dcgm4_skip_r3_1gpu.json").warnings
    assert skipped[0] == "memory skipped on GPU 0"
    assert "targeted_power skipped on GPU 0" in skipped


def test_exit_statuses_are_dcgms() -> None:
    assert (EXIT_NVVS_ERROR, EXIT_NVVS_ISOLATE_ERROR, EXIT_CONNECTION_NOT_VALID, EXIT_NVVS_KILLED) == (
        226,
        205,
        235,
        203,
    )
    assert [status & 0xFF for status in (-30, -51, -21, -53)] == [226, 205, 235, 203]
    assert exit_meaning(226).startswith("DCGM_ST_NVVS_ERROR")
    assert exit_meaning(205).startswith("DCGM_ST_NVVS_ISOLATE_ERROR")
    assert exit_meaning(235).startswith("DCGM_ST_CONNECTION_NOT_VALID")
    assert exit_meaning(254) == "command line rejected"
    assert exit_meaning(1) == "usage error"
    assert exit_meaning(143) == "signal 15"
    assert exit_meaning(-9) == "killed by signal 9"
    assert exit_meaning(217) == "DCGM_ST_DIAG_ALREADY_RUNNING"
    assert exit_meaning(100) == "unknown exit status"


# ---- exit status against the JSON ----------------------------------------------------------------


def test_exit_0_with_a_fail_in_the_json_fails() -> None:
    """3.x exits 0 for a WARN its JSON writes "Fail": the JSON, the stronger signal, wins."""
    outcome = run_fixture("dcgm4_fail_software_gb10.json", rc=0)
    assert not outcome.passed
    assert [(f.test, f.gpu) for f in outcome.failures] == [("software", 0)]


def test_nonzero_exit_fails_even_when_every_test_passed() -> None:
    outcome = run_fixture("dcgm4_pass_r2_4gpu.json", rc=EXIT_NVVS_ERROR)
    assert not outcome.passed and outcome.shape == "dcgm4"
    assert outcome.failures[-1].test == "dcgmi"
    assert "exit 226 (DCGM_ST_NVVS_ERROR" in outcome.failures[-1].message


def test_nonzero_exit_without_json_names_the_exit_and_the_first_line() -> None:
    outcome = parse_diag("\n\n  Error: Unable to start an embedded host engine. NVML error.\nmore\n", 248)
    assert not outcome.passed and outcome.shape == "none"
    (failure,) = outcome.failures
    assert failure.message == (
        "exit 248 (DCGM_ST_NVML_ERROR); no JSON document: "
        "Error: Unable to start an embedded host engine. NVML error."
    )


def test_a_run_refused_with_exit_0_still_fails() -> None:
    outcome = run_fixture("dcgm4_runtime_error_already_running.json", rc=0)
    assert not outcome.passed
    assert "A diag instance is already running" in outcome.failures[0].message


def test_a_cut_document_fails_as_invalid_json() -> None:
    text = fixture("dcgm4_pass_r2_4gpu.json")
    outcome = parse_diag(text[: len(text) // 2], 0)
    assert not outcome.passed
    assert "not valid JSON" in outcome.failures[0].message


@pytest.mark.parametrize("rc", [0, 226])
def test_empty_output_fails(rc: int) -> None:
    outcome = parse_diag("", rc)
    assert not outcome.passed and "no JSON document" in outcome.failures[0].message


def test_lines_before_the_document_are_skipped() -> None:
    text = "Warning: CUDA_VISIBLE_DEVICES is set\n{ not this\n" + fixture("dcgm4_pass_r2_4gpu.json")
    assert parse_diag(text, 0).passed


# ---- statuses -------------------------------------------------------------------------------------


def doc4(*results: dict[str, Any], summary_status: object = None, name: object = "memory") -> str:
    test: dict[str, Any] = {"name": name, "results": list(results)}
    if summary_status is not None:
        test["test_summary"] = {"status": summary_status}
    return json.dumps({"DCGM Diagnostic": {"test_categories": [{"category": "Hardware", "tests": [test]}]}})


def gpu(n: int, status: object, **extra: Any) -> dict[str, Any]:
    return {"entity_group": "GPU", "entity_group_id": 1, "entity_id": n, "status": status, **extra}


def test_skip_and_warn_do_not_fail_but_are_listed() -> None:
    warned = gpu(1, "Warn", warnings=[{"warning": "Clocks are being optimized for GPU 1"}])
    outcome = parse_diag(doc4(gpu(0, "Pass"), warned, gpu(2, "Skip")), 0)
    assert outcome.passed
    assert outcome.warnings == (
        "memory warned on GPU 1: Clocks are being optimized for GPU 1",
        "memory skipped on GPU 2",
    )


def test_a_run_where_nothing_passed_fails() -> None:
    outcome = parse_diag(doc4(gpu(0, "Skip"), gpu(1, "Skip")), 0)
    assert not outcome.passed
    assert outcome.failures[-1].message == "no test passed (all skipped)"
    assert not parse_diag(json.dumps({"DCGM Diagnostic": {}}), 0).passed


@pytest.mark.parametrize("status", ["Inconclusive", "", None, 5, 1.5, True, ["Pass"], {"x": 1}])
def test_an_unrecognised_status_fails(status: object) -> None:
    outcome = parse_diag(doc4(gpu(0, "Pass"), gpu(1, status)), 0)
    assert not outcome.passed
    assert [(f.test, f.gpu) for f in outcome.failures] == [("memory", 1)]
    assert outcome.failures[0].message.startswith("unrecognised status")
    assert_clean(outcome)


def test_a_result_without_status_fails() -> None:
    result = {"entity_group": "GPU", "entity_group_id": 1, "entity_id": 0}
    assert not parse_diag(doc4(gpu(1, "Pass"), result), 0).passed


def test_status_words_are_read_whatever_their_case() -> None:
    assert parse_diag(doc4(gpu(0, " PASS ")), 0).passed
    outcome = parse_diag(doc4(gpu(0, "FAIL")), 0)
    assert [(f.test, f.gpu, f.message) for f in outcome.failures] == [("memory", 0, "failed")]


def test_a_summary_fail_without_an_entity_fail_is_a_failure() -> None:
    outcome = parse_diag(doc4(gpu(0, "Pass"), summary_status="Fail"), 0)
    assert [(f.test, f.gpu) for f in outcome.failures] == [("memory", None)]
    assert not parse_diag(doc4(gpu(0, "Pass"), summary_status=7), 0).passed


def test_a_non_gpu_entity_is_named_in_the_message() -> None:
    cpu = {"entity_group": "CPU", "entity_group_id": 7, "entity_id": 0, "status": "Fail"}
    outcome = parse_diag(doc4(gpu(0, "Pass"), cpu), 0)
    assert [(f.test, f.gpu, f.message) for f in outcome.failures] == [("memory", None, "CPU 0: failed")]


def test_3x_deployment_warnings_keyed_warnings_are_read() -> None:
    text = json.dumps(
        {
            "DCGM GPU Diagnostic": {
                "test_categories": [
                    {
                        "category": "Deployment",
                        "tests": [
                            {"name": "Denylist", "results": [{"status": "Pass"}]},
                            {
                                "name": "Persistence Mode",
                                "results": [
                                    {
                                        "gpu_id": 0,
                                        "status": "Fail",
                                        "warnings": [{"error_id": 29, "warnings": "Persistence mode is off"}],
                                    }
                                ],
                            },
                        ],
                    }
                ]
            }
        }
    )
    outcome = parse_diag(text, 0)
    assert [(f.test, f.gpu, f.message) for f in outcome.failures] == [
        ("Persistence Mode", 0, "Persistence mode is off")
    ]


def test_summary_groups_gpus_and_counts_other_failures() -> None:
    text = json.dumps(
        {
            "DCGM Diagnostic": {
                "test_categories": [
                    {
                        "category": "Hardware",
                        "tests": [
                            {"name": "memory", "results": [gpu(1, "Fail"), gpu(3, "Fail"), gpu(0, "Pass")]},
                            {"name": "pcie", "results": [gpu(2, "Fail")]},
                        ],
                    }
                ]
            }
        }
    )
    outcome = parse_diag(text, EXIT_NVVS_ERROR)
    assert summary(outcome, "dcgmi diag -r 2") == "dcgmi diag -r 2: memory failed on GPUs 1,3 (+1 more)"


# ---- hostile output -------------------------------------------------------------------------------


def test_a_50_mib_output_is_a_clear_failure() -> None:
    huge = fixture("dcgm4_pass_r2_4gpu.json") + " " * (50 * 1024 * 1024)
    start = time.monotonic()
    outcome = parse_diag(huge, 0)
    assert time.monotonic() - start < 2.0
    assert not outcome.passed
    assert "output too large" in outcome.failures[0].message
    assert str(MAX_OUTPUT_CHARS) in outcome.detail
    assert_clean(outcome)


@pytest.mark.parametrize(
    "text",
    [
        '{"DCGM Diagnostic": {"test_categories": [{"tests": [{"name": "memory", "results": '
        '[{"entity_id": 0, "status": NaN}]}]}]}}',
        '{"DCGM Diagnostic": {"test_categories": [], "x": Infinity}}',
        '{"DCGM Diagnostic": {"x": -Infinity}}',
        "[" * 100_000 + "]" * 100_000,
        '{"DCGM Diagnostic": ' + '{"a": ' * 50_000 + "1" + "}" * 50_001,
        '{"DCGM Diagnostic": {"test_categories": [{"tests": [{"name": "memory", "results": ['
        + "[" * 900
        + "]" * 900
        + "]}]}]}}",
        '{"DCGM Diagnostic": {"x": ' + "9" * 5000 + "}}",
        "[]",
        "42",
        "null",
        '"DCGM Diagnostic"',
        '{"DCGM Diagnostic": []}',
        '{"DCGM Diagnostic": {"test_categories": {"not": "a list"}}}',
        '{"DCGM Diagnostic": {"test_categories": [7, {"tests": "x"}, {"tests": [null, 1]}]}}',
        '{"DCGM Diagnostic": {"test_categories": [{"tests": [{"name": 7, "results": {"x": 1}}]}]}}',
        '{"DCGM Diagnostic": {"test_categories": [{"tests": [{"name": "m", "results": [1, null]}]}]}}',
        '{"DCGM Diagnostic": {"runtime_error": {"nested": ["x"]}}}',
        '{"DCGM GPU Diagnostic": {"test_categories": [{"tests": [{"name": "m", "results": '
        '[{"gpu_id": {"x": 1}, "status": "Pass"}], "test_summary": "Fail"}]}]}}',
        "\x00\x01\x02\x1b[31m{\x7f",
        "\ud800 lone surrogate {",
    ],
    ids=lambda t: repr(t[:40]),
)
def test_hostile_output_is_a_clear_failure(text: str) -> None:
    outcome = parse_diag(text, 0)
    assert not outcome.passed
    assert outcome.failures
    assert_clean(outcome)


def test_control_characters_and_long_names_are_cleaned_and_bounded() -> None:
    name = "\x1b[31mmem\u202eory\u2028\n" + "x" * 10_000
    message = "line one\r\nline two\x00\x07 \u200b" + "y" * 10_000
    text = doc4(gpu(3, "Fail", warnings=[{"warning": message}]), name=name)
    outcome = parse_diag(text, EXIT_NVVS_ERROR)
    (failure,) = outcome.failures
    assert failure.gpu == 3
    assert failure.test.startswith("[31mmem ory x") and failure.test.endswith("...")
    assert failure.message.startswith("line one line two ") and failure.message.endswith("...")
    assert_clean(outcome)


@pytest.mark.parametrize(
    "gpu_id", ["\u00b2", "\u0663", "-1", "1e3", "12345678", 2**64, -3, 1.5, True, [0, 1]]
)
def test_odd_gpu_ids_are_no_gpu(gpu_id: object) -> None:
    text = json.dumps(
        {"DCGM GPU Diagnostic": {"test_categories": [{"tests": [{"name": "m", "results": [
            {"gpu_id": "0", "status": "Pass"}, {"gpu_id": gpu_id, "status": "Fail"}]}]}]}}
    )  # fmt: skip
    outcome = parse_diag(text, EXIT_NVVS_ERROR)
    assert [(f.test, f.gpu) for f in outcome.failures] == [("m", None)]
    assert outcome.failures[0].message.startswith("GPUs ")
    assert_clean(outcome)


def test_failures_are_bounded_but_counted() -> None:
    results = [gpu(i, "Fail") for i in range(5000)]
    outcome = parse_diag(doc4(*results), EXIT_NVVS_ERROR)
    assert len(outcome.failures) == MAX_FAILURES
    assert "5000 failed" in outcome.detail
    assert_clean(outcome)


@pytest.mark.parametrize("rc", [None, "0", True, 1.0])
def test_an_exit_status_that_is_not_an_int_fails(rc: Any) -> None:
    outcome = parse_diag(fixture("dcgm4_pass_r2_4gpu.json"), rc)
    assert not outcome.passed and outcome.failures[0].message.startswith("no exit status")


def test_bytes_and_none_are_read() -> None:
    assert parse_diag(fixture("dcgm4_pass_r2_4gpu.json").encode(), 0).passed  # type: ignore[arg-type]
    assert not parse_diag(None, 0).passed  # type: ignore[arg-type]


def test_clean_text_never_shows_a_container() -> None:
    deep: list[Any] = []
    for _ in range(5000):
        deep = [deep]
    assert clean_text(deep) == "<list>"
    assert clean_text({"a": 1}) == "<dict>"
    assert clean_text(None) == "None"


# ---- properties -----------------------------------------------------------------------------------

JSON_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(
        ["Pass", "Fail", "Skip", "Warn", "GPU", "CPU", "0", "3", "", "memory", "\u00b2", "\u0663"]
    ),
    st.text(max_size=30),
)
KEYS = st.sampled_from(
    [
        "test_categories",
        "tests",
        "results",
        "status",
        "name",
        "category",
        "test_summary",
        "entity_group",
        "entity_group_id",
        "entity_id",
        "gpu_id",
        "gpu_ids",
        "warnings",
        "warning",
        "info",
        "runtime_error",
    ]
)
JSON_VALUES = st.recursive(
    JSON_LEAVES,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(KEYS, children, max_size=5),
    max_leaves=40,
)


def check_property(outcome: DiagOutcome, rc: int) -> None:
    assert isinstance(outcome, DiagOutcome)
    # the catch-all in parse_diag is a last resort: the rules themselves must not raise
    assert not any(f.message.startswith("unreadable") for f in outcome.failures)
    if outcome.passed:
        assert rc == 0 and not outcome.failures
    else:
        assert outcome.failures
    assert_clean(outcome)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=2000), st.integers(-(2**40), 2**40))
def test_parse_diag_never_raises_on_text(text: str, rc: int) -> None:
    check_property(parse_diag(text, rc), rc)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    JSON_VALUES,
    st.sampled_from(["DCGM Diagnostic", "DCGM GPU Diagnostic"]),
    st.sampled_from([0, 0, 226, 205]),
)
def test_parse_diag_never_raises_on_json_shapes(value: Any, root: str, rc: int) -> None:
    check_property(parse_diag(json.dumps({root: value}), rc), rc)
    check_property(parse_diag(json.dumps({root: {"test_categories": [{"tests": value}]}}), rc), rc)


@settings(max_examples=200, deadline=None)
@given(st.integers(-300, 300), st.text(max_size=300) | st.none(), st.text(max_size=300) | st.none())
def test_parse_command_never_raises(rc: int, stdout: str | None, stderr: str | None) -> None:
    outcome = parse_command(rc, stdout, stderr)
    assert outcome.passed is (rc == 0)
    check_property(outcome, rc)


# ---- a site's own validation command --------------------------------------------------------------


def test_parse_command() -> None:
    assert parse_command(0, "all good\n", "").passed
    outcome = parse_command(1, "out 1\nout last\n", "warning\n#  Out of bounds values : 3 FAILED\n\n  \n")
    assert not outcome.passed and outcome.shape == "none"
    assert outcome.failures[0].message == "exit 1: # Out of bounds values : 3 FAILED"
    assert parse_command(3, "stdout last\n\n", "").failures[0].message == "exit 3: stdout last"
    assert parse_command(2, None, None).failures[0].message == "exit 2: (no output)"
    assert (
        parse_command(-9, "", b"\xff\xfe bytes\n").failures[0].message
        == "killed by signal 9: \ufffd\ufffd bytes"
    )
    assert (
        summary(parse_command(1, "", "NCCL error"), "nccl all-reduce")
        == "nccl all-reduce: exit 1: NCCL error"
    )
    huge = parse_command(1, "x" * (20 * 1024 * 1024), "\x1b[1m" + "e" * 10_000)
    assert_clean(huge)
    assert not parse_command(None, "", "").passed  # type: ignore[arg-type]


# ---- the fake dcgmi -------------------------------------------------------------------------------


def fake(
    args: list[str],
    plan: dict[str, Any] | None,
    tmp_path: Path,
    node: str | None = None,
    direct: bool = False,
) -> tuple[subprocess.CompletedProcess[str], Path]:
    env = {k: v for k, v in os.environ.items() if k not in ("FLEETWATCH_FAKE_DCGMI_PLAN", "SLURMD_NODENAME")}
    plan_path = tmp_path / "plan.json"
    if plan is not None:
        plan_path.write_text(json.dumps(plan))
        env["FLEETWATCH_FAKE_DCGMI_PLAN"] = str(plan_path)
    if node:
        env["SLURMD_NODENAME"] = node
    argv = [str(FAKE), *args] if direct else [sys.executable, str(FAKE), *args]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)
    return done, Path(f"{plan_path}.calls")


def calls(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_fake_is_an_executable_script(tmp_path: Path) -> None:
    assert os.access(FAKE, os.X_OK)
    assert FAKE.read_text().startswith("#!/usr/bin/env python3\n")
    done, _ = fake(["diag", "-r", "1", "-j"], {"fixture": "dcgm4_pass_r2_4gpu.json"}, tmp_path, direct=True)
    assert done.returncode == 0 and parse_diag(done.stdout, done.returncode).passed


def test_the_fake_replays_a_passing_run(tmp_path: Path) -> None:
    plan = {"fixture": "dcgm3_pass_r2.json", "rc": 0, "sleep_s": 0, "stderr": ""}
    done, calls_file = fake(["diag", "-r", "2", "-j", "-i", "0,1,2,3"], plan, tmp_path)
    assert (done.returncode, done.stdout, done.stderr) == (0, fixture("dcgm3_pass_r2.json"), "")
    (call,) = calls(calls_file)
    assert call["argv"] == ["diag", "-r", "2", "-j", "-i", "0,1,2,3"]
    assert call["rc"] == 0 and call["entry"] == "plan" and call["node"]
    assert abs(call["time"] - time.time()) < 60


def test_the_fake_replays_a_failing_run_with_its_real_exit_status(tmp_path: Path) -> None:
    done, _ = fake(["diag", "-r", "2", "-j"], {"fixture": "dcgm4_fail_memory_gpu3.json"}, tmp_path)
    assert done.returncode == EXIT_NVVS_ISOLATE_ERROR
    outcome = parse_diag(done.stdout, done.returncode)
    assert [(f.test, f.gpu) for f in outcome.failures] == [("memory", 3)]
    plan = {"fixture": "dcgm4_fail_memory_gpu3.json", "rc": 226, "stderr": "some warning\n"}
    done, _ = fake(["diag", "--run", "memory", "--json"], plan, tmp_path)
    assert (done.returncode, done.stderr) == (226, "some warning\n")


def test_the_fake_chooses_by_node(tmp_path: Path) -> None:
    plan = {
        "nodes": {
            "node-a": {"fixture": "dcgm4_fail_software_gb10.json"},
            "node-b": {"stdout": "custom\n", "rc": 7},
        },
        "default": {"fixture": "dcgm4_pass_r2_4gpu.json"},
    }
    a, calls_file = fake(["diag", "-r", "1", "-j"], plan, tmp_path, node="node-a")
    b, _ = fake(["diag", "-r", "1", "-j"], plan, tmp_path, node="node-b.cluster.local")
    c, _ = fake(["diag", "-r", "1", "-j"], plan, tmp_path, node="node-c")
    assert (a.returncode, b.returncode, c.returncode) == (226, 7, 0)
    assert b.stdout == "custom\n"
    assert [(x["node"], x["entry"]) for x in calls(calls_file)] == [
        ("node-a", "nodes.node-a"),
        ("node-b.cluster.local", "nodes.node-b"),
        ("node-c", "default"),
    ]
    del plan["default"]
    d, _ = fake(["diag", "-r", "1", "-j"], plan, tmp_path, node="node-c")
    assert (d.returncode, d.stdout) == (EXIT_CONNECTION_NOT_VALID, fixture("hostengine_not_running.txt"))


def test_the_fake_sleeps_and_answers_a_signal_as_dcgmi_does(tmp_path: Path) -> None:
    done, _ = fake(
        ["diag", "-r", "1", "-j"], {"fixture": "dcgm4_pass_r2_4gpu.json", "sleep_s": 0.3}, tmp_path
    )
    assert done.returncode == 0
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps({"fixture": "dcgm4_pass_r2_4gpu.json", "sleep_s": 30}))
    env = {**os.environ, "FLEETWATCH_FAKE_DCGMI_PLAN": str(plan_path)}
    start = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, str(FAKE), "diag", "-r", "1", "-j", "-i", "0,1"],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 10
    while not Path(f"{plan_path}.calls").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.2)  # the handler is installed right after the call is recorded
    proc.send_signal(signal.SIGTERM)
    stdout, _ = proc.communicate(timeout=10)
    assert time.monotonic() - start < 10
    assert proc.returncode == EXIT_NVVS_KILLED
    outcome = parse_diag(stdout, proc.returncode)
    assert not outcome.passed and outcome.shape == "dcgm4"
    assert "Return: (-53) : The DCGM diagnostic was killed by a signal" in outcome.failures[0].message
    assert "entities 0,1" in outcome.failures[0].message


def test_the_fake_sleep_takes_its_time(tmp_path: Path) -> None:
    start = time.monotonic()
    fake(["diag", "-r", "1", "-j"], {"fixture": "dcgm4_pass_r2_4gpu.json", "sleep_s": 0.5}, tmp_path)
    assert time.monotonic() - start >= 0.5


def test_without_a_plan_the_fake_is_a_host_without_a_host_engine(tmp_path: Path) -> None:
    done, _ = fake(["diag", "-r", "1", "-j"], None, tmp_path)
    assert (done.returncode, done.stdout, done.stderr) == (235, fixture("hostengine_not_running.txt"), "")
    outcome = parse_diag(done.stdout, done.returncode)
    assert "DCGM_ST_CONNECTION_NOT_VALID" in outcome.failures[0].message


@pytest.mark.parametrize(
    ("args", "arg_id", "message"),
    [
        (["diag", "-r", "1", "--bogus"], "--bogus", "Couldn't find match for argument"),
        (["diag", "-x"], "-x", "Couldn't find match for argument"),
        (["diag", "-j", "-r"], "-r (--run)", "Missing a value for this argument!"),
        (["diag", "-r", "1", "-j", "-j"], "-j (--json)", "Argument already set!"),
    ],
)
def test_bad_arguments_get_dcgmis_usage_error(
    tmp_path: Path, args: list[str], arg_id: str, message: str
) -> None:
    done, calls_file = fake(args, {"fixture": "dcgm4_pass_r2_4gpu.json"}, tmp_path)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith(f"PARSE ERROR: Argument: {arg_id}\n             {message}\n\nUsage: \n")
    assert "For complete USAGE and HELP type: \n" in done.stderr
    assert calls(calls_file)[0]["rc"] is None
    assert not parse_diag(done.stdout, done.returncode).passed


def test_the_fake_refuses_other_subcommands_and_bad_plans(tmp_path: Path) -> None:
    done, _ = fake(["discovery", "-l"], {"fixture": "dcgm4_pass_r2_4gpu.json"}, tmp_path)
    assert done.returncode == 2 and "only 'diag'" in done.stderr
    done, _ = fake(["diag", "-r", "1", "-j"], {"fixture": "no_such_file.json"}, tmp_path)
    assert done.returncode == 2 and "bad plan" in done.stderr
    done, _ = fake(["diag", "-r", "1", "-j"], ["not", "an", "object"], tmp_path)  # type: ignore[arg-type]
    assert done.returncode == 2 and "bad plan" in done.stderr
