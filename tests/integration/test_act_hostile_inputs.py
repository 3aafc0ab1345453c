"""Floods of hostile records on the topics a running act reads (all but the job table's), on the
real broker and Alertmanager.

- slurm_node/1: garbage, unsigned and forged "this node is in maintenance" claims, a genuine record
  under another node's key, a genuine record from an adapter clock a day ahead, oversized values.
- control/1, drain results, the census, findings: garbage, forged pauses and a genuine pause from a
  clock a day ahead, forged results, genuine results bound to no request (as an adapter of an earlier
  release writes them), forged census records, a forged critical finding.

act refuses and counts each by its reason (logging only the first of each and every 1000th),
stays up, pauses nothing, shields no node it should drain and drains none on forged evidence,
reaches the genuine records queued behind the floods, and drains on them within seconds."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from fleetwatch.alerts import drain_request
from fleetwatch.alerts.drain_pause import make_control
from fleetwatch.alerts.drain_result import BINDING, make_result
from fleetwatch.alerts.slurm import NodeInfo
from fleetwatch.alerts.slurm_nodes import make_record
from fleetwatch.bus.admin import Admin
from fleetwatch.census import node_message
from fleetwatch.signing import encode_signed
from tests.helpers.findings import finding, signed
from tests.integration.act_rig import CENSUS_KEY, KEY, ActRig, free_port, metric
from tests.integration.services import APART, Alertmanager, PrivateBroker, TopicTail

pytestmark = APART

ATTACKER_KEY = b"attacker-key-attacker-key-123456"
REASONS = ("malformed", "bad_signature", "clock_skew")


def view(node: str, *, maintenance: bool, ts: float, key: bytes = KEY.encode()) -> dict[str, Any]:
    return make_record(NodeInfo(node, "idle", ""), (), maintenance, ts, key)


def by_label(port: int, name: str, label: str, where: str = "") -> dict[str, float]:
    """A counter's series summed by one label (`where`: only series whose labels contain it)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        lines = r.read().decode().splitlines()
    out: dict[str, float] = {}
    for x in lines:
        if x.startswith(name + "{") and where in x.partition("}")[0]:
            value = x.partition(f'{label}="')[2].partition('"')[0]
            out[value] = out.get(value, 0.0) + float(x.rsplit(" ", 1)[1])
    return {k: v for k, v in out.items() if v}


def refused(port: int) -> dict[str, float]:
    """fleetwatch_act_slurm_nodes_refused_total by reason."""
    got = by_label(port, "fleetwatch_act_slurm_nodes_refused_total", "reason")
    return {why: got.get(why, 0.0) for why in REASONS}


def hostile_records(
    a: str, b: str, now: float, copies: int
) -> tuple[list[tuple[bytes, bytes]], dict[str, int]]:
    """(key, value) records that must all be refused, and how many of each reason."""
    out: list[tuple[bytes, bytes]] = []
    count = dict.fromkeys(REASONS, 0)

    def add(why: str, key: bytes, value: bytes) -> None:
        out.append((key, value))
        count[why] += 1

    for i in range(copies):
        for node in (a, b):
            k = node.encode()
            shield = view(node, maintenance=True, ts=now + i * 1e-3)
            unsigned = {f: v for f, v in shield.items() if f != "signature"}
            add("malformed", k, orjson.dumps(unsigned))  # no signature: the schema requires it
            forged = view(node, maintenance=True, ts=now + i * 1e-3, key=ATTACKER_KEY)
            add("bad_signature", k, orjson.dumps(forged))
            edited = {**view(node, maintenance=False, ts=now + i * 1e-3), "maintenance": True}
            add("bad_signature", k, orjson.dumps(edited))  # signed, then changed
            add("malformed", (b if node == a else a).encode(), orjson.dumps(shield))  # another node's key
            add("malformed", k, bytes([i % 256]) * 64)  # not JSON
            add("malformed", k, b"[" * 5000 + b"]" * 5000)  # deep nesting
            add("malformed", k, orjson.dumps([shield]))  # not an object
            add("malformed", k, orjson.dumps({**shield, "ts": "now"}))  # a wrong type
    for node in (a, b):  # genuine, from an adapter whose clock ran a day ahead
        add("clock_skew", node.encode(), orjson.dumps(view(node, maintenance=True, ts=now + 86_400)))
        big = {**view(node, maintenance=True, ts=now), "reason": "x" * 900_000}
        add("malformed", node.encode(), orjson.dumps(big))  # within the broker's limit, not the schema's
    return out, count


