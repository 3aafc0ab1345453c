"""Alerts to a real Alertmanager (alerts/alert_model.py + alerts/alertmanager.py), read back with
GET /api/v2/alerts: labels, annotations, re-sends, ends, severity changes, an outage; a bad alert
in a batch (dead-lettered on the real broker, the rest delivered at once), alerts timed by a
clock ahead of ours, and any accepted finding's alert passing Alertmanager's validation."""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from fleetwatch import topics
from fleetwatch.alerts.alert_model import AlertBook, AlertBuilder, AlertRecord, fingerprint, rfc3339
from fleetwatch.alerts.alertmanager import (
    BATCH,
    REASONS,
    AlertmanagerClient,
    AlertMetrics,
    AlertSender,
    Dispatcher,
    Outcome,
    dead_letter_alert,
    reject_reason,
)
from fleetwatch.bus.kafka import KafkaBus
from tests.helpers.findings import finding
from tests.integration.services import Alertmanager, TopicTail


def parse(ts: str) -> float:
    return dt.datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


def rig(am: Alertmanager, name: str) -> tuple[AlertBuilder, AlertBook, Dispatcher]:
    """An alert builder and book for cluster `name`, and a dispatcher posting to the real `am`."""
    return AlertBuilder(name), AlertBook(), Dispatcher(AlertmanagerClient(am.url), resend_s=60)


def fire(book: AlertBook, builder: AlertBuilder, f: dict[str, Any], drain: str | None = None) -> None:
    labels, annotations = builder.from_finding(f, drain)
    book.fire(f["id"], labels, annotations, f["first_seen"])


def test_finding_becomes_an_alert_with_grouping_labels_and_ends_when_resolved(
    alertmanager: Alertmanager,
    cluster: str,
) -> None:
    now = time.time()
    builder, book, disp = rig(alertmanager, cluster)
    f = finding("gpu-node-07", ts=now - 5, gpu=3)
    fire(book, builder, f, "XID 79")
    assert disp.flush([book])
    got = alertmanager.wait_for(lambda a: len(a) == 1, cluster=cluster)
    assert len(got) == 1
    a = got[0]
    assert a["labels"] == {
        "alertname": "FleetwatchXid",
        "cluster": cluster,
        "node": "gpu-node-07",
        "gpu": "3",
        "kind": "xid",
        "rule": "xid_burst",
        "severity": "critical",
    }
    ann = a["annotations"]
    assert ann["summary"] == f["summary"] and ann["finding_id"] == f["id"]
    assert json.loads(ann["evidence"]) == f["evidence"]
    assert ann["runbook_url"].endswith("/runbooks/xid.md") and ann["action"] == "drain node (XID 79)"
    assert [r["name"] for r in a["receivers"]] == ["pager"]  # critical routes to the pager
    assert abs(parse(a["startsAt"]) - f["first_seen"]) < 0.01
    assert 200 < parse(a["endsAt"]) - now < 260  # 4 x the re-send period: expires if we go quiet

    fire(book, builder, f, "XID 79")  # the same finding again: the same alert, nothing new to send
    assert not any(r.dirty for r in book.records.values())

    book.end(f["id"], now)
    assert disp.flush([book])
    assert alertmanager.wait_for(lambda a: a == [], cluster=cluster) == []
    assert book.records == {}  # delivered ends are forgotten


def test_active_alerts_are_re_sent_and_their_expiry_moves(
    alertmanager: Alertmanager,
    cluster: str,
) -> None:
    builder, book = AlertBuilder(cluster), AlertBook()
    disp = Dispatcher(AlertmanagerClient(alertmanager.url), resend_s=1.0)
    fire(book, builder, finding("gpu-node-08", "thermal", "warning", "thermal_throttle", ts=time.time()))
    disp.flush([book])
    first = alertmanager.wait_for(lambda a: len(a) == 1, cluster=cluster)[0]
    assert [r["name"] for r in first["receivers"]] == ["chat"]  # warnings go to chat
    assert disp.flush([book])  # not due yet: nothing posted
    time.sleep(1.1)
    assert disp.flush([book])
    again = alertmanager.wait_for(lambda a: a and a[0]["endsAt"] != first["endsAt"], cluster=cluster)
    assert parse(again[0]["endsAt"]) > parse(first["endsAt"])
    assert again[0]["fingerprint"] == first["fingerprint"]  # one alert, kept alive


