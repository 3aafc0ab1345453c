"""Slurm as the adapter (alerts/slurm_drainer.py) asks it about one node, in memory, and the results
topic as its producer writes it: for unit tests of the adapter's decisions (the real Slurm's are in
tests/integration/test_slurm_drainer.py and test_validation.py)."""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fleetwatch import schemas
from fleetwatch.alerts import drain_request
from fleetwatch.alerts.journal import Journal
from fleetwatch.alerts.slurm import NodeInfo, SlurmError
from fleetwatch.alerts.slurm_drainer import Drainer
from fleetwatch.alerts.validation import ValidationSettings, Validator

KEY = b"k" * 32
T0 = 1_800_000_000.0


class MemorySlurm:
    """What the adapter asks Slurm for one node, in memory; `away` makes every call fail."""

    def __init__(self, state: str, reason: str, results: list[int] | None = None) -> None:
        self.state, self.reason, self.comment_text = state, reason, ""
        self.results = results or []  # the exit status of each validation run, in turn
        self.runs = 0
        self.reservations: set[str] = set()
        self.maintenance: set[str] = set()  # nodes in a MAINT reservation that is not a validation
        self.away = False
        self.updates = 0  # scontrol updates run (drains and resumes)
        self.stdout, self.stderr = "", "GPU 3: all-reduce mismatch"  # what each validation prints
        self.during_test: Callable[[MemorySlurm], None] | None = None  # people, while the test runs

    def _up(self) -> None:
        if self.away:
            raise SlurmError("slurmctld is not answering")

    def knows(self, node: str) -> bool:
        self._up()
        return node == "gpu01"

    def node(self, node: str) -> NodeInfo:
        self._up()
        return NodeInfo(node, self.state, self.reason)

    def comment(self, node: str) -> str:
        self._up()
        return self.comment_text

    def drain(self, node: str, reason: str, comment: str | None = None) -> None:
        self._up()
        self.state, self.reason = "drained", reason
        self.updates += 1
        self.comment_text = comment if comment is not None else self.comment_text

    def resume(self, node: str) -> None:
        self._up()
        self.state, self.reason = "idle", ""  # as SlurmClient.node reads a node with no Reason
        self.updates += 1

    def reservation_exists(self, name: str) -> bool:
        self._up()
        return name in self.reservations

    def create_reservation(self, name: str, node: str, user: str) -> None:
        self._up()
        self.reservations.add(name)

    def delete_reservation(self, name: str) -> None:
        self._up()
        self.reservations.discard(name)

    def placement(self, node: str) -> tuple[int, str]:
        return 8, "gpu"

    def run_on(self, node: str, reservation: str, argv: list[str], timeout_s: float, gpus: int = 0,
               partition: str | None = None) -> subprocess.CompletedProcess[str]:  # fmt: skip
        rc = self.results[self.runs]
        self.runs += 1
        if self.during_test is not None:
            self.during_test(self)
        elif rc != 0:
            self.away = True  # slurmctld fails over right after the failed test
        return subprocess.CompletedProcess(argv, rc, self.stdout, self.stderr)

    def cancel_reservation_jobs(self, reservation: str) -> None:
        pass

    def maintenance_nodes(self, except_prefix: str = "") -> set[str]:
        self._up()
        return set(self.maintenance)


class Results:
    """The results topic, as the adapter's producer writes it."""

    def __init__(self) -> None:
        self.outcomes: list[str] = []
        self.details: list[str] = []

    def send(self, topic: str, key: bytes | None = None, value: bytes = b"", **_kw: object) -> None:
        msg = schemas.decode(value)
        if msg.get("schema") == "drain_result/1":
            self.outcomes.append(msg["outcome"])
            self.details.append(msg["detail"])

    def flush(self, timeout: float | None = None) -> int:
        return 0


class NoWait(threading.Event):
    """The adapter's stop flag, its waits cut short (backoff, the draining poll)."""

    def wait(self, timeout: float | None = None) -> bool:
        return super().wait(0.001)


def validating_drainer(
    slurm: MemorySlurm, tmp_path: Path, mode: str = "command", journal: Journal | None = None
) -> tuple[Drainer, Results]:
    """An adapter that validates before a resume (a site's command, or dcgmi), on `slurm`."""
    settings = ValidationSettings(mode=mode, command=("nccl-check",), user="fw")
    results = Results()
    drainer = Drainer(
        slurm,  # type: ignore[arg-type]
        journal or Journal(tmp_path / "journal.sqlite"),
        KEY,
        results,
        clock=lambda: T0 + 1,
        validator=Validator(slurm, settings),  # type: ignore[arg-type]
    )
    drainer._stopping = NoWait()
    return drainer, results


def resume_request(node: str = "gpu01") -> dict[str, Any]:
    return drain_request.make_request(
        node=node, action="resume", reason="fleetwatch: XID 79", severity="critical", findings=["f1"],
        issued_at=T0, key=KEY,
    )  # fmt: skip