def test_a_flood_of_hostile_node_states_shields_no_node_and_blocks_nothing(
    rig: ActRig, topic_tail: Callable[[str], TopicTail]
) -> None:
    a, b, c = (f"{x}-{rig.group}" for x in ("flood-a", "flood-b", "flood-c"))
    drains = topic_tail(rig.drains)
    rig.census(a, b, c)
    # the rig's Slurm-node topic is LogAppendTime, as scheduler.nodes.v1 (act_rig.py): act checks
    # each view's ts against the time the broker took it, the path a deployment takes
    with Admin(rig.bootstrap) as admin:
        assert admin.describe_configs(rig.slurm_nodes)["message.timestamp.type"] == "LogAppendTime"
    port = free_port()
    act = rig.act("--fleet-size", "10", "--budget-min-nodes", "3", "--metrics-port", str(port))
    rig.wait_for_log(0, "assigned")
    now = time.time()
    flood, expected = hostile_records(a, b, now, copies=1000)
    assert len(flood) > 16_000
    for key, value in flood:
        rig.producer.send(rig.slurm_nodes, key=key, value=value)
    # behind the flood, the one genuine record: c is in a maintenance reservation
    rig.producer.send(rig.slurm_nodes, key=c.encode(), value=orjson.dumps(view(c, maintenance=True, ts=now)))
    rig.flush(60)
    sent = time.monotonic()
    deadline = sent + 120
    while time.monotonic() < deadline:
        try:
            if refused(port) == expected and metric(port, "fleetwatch_act_nodes_held") == 1:
                break
        except (OSError, AssertionError):
            pass
        time.sleep(0.2)
    got_refused = refused(port)
    assert got_refused == {k: float(v) for k, v in expected.items()}, (got_refused, expected, rig.logs())
    assert metric(port, "fleetwatch_act_nodes_held") == 1, rig.logs()  # c, reached behind the flood
    assert act.poll() is None, rig.logs()

    t0 = time.monotonic()
    rig.send(*(finding(n, ts=time.time() - 1) for n in (a, b, c)))
    got = drains.collect(lambda rs: len(issued(rs)) >= 2, timeout_s=30)
    took = time.monotonic() - t0
    assert sorted(r.key for r in issued(got)) == sorted([a.encode(), b.encode()]), rig.logs()
    assert took < 20.0, f"the drains took {took:.1f} s after the flood"
    got += drains.collect(lambda rs: False, timeout_s=3)  # act decides every second: c never
    assert c.encode() not in [r.key for r in issued(got)], rig.logs()
    assert act.poll() is None, rig.logs()
    # every refusal counted, few logged: a flood of them must not become a flood of log lines
    logged = (rig.tmp / "act-0.log").read_text(errors="replace").count("slurm_node record refused")
    assert 0 < logged <= 2 * len(REASONS) + len(flood) // 1000, logged


def issued(records: list[Any]) -> list[Any]:
    """The drain topic's records act wrote (signed with the key)."""
    return [r for r in records if drain_request.verify(orjson.loads(r.value), KEY.encode())]


