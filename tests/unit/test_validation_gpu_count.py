"""What a dcgmi run must show before a node passes its validation (alerts/dcgm_diag.py parse_diag,
alerts/validation.py): every GPU Slurm configures on the node tested and passed (a GPU that fell off
the bus after an XID 79 is one DCGM cannot see, so never fails), all of its output read, and a
timeout that is a number of seconds. Findings of an adversarial probe."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fleetwatch import schemas
from fleetwatch.alerts.dcgm_diag import parse_diag, summary
from fleetwatch.alerts.validation import ValidationSettings
from tests.helpers.memory_slurm import MemorySlurm, resume_request, validating_drainer
from tests.helpers.paths import FIXTURES

PASS_4_GPUS = (FIXTURES / "dcgm_diag" / "dcgm4_pass_r2_4gpu.json").read_text()
DCGM3_R1 = (FIXTURES / "dcgm_diag" / "dcgm3_pass_r2.json").read_text()


def dcgm3_level1(devices: int) -> str:
    """DCGM 3.x at level 1: deployment tests only, whose results name no GPU; `GPU Device IDs`
    lists the GPUs it ran on."""
    doc: dict[str, Any] = json.loads(DCGM3_R1)
    root = doc["DCGM GPU Diagnostic"]
    root["test_categories"] = [c for c in root["test_categories"] if c["category"] == "Deployment"]
    doc["GPU Device IDs"] = ["20b5"] * devices
    return json.dumps(doc)


@pytest.mark.parametrize(("expected", "passed"), [(0, True), (4, True), (3, True), (8, False)])
def test_a_run_passes_only_with_every_gpu_slurm_configures(expected: int, passed: bool) -> None:
    outcome = parse_diag(PASS_4_GPUS, 0, expected_gpus=expected)
    assert outcome.passed is passed
    if not passed:
        assert summary(outcome, "dcgmi diag -r 2") == (
            "dcgmi diag -r 2: only 4 of the 8 GPUs Slurm configures on the node were tested and passed "
            "(a GPU DCGM cannot see is never tested)"
        )


def test_one_gpu_of_eight_passing_is_not_a_healthy_node() -> None:
    result = {"entity_group": "GPU", "entity_group_id": 1, "entity_id": 0, "status": "Pass"}
    one = {
        "DCGM Diagnostic": {
            "test_categories": [{"category": "x", "tests": [{"name": "software", "results": [result]}]}]
        }
    }
    assert parse_diag(json.dumps(one), 0).passed  # no count to hold it to
    assert not parse_diag(json.dumps(one), 0, expected_gpus=8).passed


@pytest.mark.parametrize(("devices", "passed"), [(8, True), (7, False)])
def test_a_level_1_run_that_names_no_gpu_counts_the_gpus_it_lists(devices: int, passed: bool) -> None:
    assert parse_diag(dcgm3_level1(devices), 0, expected_gpus=8).passed is passed


def test_the_adapter_holds_the_run_to_the_gpus_slurm_configures(tmp_path: Path) -> None:
    slurm = MemorySlurm("drained", "fleetwatch: XID 79 [fw:aaaaaaaaaaaa]", results=[0])  # gpu:8 in Slurm
    slurm.stdout = PASS_4_GPUS
    drainer, results = validating_drainer(slurm, tmp_path, mode="dcgmi")
    drainer.handle(schemas.encode(resume_request()), "t:0:0", key=b"gpu01")
    assert drainer.settle(10) == ["validation_failed"]
    assert "only 4 of the 8 GPUs" in results.details[0] and slurm.state == "drained"


def test_output_the_reader_cut_fails_whatever_its_characters() -> None:
    # a passing document and 6 MB of 2-byte characters: 4 MiB read, under 4 Mi characters
    kept = (PASS_4_GPUS + "\n" + "é" * 3_000_000).encode()[: 4 * 1024 * 1024].decode("utf-8", "replace")
    assert parse_diag(kept, 0).passed  # the characters alone do not say it was cut
    outcome = parse_diag(kept, 0, truncated=True)
    assert not outcome.passed and "output too large" in outcome.failures[0].message


def test_a_json_error_names_what_is_wrong() -> None:
    outcome = parse_diag('{"DCGM Diagnostic": {"test_categories": [', 0)
    assert "Expecting value" in outcome.failures[0].message  # not "<JSONDecodeError>"


@pytest.mark.parametrize("timeout_s", [float("inf"), float("nan"), 0.0])
def test_a_timeout_that_is_no_number_of_seconds_is_refused_at_start(timeout_s: float) -> None:
    with pytest.raises(ValueError, match="--validate-timeout"):
        ValidationSettings.from_flags("dcgmi", 1, None, timeout_s, "dcgmi")
