"""The Slurm adapter (alerts/slurm_drainer.py) against a real slurmctld + slurmd + munge
(services/slurm/slurm.sh): drains and resumes, refuses unknown nodes, unsigned, forged and tampered
requests, never repeats a request, never overrules a human, and survives a crash mid-request."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from fleetwatch import schemas, topics
from fleetwatch.alerts import drain_request as dr
from fleetwatch.alerts.drain_pause import make_control
from fleetwatch.alerts.journal import Journal
from fleetwatch.alerts.slurm import SlurmClient
from fleetwatch.alerts.slurm_drainer import Drainer
from fleetwatch.bus import Record, TopicPart
from fleetwatch.bus.admin import Admin, ensure_topics
from fleetwatch.bus.kafka import KafkaBus
from fleetwatch.bus.partitioner import partition_for
from tests.helpers.paths import REPO
from tests.integration.services import USES_SLURM, Slurm, TopicTail

pytestmark = USES_SLURM

KEY = b"test-drain-key-0123456789abcdef"


def req(
    node: str,
    action: str = "drain",
    findings: tuple[str, ...] | None = None,
    key: bytes = KEY,
    issued_at: float | None = None,
) -> dict[str, Any]:
    return dr.make_request(
        node=node,
        action=action,
        reason="fleetwatch: XID 79",
        severity="critical",
        findings=findings or (uuid.uuid4().hex,),
        issued_at=time.time() if issued_at is None else issued_at,  # the drainer refuses stale ones
        key=key,
    )


def raw(msg: dict[str, Any]) -> bytes:
    return orjson.dumps(msg)


@pytest.fixture
def drainer(slurm: Slurm, kafka_bootstrap: str, tmp_path: Path) -> Iterator[Drainer]:
    producer = KafkaBus(kafka_bootstrap).producer()
    d = Drainer(SlurmClient(slurm.conf), Journal(tmp_path / "journal.sqlite"), KEY, producer)
    yield d
    assert not producer.flush(10), "records not acknowledged"
    producer.close(5)
    d.journal.close()


def test_drain_and_resume_a_real_node(drainer: Drainer, slurm: Slurm) -> None:
    slurm.reset("gpu-node-03")
    drain = req("gpu-node-03")
    assert drainer.handle(raw(drain), "t:0:1") == "executed"
    state, reason = slurm.state("gpu-node-03")
    assert state.startswith("drain") and reason == f"fleetwatch: XID 79 [fw:{drain['request_id'][:12]}]"
    resume = req("gpu-node-03", "resume", tuple(drain["findings"]))
    assert drainer.handle(raw(resume), "t:0:2") == "executed"
    state, reason = slurm.state("gpu-node-03")
    assert state.rstrip("*") == "idle" and reason == "none"
    # The old drain delivered again (Kafka at-least-once, a replaying act) must not drain it again.
    assert drainer.handle(raw(drain), "t:0:1") == "duplicate"
    assert slurm.state("gpu-node-03")[0].startswith("idle")
    assert [(e.action, e.status) for e in drainer.journal.entries("gpu-node-03")] == [
        ("drain", "executed"),
        ("resume", "executed"),
    ]


def test_refuses_unknown_unsigned_forged_and_tampered_requests(
    drainer: Drainer,
    slurm: Slurm,
    topic_tail: Callable[[str], TopicTail],
) -> None:
    slurm.reset("gpu-node-02")
    dead = topic_tail(topics.DEADLETTER)
    good = req("gpu-node-02")
    unsigned = {k: v for k, v in good.items() if k != "signature"}
    forged = req("gpu-node-02", key=b"attacker-key-attacker-key-123456")
    tampered = {**req("gpu-node-01"), "node": "gpu-node-02"}
    cases = [
        (raw(req("gpu-node-99")), "unknown_node"),
        (raw(unsigned), "malformed"),
        (raw(forged), "forged"),
        (raw(tampered), "forged"),
        (b"\xff not json", "malformed"),
    ]
    for i, (value, outcome) in enumerate(cases):
        assert drainer.handle(value, f"t:0:{i}") == outcome
    drainer.producer.flush(10)
    assert slurm.state("gpu-node-02")[0].startswith("idle")  # nothing reached scontrol
    got = dead.collect(lambda rs: len(rs) >= len(cases))
    reasons = sorted(dict(r.headers)["reason"].decode() for r in got)
    assert reasons == sorted(o for _, o in cases)
    assert {r.value for r in got} == {v for v, _ in cases}  # original bytes, untouched


def test_a_flood_of_forged_and_garbage_requests_is_dead_lettered_and_logged_sparsely(
    drainer: Drainer,
    slurm: Slurm,
    topic_tail: Callable[[str], TopicTail],
    caplog: pytest.LogCaptureFixture,
) -> None:
    slurm.reset("gpu-node-02")
    forged = raw(req("gpu-node-02", key=b"attacker-key-attacker-key-123456"))
    dead = topic_tail(topics.DEADLETTER)
    with caplog.at_level(logging.WARNING, logger="fleetwatch.alerts.slurm_drainer"):
        for i in range(3000):
            value = forged if i % 2 else bytes([i % 256]) * 32
            assert drainer.handle(value, f"t:1:{i}") in ("forged", "malformed")
    drainer.producer.flush(30)
    assert slurm.state("gpu-node-02")[0].startswith("idle")  # nothing reached scontrol
    lines = [r for r in caplog.records if "rejected drain request" in r.getMessage()]
    assert 2 <= len(lines) <= 6, len(lines)  # the first of each reason, and each 1000th
    got = dead.collect(lambda rs: len(rs) >= 3000, timeout_s=60)
    assert len(got) == 3000 and {dict(r.headers)["reason"] for r in got} == {b"forged", b"malformed"}


def test_never_overrules_a_human_drain(drainer: Drainer, slurm: Slurm) -> None:
    subprocess.run(
        ["scontrol", "update", "NodeName=gpu-node-04", "State=DRAIN", "Reason=admin: bad fan"],
        env=slurm.env,
        check=True,
    )
    try:
        assert drainer.handle(raw(req("gpu-node-04", "resume")), "t:0:1") == "not_ours"
        assert drainer.handle(raw(req("gpu-node-04", "drain")), "t:0:2") == "not_ours"
        state, reason = slurm.state("gpu-node-04")
        assert state.startswith("drain") and reason == "admin: bad fan"
    finally:
        slurm.reset("gpu-node-04")


def test_a_human_drain_whose_reason_only_starts_with_fleetwatch_is_not_ours(
    drainer: Drainer, slurm: Slurm
) -> None:
    """The adapter took any Reason starting with "fleetwatch" for its own: a human's "fleetwatch false
    positive? keep drained" was lifted by a resume and overwritten by a drain (an adversarial probe's
    find). Its own drains end with their request's token."""
    node = "gpu-node-04"
    reason = "Reason=fleetwatch false positive? keep drained, RMA 4711"
    subprocess.run(
        ["scontrol", "update", f"NodeName={node}", "State=DRAIN", reason], env=slurm.env, check=True
    )
    try:
        assert drainer.handle(raw(req(node, "drain")), "t:0:1") == "not_ours"
        assert drainer.handle(raw(req(node, "resume")), "t:0:2") == "not_ours"
        state, now = slurm.state(node)  # ('*' comes and goes with slurmd's heartbeat: not compared)
        assert state.rstrip("*").startswith("drain") and now == reason.removeprefix("Reason=")
    finally:
        slurm.reset(node)