def test_severity_rise_replaces_the_warning_with_a_critical(
    alertmanager: Alertmanager,
    cluster: str,
) -> None:
    builder, book = AlertBuilder(cluster), AlertBook()
    disp = Dispatcher(AlertmanagerClient(alertmanager.url))
    now = time.time()
    warn = finding("gpu-node-09", "nvlink", "warning", "nvlink_crc", ts=now, gpu=1)
    fire(book, builder, warn)
    disp.flush([book])
    fire(book, builder, {**warn, "severity": "critical", "ts": now + 1}, "NVLink errors")
    disp.flush([book])
    got = alertmanager.wait_for(
        lambda a: [x["labels"]["severity"] for x in a] == ["critical"], cluster=cluster
    )
    assert [x["labels"]["severity"] for x in got] == ["critical"]


def test_outage_buffers_alerts_then_delivers_them(cluster: str) -> None:
    am = Alertmanager(19096)  # a private instance, so stopping it disturbs no other test
    am.stop()
    builder, book = AlertBuilder(cluster), AlertBook()
    registry = CollectorRegistry()  # the dispatcher's own metrics, never the global registry's
    disp = Dispatcher(
        AlertmanagerClient(am.url, timeout_s=1, retries=0), max_ended=2, metrics=AlertMetrics(registry)
    )
    now = time.time()
    fs = [finding(f"gpu-node-1{i}", ts=now, gpu=i) for i in range(5)]
    for f in fs:
        fire(book, builder, f)
    assert not disp.flush([book])  # down: nothing raised, everything kept
    assert len(book.records) == 5 and all(r.dirty for r in book.records.values())
    assert not disp.healthy and disp.retry_at > now  # unavailable: the next tries back off
    assert registry.get_sample_value("fleetwatch_act_alerts_dropped_total") == 0
    for f in fs[:4]:  # four end while it is down; only the newest two ends are kept
        book.end(f["id"], now - 10 + fs.index(f))
    assert not disp.flush([book], force=True)
    assert registry.get_sample_value("fleetwatch_act_alerts_dropped_total") == 2 and len(book.records) == 3
    am.start()
    try:
        assert disp.flush([book], force=True)
        assert disp.healthy and disp.retry_at == 0.0
        got = am.wait_for(lambda a: len(a) == 1, cluster=cluster)
        assert [a["labels"]["node"] for a in got] == ["gpu-node-14"]  # the one still active
        assert book.records and all(r.ends_at is None for r in book.records.values())
    finally:
        am.stop()


