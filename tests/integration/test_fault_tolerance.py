"""Fault tests against the real broker (issue 6, item 1).

- A `fleetwatch detect` process SIGKILLed mid-stream while a second one is in the group: the
  survivor takes its partitions over (from the dead one's snapshots) and every fault is found,
  with exactly the ids the clock-free in-process path gives; a repeated finding has the same id.
- A worker stopped cleanly (close(): snapshot, leave) and replaced by a new one in the same group
  that continues the stream: no finding on a healthy node, no incident re-opened under a new id,
  and again exactly the in-process ids.
- The broker (a private one on its own port) stopped and started during a run: the producer's
  retries and the worker's reconnects carry the stream through, and the findings arrive.

Fault nodes are picked per partition (Kafka's default murmur2 partitioner on the node key), so
every partition, and therefore every worker, has faults before and after the event under test.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from fleetwatch import schemas, topics
from fleetwatch.bus import Record, TopicPart
from fleetwatch.bus.admin import Admin
from fleetwatch.bus.kafka import KafkaBus
from fleetwatch.bus.partitioner import partition_for
from fleetwatch.collectors.sim.cli import live_epoch
from fleetwatch.runtime import stop_processes
from tests.helpers.paths import REPO
from tests.integration.scale import (
    Member,
    commit_start,
    describe,
    drain_tail,
    drain_to_end,
    end_offsets,
    expected_ids,
    first_by_id,
    mine,
    produce,
    scenario,
    sim_ticks,
    wait_drained,
)
from tests.integration.services import APART, TopicTail, read_quiet, reader_at

pytestmark = APART

PARTITIONS = 4  # ensure_topics' default, which the broker's topics were created with
NODES = 64


def partition_of(node: str) -> int:
    return partition_for(node.encode(), PARTITIONS)


def nodes_by_partition(prefix: str) -> list[list[int]]:
    """Node numbers (1-based, as in scenarios) of each partition."""
    parts: list[list[int]] = [[] for _ in range(PARTITIONS)]
    for n in range(1, NODES + 1):
        parts[partition_of(f"{prefix}{n:04d}")].append(n)
    assert all(len(p) >= 4 for p in parts), parts
    return parts


def faults_around(prefix: str, event_s: float) -> list[dict[str, Any]]:
    """In every partition: an XID well before the event, a node going silent shortly before it
    (found only after it, from restored state), an IB link down across it, and an XID after it."""
    faults: list[dict[str, Any]] = []
    for p, nodes in enumerate(nodes_by_partition(prefix)):
        faults += [
            {"kind": "xid79", "node": nodes[0], "gpu": p, "onset_s": 5 + p},
            {"kind": "node_down", "node": nodes[1], "onset_s": event_s - 4},
            {"kind": "ib_link_down", "node": nodes[2], "onset_s": event_s - 8 + p},
            {"kind": "xid48", "node": nodes[3], "gpu": 7 - p, "onset_s": event_s + 10 + p},
        ]
    return faults


def fault_nodes(sc: Any) -> set[str]:
    return {sc.node_name(f.node) for f in sc.faults}


def _listing(findings: dict[str, dict[str, Any]]) -> str:
    """Every finding on its own line (pytest shortens the repr of a long list in a message)."""
    return "\n".join(f"  {row}" for row in describe(findings))


def check_findings(got: dict[str, dict[str, Any]], expected: dict[str, dict[str, Any]], sc: Any) -> None:
    # every fault found, no finding on a healthy node
    if {f["node"] for f in got.values()} != fault_nodes(sc):
        raise AssertionError(f"found on other nodes than the faults'; got:\n{_listing(got)}")
    # one id per incident: nothing re-opened under a new first_seen
    keys: dict[tuple[Any, ...], set[str]] = {}
    for i, f in got.items():
        keys.setdefault((f["node"], f.get("gpu"), f["kind"], f["evidence"].get("rule")), set()).add(i)
    reopened = {i: got[i] for ids in keys.values() if len(ids) > 1 for i in ids}
    if reopened:
        raise AssertionError(
            f"incidents re-opened under a new id:\n{_listing(reopened)}\nexpected:\n{_listing(expected)}"
        )
    # and exactly the incidents of the clock-free path
    if set(got) != set(expected):
        raise AssertionError(f"got:\n{_listing(got)}\nexpected:\n{_listing(expected)}")


# what a failure shows of a detect process's log: how its partitions moved and what went wrong
_LOG_STORY = (
    "assigned",
    "revoked",
    "restored",
    "cold",
    "snapshot",
    "WARNING",
    "ERROR",
    "CRITICAL",
    "Traceback",
)


def log_story(path: Path, limit: int = 80) -> str:
    lines = path.read_text(errors="replace").splitlines()
    story = [ln for ln in lines if any(w in ln for w in _LOG_STORY)]
    return f"--- {path.name} ({len(lines)} lines; these {min(limit, len(story))} of them)\n" + "\n".join(
        ln[:400] for ln in story[-limit:]
    )


def assert_no_conflicting_duplicates(records: list[dict[str, Any]]) -> None:
    """A finding seen twice is the same finding (same id, same incident)."""
    seen: dict[tuple[str, bool, str], tuple[Any, ...]] = {}
    for f in records:
        k = (f["id"], f["resolved"], f["severity"])
        v = (f["node"], f.get("gpu"), f["kind"], f["first_seen"])
        assert seen.setdefault(k, v) == v, (k, seen[k], v)


# ---------------------------------------------------------------- worker killed


# `fleetwatch detect` exactly as the CLI runs it: the Worker's 10 s group session lets a killed
# member's partitions move within the test's time budget.


def _detect_proc(bootstrap: str, group: str, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fleetwatch.cli",
            "detect",
            "--bootstrap",
            bootstrap,
            "--group",
            group,
            "--start-at",
            "latest",
            "--metrics-port",
            "0",
        ],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def _members(bootstrap: str, group: str) -> tuple[str, int]:
    """The group's state ("STABLE", ...) and how many members it has."""
    with Admin(bootstrap) as admin:
        state, members, _assigned = admin.describe_group(group)
    return state, members


