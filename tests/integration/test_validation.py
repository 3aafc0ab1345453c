"""Validation before a drained node returns (alerts/validation.py, alerts/slurm_drainer.py) on the
real Slurm (services/slurm/slurm.sh): the adapter reserves the node, lifts the drain inside the
reservation, runs the test as a real Slurm job on that node (the fake `dcgmi`, tests/fakes/dcgmi,
replaying real outputs and exit codes) and resumes the node only if it passes; a node that fails, or
whose test runs too long, is drained again with the failing test and GPU in its Reason, and its
failed job is in Slurm's job log (where slurm-jobs reads job ends for the lemon history). A node an
operator drained is never touched, and a validation a crash interrupted is finished, not skipped."""

from __future__ import annotations

import json
import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from fleetwatch.alerts import drain_request as dr
from fleetwatch.alerts.journal import Journal
from fleetwatch.alerts.slurm import SlurmClient
from fleetwatch.alerts.slurm_drainer import Drainer
from fleetwatch.alerts.validation import ValidationSettings, Validator, reservation_name
from fleetwatch.bus.kafka import KafkaBus
from tests.helpers.paths import REPO
from tests.integration.services import USES_SLURM, Jobs, Slurm

pytestmark = USES_SLURM

KEY = b"test-drain-key-0123456789abcdef"
FAKE_DCGMI = str(REPO / "tests" / "fakes" / "dcgmi")
NODE = "gpu-node-02"


def req(node: str, action: str, findings: tuple[str, ...]) -> bytes:
    msg = dr.make_request(
        node=node,
        action=action,
        reason="fleetwatch: XID 79",
        severity="critical",
        findings=findings,
        issued_at=time.time(),
        key=KEY,
    )
    return orjson.dumps(msg)


