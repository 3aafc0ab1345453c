"""The alert queue of `fleetwatch act` (alerts/alertmanager.py AlertSender), without posting: it
holds the latest state per alert, is bounded, and a changed alert evicts the oldest queued re-send
(counted) while the evicted one stays due in its book; backoff counts from the end of a failed
post. Delivery itself is tested against the real Alertmanager (tests/integration/
test_alertmanager.py, test_act_slow_alertmanager.py)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from fleetwatch.alerts.alert_model import AlertBook, AlertBuilder
from fleetwatch.alerts.alertmanager import AlertmanagerClient, AlertMetrics, AlertSender, PostResult
from tests.helpers.findings import T0, finding

NOW = T0 + 100


def sender(max_queued: int = 10, registry: CollectorRegistry | None = None) -> AlertSender:
    # start=False: nothing is posted, so the queue can be inspected as flush leaves it
    client = AlertmanagerClient("http://127.0.0.1:9")
    metrics = AlertMetrics(registry)  # the test's own registry, never the global one
    return AlertSender(
        client, resend_s=60, max_queued=max_queued, clock=lambda: NOW, start=False, metrics=metrics
    )


def fire(book: AlertBook, node: str, severity: str = "critical", summary: str = "") -> str:
    f = {**finding(node, severity=severity, ts=T0), "summary": summary or node}
    labels, annotations = AlertBuilder("test").from_finding(f, None)
    book.fire(f["id"], labels, annotations, T0)
    return str(f["id"])


def test_the_queue_keeps_the_latest_state_of_each_alert_once() -> None:
    s, book = sender(), AlertBook()
    fid = fire(book, "n1", summary="first words")
    s.flush([book])
    s.flush([book])  # due again (not delivered yet), already queued: not queued twice
    assert [q.annotations["summary"] for q in s.queued()] == ["first words"]
    fire(book, "n1", summary="second words")  # the same alert (labels), changed
    s.flush([book])
    assert [q.annotations["summary"] for q in s.queued()] == ["second words"]
    book.end(fid, T0 + 50)  # ended: the record is the same object, its end is new
    s.flush([book])
    assert [(q.annotations["summary"], q.ends_at) for q in s.queued()] == [("second words", T0 + 50)]


def test_a_full_queue_takes_a_change_in_place_of_the_oldest_re_send_and_nothing_else() -> None:
    registry = CollectorRegistry()
    s, book = sender(max_queued=2, registry=registry), AlertBook()
    fire(book, "n1")
    fire(book, "n2")
    for rec in book.records.values():  # delivered long ago: only due for a re-send
        rec.dirty, rec.last_sent = False, NOW - 120
    s.flush([book])
    assert [q.labels["node"] for q in s.queued()] == ["n1", "n2"]
    fire(book, "n3")
    for rec in book.records.values():
        if rec.labels["node"] == "n3":
            rec.dirty, rec.last_sent = False, NOW - 120
    s.flush([book])  # a re-send when full waits in its book
    assert [q.labels["node"] for q in s.queued()] == ["n1", "n2"]
    assert registry.get_sample_value("fleetwatch_act_alerts_evicted_total") == 0
    fire(book, "n4")  # a change: it evicts the oldest re-send
    s.flush([book])
    assert [q.labels["node"] for q in s.queued()] == ["n2", "n4"]
    assert registry.get_sample_value("fleetwatch_act_alerts_evicted_total") == 1
    assert {r.labels["node"] for r in book.records.values()} == {"n1", "n2", "n3", "n4"}  # all kept
    fire(book, "n5")  # full of changes and n2 (a re-send): n2 goes, then no more room
    fire(book, "n6")
    s.flush([book])
    assert sorted(q.labels["node"] for q in s.queued()) == ["n4", "n5"]
    assert len(s.queued()) == 2 and len(book.records) == 6


def test_closing_a_sender_that_could_not_post_counts_what_is_left_and_keeps_it() -> None:
    s, book = sender(), AlertBook()
    fire(book, "n1")
    fire(book, "n2")
    assert s.close([book], timeout_s=0) == 2
    assert len(book.records) == 2 and all(r.dirty for r in book.records.values())


def test_backoff_counts_from_the_end_of_a_failed_post_and_the_alert_stays_queued() -> None:
    t = [100.0]

    class ThirtySecondPost(AlertmanagerClient):
        """The real client; the test's clock moves 30 s while it posts (to a port nobody serves)."""

        def post(self, alerts: list[dict[str, object]]) -> PostResult:
            t[0] += 30
            return super().post(alerts)

    client = ThirtySecondPost("http://127.0.0.1:9", timeout_s=1, retries=0)
    s = AlertSender(client, clock=lambda: NOW, start=False, monotonic=lambda: t[0])
    book = AlertBook()
    fire(book, "n1")
    s.flush([book])
    assert s.post_next() == 1 and not s.healthy
    assert t[0] == 130 and s.retry_in() == 1.0  # 1 s after the post ENDED, not after it began
    assert [q.labels["node"] for q in s.queued()] == ["n1"]  # back in the queue, nothing lost
    t[0] = 200
    assert s.retry_in() == 0 and s.post_next() == 1
    assert s.retry_in() == 2.0  # doubled, again from the end (t = 230)
    s.flush([book])
    assert all(r.dirty for r in book.records.values())  # still due in its book