def _wait_stable(bootstrap: str, group: str, n: int, procs: list[Any], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    state, members = "", 0
    while time.monotonic() < deadline:
        for p in procs:
            assert p.poll() is None, f"a detect process exited early (rc {p.returncode})"
        state, members = _members(bootstrap, group)
        if state == "STABLE" and members == n:
            return
        time.sleep(0.5)
    raise AssertionError(f"group {group} not stable with {n} members: {state} {members}")


# Silence is judged on the broker's clock (detectors/silence.py): a node is silent once its
# partition-mates' records kept reaching the broker for silent_after_s (10 s) without one of its
# own. The ticks after each test's event are sent one a second for this many ticks, so that the
# silence begun before the event is found, as it is live; the rest are sent as fast as they go.
SILENT_PACE_TICKS = 12


def _plan(
    tag: str, name: str, duration_s: int, event_s: int
) -> tuple[str, str, Any, float, Any, dict[str, Any]]:
    """A test run's node prefix, group, scenario (faults around event_s), epoch, ticks and the
    finding ids the clock-free path gives for them."""
    run = uuid.uuid4().hex[:6]
    prefix, group = f"{tag}{run}-", f"test-{name}-{run}"
    sc = scenario(prefix, NODES, duration_s, faults_around(prefix, event_s))
    # every tick stamped before it is sent (as `fleetwatch simulate` stamps them: live_epoch), so no
    # sample is ahead of the broker's time, where the node stage would cap its event time
    epoch = float(int(live_epoch(time.time(), duration_s, 0.0)))
    ticks = sim_ticks(sc, epoch)
    expected = expected_ids(sc, epoch)
    assert {f["node"] for f in expected.values()} == fault_nodes(sc), describe(expected)
    return prefix, group, sc, epoch, ticks, expected


def test_killed_worker_loses_no_finding(kafka_bootstrap: str, tmp_path: Path) -> None:
    kill_s = 30
    prefix, group, sc, _epoch, ticks, expected = _plan("ftk", "kill", 60, kill_s)

    commit_start(kafka_bootstrap, group)
    tail = TopicTail(kafka_bootstrap, topics.FINDINGS)
    procs = [_detect_proc(kafka_bootstrap, group, tmp_path / f"detect{i}.log") for i in range(2)]
    records: list[Any] = []
    try:
        _wait_stable(kafka_bootstrap, group, 2, procs, 60)
        produce(kafka_bootstrap, ticks[:kill_s], pace_s=0.05)
        # the pipeline is live: the early XIDs of every partition are out before the kill
        early = {sc.node_name(f.node) for f in sc.faults if f.kind == "xid79"}
        # generous deadlines: each returns as soon as its condition holds; a loaded CI machine
        # (two pytest processes beside their brokers) took longer than 30-40 s here
        records += tail.collect(lambda rs: {f["node"] for f in mine(rs, prefix)} >= early, 90)
        assert {f["node"] for f in mine(records, prefix)} >= early, describe(
            first_by_id(mine(records, prefix))
        )
        victim, survivor = procs
        # No close(): no final snapshot, no LeaveGroup. With the CLI's default snapshot interval
        # (30 s) the victim's newest snapshot of each partition is the one written when it was
        # assigned, before it processed anything.
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
        produce(kafka_bootstrap, ticks[kill_s : kill_s + SILENT_PACE_TICKS], pace_s=1.0)
        produce(kafka_bootstrap, ticks[kill_s + SILENT_PACE_TICKS :], pace_s=0.02)
        # the survivor gets the dead member's partitions when its session expires
        _wait_stable(kafka_bootstrap, group, 1, [survivor], 90)
        wait_drained(kafka_bootstrap, group, 60)
        assert survivor.poll() is None, "the surviving detect process exited"
        records += drain_tail(tail)
    finally:
        stop_processes(procs)
        tail.close()
    found = mine(records, prefix)
    assert_no_conflicting_duplicates(found)
    logs = "\n".join(log_story(tmp_path / f"detect{i}.log") for i in range(2))
    got = first_by_id(found)
    try:
        check_findings(got, expected, sc)
    except AssertionError as e:
        raise AssertionError(f"{e}\n--- detect logs ---\n{logs}") from None


# ---------------------------------------------------------------- worker restarted from its snapshot


def test_restarted_worker_resumes_from_snapshot_without_false_findings(kafka_bootstrap: str) -> None:
    restart_s = 40
    prefix, group, sc, epoch, ticks, expected = _plan("ftr", "restart", 80, restart_s)

    commit_start(kafka_bootstrap, group)
    tail = TopicTail(kafka_bootstrap, topics.FINDINGS)
    try:
        first = Member(kafka_bootstrap, group, "before")
        try:
            produce(kafka_bootstrap, ticks[:restart_s])
            wait_drained(kafka_bootstrap, group, 60)
            first.check()
        finally:
            first.close()  # snapshot every task, flush, leave the group
        # all of the first member's findings (flushed by close), read to the topic's end: a quiet
        # spell of 0.5 s once ended this read early on a loaded machine, and the rest of them then
        # read as "new after the restart"
        before = drain_to_end(tail)
        second = Member(kafka_bootstrap, group, "after")
        try:
            produce(kafka_bootstrap, ticks[restart_s : restart_s + SILENT_PACE_TICKS], pace_s=1.0)
            produce(kafka_bootstrap, ticks[restart_s + SILENT_PACE_TICKS :])
            wait_drained(kafka_bootstrap, group, 60)
            second.check()
        finally:
            second.close()
        after = drain_tail(tail)
    finally:
        tail.close()
    found_before, found_after = mine(before, prefix), mine(after, prefix)
    assert_no_conflicting_duplicates(found_before + found_after)
    # after the restart: only what the stream's second half holds (the late XIDs, the silences
    # that began just before the restart, resolutions), never a re-opened incident
    new_after = {f["id"] for f in found_after} - {f["id"] for f in found_before}
    late = {i for i, f in expected.items() if f["first_seen"] >= epoch + restart_s}
    assert new_after <= late, describe(
        {i: f for i, f in first_by_id(found_after).items() if i in new_after - late}
    )
    check_findings(first_by_id(found_before + found_after), expected, sc)


# ---------------------------------------------------------------- broker restarted


def test_broker_restart_during_a_run(private_broker: Any, caplog: pytest.LogCaptureFixture) -> None:
    # the member's own account (assignments, restores, resends) is shown if this fails
    caplog.set_level(logging.INFO, logger="fleetwatch.pipeline")
    bootstrap = private_broker.bootstrap
    outage_s = 20
    prefix, group, sc, _epoch, ticks, expected = _plan("ftb", "broker", 45, outage_s)

    commit_start(bootstrap, group)
    # Findings are read after the run by a consumer made then: one that lived through the outage
    # could still be backing off its reconnects when the test reads it.
    findings_from = end_offsets(bootstrap, [topics.FINDINGS])
    member = Member(bootstrap, group, "through-outage")
    errors: list[BaseException] = []
    reached, back = threading.Event(), threading.Event()

    def agent() -> None:
        # agent-like: one sample per node per tick, and the client buffers and retries through
        # the outage (acks=all, idempotent: nothing lost, nothing doubled)
        try:
            p = KafkaBus(bootstrap).producer(linger_ms=20)
            try:
                for k, tick in enumerate(ticks):
                    if k == outage_s:
                        reached.set()
                    if k == outage_s + 5:  # five ticks sent into the outage; the rest once it is over
                        back.wait(90)
                    for topic, key, m in tick:
                        p.send(topic, key=key.encode(), value=schemas.encode(m))
                    # one a second once the broker is back: the member may rejoin and restore its
                    # tasks (whose broker clock starts afresh) a few seconds into it
                    time.sleep(1.0 if k >= outage_s + 5 else 0.05)
                assert not p.flush(90), "records not acknowledged"
            finally:
                p.close(10)
        except BaseException as e:
            errors.append(e)

    producer = threading.Thread(target=agent, daemon=True)
    records: list[Any] = []
    try:
        producer.start()
        assert reached.wait(30), "the producer never got to the outage"
        private_broker.stop()
        time.sleep(1)
        member.check()
        private_broker.start()
        back.set()
        producer.join(120)
        assert not producer.is_alive() and not errors, errors
        wait_drained(bootstrap, group, 60)
        member.check()
        records = read_from(bootstrap, findings_from)
    finally:
        member.close()
    found = mine(records, prefix)
    assert_no_conflicting_duplicates(found)
    check_findings(first_by_id(found), expected, sc)


def read_from(
    bootstrap: str, start: dict[TopicPart, int], quiet_s: float = 2.0, timeout_s: float = 30.0
) -> list[Record]:
    """Every record after `start` (topic-partition -> offset), until nothing new for quiet_s."""
    reader = reader_at(bootstrap, start)
    try:
        return read_quiet(reader, quiet_s, timeout_s)
    finally:
        reader.close()