def test_a_flood_on_every_other_topic_act_reads_pauses_nothing_and_drains_only_what_is_signed(
    rig: ActRig, topic_tail: Callable[[str], TopicTail]
) -> None:
    """Forged pauses, a genuine pause from a clock a day ahead, forged, garbage and unbound drain
    results, census records and findings (a forged critical XID for a node of the fleet): none pauses act,
    drains a node or changes the fleet; each is counted by its reason; the genuine finding behind
    them all drains its node."""
    d, e = (f"{x}-{rig.group}" for x in ("flood-d", "flood-e"))
    drains = topic_tail(rig.drains)
    rig.census(d, e)
    port = free_port()
    act = rig.act("--fleet-size", "10", "--budget-min-nodes", "3", "--metrics-port", str(port))
    rig.wait_for_log(0, "assigned")
    now, copies = time.time(), 500
    garbage = [bytes([i % 256]) * 64 for i in range(copies)]
    send = rig.producer.send
    for i in range(copies):
        send(rig.control, key=b"drain_pause", value=garbage[i])
        pause = make_control(paused=True, reason="forged", by="mallory@x", issued_at=now + i * 1e-3,
                             until=now + 3600, key=ATTACKER_KEY)  # fmt: skip
        send(rig.control, key=b"drain_pause", value=orjson.dumps(pause))
        send(rig.results, key=d.encode(), value=garbage[i])
        result = make_result(request_id=f"{i:032x}", node=d, action="resume", outcome="executed", detail="",
                             ts=now, request_signature="ab" * 32, key=ATTACKER_KEY)  # fmt: skip
        send(rig.results, key=d.encode(), value=orjson.dumps(result))
        # signed with the real key but bound to no request's signature: counted, never filed
        legacy = make_result(request_id=f"{i:032x}", node=d, action="resume", outcome="executed", detail="",
                             ts=now, request_signature="ab" * 32, key=KEY.encode())  # fmt: skip
        legacy = {k: v for k, v in legacy.items() if k not in (BINDING, "signature")}
        legacy["signature"] = drain_request.sign(legacy, KEY.encode())
        send(rig.results, key=d.encode(), value=orjson.dumps(legacy))
        send(rig.nodes, key=e.encode(), value=garbage[i])
        gone = node_message(e, now - 10, now + i * 1e-3, steady_since=now - 10, seen_at=now + i * 1e-3)
        send(rig.nodes, key=e.encode(), value=encode_signed({**gone, "gone": True}, ATTACKER_KEY))
        send(rig.findings, key=d.encode(), value=garbage[i])
        send(rig.findings, key=d.encode(), value=signed(finding(d, ts=now - 1), ATTACKER_KEY.decode()))
    ahead = make_control(paused=True, reason="a clock a day ahead", by="oncall@x", issued_at=now + 86_400,
                         until=now + 86_400 + 3600, key=KEY.encode())  # fmt: skip
    send(rig.control, key=b"drain_pause", value=orjson.dumps(ahead))
    rig.send(finding(e, ts=time.time() - 1))  # the one genuine finding, behind them all
    rig.flush(60)
    got = drains.collect(lambda rs: len(issued(rs)) >= 1, timeout_s=60)
    assert [r.key for r in issued(got)] == [e.encode()], rig.logs()
    got += drains.collect(lambda rs: False, timeout_s=3)
    assert [r.key for r in issued(got)] == [e.encode()], rig.logs()  # never d, on forged findings
    assert metric(port, "fleetwatch_act_drains_paused") == 0
    want = {
        "fleetwatch_act_control_refused_total": {
            "malformed": copies,
            "bad_signature": copies,
            "clock_skew": 1,
        },
        "fleetwatch_act_drain_results_ignored_total": {
            "malformed": copies,
            "bad_signature": copies,
            "unbound": copies,
        },
        "fleetwatch_act_census_refused_total": {"malformed": copies, "bad_signature": copies},
    }
    where = f'source_topic="{rig.findings}"'

    def counts() -> dict[str, dict[str, float]]:
        got = {name: by_label(port, name, "reason") for name in want}
        got["deadletter"] = by_label(port, "fleetwatch_deadletter_total", "reason", where=where)
        return got

    # each follower thread and the findings' partitions reach the end of the flood in their own time
    deadline = time.monotonic() + 60
    while True:
        got_counts = counts()
        dead = got_counts.pop("deadletter")
        if (got_counts == want and sum(dead.values()) == 2 * copies) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert got_counts == want, got_counts
    assert sum(dead.values()) == 2 * copies and dead.get("bad_signature") == copies, dead
    assert [r.key for r in issued(got + drains.collect(lambda rs: False, timeout_s=1))] == [e.encode()]
    assert metric(port, "fleetwatch_act_drains_paused") == 0
    assert act.poll() is None, rig.logs()
    log = (rig.tmp / "act-0.log").read_text(errors="replace")
    assert log.count("\n") < 200, f"{log.count(chr(10))} log lines for {9 * copies} refused records"


