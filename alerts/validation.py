"""Validation before a drained node returns: the test the Slurm adapter runs on the node before it
lifts fleetwatch's drain (alerts/slurm_drainer.py, docs/validation.md).

Where it runs, and why there: through Slurm, by the adapter. The adapter already holds the Slurm
rights and the drain; Slurm reaches every node's GPUs the way the jobs that will follow do (the same
cgroups, the same GRES), and it needs no command channel into the node agent, which would let anyone
who can write Kafka run commands on every node. The steps, on a node fleetwatch drained:

1. a one-node MAINT reservation for the adapter's user (`fleetwatch-validate-<node>`): from now on
   no job but the adapter's can start there;
2. the node is resumed (scontrol RESUME), so a job can start on it, inside the reservation only;
3. the test runs as a job on the whole node with all its GPUs (`srun --reservation ... --exclusive
   --gres=gpu:N`): by default `dcgmi diag -r <level> -j` (NVIDIA's levels: 1 quick deployment
   checks, seconds; 2 about two minutes; 3 about fifteen), read by alerts/dcgm_diag.py; or a site's
   own command (an NCCL all-reduce), where its exit status decides. A job that does not finish
   within the timeout is cancelled and fails. Where dcgmi is not installed on the node and a command
   is configured, the command runs; with neither, the validation fails: a node is never returned
   untested. srun failing before its job ran (slurmctld away) is Slurm's failure, retried, never
   the node's; a dcgmi run passes only with every GPU Slurm configures on the node;
4. pass: the reservation is deleted and the node is back in service. Fail: the adapter drains the
   node again, naming the failing test and GPU in its Reason, then deletes the reservation.

The test job is a real Slurm job: a failed one ends FAILED in Slurm's accounting, so `slurm-jobs`
publishes it, and the lemon detector counts it against the node like any failed job on it.
"""

from __future__ import annotations

import getpass
import logging
import math
import re
import shlex
from dataclasses import dataclass

from fleetwatch.alerts.dcgm_diag import DiagFailure, DiagOutcome, parse_command, parse_diag, summary
from fleetwatch.alerts.slurm import JobOutput, JobTimeout, SlurmClient, SlurmError

log = logging.getLogger(__name__)

RESERVATION_PREFIX = "fleetwatch-validate-"
MODES = ("dcgmi", "command", "none")
# the shortest timeout that lets each long level finish (NVIDIA: level 3 about 15 minutes, 4 longer)
MIN_TIMEOUT_S = {3: 1200.0, 4: 3600.0}
# srun's exit status and message when the program is not on the node (slurmstepd's execve error)
_NOT_FOUND = "No such file or directory"
TOOLS = ("srun", "scancel")  # what a validation runs where the adapter runs (checked at its start)
_SRUN_SAYS = re.compile(r"srun: (?:error|fatal): ")
# srun's lines once a step ran: a task's end, the program not found on the node, the step
# cancelled or aborted, the node failing under it (the test's failure, not Slurm's)
_STEP_RAN = re.compile(r"\btask \d+|execve|\*\*\* STEP|step aborted|Node failure", re.IGNORECASE)


@dataclass(frozen=True)
class ValidationSettings:
    mode: str = "dcgmi"  # dcgmi | command | none (resume without a test, as before validation)
    level: int = 1  # dcgmi diag -r <level>
    command: tuple[str, ...] = ()  # the site's test (argv), for mode command or where dcgmi is missing
    timeout_s: float = 600.0
    dcgmi: str = "dcgmi"  # the program on the node
    user: str = ""  # the reservation's user: the adapter's own (default)

    @classmethod
    def from_flags(
        cls, mode: str, level: int, command: str | None, timeout_s: float, dcgmi: str
    ) -> ValidationSettings:
        if mode not in MODES:
            raise ValueError(f"--validate must be one of {MODES}")
        argv = tuple(shlex.split(command)) if command else ()
        if mode == "command" and not argv:
            raise ValueError("--validate command needs --validate-command")
        if not 1 <= level <= 4:
            raise ValueError("--validate-level is 1 to 4 (dcgmi diag -r)")
        if not (math.isfinite(timeout_s) and timeout_s > 0):  # inf: srun's --time failed every run
            raise ValueError(f"--validate-timeout must be a finite number of seconds > 0, got {timeout_s}")
        if mode == "dcgmi" and level >= 3 and timeout_s < MIN_TIMEOUT_S[level]:
            raise ValueError(
                f"dcgmi diag -r {level} takes {MIN_TIMEOUT_S[level] // 60:.0f} minutes or more: "
                f"--validate-timeout {MIN_TIMEOUT_S[level]:.0f} at least"
            )
        return cls(mode, level, argv, timeout_s, dcgmi, getpass.getuser())

    @property
    def enabled(self) -> bool:
        return self.mode != "none"


