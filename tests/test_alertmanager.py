"""Alerts to a real Alertmanager (alerts/alert_model.py + alerts/alertmanager.py), read back with
GET /api/v2/alerts: labels, annotations, re-sends, ends, severity changes, an outage."""

from __future__ import annotations

import datetime as dt
import json
import time
from typing import Any

from alerts.alert_model import AlertBook, AlertBuilder
from alerts.alertmanager import DROPPED, AlertmanagerClient, Dispatcher
from tests.test_alerting_services import Alertmanager, alertmanager, cluster  # noqa: F401
from tests.test_drain_policy import finding


def parse(ts: str) -> float:
    return dt.datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


def fire(book: AlertBook, builder: AlertBuilder, f: dict[str, Any], drain: str | None = None) -> None:
    labels, annotations = builder.from_finding(f, drain)
    book.fire(f["id"], labels, annotations, f["first_seen"])


def test_finding_becomes_an_alert_with_grouping_labels_and_ends_when_resolved(
    alertmanager: Alertmanager,  # noqa: F811
    cluster: str,  # noqa: F811
) -> None:
    now = time.time()
    builder, book = AlertBuilder(cluster), AlertBook()
    disp = Dispatcher(AlertmanagerClient(alertmanager.url), resend_s=60)
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
    assert ann["runbook_url"].endswith("#xid") and ann["action"] == "drain node (XID 79)"
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
    alertmanager: Alertmanager,  # noqa: F811
    cluster: str,  # noqa: F811
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
    alertmanager: Alertmanager,  # noqa: F811
    cluster: str,  # noqa: F811
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


def test_outage_buffers_alerts_then_delivers_them(cluster: str) -> None:  # noqa: F811
    am = Alertmanager(19096)  # a private instance, so stopping it disturbs no other test
    am.stop()
    builder, book = AlertBuilder(cluster), AlertBook()
    disp = Dispatcher(AlertmanagerClient(am.url, timeout_s=1, retries=0), max_ended=2)
    now = time.time()
    fs = [finding(f"gpu-node-1{i}", ts=now, gpu=i) for i in range(5)]
    for f in fs:
        fire(book, builder, f)
    assert not disp.flush([book])  # down: nothing raised, everything kept
    assert len(book.records) == 5 and all(r.dirty for r in book.records.values())
    dropped = DROPPED._value.get()
    for f in fs[:4]:  # four end while it is down; only the newest two ends are kept
        book.end(f["id"], now - 10 + fs.index(f))
    assert not disp.flush([book], force=True)
    assert DROPPED._value.get() - dropped == 2 and len(book.records) == 3
    am.start()
    try:
        assert disp.flush([book], force=True)
        got = am.wait_for(lambda a: len(a) == 1, cluster=cluster)
        assert [a["labels"]["node"] for a in got] == ["gpu-node-14"]  # the one still active
        assert book.records and all(r.ends_at is None for r in book.records.values())
    finally:
        am.stop()