def test_crash_between_journal_and_scontrol_is_recovered_without_repeating(
    drainer: Drainer,
    slurm: Slurm,
) -> None:
    slurm.reset("gpu-node-01")
    drain = req("gpu-node-01")
    tag = f"[fw:{drain['request_id'][:12]}]"
    # What a drainer that died right after scontrol (before journaling the outcome) leaves behind:
    drainer.journal.begin(drain["request_id"], "gpu-node-01", "drain", drain["issued_at"], "t:0:1")
    drainer.slurm.drain("gpu-node-01", f"fleetwatch: XID 79 {tag}")
    assert drainer.handle(raw(drain), "t:0:1") == "executed"
    e = drainer.journal.get(drain["request_id"])
    assert e is not None and e.status == "executed" and e.detail == "found done after a restart"
    # ... and one that died before scontrol ran: the restart executes it.
    slurm.reset("gpu-node-01")
    other = req("gpu-node-01")
    drainer.journal.begin(other["request_id"], "gpu-node-01", "drain", other["issued_at"], "t:0:2")
    assert drainer.handle(raw(other), "t:0:2") == "executed"
    assert drainer.journal.get(other["request_id"]).detail == ""  # type: ignore[union-attr]
    assert slurm.state("gpu-node-01")[1].endswith(f"[fw:{other['request_id'][:12]}]")
    slurm.reset("gpu-node-01")


def queued(bootstrap: str, *requests: dict[str, Any]) -> str:
    """A drain topic of this test's own holding `requests`, acknowledged by the broker."""
    topic = f"test.drain.{uuid.uuid4().hex[:8]}"
    ensure_topics(bootstrap, [topic])
    producer = KafkaBus(bootstrap).producer()
    for m in requests:
        producer.send(topic, key=m["node"].encode(), value=schemas.encode(m))
    assert not producer.flush(10), "records not acknowledged"
    producer.close(5)
    return topic