def reservation_name(node: str) -> str:
    return f"{RESERVATION_PREFIX}{node}"


def srun_failed(returncode: int, stdout: str, stderr: str) -> bool:
    """Whether srun itself failed before any step ran ("srun: error: Unable to allocate resources:
    Unable to contact slurm controller", "srun: fatal: Could not establish a configuration
    source"): a non-zero exit, nothing on stdout, and stderr only srun's own error lines, none of
    a task's end. Read as the test's failure, that drained a node for good for an outage."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    return (
        returncode != 0
        and not stdout.strip()
        and bool(lines)
        and all(line.startswith("srun:") for line in lines)
        and any(_SRUN_SAYS.match(line) for line in lines)
        and not any(_STEP_RAN.search(line) for line in lines)
    )


def _not_found(program: str, node: str) -> str:
    return f"{program}: {_NOT_FOUND} on {node}"


def _failed(test: str, message: str) -> DiagOutcome:
    return DiagOutcome(False, "none", (DiagFailure(test, None, message),), (), message)


class Validator:
    def __init__(self, slurm: SlurmClient, settings: ValidationSettings) -> None:
        self.slurm = slurm
        self.settings = settings

    def label(self, command: bool = False) -> str:
        s = self.settings
        if command or s.mode == "command":
            return "validation command " + " ".join(s.command)[:60]
        return f"dcgmi diag -r {s.level}"

    def prepare(self, node: str, drained: bool) -> None:
        """Steps 1-2: reserve the node for the adapter alone, then lift the drain (in that order:
        no other job can land between them)."""
        name = reservation_name(node)
        if not self.slurm.reservation_exists(name):  # it may be left from an interrupted run
            self.slurm.create_reservation(name, node, self.settings.user or getpass.getuser())
        if drained:
            self.slurm.resume(node)

    def run(self, node: str) -> tuple[DiagOutcome, str]:
        """Step 3: (the outcome, the label of what ran). SlurmError (Slurm unreachable, or srun
        failing before its job ran) is the caller's to retry; a test that fails or times out is an
        outcome."""
        s = self.settings
        gpus, partition = self.slurm.placement(node)
        if s.mode != "command":
            argv = [s.dcgmi, "diag", "-r", str(s.level), "-j"]
            outcome = self._run(node, argv, gpus, partition, diag=True)
            # dcgmi absent on the node (not srun on this host, whose error reads alike)
            missing = not outcome.passed and outcome.detail == _not_found(s.dcgmi, node)
            if not missing:
                return outcome, self.label()
            if not s.command:
                return _failed(
                    "dcgmi", f"{s.dcgmi} is not installed on {node} and no --validate-command is set"
                ), self.label()
        return self._run(node, list(s.command), gpus, partition, diag=False), self.label(command=True)

    def _run(self, node: str, argv: list[str], gpus: int, partition: str | None, diag: bool) -> DiagOutcome:
        try:
            r = self.slurm.run_on(
                node, reservation_name(node), argv, self.settings.timeout_s, gpus, partition
            )
        except JobTimeout as e:
            return _failed("timeout", str(e))
        except OSError as e:  # srun could not be started here: an answer, not a retry for ever
            return _failed("srun", f"srun could not be run on the adapter's host: {e}")
        if r.returncode != 0 and _NOT_FOUND in r.stderr and "execve" in r.stderr:
            return _failed(argv[0], _not_found(argv[0], node))
        if srun_failed(r.returncode, r.stdout, r.stderr):
            # no job ran (slurmctld away, no allocation): Slurm's failure, retried, never a verdict
            raise SlurmError(f"srun on {node} failed before its job ran: {r.stderr.strip()[-300:]}")
        if not diag:
            return parse_command(r.returncode, r.stdout, r.stderr)
        truncated = isinstance(r, JobOutput) and r.truncated
        return parse_diag(r.stdout, r.returncode, expected_gpus=gpus, truncated=truncated)

    def release(self, node: str) -> None:
        """Step 4's end, pass or fail: the reservation goes."""
        self.slurm.delete_reservation(reservation_name(node))

    def reason(self, outcome: DiagOutcome, label: str) -> str:
        return summary(outcome, label)
