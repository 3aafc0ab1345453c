"""A validated resume's test runs once per request: its verdict is journalled before it is carried
out (alerts/journal.py `verdicts`).

An adversarial probe's find: the test failed, then Slurm did not answer while the verdict was being
carried out (its five tries with backoff) and the job gave up; recover() took the request up again
from the journal, where nothing said a test had run, and tested the node again. A flaky GPU that
failed once passed the second run and went back into service. The real Slurm's validations:
tests/integration/test_validation.py; here Slurm is an in-memory stand-in that can go away."""

from __future__ import annotations

import threading
from pathlib import Path

from fleetwatch import schemas
from fleetwatch.alerts import drain_request
from fleetwatch.alerts.journal import Journal
from fleetwatch.alerts.slurm_drainer import Drainer
from fleetwatch.alerts.validation import ValidationSettings, Validator
from tests.helpers.memory_slurm import MemorySlurm, Results

KEY = b"k" * 32
T0 = 1_800_000_000.0


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