def fleetwatch(bootstrap: str, slurm: Slurm, *args: str) -> subprocess.CompletedProcess[str]:
    """A real `fleetwatch` command with the test's drain key (which also signs the pause)."""
    env = {**os.environ, "FLEETWATCH_DRAIN_KEY": KEY.decode(), "SLURM_CONF": slurm.conf}
    argv = [sys.executable, "-m", "fleetwatch.cli", *args, "--bootstrap", bootstrap]
    return subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, timeout=60)


def run_cli(
    bootstrap: str, slurm: Slurm, topic: str, state_dir: Path, control: str | None = None
) -> subprocess.CompletedProcess[str]:
    """The real `fleetwatch slurm-drainer` on `topic` until it has been idle 2 s, following a control
    topic of its own (`control`, or a new one: no other test's pause)."""
    control = control or f"test.control.{uuid.uuid4().hex[:8]}"
    argv = ["slurm-drainer", "--drain-topic", topic, "--group", f"g-{topic}", "--control-topic", control]
    return fleetwatch(bootstrap, slurm, *argv, "--state-dir", str(state_dir), "--idle-exit", "2")


def test_cli_consumes_the_topic_and_commits(
    kafka_bootstrap: str,
    slurm: Slurm,
    tmp_path: Path,
) -> None:
    slurm.reset("gpu-node-02")
    drain = req("gpu-node-02")
    topic = queued(kafka_bootstrap, drain, drain, {**req("gpu-node-03"), "signature": "0" * 64})
    for _ in range(2):  # the second run finds everything committed and does nothing
        r = run_cli(kafka_bootstrap, slurm, topic, tmp_path)
        assert r.returncode == 0, r.stderr[-2000:]
    try:
        assert slurm.state("gpu-node-02")[0].startswith("drain")
        assert slurm.state("gpu-node-03")[0].startswith("idle")
        j = Journal(tmp_path / "journal.sqlite")
        assert [(e.node, e.status) for e in j.entries()] == [("gpu-node-02", "executed")]
        j.close()
    finally:
        slurm.reset("gpu-node-02")


def test_the_cli_publishes_a_nodes_view_at_once_after_draining_it_not_at_the_next_period(
    kafka_bootstrap: str, slurm: Slurm, tmp_path: Path
) -> None:
    """The accounting stage ends a drain at the first view showing its node back in service, so the
    adapter's view must show a drain as soon as the adapter made it: the real process, its views
    due only every hour, publishes the node in service at its start, then drained within seconds
    of the request (the drain lifted by hand soon after would otherwise show no change at all)."""
    node = "gpu-node-02"
    slurm.reset(node)
    topic = queued(kafka_bootstrap)
    views = f"test.slurmnodes.{uuid.uuid4().hex[:8]}"
    control = f"test.control.{uuid.uuid4().hex[:8]}"
    ensure_topics(kafka_bootstrap, [views, control])
    tail = TopicTail(kafka_bootstrap, views)
    env = {**os.environ, "FLEETWATCH_DRAIN_KEY": KEY.decode(), "SLURM_CONF": slurm.conf}
    argv = [sys.executable, "-m", "fleetwatch.cli", "slurm-drainer", "--bootstrap", kafka_bootstrap]
    argv += ["--drain-topic", topic, "--group", f"g-{topic}", "--control-topic", control]
    argv += ["--state-dir", str(tmp_path), "--slurm-nodes-topic", views, "--node-states-every", "3600"]
    log = open(tmp_path / "drainer.log", "wb")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(argv, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)

    def of_node(records: list[Record]) -> list[dict[str, Any]]:
        return [m for m in tail.messages(records) if m["node"] == node]

    try:
        first = of_node(tail.collect(lambda rs: bool(of_node(rs)), timeout_s=60))
        assert first and not first[-1]["state"].startswith("drain"), (tmp_path / "drainer.log").read_text()
        producer = KafkaBus(kafka_bootstrap).producer()
        producer.send(topic, key=node.encode(), value=schemas.encode(req(node)))
        assert not producer.flush(10), "the request was not acknowledged"
        producer.close(5)
        after = of_node(tail.collect(lambda rs: any(m["ours"] for m in of_node(rs)), timeout_s=30))
        assert after, (tmp_path / "drainer.log").read_text()
        assert after[-1]["state"].startswith("drain") and after[-1]["ours"]
        assert proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()
        tail.close()
        slurm.reset(node)


