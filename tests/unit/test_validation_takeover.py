"""A validated resume (alerts/slurm_drainer.py) against what people and Slurm do meanwhile: an
operator who takes the node over keeps it and gets no reservation left behind, a verdict journalled
before a crash is carried out whatever Slurm's state suggests, srun failing before its job ran is
retried (never a verdict), and what cannot be run ends with an answer. Findings of an adversarial
probe; Slurm here is the in-memory stand-in (the real one: tests/integration/test_validation.py)."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from fleetwatch import schemas
from fleetwatch.alerts.slurm import NodeInfo
from fleetwatch.alerts.validation import srun_failed
from tests.helpers.memory_slurm import MemorySlurm, resume_request, validating_drainer

OURS = "fleetwatch: XID 79 [fw:aaaaaaaaaaaa]"
RESERVATION = "fleetwatch-validate-gpu01"


def started(slurm: MemorySlurm, tmp_path: Path) -> tuple[object, ...]:
    """An adapter that journalled a validated resume, reserved the node and resumed it inside the
    reservation, then stopped (steps 1-2 done): (drainer, results, request)."""
    drainer, results = validating_drainer(slurm, tmp_path)
    msg = resume_request()
    drainer.journal.begin(
        msg["request_id"], "gpu01", "resume", msg["issued_at"], "t:0:0", None, msg["signature"]
    )
    slurm.create_reservation(RESERVATION, "gpu01", "fw")
    slurm.resume("gpu01")
    return drainer, results, msg


def test_a_failed_verdict_journalled_before_a_restart_is_never_read_as_a_pass(tmp_path: Path) -> None:
    # the node in service and no reservation of ours: from Slurm's state alone, the test had passed
    # (what a `scontrol show reservation` that timed out, read as "none", showed a restart)
    slurm = MemorySlurm("drained", OURS, results=[])
    drainer, results, msg = started(slurm, tmp_path)
    slurm.reservations.clear()
    drainer.journal.save_verdict(msg["request_id"], False, "dcgmi diag -r 1: memory failed on GPU 3")
    assert drainer.recover() == 1
    assert drainer.settle(10) == ["not_ours"]  # someone removed our reservation: theirs, not executed
    assert results.outcomes == ["rejected_not_ours"] and slurm.runs == 0  # and never tested again


def test_a_passed_verdict_journalled_before_a_restart_is_answered_as_validated(tmp_path: Path) -> None:
    slurm = MemorySlurm("drained", OURS, results=[])
    drainer, results, msg = started(slurm, tmp_path)
    drainer.journal.save_verdict(msg["request_id"], True, "dcgmi diag -r 1: passed")
    slurm.reservations.clear()  # released, then the adapter stopped before it answered
    assert drainer.recover() == 1
    assert drainer.settle(10) == ["executed"]
    assert results.details == ["validated: dcgmi diag -r 1: passed"]  # act counts it as a pass


def test_an_interrupted_validation_an_operator_took_over_releases_its_reservation(tmp_path: Path) -> None:
    slurm = MemorySlurm("drained", OURS)
    drainer, results, _msg = started(slurm, tmp_path)
    slurm.state, slurm.reason = "drained", "RMA ticket 4711 (bob)"  # while the adapter was down
    assert drainer.recover() == 1
    assert results.outcomes == ["rejected_not_ours"]
    # left, only the adapter's user could run jobs there after bob's RESUME, for ever
    assert slurm.reservations == set()
    assert slurm.reason == "RMA ticket 4711 (bob)" and slurm.runs == 0


class ResumedWhileDraining(MemorySlurm):
    """A node whose jobs are still running when its validation starts; the operator resumes it
    by hand (scontrol RESUME) while the test waits for them."""

    def node(self, node: str) -> NodeInfo:
        if self.state == "draining" and self.updates == 0:
            self.updates += 1  # the first look: still draining
        elif self.state == "draining":
            self.state, self.reason = "mixed", ""  # the operator's RESUME, jobs still running
        return super().node(node)


def test_a_node_resumed_by_hand_while_its_jobs_drain_is_not_tested_nor_drained_again(
    tmp_path: Path,
) -> None:
    slurm = ResumedWhileDraining("draining", OURS, results=[1])
    drainer, results = validating_drainer(slurm, tmp_path)
    msg = resume_request()
    assert drainer.handle(schemas.encode(msg), "t:0:0", key=b"gpu01") == "validating"
    assert drainer.settle(10) == ["not_ours"]
    assert results.outcomes == ["rejected_not_ours"] and "before its test" in results.details[0]
    assert slurm.runs == 0 and slurm.reservations == set()
    assert (slurm.state, slurm.reason) == ("mixed", "")  # as the operator left it


def test_a_node_set_down_with_someone_elses_reason_during_a_failing_test_keeps_their_reason(
    tmp_path: Path,
) -> None:
    def bob(s: MemorySlurm) -> None:
        s.state, s.reason = "down", "bob: PSU smoking, do not touch"

    slurm = MemorySlurm("drained", OURS, results=[1])
    slurm.during_test = bob
    drainer, results = validating_drainer(slurm, tmp_path)
    assert drainer.handle(schemas.encode(resume_request()), "t:0:0", key=b"gpu01") == "validating"
    assert drainer.settle(10) == ["not_ours"]
    assert slurm.reason == "bob: PSU smoking, do not touch" and slurm.state == "down"
    assert slurm.reservations == set()
    assert results.outcomes == ["rejected_not_ours"] and "all-reduce mismatch" in results.details[0]


def test_srun_failing_before_its_job_ran_is_retried_never_a_verdict(tmp_path: Path) -> None:
    slurm = MemorySlurm("drained", OURS, results=[1, 1, 1, 1, 1, 0])
    slurm.during_test = lambda s: None  # slurmctld stays up
    slurm.stderr = (
        "srun: error: Unable to allocate resources: Unable to contact slurm controller (connect failure)"
    )
    drainer, results = validating_drainer(slurm, tmp_path)
    msg = resume_request()
    assert drainer.handle(schemas.encode(msg), "t:0:0", key=b"gpu01") == "validating"
    assert drainer.settle(10) == []  # five tries, then taken up again later: no answer, no verdict
    assert results.outcomes == [] and drainer.journal.verdict(msg["request_id"]) is None
    assert slurm.state == "idle" and slurm.reservations == {RESERVATION}  # held for the adapter alone
    slurm.stderr = ""
    assert drainer.recover() == 1 and drainer.settle(10) == ["executed"]  # the controller is back
    assert slurm.reservations == set()


def test_a_test_job_that_ran_and_failed_is_still_a_verdict(tmp_path: Path) -> None:
    slurm = MemorySlurm("drained", OURS, results=[1])
    slurm.during_test = lambda s: None
    slurm.stderr = "NCCL error: unhandled cuda error\nsrun: error: gpu01: task 0: Exited with exit code 1"
    drainer, results = validating_drainer(slurm, tmp_path)
    drainer.handle(schemas.encode(resume_request()), "t:0:0", key=b"gpu01")
    assert drainer.settle(10) == ["validation_failed"]
    assert results.outcomes == ["rejected_validation"] and slurm.state == "drained"


class NoSrun(MemorySlurm):
    def run_on(self, *args: object, **kwargs: object) -> subprocess.CompletedProcess[str]:
        raise FileNotFoundError(2, "No such file or directory", "srun")


def test_srun_that_cannot_be_run_here_is_an_answer_not_a_loop(tmp_path: Path) -> None:
    slurm = NoSrun("drained", OURS)
    drainer, results = validating_drainer(slurm, tmp_path)
    drainer.handle(schemas.encode(resume_request()), "t:0:0", key=b"gpu01")
    assert drainer.settle(10) == ["validation_failed"]
    assert "srun could not be run on the adapter's host" in results.details[0]
    assert [e.status for e in drainer.journal.entries()] == ["rejected"]  # not `executing` for ever


def test_srun_missing_here_is_not_taken_for_dcgmi_missing_on_the_node(tmp_path: Path) -> None:
    slurm = NoSrun("drained", OURS)
    drainer, results = validating_drainer(slurm, tmp_path, mode="dcgmi")
    drainer.handle(schemas.encode(resume_request()), "t:0:0", key=b"gpu01")
    assert drainer.settle(10) == ["validation_failed"]
    assert results.details[0].startswith("dcgmi diag -r 1: srun failed: srun could not be run")


def test_requests_read_while_validation_threads_end_never_trip_on_the_running_set(tmp_path: Path) -> None:
    slurm = MemorySlurm("drained", OURS)
    drainer, _results = validating_drainer(slurm, tmp_path)
    stop = threading.Event()

    def churn() -> None:  # validations starting and ending, as their threads do
        i = 0
        while not stop.is_set():
            rid = f"r{i % 200}"
            drainer._forget_running(rid)
            with drainer._running_lock:
                drainer._running[rid] = ((rid, f"n{i % 200}", "resume", "s"), threading.current_thread())
            i += 1

    for i in range(200):
        drainer._running[f"r{i}"] = ((f"r{i}", f"n{i}", "resume", "s"), threading.current_thread())
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch as often as they can: the race shows at once
    t = threading.Thread(target=churn)
    t.start()
    try:
        for _ in range(3000):
            assert drainer._validating("gpu99") is None
    finally:
        stop.set()
        t.join()
        sys.setswitchinterval(switch)


class JobsEnding(MemorySlurm):
    """Drained with jobs still running, shown as a compound state; they end after a few looks."""

    def __init__(self) -> None:
        super().__init__("mixed+drain", OURS, results=[0])
        self.reserved_while: list[str] = []
        self.looks = 0

    def node(self, node: str) -> NodeInfo:
        self.looks += 1
        if self.looks == 4:
            self.state = "drained"
        return super().node(node)

    def create_reservation(self, name: str, node: str, user: str) -> None:
        self.reserved_while.append(self.state)
        super().create_reservation(name, node, user)


def test_the_test_waits_for_the_jobs_of_a_node_shown_mixed_and_drained(tmp_path: Path) -> None:
    slurm = JobsEnding()
    drainer, _results = validating_drainer(slurm, tmp_path)
    drainer.handle(schemas.encode(resume_request()), "t:0:0", key=b"gpu01")
    assert drainer.settle(10) == ["executed"]
    assert slurm.reserved_while == ["drained"]  # not while its jobs ran


class NoDcgmiOnTheNode(MemorySlurm):
    """dcgmi not installed on the node (slurmstepd's execve error); the site's command is."""

    def run_on(
        self, node: str, reservation: str, argv: list[str], *args: object, **kwargs: object
    ) -> subprocess.CompletedProcess[str]:
        self.runs += 1
        if argv[0] != "dcgmi":
            return subprocess.CompletedProcess(argv, 0, "all-reduce ok\n", "")
        stderr = (
            "slurmstepd: error: execve(): dcgmi: No such file or directory\n"
            "srun: error: gpu01: task 0: Exited with exit code 2\n"
        )
        return subprocess.CompletedProcess(argv, 2, "", stderr)


def test_dcgmi_missing_on_the_node_runs_the_sites_command_instead(tmp_path: Path) -> None:
    slurm = NoDcgmiOnTheNode("drained", OURS)
    drainer, results = validating_drainer(slurm, tmp_path, mode="dcgmi")
    drainer.handle(schemas.encode(resume_request()), "t:0:0", key=b"gpu01")
    assert drainer.settle(10) == ["executed"]
    assert results.details == ["validated: validation command nccl-check: passed"] and slurm.runs == 2


NO_CONFIG = (
    "srun: error: Could not establish a configuration source\nsrun: fatal: Could not establish a config"
)
NO_STEP = "srun: error: Unable to create step for job 12: Requested node configuration is not available"
CANCELLED = "srun: Job step aborted: Waiting up to 32 seconds\nsrun: error: *** STEP 12.0 ON gpu01 CANCELLED"


@pytest.mark.parametrize(
    ("stderr", "before_its_job"),
    [
        ("srun: error: Unable to allocate resources: Unable to contact slurm controller", True),
        (NO_CONFIG, True),
        (NO_STEP, True),
        ("srun: error: gpu01: task 0: Exited with exit code 1", False),
        ("srun: error: Node failure on gpu01", False),  # the node failed under its test
        (CANCELLED, False),
        ("NCCL WARN bus error\nsrun: error: Unable to contact slurm controller", False),  # the test printed
    ],
)
def test_srun_failing_before_its_job_is_told_from_a_job_that_failed(
    stderr: str, before_its_job: bool
) -> None:
    assert srun_failed(1, "", stderr) is before_its_job
    assert not srun_failed(0, "", stderr)