class Rig:
    def __init__(self, slurm: Slurm, bootstrap: str, tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.slurm, self.tmp, self.bootstrap = slurm, tmp, bootstrap
        self.plan = tmp / "plan.json"
        # srun hands the job this process's environment: the fake dcgmi finds its plan there
        monkeypatch.setenv("FLEETWATCH_FAKE_DCGMI_PLAN", str(self.plan))
        self.client = SlurmClient(slurm.conf)
        self.producer = KafkaBus(bootstrap).producer()
        self.journal = Journal(tmp / "journal.sqlite")

    def drainer(self, **settings: Any) -> Drainer:
        s = {"mode": "dcgmi", "level": 1, "timeout_s": 60.0, "dcgmi": FAKE_DCGMI, "user": "root", **settings}
        validator = Validator(self.client, ValidationSettings(**s))
        return Drainer(self.client, self.journal, KEY, self.producer, validator=validator)

    def planned(self, entry: dict[str, Any]) -> None:
        self.plan.write_text(json.dumps({"nodes": {NODE: entry}}))

    def calls(self) -> list[dict[str, Any]]:
        path = Path(f"{self.plan}.calls")
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def drained_by_us(self, d: Drainer) -> tuple[str, ...]:
        findings = (uuid.uuid4().hex,)
        assert d.handle(req(NODE, "drain", findings), "t:0:0") == "executed"
        assert self.slurm.state(NODE)[0].startswith("drain")
        return findings

    def close(self) -> None:
        assert not self.producer.flush(10)
        self.producer.close(5)
        self.journal.close()


@pytest.fixture
def rig(slurm: Slurm, kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Rig]:
    slurm.reset(NODE)
    r = Rig(slurm, kafka_bootstrap, tmp_path, monkeypatch)
    yield r
    r.close()
    subprocess.run(
        ["scontrol", "delete", f"ReservationName={reservation_name(NODE)}"],
        env=slurm.env,
        capture_output=True,
    )
    slurm.reset(NODE)


def jobcomp(slurm: Slurm) -> str:
    return (Path(slurm.conf).parent / "jobcomp.log").read_text(errors="replace")


def test_a_node_that_passes_dcgmi_diag_on_the_node_is_resumed(rig: Rig) -> None:
    d = rig.drainer()
    findings = rig.drained_by_us(d)
    rig.planned({"fixture": "dcgm4_pass_r2_8gpu.json"})
    assert d.handle(req(NODE, "resume", findings), "t:0:1") == "validating"  # on its own thread
    assert d.settle() == ["executed"]
    state, reason = rig.slurm.state(NODE)
    assert state.rstrip("*") == "idle" and reason == "none"
    assert not rig.client.reservation_exists(reservation_name(NODE))  # back in service for all
    (call,) = rig.calls()  # the test ran once, as a job on that very node, as dcgmi is run
    assert call["node"] == NODE and call["argv"] == ["diag", "-r", "1", "-j"]
    (entry,) = [e for e in rig.journal.entries(NODE) if e.action == "resume"]
    assert entry.status == "executed" and entry.detail == "validated: dcgmi diag -r 1: passed"


def test_a_node_that_fails_stays_drained_naming_the_test_and_gpu_and_its_job_failed(rig: Rig) -> None:
    d = rig.drainer()
    findings = rig.drained_by_us(d)
    rig.planned({"fixture": "dcgm4_fail_memory_gpu3.json"})  # exits 205, as dcgmi does for it
    assert d.handle(req(NODE, "resume", findings), "t:0:1") == "validating"
    assert d.settle() == ["validation_failed"]
    state, reason = rig.slurm.state(NODE)
    assert state.startswith("drain")
    assert reason.startswith("fleetwatch: validation failed: dcgmi diag -r 1: ") and "GPU 3" in reason
    assert not rig.client.reservation_exists(reservation_name(NODE))
    log = jobcomp(rig.slurm)  # the failed test is a failed job on the node, for the lemon history
    ends = [line for line in log.splitlines() if f"Name={reservation_name(NODE)} " in line]
    assert ends and "JobState=FAILED" in ends[-1] and f"NodeList={NODE}" in ends[-1]
    # ... which slurm-jobs publishes as a failed job/1 on that node: the lemon detector counts it
    job = re.search(r"JobId=(\d+)", ends[-1])
    assert job is not None
    jobs = Jobs(rig.slurm, rig.bootstrap, rig.tmp)
    jobs.start("--once")
    try:
        jobs.wait(jobs.ended(job.group(1)))
    finally:
        jobs.stop()
    (end,) = [m for m in jobs.messages(job.group(1)) if m["state"] in ("finished", "failed")]
    assert end["state"] == "failed" and end["nodes"] == [NODE] and end["end_state"] == "FAILED"


def test_a_reservation_slurm_refuses_for_good_fails_the_validation_at_once(rig: Rig) -> None:
    """A validation user Slurm does not know ("Invalid user id") was taken for Slurm being away:
    retried every minute for ever, the resume unanswered until act paged an hour later. Now the
    answer comes at once, the node stays drained, and the Reason says why; nothing ran on it."""
    d = rig.drainer(user="fleetwatch-no-such-user")
    findings = rig.drained_by_us(d)
    assert d.handle(req(NODE, "resume", findings), "t:0:1") == "validating"
    assert d.settle() == ["validation_failed"]
    state, reason = rig.slurm.state(NODE)
    assert state.startswith("drain") and "cannot reserve" in reason and "Invalid user id" in reason
    assert not rig.client.reservation_exists(reservation_name(NODE)) and rig.calls() == []


def test_a_test_that_runs_too_long_is_cancelled_and_fails(rig: Rig) -> None:
    d = rig.drainer(timeout_s=5.0)
    findings = rig.drained_by_us(d)
    rig.planned({"fixture": "dcgm4_pass_r2_8gpu.json", "sleep_s": 60})
    t0 = time.monotonic()
    assert d.handle(req(NODE, "resume", findings), "t:0:1") == "validating"
    assert d.settle() == ["validation_failed"]
    assert time.monotonic() - t0 < 30
    state, reason = rig.slurm.state(NODE)
    assert state.startswith("drain") and "did not finish in 5 s" in reason


def test_without_dcgmi_on_the_node_the_sites_command_decides_and_with_neither_it_fails(rig: Rig) -> None:
    d = rig.drainer(dcgmi="/nonexistent/dcgmi")
    findings = rig.drained_by_us(d)
    assert d.handle(req(NODE, "resume", findings), "t:0:1") == "validating"
    assert d.settle() == ["validation_failed"]
    assert "not installed" in rig.slurm.state(NODE)[1]  # never returned untested
    d = rig.drainer(dcgmi="/nonexistent/dcgmi", command=("sh", "-c", 'test -n "$SLURM_JOB_ID"'))
    findings = rig.drained_by_us(d)
    assert d.handle(req(NODE, "resume", findings), "t:0:2") == "validating"
    assert d.settle() == ["executed"]  # the command ran inside a job: passed
    assert rig.slurm.state(NODE)[0].rstrip("*") == "idle"


def test_an_operators_drain_is_never_validated_nor_lifted(rig: Rig) -> None:
    d = rig.drainer()
    rig.planned({"fixture": "dcgm4_pass_r2_8gpu.json"})
    subprocess.run(
        ["scontrol", "update", f"NodeName={NODE}", "State=DRAIN", "Reason=bad fan (alice)"],
        env=rig.slurm.env,
        check=True,
    )
    assert d.handle(req(NODE, "resume", (uuid.uuid4().hex,)), "t:0:1") == "not_ours"
    assert rig.slurm.state(NODE) == ("drained", "bad fan (alice)") and rig.calls() == []
    assert not rig.client.reservation_exists(reservation_name(NODE))


def test_a_validation_a_crash_interrupted_is_finished_not_skipped(rig: Rig) -> None:
    d = rig.drainer()
    findings = rig.drained_by_us(d)
    rig.planned({"fixture": "dcgm3_fail_memory_gpu1.json"})
    resume = req(NODE, "resume", findings)
    msg = orjson.loads(resume)
    # The crash came after the journal and the first two steps: reserved, drain lifted, no test yet.
    d.journal.begin(msg["request_id"], NODE, "resume", time.time(), "t:0:1", None, msg["signature"])
    assert d.validator is not None
    d.validator.prepare(NODE, drained=True)
    assert rig.slurm.state(NODE)[0].rstrip("*") in ("idle", "maint", "reserved")
    again = rig.drainer()  # the restarted adapter, on the same journal, takes it up at start
    assert again.recover() == 1
    assert again.settle() == ["validation_failed"]
    assert again.handle(resume, "t:0:1") == "duplicate"  # the request redelivered: answered once
    state, reason = rig.slurm.state(NODE)
    assert state.startswith("drain") and "GPU 1" in reason
    assert not rig.client.reservation_exists(reservation_name(NODE))
    assert len(rig.calls()) == 1


def test_requests_behind_a_long_validation_are_not_held_up(rig: Rig) -> None:
    d = rig.drainer()
    findings = rig.drained_by_us(d)
    rig.planned({"fixture": "dcgm4_pass_r2_8gpu.json", "sleep_s": 4})
    assert d.handle(req(NODE, "resume", findings), "t:0:1") == "validating"
    other = "gpu-node-04"
    rig.slurm.reset(other)
    try:
        t0 = time.monotonic()
        assert d.handle(req(other, "drain", (uuid.uuid4().hex,)), "t:0:2") == "executed"
        assert time.monotonic() - t0 < 5 and d.busy  # drained while the test still runs
        assert rig.slurm.state(other)[0].startswith("drain")
        assert d.settle() == ["executed"]
    finally:
        rig.slurm.reset(other)


@pytest.mark.parametrize(
    ("stdout", "why"),
    [
        ("{" * 5 + "x" * (6 * 1024 * 1024), "too big"),  # 6 MiB of garbage, exit 0
        ('{"DCGM Diagnostic": {"test_categories": [{"category": "Hardware", "tests": [', "truncated"),
        ("\x1b[31mOK\x00\u202e all tests passed\n", "not JSON, with control characters"),
    ],
)
def test_hostile_output_from_the_node_fails_the_validation_and_nothing_dies(
    rig: Rig, stdout: str, why: str
) -> None:
    """Whatever the node prints through the real srun (huge, truncated, escape codes) with exit 0,
    the adapter reads at most its bound, fails the validation with a one-line reason and goes on."""
    d = rig.drainer()
    findings = rig.drained_by_us(d)
    rig.planned({"stdout": stdout, "rc": 0})
    assert d.handle(req(NODE, "resume", findings), "t:0:1") == "validating"
    assert d.settle() == ["validation_failed"], why
    state, reason = rig.slurm.state(NODE)
    assert state.startswith("drain") and reason.startswith("fleetwatch: validation failed: ")
    assert "\x1b" not in reason and "\x00" not in reason and len(reason) < 400
    assert not rig.client.reservation_exists(reservation_name(NODE))
    assert d.handle(req(NODE, "drain", (uuid.uuid4().hex,)), "t:0:2") == "executed"  # and it goes on