def test_an_operators_pause_defers_the_adapters_requests_and_a_copy_signed_anew_after_it_is_executed(
    kafka_bootstrap: str, slurm: Slurm, tmp_path: Path, topic_tail: Callable[[str], TopicTail]
) -> None:
    """`fleetwatch pause` held act's drains but not the adapter, which carried out what act had asked
    just before the pause (an adversarial probe's find; holding the request unanswered instead let
    it go stale, a refusal act takes as final). The adapter follows the pause: the request is
    answered `deferred`, nothing done in Slurm; the copy act signs anew after the pause is drained."""
    node = "gpu-node-02"
    slurm.reset(node)
    results = topic_tail(topics.DRAIN_RESULTS)
    control = f"test.control.{uuid.uuid4().hex[:8]}"
    ensure_topics(kafka_bootstrap, [control])
    paused = fleetwatch(
        kafka_bootstrap, slurm, "pause", "--control-topic", control, "--reason", "rack work", "--for", "10m"
    )
    assert paused.returncode == 0, paused.stderr
    first = req(node)
    r = run_cli(kafka_bootstrap, slurm, queued(kafka_bootstrap, first), tmp_path, control)
    try:
        assert r.returncode == 0, r.stderr[-2000:]
        assert slurm.state(node)[0].rstrip("*").startswith("idle")  # nothing done
        (answer,) = results_of(results, first)[first["request_id"]]
        assert answer["outcome"] == "deferred" and "rack work" in answer["detail"], answer
        assert answer["request_signature"] == first["signature"]
        j = Journal(tmp_path / "journal.sqlite")
        assert [(e.node, e.status) for e in j.entries()] == [(node, "deferred")]
        j.close()
        lifted = fleetwatch(kafka_bootstrap, slurm, "resume-drains", "--control-topic", control)
        assert lifted.returncode == 0, lifted.stderr
        again = req(node, findings=tuple(first["findings"]))  # act's retry: the same id, signed anew
        assert again["request_id"] == first["request_id"] and again["signature"] != first["signature"]
        r = run_cli(kafka_bootstrap, slurm, queued(kafka_bootstrap, again), tmp_path, control)
        assert r.returncode == 0, r.stderr[-2000:]
        assert slurm.state(node)[0].startswith("drain")
        answers = results_of(results, again, timeout_s=10)[again["request_id"]]
        assert [(a["outcome"], a["request_signature"]) for a in answers][-1] == (
            "executed",
            again["signature"],
        )
    finally:
        slurm.reset(node)


def test_hostile_records_on_the_control_topic_neither_stop_the_adapter_nor_hold_its_drains(
    kafka_bootstrap: str, slurm: Slurm, tmp_path: Path, topic_tail: Callable[[str], TopicTail]
) -> None:
    """The adapter reads fleet.control.v1, which whoever can write the topic feeds: garbage, a cut
    record, a tombstone and a pause signed with another key must not stop it, and must not defer
    a drain (a forged pause would switch the adapter off); they are refused and said so."""
    node = "gpu-node-02"
    slurm.reset(node)
    results = topic_tail(topics.DRAIN_RESULTS)
    control = f"test.control.{uuid.uuid4().hex[:8]}"
    ensure_topics(kafka_bootstrap, [control])
    forged = make_control(
        paused=True, reason="forged", by="mallory@x", issued_at=time.time(), until=time.time() + 3600,
        key=b"attacker-key-attacker-key-123456",
    )  # fmt: skip
    real = make_control(
        paused=True, reason="x", by="oncall@h", issued_at=time.time(), until=time.time() + 3600, key=KEY
    )
    cut = schemas.encode(real)[:-20]
    producer = KafkaBus(kafka_bootstrap).producer()
    for value in (b"\xff\xfe garbage", cut, None, schemas.encode(forged), b"{}" * 100_000):
        producer.send(control, key=b"drain_pause", value=value)
    assert not producer.flush(10), "records not acknowledged"
    producer.close(5)
    drain = req(node)
    r = run_cli(kafka_bootstrap, slurm, queued(kafka_bootstrap, drain), tmp_path, control)
    try:
        assert r.returncode == 0, r.stderr[-2000:]
        assert "control record refused" in r.stderr, r.stderr[-2000:]
        assert slurm.state(node)[0].startswith("drain")
        (answer,) = results_of(results, drain)[drain["request_id"]]
        assert answer["outcome"] == "executed", answer
    finally:
        slurm.reset(node)