def flush_until(
    sender: AlertSender, book: AlertBook, done: Callable[[], bool], timeout_s: float = 30
) -> bool:
    """Call the sender's flush (as act's decision step does, every second) until `done()`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        sender.flush([book])
        if done():
            return True
        time.sleep(0.1)
    return False


def test_the_sender_buffers_an_outage_and_delivers_each_alert_once_when_it_is_back(cluster: str) -> None:
    """act's AlertSender: flush only queues (its thread posts), an outage keeps every alert due
    in its book, and once Alertmanager is back each is delivered, once."""
    am = Alertmanager(19096)  # a private instance, so stopping it disturbs no other test
    am.stop()
    builder, book = AlertBuilder(cluster), AlertBook()
    sender = AlertSender(AlertmanagerClient(am.url, timeout_s=1, retries=0), resend_s=60)
    now = time.time()
    fs = [finding(f"gpu-node-2{i}", ts=now, gpu=i) for i in range(5)]
    for f in fs:
        fire(book, builder, f)
    try:
        assert flush_until(sender, book, lambda: not sender.healthy)  # down: nothing raised, all kept
        assert len(book.records) == 5 and all(r.dirty for r in book.records.values())
        book.end(fs[0]["id"], now + 1)  # one ends while it is down
        am.start()
        assert flush_until(sender, book, lambda: not any(r.dirty for r in book.records.values()), 60)
        assert sender.healthy and len(book.records) == 4  # the ended one's end was delivered
        got = am.wait_for(lambda a: len(a) == 4, cluster=cluster)
        assert sorted(a["labels"]["node"] for a in got) == [f"gpu-node-2{i}" for i in range(1, 5)]
        assert sender.close([book], timeout_s=5) == 0
    finally:
        am.stop()


# ------------------------------------------------------------ one record's problem is its own


def bad_record(cluster_label: str, now: float) -> AlertRecord:
    """An alert Alertmanager must refuse whatever the stamping does: a label name it does not allow
    (built by hand: AlertBuilder only makes valid names)."""
    labels = {"alertname": "FleetwatchXid", "cluster": cluster_label, "node": "bad-node", "bad-name": "x"}
    return AlertRecord(labels, {"summary": "hand-made"}, now)


def rejected(disp: Dispatcher, reason: str) -> float:
    """How many alerts this dispatcher counted as refused for `reason` (its own metrics)."""
    return sum(
        s.value
        for m in disp.metrics.rejected.collect()
        for s in m.samples
        if s.name.endswith("_total") and s.labels["reason"] == reason
    )


def test_one_bad_alert_is_dead_lettered_and_the_rest_delivered_at_once(
    alertmanager: Alertmanager,
    cluster: str,
    kafka_bootstrap: str,
    topic_tail: Callable[[str], TopicTail],
) -> None:
    deadletters = topic_tail(topics.DEADLETTER)
    producer = KafkaBus(kafka_bootstrap).producer()
    now = time.time()
    builder, book = AlertBuilder(cluster), AlertBook()
    for i in range(6):
        fire(book, builder, finding(f"gpu-node-{i:02d}", ts=now - 5, gpu=i))
    book.records[fingerprint(bad_record(cluster, now).labels)] = bad_record(cluster, now)
    disp = Dispatcher(
        AlertmanagerClient(alertmanager.url),
        on_rejected=lambda raw, reason, detail: dead_letter_alert(producer, raw, reason, detail),
    )
    assert rejected(disp, "invalid_label") == 0
    try:
        assert disp.flush([book])  # Alertmanager answered every post: a success, whatever it refused
        assert not producer.flush(10), "dead letter not acknowledged"
    finally:
        producer.close(5)
    got = alertmanager.wait_for(lambda a: len(a) == 6, cluster=cluster)
    assert sorted(a["labels"]["node"] for a in got) == [f"gpu-node-{i:02d}" for i in range(6)]
    assert len(book.records) == 6 and not any(r.dirty for r in book.records.values())  # all sent
    assert rejected(disp, "invalid_label") == 1
    assert disp.healthy and disp.retry_at == 0.0  # a refusal is no outage: nothing waits for it
    records = deadletters.collect(lambda rs: len(rs) >= 1)
    assert len(records) == 1
    headers = {k: v.decode() for k, v in records[0].headers}
    assert headers["reason"] == "alert_rejected" and headers["source"] == "alertmanager"
    assert headers["detail"].startswith("invalid_label: HTTP 400: invalid label set")
    alert = json.loads(records[0].value)
    assert alert["labels"]["bad-name"] == "x" and alert["labels"]["node"] == "bad-node"


def test_a_refused_first_chunk_holds_back_no_later_chunk(
    alertmanager: Alertmanager,
    cluster: str,
) -> None:
    now = time.time()
    builder, book = AlertBuilder(cluster), AlertBook()
    book.records[fingerprint(bad_record(cluster, now).labels)] = bad_record(cluster, now)  # chunk 1
    n = 2 * BATCH + 50  # three chunks
    for i in range(n):
        fire(book, builder, finding(f"chunk-node-{i:03d}", ts=now - 5, gpu=0))
    dead: list[tuple[bytes, str, str]] = []
    disp = Dispatcher(AlertmanagerClient(alertmanager.url), on_rejected=lambda *a: dead.append(a))
    assert disp.flush([book])  # ONE flush
    got = alertmanager.wait_for(lambda a: len(a) == n, cluster=cluster)
    assert len(got) == n and "bad-node" not in {a["labels"]["node"] for a in got}
    assert [reason for _, reason, _ in dead] == ["invalid_label"]
    assert len(book.records) == n and disp.retry_at == 0.0


def test_alerts_timed_ahead_of_our_clock_are_accepted_and_keep_their_event_time(
    alertmanager: Alertmanager,
    cluster: str,
) -> None:
    # A node clock 10 minutes ahead (within the 1 h skew findings are accepted with), or a
    # simulation faster than real time: the finding's times are after fleetwatch's `now`.
    now = time.time()
    builder, book, disp = rig(alertmanager, cluster)
    ahead = finding("skew-node-01", ts=now + 600, gpu=1)
    fire(book, builder, ahead)
    ended = finding("skew-node-02", ts=now + 900, gpu=2)
    fire(book, builder, ended)
    before = sum(rejected(disp, r) for r in REASONS)
    assert disp.flush([book])
    got = alertmanager.wait_for(lambda a: len(a) == 2, cluster=cluster)
    a = next(x for x in got if x["labels"]["node"] == "skew-node-01")
    assert parse(a["startsAt"]) <= time.time() < parse(a["endsAt"])  # on our clock, and active
    assert 200 < parse(a["endsAt"]) - now < 260
    assert a["annotations"]["first_seen"] == rfc3339(now + 600)  # the node's own time, for on-call
    book.end(ended["id"], now + 1200)  # resolved, also in the node's future
    assert disp.flush([book])
    got = alertmanager.wait_for(lambda a: len(a) == 1, cluster=cluster)  # resolved now, not later
    assert [x["labels"]["node"] for x in got] == ["skew-node-01"]
    assert sum(rejected(disp, r) for r in REASONS) == before and len(book.records) == 1


def test_refusals_are_named_by_reason_and_a_wrong_endpoint_is_an_outage_not_a_refusal(
    alertmanager: Alertmanager,
    cluster: str,
) -> None:
    client = AlertmanagerClient(alertmanager.url)
    now = time.time()

    def alert(
        labels: dict[str, str], starts: float = now, ends: float = now + 60, **ann: str
    ) -> dict[str, Any]:
        return {"labels": labels, "annotations": ann, "startsAt": rfc3339(starts), "endsAt": rfc3339(ends)}

    ok = {"alertname": "FleetwatchXid", "cluster": cluster}
    cases = {  # Alertmanager's own answers, bypassing the stamping
        "start_after_end": alert(ok, now + 60, now),
        "invalid_label": alert({**ok, "bad-name": "x"}),
        "empty_labels": alert({"alertname": ""}),  # Alertmanager drops empty values first
        "invalid_annotation": alert(ok, **{"bad name": "x"}),
    }
    for reason, payload in cases.items():
        result = client.post([payload])
        assert result.outcome is Outcome.REFUSED, (reason, result)
        assert reject_reason(result.detail) == reason, result.detail
    assert client.post([alert(ok)]).outcome is Outcome.ACCEPTED

    # A wrong path (or a proxy's 401/403) says nothing about the alerts: bisecting it would
    # dead-letter every one of them. It is buffered and retried with backoff instead.
    builder, book = AlertBuilder(cluster), AlertBook()
    fire(book, builder, finding("gpu-node-30", ts=now))
    wrong = AlertmanagerClient(alertmanager.url + "/not-here", retries=0)
    assert wrong.post([alert(ok)]).outcome is Outcome.UNAVAILABLE
    dead: list[tuple[bytes, str, str]] = []
    disp = Dispatcher(wrong, on_rejected=lambda *a: dead.append(a), clock=lambda: now)
    assert not disp.flush([book])
    assert dead == [] and len(book.records) == 1 and disp.retry_at == now + 1.0


finding_times = st.one_of(
    st.floats(-2 * 86400, 2 * 86400).map(lambda d: time.time() + d),  # around now, either way
    st.floats(0, 1e15),  # anything finding/1 accepts: >= 0 and finite
)


@given(
    findings=st.lists(
        st.tuples(finding_times, st.floats(0, 86400), st.booleans(), st.booleans()), min_size=1, max_size=6
    )
)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_alerts_from_any_accepted_finding_pass_alertmanagers_validation(
    alertmanager: Alertmanager,
    cluster: str,
    findings: list[tuple[float, float, bool, bool]],
) -> None:
    builder, book, disp = rig(alertmanager, cluster)
    ends: list[tuple[str, float]] = []
    for i, (first_seen, lasted, resolved, sent_first) in enumerate(findings):
        f = finding(f"prop-node-{i}", ts=first_seen + lasted, first_seen=first_seen, gpu=i)
        fire(book, builder, f)
        if resolved:
            ends.append((f["id"], f["ts"]))
            if not sent_first:
                book.end(f["id"], f["ts"])  # ends before Alertmanager ever saw it
    before = sum(rejected(disp, r) for r in REASONS)
    assert disp.flush([book])
    for fid, ts in ends:
        book.end(fid, ts)
    assert disp.flush([book])
    assert sum(rejected(disp, r) for r in REASONS) == before  # Alertmanager took every one of them
    assert all(r.ends_at is None and not r.dirty for r in book.records.values())


def test_the_sender_bisects_a_refused_batch_and_dead_letters_only_the_bad_alert(
    alertmanager: Alertmanager,
    cluster: str,
) -> None:
    now = time.time()
    builder, book = AlertBuilder(cluster), AlertBook()
    for i in range(6):
        fire(book, builder, finding(f"gpu-node-{i:02d}", ts=now - 5, gpu=i))
    book.records[fingerprint(bad_record(cluster, now).labels)] = bad_record(cluster, now)
    dead: list[tuple[bytes, str, str]] = []
    sender = AlertSender(AlertmanagerClient(alertmanager.url), on_rejected=lambda *a: dead.append(a))
    assert flush_until(
        sender, book, lambda: len(dead) == 1 and not any(r.dirty for r in book.records.values())
    )
    got = alertmanager.wait_for(lambda a: len(a) == 6, cluster=cluster)
    assert sorted(a["labels"]["node"] for a in got) == [f"gpu-node-{i:02d}" for i in range(6)]
    assert [reason for _, reason, _ in dead] == ["invalid_label"] and len(book.records) == 6
    assert json.loads(dead[0][0])["labels"]["bad-name"] == "x"
    assert sender.healthy and sender.close([book], timeout_s=5) == 0
