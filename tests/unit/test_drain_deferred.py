"""`deferred`: the Slurm adapter's "not now" (drain_result/1), which act does not take as final.

An operator's pause held act's drains but not the adapter, which carried out the requests act had
issued just before it; and a request issued before an admin took a node DOWN or into maintenance
overwrote their Reason. Refusing them was worse: act takes a refusal as final (a node never
drained once it came back, a resume never executed). The adapter now answers `deferred`, nothing
done; act frees the drain's slot, keeps a resume's drain, and asks again after retry_deferred_s in
a copy signed anew, which the adapter judges afresh. The real Slurm, broker and processes:
tests/integration/test_slurm_drainer.py and test_oncall_controls.py."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from fleetwatch import schemas
from fleetwatch.alerts import drain_request, drain_result
from fleetwatch.alerts.drain_log import ResultBook
from fleetwatch.alerts.drain_pause import Pause
from fleetwatch.alerts.journal import Journal
from fleetwatch.alerts.policy import DEFERRED, NodeState, Policy, PolicyConfig
from fleetwatch.alerts.slurm import SlurmError, SlurmOutputNotUnderstood
from fleetwatch.alerts.slurm_drainer import Drainer, Retry
from fleetwatch.alerts.validation import ValidationSettings, Validator
from tests.helpers.findings import T0, finding, resolve
from tests.helpers.memory_slurm import MemorySlurm, Results

KEY = b"k" * 32
RETRY_S = 60.0


class Acting:
    """The policy driven as the actor drives it: each issued request signed anew (its signature
    depends on the time it was issued, as the real HMAC over `issued_at` does)."""

    def __init__(self, **cfg: float) -> None:
        self.policy = Policy(PolicyConfig(retry_deferred_s=RETRY_S, **cfg))
        self.st = NodeState()

    def step(self, now: float, paused: bool = False) -> list[str]:
        ev = self.policy.evaluate({"n1": self.st}, now, 100, _NoJobs(), paused=paused)
        for _a in ev.actions:
            self.st.request_sig = hashlib.sha256(f"{self.st.request_id}@{now}".encode()).hexdigest()
        return [a.action for a in ev.actions]

    def drained_then_healthy(self) -> dict[str, object]:
        """A node drained (executed) for a finding that resolves at T0 + 2; its resume is due from
        T0 + 62 (resume_after_s 60). The finding."""
        f = finding("n1", ts=T0)
        self.policy.observe(self.st, f)
        self.step(T0)
        self.answer("executed", T0 + 1)
        self.policy.observe(self.st, resolve(f, T0 + 2))
        return f

    def answer(self, outcome: str, now: float, detail: str = "") -> str | None:
        st = self.st
        return self.policy.apply_result(
            st, st.request_id, "resume" if st.resuming else "drain", outcome, detail,
            request_sig=st.request_sig, now=now,
        )  # fmt: skip


class _NoJobs:
    def jobs_on(self, node: str) -> tuple[str, ...]:
        return ()

    def nodes_of(self, job: str) -> tuple[str, ...]:
        return ()


def test_a_deferred_drain_frees_its_slot_and_is_asked_again_after_the_retry_with_the_same_id() -> None:
    a = Acting()
    a.policy.observe(a.st, finding("n1", ts=T0))
    assert a.step(T0) == ["drain"]
    first_id, first_sig = a.st.request_id, a.st.request_sig
    assert a.answer(DEFERRED, T0 + 1, "held in Slurm (down): down: rack power") == "adapter:deferred"
    assert not a.st.drained and a.st.refused == "adapter:deferred"  # nothing was done: no slot held
    assert a.answer(DEFERRED, T0 + 30) is None and a.st.deferred_at == T0 + 1  # re-applied: unchanged
    assert a.step(T0 + 30) == [] and a.st.refused == "adapter:deferred"  # not before the retry
    assert a.step(T0 + 1 + RETRY_S) == ["drain"]
    assert a.st.request_id == first_id and a.st.request_sig != first_sig  # the same request, signed anew
    assert a.st.pending and DEFERRED not in a.st.rejected.values()
    assert a.answer("executed", T0 + 70) is None and a.st.drained and a.st.confirmed


def test_a_deferral_during_a_pause_waits_for_the_pause_and_a_final_refusal_is_never_asked_again() -> None:
    a = Acting()
    a.policy.observe(a.st, finding("n1", ts=T0))
    a.step(T0)
    a.answer(DEFERRED, T0 + 1, "drains paused until ... by oncall@h: rollout")
    # due again, but act's own pause holds it: refused as paused, asked once the pause is over
    assert a.step(T0 + 100, paused=True) == [] and a.st.refused == "paused"
    assert a.step(T0 + 200, paused=True) == []
    assert a.step(T0 + 300) == ["drain"]
    # any other refusal stays final for these findings
    a.answer("rejected_stale", T0 + 301, "issued 700 s ago")
    assert a.step(T0 + 301 + 10 * RETRY_S) == [] and a.st.refused == "adapter:rejected_stale"


def test_a_deferred_resume_keeps_the_drain_counted_and_is_asked_again() -> None:
    a = Acting(resume_after_s=60.0)
    a.drained_then_healthy()
    assert a.step(T0 + 100) == ["resume"] and a.st.resuming
    resume_id = a.st.request_id
    assert a.answer(DEFERRED, T0 + 101, "held in Slurm (maintenance): idle") is None
    assert a.st.drained and a.st.confirmed and not a.st.resuming  # our drain is still in place
    assert a.step(T0 + 120) == []
    assert a.step(T0 + 101 + RETRY_S) == ["resume"] and a.st.request_id == resume_id
    a.answer("executed", T0 + 170, "validated: passed")
    assert not a.st.drained


def _request(action: str = "drain", issued_at: float = T0, finding_id: str = "f1") -> dict[str, object]:
    return drain_request.make_request(
        node="gpu01", action=action, reason="fleetwatch: XID 79", severity="critical",
        findings=[finding_id], issued_at=issued_at, key=KEY,
    )  # fmt: skip


def test_the_adapter_defers_during_a_pause_answers_the_same_copy_alike_and_takes_a_new_copy_afresh(
    tmp_path: Path,
) -> None:
    slurm = MemorySlurm("idle", "")
    results = Results()
    now = [T0 + 5]
    paused: list[Pause] = [Pause("switch firmware rollout", "oncall@h", T0, T0 + 3600)]
    drainer = Drainer(
        slurm, Journal(tmp_path / "journal.sqlite"), KEY, results,  # type: ignore[arg-type]
        clock=lambda: now[0], pause=lambda _t: paused[0] if paused else None,
    )  # fmt: skip
    first = _request()
    assert drainer.handle(schemas.encode(first), "t:0:0", key=b"gpu01") == "deferred"
    assert slurm.updates == 0 and results.outcomes == ["deferred"]
    assert "switch firmware rollout" in results.details[0]
    entry = drainer.journal.get(first["request_id"])  # type: ignore[arg-type]
    assert entry is not None and entry.status == "deferred"
    paused.clear()
    # the copy deferred, delivered again (a batch read again): the same answer, nothing done
    assert drainer.handle(schemas.encode(first), "t:0:0", key=b"gpu01") == "duplicate"
    assert results.outcomes[-1] == "deferred" and slurm.updates == 0
    # act's copy signed anew after the pause: judged afresh, executed
    now[0] = T0 + 70
    again = _request(issued_at=T0 + 65)
    assert again["request_id"] == first["request_id"] and again["signature"] != first["signature"]
    assert drainer.handle(schemas.encode(again), "t:0:1", key=b"gpu01") == "executed"
    assert slurm.state == "drained" and results.outcomes[-1] == "executed"


def test_the_adapter_defers_a_node_down_or_in_maintenance_and_drains_it_once_it_is_back(
    tmp_path: Path,
) -> None:
    slurm = MemorySlurm("down*", "Not responding")
    results = Results()
    now = [T0 + 1]
    drainer = Drainer(slurm, Journal(tmp_path / "j.sqlite"), KEY, results, clock=lambda: now[0])  # type: ignore[arg-type]
    assert drainer.handle(schemas.encode(_request()), "t:0:0", key=b"gpu01") == "deferred"
    assert results.details[-1] == "held in Slurm (down): down*: Not responding"
    assert slurm.state == "down*" and slurm.reason == "Not responding"  # the admin's Reason stays
    slurm.state, slurm.reason = "idle", ""
    slurm.maintenance = {"gpu01"}
    now[0] = T0 + 61
    assert drainer.handle(schemas.encode(_request(issued_at=T0 + 60)), "t:0:1", key=b"gpu01") == "deferred"
    assert results.details[-1].startswith("held in Slurm (maintenance)")
    slurm.maintenance = set()
    now[0] = T0 + 121
    assert drainer.handle(schemas.encode(_request(issued_at=T0 + 120)), "t:0:2", key=b"gpu01") == "executed"
    assert slurm.state == "drained" and slurm.reason.startswith("fleetwatch: XID 79 [fw:")


def test_a_stale_request_stays_stale_and_someone_elses_drain_stays_final_paused_or_not(
    tmp_path: Path,
) -> None:
    slurm = MemorySlurm("drained", "admin: bad fan")
    results = Results()
    pause = Pause("rollout", "oncall@h", T0, T0 + 3600)
    drainer = Drainer(
        slurm, Journal(tmp_path / "j.sqlite"), KEY, results, clock=lambda: T0 + 1000,  # type: ignore[arg-type]
        pause=lambda _t: pause,
    )  # fmt: skip
    assert drainer.handle(schemas.encode(_request()), "t:0:0", key=b"gpu01") == "stale"
    other = _request(issued_at=T0 + 999, finding_id="f2")
    assert drainer.handle(schemas.encode(other), "t:0:1", key=b"gpu01") == "not_ours"
    assert results.outcomes == ["rejected_stale", "rejected_not_ours"] and slurm.updates == 0


def test_a_duplicate_answer_is_never_resolved_to_a_deferral() -> None:
    """The adapter answers `duplicate` for a request it handled before and did not execute; act
    takes the first answer to the id instead. A deferral is not one: the id was judged afresh
    after it, and resolving to it would have act ask again for a request refused for good."""
    book = ResultBook(KEY)
    req = _request()
    copy = _request(issued_at=T0 + 60)

    def answer(request: dict[str, object], outcome: str) -> None:
        r = drain_result.make_result(
            request_id=str(request["request_id"]), node="gpu01", action="drain", outcome=outcome,
            detail=outcome, ts=T0, request_signature=str(request["signature"]), key=KEY,
        )  # fmt: skip
        book.apply(b"gpu01", schemas.encode(r))

    answer(req, "deferred")
    answer(copy, "rejected_stale")
    third = _request(issued_at=T0 + 120)
    answer(third, "duplicate")
    (got,) = book.answers(str(third["request_id"]), str(third["signature"]))
    assert got.outcome == "rejected_stale"


def test_a_request_refused_before_a_crash_is_answered_alike_when_read_again(tmp_path: Path) -> None:
    """The journal row of a refused request was written, then the adapter died before its answer
    reached Kafka: read again, it was answered `duplicate`, which act resolves from the first
    answer, which never came (act waited, then paged adapter:no_result). The answer is kept in
    the row and given again."""
    slurm = MemorySlurm("drained", "admin: bad fan")
    results = Results()
    journal = Journal(tmp_path / "j.sqlite")
    drainer = Drainer(slurm, journal, KEY, results, clock=lambda: T0 + 1)  # type: ignore[arg-type]
    refused = _request()
    drainer._result = lambda *_a: None  # type: ignore[method-assign]  # died before the answer went out
    assert drainer.handle(schemas.encode(refused), "t:0:0", key=b"gpu01") == "not_ours"
    assert results.outcomes == []
    restarted = Drainer(slurm, journal, KEY, results, clock=lambda: T0 + 2)  # type: ignore[arg-type]
    assert restarted.handle(schemas.encode(refused), "t:0:0", key=b"gpu01") == "duplicate"
    assert results.outcomes == ["rejected_not_ours"] and results.details[0].startswith("already rejected")
    stale = _request(issued_at=T0 - 3600, finding_id="f2")
    assert restarted.handle(schemas.encode(stale), "t:0:1", key=b"gpu01") == "stale"
    assert restarted.handle(schemas.encode(stale), "t:0:1", key=b"gpu01") == "duplicate"
    assert results.outcomes[1:] == ["rejected_stale", "rejected_stale"]


def test_a_request_for_a_node_whose_validation_is_under_way_is_deferred(tmp_path: Path) -> None:
    """A drain carried out while a validated resume of the node waited for its jobs to end was
    lifted by the validation's own resume before its test (and the node returned on a pass); a
    second resume would test it twice at once. act sends neither; the adapter defers both."""
    slurm = MemorySlurm("draining", "fleetwatch: XID 79 [fw:aaaaaaaaaaaa]", results=[0])
    validator = Validator(slurm, ValidationSettings(mode="command", command=("nccl-check",), user="fw"))  # type: ignore[arg-type]
    results = Results()
    drainer = Drainer(slurm, Journal(tmp_path / "j.sqlite"), KEY, results, clock=lambda: T0 + 1,  # type: ignore[arg-type]
                      validator=validator)  # fmt: skip
    try:
        resume = _request("resume")
        assert drainer.handle(schemas.encode(resume), "t:0:0", key=b"gpu01") == "validating"
        drain = _request(finding_id="f2")
        assert drainer.handle(schemas.encode(drain), "t:0:1", key=b"gpu01") == "deferred"
        other_resume = _request("resume", finding_id="f3")
        assert drainer.handle(schemas.encode(other_resume), "t:0:2", key=b"gpu01") == "deferred"
        # the same request asked again in a copy signed anew (an act restarted from an older
        # snapshot): deferred, not left unanswered ("validating": its answer goes to the first copy)
        copy = _request("resume", issued_at=T0 + 0.5)
        assert copy["request_id"] == resume["request_id"]
        assert drainer.handle(schemas.encode(copy), "t:0:3", key=b"gpu01") == "deferred"
        assert drainer.handle(schemas.encode(resume), "t:0:0", key=b"gpu01") == "validating"
        assert results.outcomes == ["deferred", "deferred", "deferred"]
        assert "validation of gpu01" in results.details[0] and slurm.updates == 0
    finally:
        drainer.stop(5)


def test_an_older_copy_of_a_deferred_request_read_again_gets_the_same_answer(tmp_path: Path) -> None:
    """Offsets rewound (a crash before a commit): an older copy of a request deferred since in a
    newer copy was judged afresh, and could be refused for good as stale (act then resolves the
    next copy's `duplicate` to that)."""
    slurm = MemorySlurm("down", "admin: PSU")
    results = Results()
    now = [T0 + 1]
    drainer = Drainer(slurm, Journal(tmp_path / "j.sqlite"), KEY, results, clock=lambda: now[0])  # type: ignore[arg-type]
    s1 = _request(issued_at=T0)
    assert drainer.handle(schemas.encode(s1), "t:0:0", key=b"gpu01") == "deferred"
    now[0] = T0 + 661
    s2 = _request(issued_at=T0 + 660)
    assert drainer.handle(schemas.encode(s2), "t:0:1", key=b"gpu01") == "deferred"
    assert drainer.handle(schemas.encode(s1), "t:0:0", key=b"gpu01") == "duplicate"  # not stale
    assert results.outcomes == ["deferred"] * 3


def test_reservations_slurm_lists_unreadably_defer_the_request_and_slurm_away_is_retried(
    tmp_path: Path,
) -> None:
    """A reservation node list this cannot read would end the request `failed` after five tries,
    for good: deferred. Slurm not answering is an outage like any other: retried, nothing answered
    (deferring then freed act's budget slot while the drain might still happen: the full suite's
    forged-request test caught that)."""
    slurm = MemorySlurm("idle", "")
    results = Results()
    error: list[SlurmError] = [SlurmOutputNotUnderstood("a reservation's node list not understood")]

    def reservations(except_prefix: str = "") -> set[str]:
        raise error[0]

    slurm.maintenance_nodes = reservations  # type: ignore[method-assign]
    drainer = Drainer(slurm, Journal(tmp_path / "j.sqlite"), KEY, results, clock=lambda: T0 + 1)  # type: ignore[arg-type]
    assert drainer.handle(schemas.encode(_request()), "t:0:0", key=b"gpu01") == "deferred"
    assert "could not be read" in results.details[0] and slurm.updates == 0
    error[0] = SlurmError("scontrol show reservation failed: Unable to contact slurm controller")
    with pytest.raises(Retry):
        drainer.handle(schemas.encode(_request(finding_id="f2")), "t:0:1", key=b"gpu01")
    assert results.outcomes == ["deferred"]


def test_a_restarted_act_adopts_the_copy_it_sent_after_a_deferral_and_waits_for_its_answer() -> None:
    """act asked again (copy 2) and died before its next snapshot; restored from the one before,
    it held the request as deferred, did not adopt copy 2 from the drain log, and asked a third
    time: the adapter answered only copy 2 (its validation), and the resume waited for good."""
    a = Acting(resume_after_s=60.0)
    f = a.drained_then_healthy()
    a.step(T0 + 100)
    a.answer(DEFERRED, T0 + 101)
    snapshot = NodeState.from_dict(a.st.to_dict())  # the last snapshot: the resume deferred
    assert a.step(T0 + 101 + RETRY_S) == ["resume"]
    copy2 = (a.st.request_id, a.st.request_sig)
    restored = snapshot
    assert a.policy.adopt(restored, "resume", [f["id"]], "fleetwatch: healthy", T0 + 161, *copy2)
    assert restored.resuming and (restored.request_id, restored.request_sig) == copy2
    a.st = restored
    assert a.step(T0 + 300) == []  # not asked a third time: copy 2's answer is awaited
    assert a.answer("executed", T0 + 400, "validated: passed") is None and not a.st.drained