def test_an_operators_reason_holding_a_forged_log_line_and_markup_is_refused_as_theirs_in_one_line(
    kafka_bootstrap: str, slurm: Slurm, tmp_path: Path, topic_tail: Callable[[str], TopicTail]
) -> None:
    """Anyone who can set a node's Reason (an admin's scontrol, a health check) writes what the adapter
    reads and repeats: here a line break, a line forged in the adapter's own log format, a terminal
    escape and chat markup, kept as they are by the real Slurm. The real adapter refuses the drain
    (the node is drained by someone else), leaves the node and its Reason as they were, and says so
    in one log line, the Reason escaped in it; its answer is one line with nothing of a terminal's."""
    node = "gpu-node-02"
    slurm.reset(node)
    forged = "2025-06-01 12:00:00,000 INFO alerts.slurm_drainer: drain gpu-node-02 done"
    reason = f"disk swap <!channel> [ticket](http://evil.example)\n{forged}\x1b[2K"
    subprocess.run(
        ["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"],
        env=slurm.env, capture_output=True, check=True, timeout=30,
    )  # fmt: skip
    results = topic_tail(topics.DRAIN_RESULTS)
    drain = req(node)
    r = run_cli(kafka_bootstrap, slurm, queued(kafka_bootstrap, drain), tmp_path)
    try:
        assert r.returncode == 0, r.stderr[-2000:]
        stamp = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ ")
        lines = r.stderr.splitlines()
        assert all(stamp.match(line) for line in lines), r.stderr[-3000:]  # no line of the Reason's own
        assert "\x1b" not in r.stderr and f"\\n{forged}\\x1b[2K" in r.stderr, r.stderr[-3000:]
        assert not any(line.startswith(forged) for line in lines)
        state, shown = slurm.state(node)
        assert state.startswith("drain") and shown.startswith("disk swap <!channel>")  # theirs, as it was
        (answer,) = results_of(results, drain)[drain["request_id"]]
        assert answer["outcome"] == "rejected_not_ours", answer
        assert "\n" not in answer["detail"] and "\x1b" not in answer["detail"], answer
    finally:
        slurm.reset(node)


def test_an_operators_line_under_the_adapters_reason_makes_the_drain_theirs(
    drainer: Drainer, slurm: Slurm
) -> None:
    """SlurmClient.node read only a Reason's first line: an operator who wrote "keep drained" on a
    line under the adapter's own Reason had the drain taken for the adapter's still, and the next
    resume lifted it, their note with it. The Reason is read whole: theirs now, left as it is."""
    node = "gpu-node-04"
    slurm.reset(node)
    drain = req(node)
    try:
        assert drainer.handle(raw(drain), "t:0:1") == "executed"
        theirs = f"{slurm.state(node)[1]}\nkeep drained: RMA 4711 (alice)"
        subprocess.run(
            ["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={theirs}"],
            env=slurm.env,
            check=True,
        )
        assert SlurmClient(slurm.conf).node(node).reason == theirs  # as Slurm keeps it
        resume = req(node, "resume", tuple(drain["findings"]))
        assert drainer.handle(raw(resume), "t:0:2") == "not_ours"
        state, reason = slurm.state(node)
        assert state.rstrip("*").startswith("drain") and reason == theirs
    finally:
        slurm.reset(node)


def test_a_node_taken_down_or_into_maintenance_is_deferred_untouched_and_drained_once_it_is_back(
    drainer: Drainer, slurm: Slurm
) -> None:
    """A request act issued before an admin took the node DOWN or into a maintenance reservation
    drained over it (the admin's Reason overwritten; a resume would clear their DOWN); refusing it
    for good left a node Slurm marked down for the very fault undrained once it came back. Now the
    adapter answers `deferred` and the copy act signs anew later is judged afresh."""
    node = "gpu-node-04"
    slurm.reset(node)
    resv = f"maint-{uuid.uuid4().hex[:6]}"
    subprocess.run(
        ["scontrol", "update", f"NodeName={node}", "State=DOWN", "Reason=admin: PSU swap"],
        env=slurm.env,
        check=True,
    )
    try:
        first = req(node)
        assert drainer.handle(raw(first), "t:0:1") == "deferred"
        state, reason = slurm.state(node)
        assert state.rstrip("*") == "down" and reason == "admin: PSU swap"  # the admin's, untouched
        entry = drainer.journal.get(first["request_id"])
        assert entry is not None and entry.status == "deferred" and "(down)" in entry.detail
        slurm.reset(node)  # back in service ... and into the admin's maintenance reservation
        subprocess.run(
            ["scontrol", "create", "reservation", f"ReservationName={resv}", f"Nodes={node}",
             "StartTime=now", "Duration=30", "Users=root", "Flags=MAINT,IGNORE_JOBS"],
            env=slurm.env, check=True, capture_output=True,
        )  # fmt: skip
        second = req(node, findings=tuple(first["findings"]))
        assert drainer.handle(raw(second), "t:0:2") == "deferred"
        assert "(maintenance)" in drainer.journal.get(first["request_id"]).detail  # type: ignore[union-attr]
        assert slurm.state(node)[0].rstrip("*").startswith(("idle", "maint"))
        subprocess.run(["scontrol", "delete", f"ReservationName={resv}"], env=slurm.env, check=True)
        third = req(node, findings=tuple(first["findings"]))
        assert drainer.handle(raw(third), "t:0:3") == "executed"
        state, reason = slurm.state(node)
        assert state.startswith("drain") and reason.endswith(f"[fw:{first['request_id'][:12]}]")
    finally:
        subprocess.run(["scontrol", "delete", f"ReservationName={resv}"], env=slurm.env, capture_output=True)
        slurm.reset(node)