def test_a_broker_outage_in_the_middle_of_a_flood_loses_nothing_and_drains_each_node_once(
    private_broker: PrivateBroker, alertmanager: Alertmanager, cluster: str, tmp_path: Path
) -> None:
    """The broker (a private one) stopped while act reads a flood of forged and garbage findings, and
    started again with more of them and a genuine finding queued behind: act stays up through the
    outage, drains the node of every genuine finding, the one sent just before the stop and the one
    sent during it, each once (not again when it reads its partitions anew), and never the node
    the forged findings name; every hostile record is dead-lettered."""
    rig = ActRig(private_broker.bootstrap, alertmanager, cluster, tmp_path)
    drains = TopicTail(private_broker.bootstrap, rig.drains)
    try:
        d, e, f, g = (f"{x}-{rig.group}" for x in ("out-d", "out-e", "out-f", "out-g"))
        rig.census(d, e, f, g)
        port = free_port()
        # three genuine drains within a minute: under the storm guard and the budget here
        act = rig.act("--fleet-size", "10", "--budget-min-nodes", "5", "--storm-min-nodes", "5",
                      "--metrics-port", str(port))  # fmt: skip
        rig.wait_for_log(0, "assigned")
        copies = 300

        def flood() -> None:  # garbage and a forged critical finding for d, `copies` of each
            for i in range(copies):
                rig.producer.send(rig.findings, key=d.encode(), value=bytes([i % 256]) * 64)
                forged = signed(finding(d, ts=time.time() - 1), ATTACKER_KEY.decode())
                rig.producer.send(rig.findings, key=d.encode(), value=forged)

        flood()
        rig.send(finding(e, ts=time.time() - 1))  # flushed: the broker has it all
        got = drains.collect(lambda rs: len(issued(rs)) >= 1, timeout_s=60)
        assert [r.key for r in issued(got)] == [e.encode()], rig.logs()
        # f's finding is taken just before the stop: act may read it and write f's drain request
        # into the outage (its producer holds it) or read it after; either way f drains once
        rig.send(finding(f, ts=time.time() - 1))
        private_broker.stop()
        try:
            flood()  # the test's producer holds these until the broker is back
            genuine = signed(finding(g, ts=time.time() - 1), CENSUS_KEY)  # as rig.send, not flushed
            rig.producer.send(rig.findings, key=g.encode(), value=genuine)
            time.sleep(5)
            assert act.poll() is None, rig.logs()  # act waits the outage out
        finally:
            private_broker.start()
        rig.flush(60)
        got += drains.collect(lambda rs: len(issued(got + rs)) >= 3, timeout_s=90)
        got += drains.collect(lambda rs: False, timeout_s=3)
        assert sorted(r.key for r in issued(got)) == sorted(n.encode() for n in (e, f, g)), rig.logs()
        where = f'source_topic="{rig.findings}"'
        deadline = time.monotonic() + 60
        while True:
            dead = by_label(port, "fleetwatch_deadletter_total", "reason", where=where)
            if sum(dead.values()) >= 4 * copies or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        # at least once: a record read again after the outage may be counted again, none is lost
        assert dead.get("bad_signature", 0) >= 2 * copies and sum(dead.values()) >= 4 * copies, dead
        assert act.poll() is None, rig.logs()
    finally:
        drains.close()
        rig.close()


def test_a_genuine_finding_whose_text_carries_markup_and_escapes_pages_one_plain_line(
    rig: ActRig, topic_tail: Callable[[str], TopicTail]
) -> None:
    """A finding detect signed whose summary and evidence hold a node's text as it sent it (a detect
    of an earlier release made nothing plain): chat mentions and links, a forged line after a
    newline, terminal escapes, a bidi override. The real act pages it to the real Alertmanager as
    one plain line, the evidence still JSON without markup, and drains the node once."""
    n = f"markup-{rig.group}"
    drains = topic_tail(rig.drains)
    rig.census(n)
    rig.act("--fleet-size", "10", "--budget-min-nodes", "3")
    rig.wait_for_log(0, "assigned")
    f = finding(n, ts=time.time() - 1)
    f["summary"] = (
        f"{n}: XID 79 on <!channel> <https://evil.example|re-auth>\n2026 INFO ok\x1b[2K\u202e [x](y)"
    )
    f["evidence"] = {**f["evidence"], "device": "<@here>\r\n\x1b]8;;https://evil\x07"}
    rig.send_raw((n, signed(f, CENSUS_KEY)))
    got = rig.am.wait_for(lambda a: any(x["labels"].get("node") == n for x in a), cluster=rig.cluster)
    [alert] = [a for a in got if a["labels"]["node"] == n and a["labels"]["alertname"] == "FleetwatchXid"]
    summary, evidence = alert["annotations"]["summary"], alert["annotations"]["evidence"]
    for text in (summary, evidence):
        assert not any(c in text for c in "<>\n\r\x1b\u202e") and "](" not in text, repr(text)
    assert summary.startswith(f"{n}: XID 79 on \u2039!channel\u203a")  # what the node sent, made plain
    assert orjson.loads(evidence)["device"].startswith("\u2039@here\u203a")
    out = drains.collect(lambda rs: len(issued(rs)) >= 1, timeout_s=30)
    out += drains.collect(lambda rs: False, timeout_s=2)
    assert [r.key for r in issued(out)] == [n.encode()], rig.logs()
