"""A validated resume's test runs once per request: its verdict is journalled before it is carried
out (alerts/journal.py `verdicts`).

An adversarial probe's find: the test failed, then Slurm did not answer while the verdict was being
carried out (its five tries with backoff) and the job gave up; recover() took the request up again
from the journal, where nothing said a test had run, and tested the node again. A flaky GPU that
failed once passed the second run and went back into service. The real Slurm's validations:
tests/integration/test_validation.py; here Slurm is an in-memory stand-in that can go away."""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

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

    def __init__(self, state: str, reason: str, results: list[int]) -> None:
        self.state, self.reason, self.comment_text = state, reason, ""
        self.results = results  # the exit status of each validation run, in turn
        self.runs = 0
        self.reservations: set[str] = set()
        self.away = False

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
        self.comment_text = comment if comment is not None else self.comment_text

    def resume(self, node: str) -> None:
        self._up()
        self.state, self.reason = "idle", "none"

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
        if rc != 0:
            self.away = True  # slurmctld fails over right after the failed test
        return subprocess.CompletedProcess(argv, rc, "", "GPU 3: all-reduce mismatch")

    def cancel_reservation_jobs(self, reservation: str) -> None:
        pass

    def maintenance_nodes(self, except_prefix: str = "") -> set[str]:
        self._up()
        return set()


class Results:
    """The results topic, as the adapter's producer writes it."""

    def __init__(self) -> None:
        self.outcomes: list[str] = []

    def send(self, topic: str, key: bytes | None = None, value: bytes = b"", **_kw: object) -> None:
        msg = schemas.decode(value)
        if msg.get("schema") == "drain_result/1":
            self.outcomes.append(msg["outcome"])

    def flush(self, timeout: float | None = None) -> int:
        return 0


class NoWait(threading.Event):
    """The adapter's stop flag, its backoff waits cut short (five tries in no time)."""

    def wait(self, timeout: float | None = None) -> bool:
        return super().wait(0.001)


def test_a_failed_test_is_carried_out_after_slurm_comes_back_never_run_again(tmp_path: Path) -> None:
    slurm = MemorySlurm("drained", "fleetwatch: XID 79 [fw:aaaaaaaaaaaa]", results=[1, 0])
    validator = Validator(slurm, ValidationSettings(mode="command", command=("nccl-check",), user="fw"))  # type: ignore[arg-type]
    results = Results()
    drainer = Drainer(slurm, Journal(tmp_path / "journal.sqlite"), KEY, results, clock=lambda: T0 + 1,  # type: ignore[arg-type]
                      validator=validator)  # fmt: skip
    drainer._stopping = NoWait()  # the backoff cut short: a test cannot wait ~31 s
    resume = drain_request.make_request(
        node="gpu01", action="resume", reason="fleetwatch: XID 79", severity="critical", findings=["f1"],
        issued_at=T0, key=KEY,
    )  # fmt: skip
    assert drainer.handle(schemas.encode(resume), "t:0:0", key=b"gpu01") == "validating"
    drainer.settle(10)
    assert slurm.runs == 1 and results.outcomes == []  # tested, failed; Slurm away: no verdict carried out
    slurm.away = False
    assert drainer.recover() == 1
    assert drainer.settle(10) == ["validation_failed"]
    assert slurm.runs == 1  # the verdict was carried out, the node not tested again
    assert results.outcomes == ["rejected_validation"]
    assert slurm.state == "drained" and "validation failed" in slurm.reason