def test_cli_with_a_damaged_journal_fails_with_one_line_and_touches_nothing(
    kafka_bootstrap: str, slurm: Slurm, tmp_path: Path
) -> None:
    """A journal damaged by a power loss (a page garbled): the real adapter says so in one line,
    status 2, before it reads a request, and neither drains nor answers anything (it was a
    traceback at start, or at every restart once a request read the damaged row)."""
    slurm.reset("gpu-node-02")
    j = Journal(tmp_path / "journal.sqlite")
    for i in range(300):
        j.begin(f"{i:032x}", "gpu-node-02", "drain", time.time(), "t:0:0", comment_before="")
    j.close()
    for side in ("journal.sqlite-wal", "journal.sqlite-shm"):
        (tmp_path / side).unlink(missing_ok=True)
    data = bytearray((tmp_path / "journal.sqlite").read_bytes())
    middle = len(data) // 4096 // 2 * 4096
    data[middle : middle + 4096] = b"\xa5" * 4096
    (tmp_path / "journal.sqlite").write_bytes(bytes(data))
    r = run_cli(kafka_bootstrap, slurm, queued(kafka_bootstrap, req("gpu-node-02")), tmp_path)
    assert r.returncode == 2, r.stderr[-2000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "is damaged" in lines[0] and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert slurm.state("gpu-node-02")[0].rstrip("*").startswith("idle")


def test_cli_without_a_key_fails_with_one_line(kafka_bootstrap: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "FLEETWATCH_DRAIN_KEY"}
    r = subprocess.run(
        [sys.executable, "-m", "fleetwatch.cli", "slurm-drainer", "--bootstrap", kafka_bootstrap],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1].startswith("fleetwatch slurm-drainer: no drain signing key")


# ---------------------------------------------------------------- issue 15: results, freshness, crashes


def results_of(
    tail: TopicTail, *requests: dict[str, Any], timeout_s: float = 30.0
) -> dict[str, list[dict[str, Any]]]:
    """request_id -> the drain_result/1 messages produced for it, in order (the topic is shared)."""
    want = {m["request_id"] for m in requests}

    def mine(records: list[Any]) -> dict[str, list[dict[str, Any]]]:
        out: dict[str, list[dict[str, Any]]] = {}
        for m in (orjson.loads(r.value) for r in records if r.value):
            if m.get("request_id") in want:
                out.setdefault(m["request_id"], []).append(m)
        return out

    return mine(tail.collect(lambda rs: set(mine(rs)) >= want, timeout_s))


def test_stale_and_far_future_requests_are_refused_with_a_reason(
    drainer: Drainer,
    slurm: Slurm,
    topic_tail: Callable[[str], TopicTail],
) -> None:
    slurm.reset("gpu-node-03")
    dead, results = topic_tail(topics.DEADLETTER), topic_tail(topics.DRAIN_RESULTS)
    now = time.time()
    month_old = req("gpu-node-03", issued_at=now - 30 * 86400)
    from_the_future = req("gpu-node-03", issued_at=now + 10 * 365 * 86400)
    assert drainer.handle(raw(month_old), "t:0:1") == "stale"
    assert drainer.handle(raw(from_the_future), "t:0:2") == "stale"
    assert drainer.handle(raw(month_old), "t:0:1") == "duplicate"  # refused once and for all
    assert slurm.state("gpu-node-03")[0].rstrip("*") == "idle"  # scontrol never ran
    details = {e.request_id: (e.status, e.detail) for e in drainer.journal.entries("gpu-node-03")}
    status, detail = details[month_old["request_id"]]
    assert status == "rejected" and detail.startswith("issued 25920") and detail.endswith("(limit 600 s)")
    assert details[from_the_future["request_id"]][1].endswith("s in the future (limit 60 s)")
    drainer.producer.flush(10)
    got = results_of(results, month_old, from_the_future)
    assert [m["outcome"] for m in got[from_the_future["request_id"]]] == ["rejected_stale"]
    assert got[month_old["request_id"]][0]["outcome"] == "rejected_stale"  # (then duplicate)
    assert all(dr.verify(m, KEY) for ms in got.values() for m in ms)
    letters = dead.collect(lambda rs: sum(r.value == raw(month_old) for r in rs) >= 1)
    letter = next(r for r in letters if r.value == raw(month_old))
    assert dict(letter.headers)["reason"] == b"stale"
    fresh = req("gpu-node-03", issued_at=now - 590)  # inside the window
    try:
        assert drainer.handle(raw(fresh), "t:0:3") == "executed"
    finally:
        slurm.reset("gpu-node-03")


def test_every_authenticated_request_gets_one_result_bound_to_it_and_no_forgery_gets_one(
    drainer: Drainer,
    slurm: Slurm,
    topic_tail: Callable[[str], TopicTail],
) -> None:
    slurm.reset("gpu-node-02", "gpu-node-04")
    results = topic_tail(topics.DRAIN_RESULTS)
    subprocess.run(
        ["scontrol", "update", "NodeName=gpu-node-04", "State=DRAIN", "Reason=admin: bad fan"],
        env=slurm.env,
        check=True,
    )
    good, unknown, human = req("gpu-node-02"), req("gpu-node-99"), req("gpu-node-04")
    # Forgeries of a real request's id: signed with another key, unsigned (malformed), and the
    # real request itself made malformed where nothing is signed (a Kafka key naming another
    # node). Our signature on a result naming their id would vouch for what nobody authenticated.
    forged = {**good, "signature": dr.sign(good, b"k" * 32)}
    unsigned = {k: v for k, v in good.items() if k != "signature"}
    try:
        assert drainer.handle(raw(good), "t:1:0", key=b"gpu-node-01") == "malformed"
        outcomes = [
            drainer.handle(raw(m), f"t:0:{i}", key=m["node"].encode())
            for i, m in enumerate((good, forged, unsigned, good, unknown, human))
        ]
        assert drainer.handle(b"\xff not json", "t:0:9") == "malformed"  # nobody to tell: no result
    finally:
        slurm.reset("gpu-node-02", "gpu-node-04")
    assert outcomes == ["executed", "forged", "malformed", "duplicate", "unknown_node", "not_ours"]
    drainer.producer.flush(10)
    got = results_of(results, good, unknown, human)
    later = results.messages(results.collect(lambda rs: False, timeout_s=1))
    got[good["request_id"]] += [m for m in later if m["request_id"] == good["request_id"]]
    assert {rid: [m["outcome"] for m in ms] for rid, ms in got.items()} == {
        good["request_id"]: ["executed", "executed"],  # its answer again; none for the three forgeries
        unknown["request_id"]: ["rejected_unknown_node"],
        human["request_id"]: ["rejected_not_ours"],
    }
    assert got[human["request_id"]][0]["detail"] == "already drained: admin: bad fan"
    assert all(dr.verify(m, KEY) for ms in got.values() for m in ms)
    by_id = {m["request_id"]: m for m in (good, unknown, human)}
    assert all(m["request_signature"] == by_id[rid]["signature"] for rid, ms in got.items() for m in ms)


def test_slurm_keeps_the_request_id_across_a_resume_so_a_replay_never_overrules_an_operator(
    drainer: Drainer,
    slurm: Slurm,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    node = "gpu-node-01"
    slurm.reset(node)
    drain = req(node)
    rid = drain["request_id"]

    def killed(*_a: Any, **_k: Any) -> None:
        raise KeyboardInterrupt("slurm-drainer killed after scontrol, before journalling the outcome")

    monkeypatch.setattr(drainer.journal, "finish", killed)
    with pytest.raises(KeyboardInterrupt):
        drainer.handle(raw(drain), "t:0:1")
    monkeypatch.undo()
    assert drainer.journal.get(rid).status == "executing"  # type: ignore[union-attr]
    assert slurm.state(node)[0].startswith("drain")
    # The operator checks the node, finds it fine and puts it back in service; Slurm drops the
    # drain reason but keeps the Comment the drain wrote in the same scontrol call.
    subprocess.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"], env=slurm.env, check=True)
    assert slurm.state(node)[1] == "none"
    assert f"[fw:{rid}]" in SlurmClient(slurm.conf).comment(node)

    # The restarted drainer, on the same journal, gets the uncommitted request again.
    restarted = Drainer(SlurmClient(slurm.conf), Journal(tmp_path / "journal.sqlite"), KEY, drainer.producer)
    try:
        assert restarted.handle(raw(drain), "t:0:1") == "executed"
        assert slurm.state(node)[0].rstrip("*") == "idle"  # still in service: the operator decided
        e = restarted.journal.get(rid)
        assert e is not None and (e.status, e.detail) == ("executed", "found done after a restart")
        assert restarted.handle(raw(drain), "t:0:1") == "duplicate"
        assert slurm.state(node)[0].rstrip("*") == "idle"
    finally:
        restarted.journal.close()
        slurm.reset(node)


def test_a_drain_keeps_an_operators_comment_of_several_lines_whole(drainer: Drainer, slurm: Slurm) -> None:
    """sinfo prints a Comment as it is, lines and all, once per partition: the adapter read its first
    line only and wrote that back with its token, dropping the rest of the operator's notes."""
    node = "gpu-node-03"
    slurm.reset(node)
    notes = "ticket 4711: fan replaced\nticket 4712: watch GPU 3 temps"
    subprocess.run(["scontrol", "update", f"NodeName={node}", f"Comment={notes}"], env=slurm.env, check=True)
    try:
        assert drainer.slurm.comment(node) == notes
        drain = req(node)
        assert drainer.handle(raw(drain), "t:0:1") == "executed"
        assert drainer.slurm.comment(node) == f"{notes} [fw:{drain['request_id']}]"
    finally:
        subprocess.run(["scontrol", "update", f"NodeName={node}", "Comment="], env=slurm.env, check=False)
        slurm.reset(node)


def test_after_a_crash_before_scontrol_it_drains_unless_someone_changed_the_node_since(
    drainer: Drainer,
    slurm: Slurm,
    topic_tail: Callable[[str], TopicTail],
) -> None:
    node = "gpu-node-01"
    slurm.reset(node)
    results = topic_tail(topics.DRAIN_RESULTS)
    first, second = req(node), req(node)
    # Died after journalling `executing` (with the node's Comment as it was), before scontrol:
    before = drainer.slurm.comment(node)
    drainer.journal.begin(first["request_id"], node, "drain", first["issued_at"], "t:0:1", before)
    assert drainer.handle(raw(first), "t:0:1") == "executed"
    assert slurm.state(node)[0].startswith("drain")
    assert drainer.slurm.comment(node).endswith(f"[fw:{first['request_id']}]")  # with the drain
    slurm.reset(node)
    # The same crash, but an operator wrote on the node in between: Slurm can no longer tell
    # whether the drain ran, so it is not run, and a human is told.
    drainer.journal.begin(
        second["request_id"], node, "drain", second["issued_at"], "t:0:2", drainer.slurm.comment(node)
    )
    subprocess.run(
        ["scontrol", "update", f"NodeName={node}", "Comment=ticket 4711: fan replaced"],
        env=slurm.env,
        check=True,
    )
    try:
        assert drainer.handle(raw(second), "t:0:2") == "undetermined"
        assert slurm.state(node)[0].rstrip("*") == "idle"
        assert drainer.journal.get(second["request_id"]).status == "undetermined"  # type: ignore[union-attr]
        drainer.producer.flush(10)
        got = results_of(results, second)[second["request_id"]]
        assert [m["outcome"] for m in got] == ["undetermined"]
    finally:
        subprocess.run(["scontrol", "update", f"NodeName={node}", "Comment="], env=slurm.env, check=False)
        slurm.reset(node)


def test_a_result_kafka_refuses_is_not_committed_past_and_its_request_is_answered_on_the_retry(
    kafka_bootstrap: str,
    slurm: Slurm,
    tmp_path: Path,
) -> None:
    """The drainer commits a batch only once its results are acknowledged: a result the broker
    refuses (here the results topic takes nothing that large, until an operator fixes it) leaves the
    batch to be read again, and its request, journalled, gets its answer then."""
    slurm.reset("gpu-node-02")
    tag = uuid.uuid4().hex[:8]
    topic, results = f"test.drain.{tag}", f"test.drain.{tag}.results"
    ensure_topics(kafka_bootstrap, [topic])
    with Admin(kafka_bootstrap) as admin:
        admin.create_topics([results], configs={results: {"max.message.bytes": "64"}})
    producer = KafkaBus(kafka_bootstrap).producer()
    drain = req("gpu-node-02")
    producer.send(topic, key=drain["node"].encode(), value=schemas.encode(drain))
    assert not producer.flush(10), "records not acknowledged"
    producer.close(5)
    env = {**os.environ, "FLEETWATCH_DRAIN_KEY": KEY.decode(), "SLURM_CONF": slurm.conf}
    argv = [sys.executable, "-m", "fleetwatch.cli", "slurm-drainer", "--bootstrap", kafka_bootstrap]
    argv += ["--drain-topic", topic, "--results-topic", results, "--group", f"g-{tag}"]
    argv += ["--state-dir", str(tmp_path), "--idle-exit", "2"]
    log = tmp_path / "drainer.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while "reading their batch again" not in log.read_text(errors="replace"):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.2)
        with Admin(kafka_bootstrap) as admin:
            admin.alter_configs(results, {"max.message.bytes": None})
        assert proc.wait(60) == 0, log.read_text()[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
        slurm.reset("gpu-node-02")
    tail = TopicTail(kafka_bootstrap, results)
    tail.rewind()
    answers = [schemas.decode(r.value) for r in tail.collect(lambda rs: len(rs) >= 1)]
    # the drain's own answer (act learns it was executed), not `duplicate`, which act resolves from
    # an earlier answer that never reached the topic
    assert [(a["request_id"], a["outcome"]) for a in answers] == [(drain["request_id"], "executed")]
    part = TopicPart(topic, partition_for(b"gpu-node-02", 4))
    with Admin(kafka_bootstrap) as admin:
        assert admin.group_offsets(f"g-{tag}", [part]) == {part: 1}
